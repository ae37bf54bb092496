"""The Docker engines a build (and a distribution source) talks to, behind one small interface.

- ``DockerPyEngine``: docker-py against the local engine (``DOCKER_HOST`` or the default socket).
- ``CliEngine``: the ``docker`` command on a cluster host, run through the transport
  (sparkctl.remote.transport): over SSH with the inventory's identity, known_hosts and host-key
  policy, or locally. docker-py's
  own ``ssh://`` transport reads only ~/.ssh/config and ~/.ssh/known_hosts and rejects every other
  host key, so it cannot honour an inventory; the CLI over our SSH layer can.

Both return the same ``ImageInfo`` and raise ``EngineError`` (one line) for anything that failed.
"""

from __future__ import annotations

import json
import os
import threading
from dataclasses import dataclass, field
from typing import Callable, Iterator, Sequence

from sparkctl.commands.docker import from_file_then_remove_argv, upload_to_temp_argv
from sparkctl.commands.probes import image_inspect_argv
from sparkctl.errors import OperationFailed

LogLine = Callable[[str], None]

# A POSIX sh script run inside an image (entrypoint cleared, no network): for each path, whether it
# exists and, if not, its deepest existing folder and that folder's entries (for a "did you mean").
PROBE_SCRIPT = r"""
for p in "$@"; do
  if [ -e "$p" ]; then printf 'present\t%s\n' "$p"; continue; fi
  d=$(dirname "$p"); while [ ! -d "$d" ]; do d=$(dirname "$d"); done
  printf 'missing\t%s\t%s\t%s\n' "$p" "$d" "$(ls -1A "$d" 2>/dev/null | head -n 500 | tr '\n' ' ')"
done
"""


class EngineError(OperationFailed):
    """The engine refused or failed (exit 1); ``str()`` is one line, ``log`` the build's last lines."""

    def __init__(self, message: str, log: Sequence[str] = ()):
        super().__init__(" ".join(message.split()))
        self.log = list(log)


@dataclass
class ImageInfo:
    id: str
    tags: list[str] = field(default_factory=list)
    digests: list[str] = field(default_factory=list)
    labels: dict[str, str] = field(default_factory=dict)
    entrypoint: list[str] | None = None
    layers: list[str] = field(default_factory=list)  # diff IDs, bottom first
    size: int = 0

    @classmethod
    def from_inspect(cls, data: dict) -> "ImageInfo":
        config = data.get("Config") or {}
        return cls(
            id=data["Id"],
            tags=list(data.get("RepoTags") or []),
            digests=list(data.get("RepoDigests") or []),
            labels=dict(config.get("Labels") or {}),
            entrypoint=config.get("Entrypoint"),
            layers=list((data.get("RootFS") or {}).get("Layers") or []),
            size=int(data.get("Size") or 0),
        )


@dataclass
class PathProbe:
    path: str
    exists: bool
    existing_dir: str | None = None
    names: list[str] = field(default_factory=list)


def parse_probe(text: str) -> list[PathProbe]:
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if parts[0] == "present" and len(parts) >= 2:
            out.append(PathProbe(parts[1], True))
        elif parts[0] == "missing" and len(parts) >= 3:
            names = parts[3].split() if len(parts) > 3 else []
            out.append(PathProbe(parts[1], False, parts[2], names))
    return out


class _LineSplitter:
    """Bytes in, complete lines out (a build log arrives in arbitrary chunks)."""

    def __init__(self, on_line: LogLine):
        self.on_line, self.buffer = on_line, b""
        self.tail: list[str] = []

    def feed(self, data: bytes) -> None:
        self.buffer += data
        while b"\n" in self.buffer:
            line, self.buffer = self.buffer.split(b"\n", 1)
            self._emit(line)

    def close(self) -> None:
        if self.buffer:
            self._emit(self.buffer)
            self.buffer = b""

    def _emit(self, raw: bytes) -> None:
        line = raw.decode("utf-8", "replace").rstrip("\r")
        self.tail = (self.tail + [line])[-20:]
        self.on_line(line)


class Engine:
    """What a build needs from a Docker engine."""

    name = "engine"
    address = ""  # where it is, for messages

    def inspect(self, ref: str) -> ImageInfo | None: ...
    def tagged_images(self, label: str) -> list[ImageInfo]: ...
    def dangling_images(self, label: str) -> list[ImageInfo]: ...
    def tag(self, image_id: str, ref: str) -> None: ...
    def untag(self, ref: str) -> None: ...
    def remove(self, image_id: str) -> bool: ...
    def pull(self, ref: str, on_log: LogLine) -> None: ...
    def import_rootfs(self, tar_path: str, tag: str, changes: list[str]) -> str: ...
    def build(self, context_tar: str, *, dockerfile: str, tag: str, args: dict[str, str], no_cache: bool,
              on_log: LogLine) -> str: ...
    def probe_paths(self, image: str, paths: list[str]) -> list[PathProbe] | None: ...
    def run_python(self, image: str, program: str, args: list[str]) -> str | None: ...
    def info(self) -> dict: ...

    def close(self) -> None:
        pass

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


# ---------------------------------------------------------------------------------------------
# docker-py


class DockerPyEngine(Engine):
    def __init__(self, base_url: str | None = None, timeout: int = 24 * 3600):
        import docker  # here, not at the top: the docker SDK costs ~0.3 s and only the local engine needs it

        self.name = "local"
        try:
            if base_url:
                self.client = docker.DockerClient(base_url=base_url, timeout=timeout)
            else:
                self.client = docker.from_env(timeout=timeout)
            self.client.ping()
        except docker.errors.DockerException as err:
            where = base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
            raise EngineError(f"cannot reach the Docker engine at {where}: {_short(err)} "
                              f"(is dockerd running? DOCKER_HOST selects another engine)") from None
        self.api = self.client.api
        self.address = self.api.base_url

    def _errors(self):
        import docker

        return docker.errors

    def inspect(self, ref: str) -> ImageInfo | None:
        try:
            return ImageInfo.from_inspect(self.api.inspect_image(ref))
        except self._errors().ImageNotFound:
            return None
        except self._errors().APIError as err:
            if err.status_code == 404:
                return None
            raise EngineError(f"inspect {ref}: {_short(err)}") from None

    def _by_label(self, label: str, dangling: bool | None) -> list[ImageInfo]:
        filters: dict = {"label": [label]}
        if dangling is not None:
            filters["dangling"] = dangling
        ids = self.api.images(all=dangling is True, filters=filters, quiet=True)
        return [info for info in (self.inspect(i) for i in dict.fromkeys(ids)) if info is not None]

    def tagged_images(self, label: str) -> list[ImageInfo]:
        return [i for i in self._by_label(label, False) if i.tags]

    def dangling_images(self, label: str) -> list[ImageInfo]:
        return [i for i in self._by_label(label, True) if not i.tags]

    def tag(self, image_id: str, ref: str) -> None:
        repository, tag = split_ref(ref)
        self.api.tag(image_id, repository, tag, force=True)

    def untag(self, ref: str) -> None:
        try:
            self.api.remove_image(ref, noprune=True)
        except self._errors().APIError as err:
            if err.status_code != 404:
                raise EngineError(f"untag {ref}: {_short(err)}") from None

    def remove(self, image_id: str) -> bool:
        try:
            self.api.remove_image(image_id)
            return True
        except self._errors().APIError:
            return False  # in use, has children or tags: not ours to force

    def pull(self, ref: str, on_log: LogLine) -> None:
        repository, tag = split_ref(ref)
        try:
            for event in self.api.pull(repository, tag, stream=True, decode=True):
                if "error" in event:
                    raise EngineError(f"pull {ref}: {event['error']}")
                status = event.get("status")
                if status and "progress" not in event:
                    on_log(f"{event.get('id', '')} {status}".strip())
        except self._errors().APIError as err:
            raise EngineError(f"pull {ref}: {_short(err)}") from None

    def import_rootfs(self, tar_path: str, tag: str, changes: list[str]) -> str:
        repository, version = split_ref(tag)
        try:
            with open(tar_path, "rb") as handle:
                response = self.api.import_image(src=_chunks(handle), repository=repository, tag=version,
                                                 changes=changes, stream_src=True)
        except self._errors().APIError as err:
            raise EngineError(f"import {tag}: {_short(err)}") from None
        for line in str(response).splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if "error" in event:
                raise EngineError(f"import {tag}: {event['error']}")
        info = self.inspect(tag)
        if info is None:
            raise EngineError(f"import {tag}: the engine reported no image ({_short(response)})")
        return info.id

    def build(self, context_tar, *, dockerfile, tag, args, no_cache, on_log) -> str:
        tail: list[str] = []
        image_id = None
        try:
            with open(context_tar, "rb") as handle:
                stream = self.api.build(fileobj=handle, custom_context=True, dockerfile=dockerfile, tag=tag,
                                        buildargs=args, nocache=no_cache, rm=True, forcerm=True,
                                        decode=True)
                for event in stream:
                    if "stream" in event:
                        for line in event["stream"].splitlines():
                            tail = (tail + [line])[-20:]
                            on_log(line)
                    if "aux" in event and isinstance(event["aux"], dict) and "ID" in event["aux"]:
                        image_id = event["aux"]["ID"]
                    if "error" in event:
                        raise EngineError(f"build {tag}: {event['error'].strip()}", tail)
        except self._errors().APIError as err:
            raise EngineError(f"build {tag}: {_short(err)}", tail) from None
        info = self.inspect(tag)
        if info is None or (image_id and info.id != image_id):
            raise EngineError(f"build {tag}: the engine did not tag the image it built", tail)
        return info.id

    def probe_paths(self, image: str, paths: list[str]) -> list[PathProbe] | None:
        errors = self._errors()
        try:
            output = self.client.containers.run(image, command=list(paths), entrypoint=["/bin/sh", "-c", PROBE_SCRIPT, "sh"],
                                                network_mode="none", remove=True, stdout=True, stderr=False)
        except (errors.ContainerError, errors.APIError):
            return None  # no /bin/sh in the image, or it cannot run here: the caller says "unknown"
        return parse_probe(output.decode("utf-8", "replace"))

    def run_python(self, image: str, program: str, args: list[str]) -> str | None:
        """``python3 -c program args`` in a throwaway container of ``image`` (entrypoint cleared, no
        network): its stdout, or None when it cannot run or fails."""
        errors = self._errors()
        try:
            output = self.client.containers.run(image, command=["-c", program, *args], entrypoint=["python3"],
                                                network_mode="none", remove=True, stdout=True, stderr=False)
        except (errors.ContainerError, errors.APIError):
            return None
        return output.decode("utf-8", "replace")

    def info(self) -> dict:
        return self.api.info()

    def save(self, ref: str, chunk_size: int) -> Iterator[bytes]:
        """``docker save`` as a stream of chunks."""
        response = self.api.get_image(ref, chunk_size=chunk_size)
        return iter(response)

    def close(self) -> None:
        self.client.close()


def _chunks(handle, size: int = 1024 * 1024):
    while True:
        block = handle.read(size)
        if not block:
            return
        yield block


def _short(err, limit: int = 300) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def split_ref(ref: str) -> tuple[str, str]:
    """"repo/name:tag" -> ("repo/name", "tag"); no tag -> "latest"."""
    name, _, tag = ref.rpartition(":")
    if not name or "/" in tag:
        return ref, "latest"
    return name, tag


# ---------------------------------------------------------------------------------------------
# the docker CLI, locally or over SSH


class _Lines:
    """Runs on a transport in the shape ``CliEngine`` wants: stdin from a file, and
    stdout split into lines as they arrive (the last ones kept for the error message)."""

    def __init__(self, transport):
        self.transport = transport

    def run(self, argv: list[str], *, stdin_path: str | None = None, timeout: float | None = None):
        if stdin_path:
            with open(stdin_path, "rb") as handle:
                return self.transport.run_stream_in(argv, _chunks(handle), timeout=timeout)
        return self.transport.run(argv, timeout=timeout)

    def stream_lines(self, argv: list[str], on_line: LogLine, *, timeout: float | None = None):
        splitter = _LineSplitter(on_line)
        lock = threading.Lock()

        def sink(data: bytes) -> None:
            with lock:
                splitter.feed(data)

        result = self.transport.run_stream_out(argv, sink, timeout=timeout)
        splitter.close()
        result.stdout = "\n".join(splitter.tail)
        return result


def _no_such_image(text: str) -> bool:
    lowered = text.lower()
    return "no such image" in lowered or "no such object" in lowered or "not found" in lowered


class CliEngine(Engine):
    """The docker CLI on one host, over any transport (sparkctl.remote.transport): the host's
    paramiko connection, or this machine's processes."""

    def __init__(self, transport, docker: str = "docker"):
        self.transport, self.docker = transport, docker
        self.runner = _Lines(transport)
        self.name = transport.name
        self.address = transport.name

    def _run(self, *args: str, stdin_path: str | None = None, timeout: float | None = 600, check: bool = True):
        result = self.runner.run([self.docker, *args], stdin_path=stdin_path, timeout=timeout)
        if check and result.exit_code != 0:
            raise EngineError(f"{self.name}: docker {args[0]} failed (exit {result.exit_code}): "
                              f"{_short(result.stderr or result.stdout)}")
        return result

    def inspect(self, ref: str) -> ImageInfo | None:
        result = self.runner.run(image_inspect_argv(ref, "{{json .}}", docker=self.docker), timeout=600)
        if result.exit_code != 0:
            if _no_such_image(result.stderr):
                return None
            raise EngineError(f"{self.name}: docker image inspect {ref}: {_short(result.stderr)}")
        return ImageInfo.from_inspect(json.loads(result.stdout))

    def _by_label(self, label: str, dangling: bool) -> list[ImageInfo]:
        args = ["image", "ls", "--no-trunc", "-q", "--filter", f"label={label}", "--filter", f"dangling={'true' if dangling else 'false'}"]
        if dangling:
            args.insert(2, "-a")
        ids = list(dict.fromkeys(self._run(*args).stdout.split()))
        return [info for info in (self.inspect(i) for i in ids) if info is not None]

    def tagged_images(self, label: str) -> list[ImageInfo]:
        return [i for i in self._by_label(label, False) if i.tags]

    def dangling_images(self, label: str) -> list[ImageInfo]:
        return [i for i in self._by_label(label, True) if not i.tags]

    def tag(self, image_id: str, ref: str) -> None:
        self._run("tag", image_id, ref)

    def untag(self, ref: str) -> None:
        result = self._run("image", "rm", "--no-prune", ref, check=False)
        if result.exit_code != 0 and not _no_such_image(result.stderr):
            raise EngineError(f"{self.name}: untag {ref}: {_short(result.stderr)}")

    def remove(self, image_id: str) -> bool:
        return self._run("image", "rm", image_id, check=False).exit_code == 0

    def pull(self, ref: str, on_log: LogLine) -> None:
        result = self.runner.stream_lines([self.docker, "pull", ref], on_log, timeout=None)
        if result.exit_code != 0:
            raise EngineError(f"{self.name}: pull {ref} failed: {_short(result.stdout)}")

    def import_rootfs(self, tar_path: str, tag: str, changes: list[str]) -> str:
        args = ["import"]
        for change in changes:
            args += ["--change", change]
        self._run(*args, "-", tag, stdin_path=tar_path, timeout=None)
        info = self.inspect(tag)
        if info is None:
            raise EngineError(f"{self.name}: import {tag}: no image afterwards")
        return info.id

    def build(self, context_tar, *, dockerfile, tag, args, no_cache, on_log) -> str:
        # The context goes to a temporary file first, so the build's own output can stream back.
        upload = self.runner.run(upload_to_temp_argv(), stdin_path=context_tar, timeout=None)
        path = upload.stdout.strip()
        if upload.exit_code != 0 or not path.startswith("/tmp/sparkctl-context."):
            raise EngineError(f"{self.name}: could not upload the build context: {_short(upload.stderr)}")
        argv = ["build", "--rm", "--force-rm", "-f", dockerfile, "-t", tag]
        for key, value in sorted(args.items()):
            argv += ["--build-arg", f"{key}={value}"]
        if no_cache:
            argv.append("--no-cache")
        result = self.runner.stream_lines(from_file_then_remove_argv(path, [self.docker, *argv]), on_log, timeout=None)
        tail = result.stdout.splitlines()
        if result.exit_code != 0:
            last = next((line for line in reversed(tail) if line.strip()), "no output")
            raise EngineError(f"{self.name}: build {tag}: {last}", tail)  # the host, as every error of this engine
        info = self.inspect(tag)
        if info is None:
            raise EngineError(f"{self.name}: build {tag}: no image tagged afterwards", tail)
        return info.id

    def probe_paths(self, image: str, paths: list[str]) -> list[PathProbe] | None:
        result = self._run("run", "--rm", "--network", "none", "--entrypoint", "/bin/sh", image, "-c", PROBE_SCRIPT, "sh",
                           *paths, check=False, timeout=120)
        if result.exit_code != 0:
            return None
        return parse_probe(result.stdout)

    def run_python(self, image: str, program: str, args: list[str]) -> str | None:
        result = self._run("run", "--rm", "--network", "none", "--entrypoint", "python3", image, "-c", program, *args,
                           check=False, timeout=300)
        return result.stdout if result.exit_code == 0 else None

    def info(self) -> dict:
        return json.loads(self._run("info", "--format", "{{json .}}").stdout)

    def close(self) -> None:
        self.transport.close()
