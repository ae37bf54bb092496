"""What changed between the running deployment and what it would be now (``sparkctl status``).

A deployment drifts without anyone touching its containers: a new image is distributed under the
same tag, a recipe is edited, a variable is changed. None of this stops it serving, so these are
*notices* (status still exits 0) — except ranks running different images, which is the kind of
mismatch that hangs a NCCL rendezvous or corrupts results, and is a problem.

Pure functions: the containers come from ``docker inspect`` (``Config.Cmd`` is the engine argv,
since the images have an empty ENTRYPOINT; ``Config.Env`` holds engine.env's values), the
expected values from the same render ``serve`` used. Environment values are never printed: they
may be tokens.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field

from sparkctl.secrets import MASK, is_secret_name


@dataclass
class Drift:
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12] or "?"


def image_drift(running: dict[str, str], tag_now: dict[str, str | None],
                layers: dict[str, tuple[str, ...] | None], tag: str) -> Drift:
    """``running``: host -> image ID its container runs; ``tag_now``: host -> the ID ``tag`` names
    there now (None: the tag is gone); ``layers``: host -> the running image's layer diff IDs
    (None: unknown). Ranks are compared by content (layers), not by ID: the same files imported
    or built on each host get different IDs."""
    drift = Drift()
    known = {host: content for host, content in layers.items() if content is not None}
    if len(set(known.values())) > 1:
        drift.problems.append("the ranks run images of different content: " + ", ".join(
            f"{host} {short_id(running[host])}" for host in known)
            + " (`sparkctl distribute`, then `sparkctl serve` again)")
    for host, image in running.items():
        now = tag_now.get(host, image)
        if now is None:
            drift.notices.append(f"{host}: runs {short_id(image)}; {tag} is no longer on the host")
        elif now != image:
            drift.notices.append(f"{host}: runs {short_id(image)} but {tag} is {short_id(now)} now "
                                 "(distributed since the serve): `sparkctl serve` again to run it")
    return drift


_SHELL_PLUMBING = {"trap", "wait"}  # in a rendered shell line: how it runs, not what it runs
_SEPARATORS = {";", "&", "&&", "||", "|"}
_ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")  # NAME=value: a shell variable set


def _commands_run(argv: list[str]) -> list[list[str]]:
    """The commands a container command runs: a ``bash -c LINE`` without its shell plumbing (each
    command of the line, ``exec`` dropped; ``trap``, ``wait`` and variable assignments left out), so
    the Ray head's line compares by its ``ray start`` and its ``vllm serve`` whichever way the shell
    around them is written (a sparkctl that changed that wrapping does not restart a running engine);
    any other argv is one command."""
    if len(argv) != 3 or argv[0] not in ("bash", "sh") or argv[1] != "-c":
        return [argv]
    lexer = shlex.shlex(argv[2], posix=True, punctuation_chars=";&|")
    lexer.whitespace_split = True
    try:
        tokens = list(lexer)
    except ValueError:  # not a line a shell would read: compared as it is
        return [argv]
    commands, current = [], []
    for token in [*tokens, ";"]:
        if token not in _SEPARATORS:
            current.append(token)
            continue
        if current and current[0] == "exec":
            current = current[1:]
        if current and current[0] not in _SHELL_PLUMBING and not _ASSIGNMENT.match(current[0]):
            commands.append(current)
        current = []
    return commands


def argv_changes(running: list[str], expected: list[str], limit: int = 4) -> list[str]:
    """The options whose values differ, as ``--flag old → new`` (``absent`` on either side); a
    ``bash -c`` line command by command (``_commands_run``)."""
    old_commands, new_commands = _commands_run(running), _commands_run(expected)
    if len(old_commands) != len(new_commands):
        # (the programs' names only: a whole command line may carry a secret's value)
        changes = [f"commands {' && '.join(' '.join(c[:2]) for c in old_commands)} → "
                   f"{' && '.join(' '.join(c[:2]) for c in new_commands)}"]
    else:
        changes = [change for old, new in zip(old_commands, new_commands) for change in _option_changes(old, new)]
    if len(changes) > limit:
        changes = changes[:limit] + [f"and {len(changes) - limit} more"]
    return changes


def _option_changes(running: list[str], expected: list[str]) -> list[str]:
    """One command's changes: its positional words, then each option whose value differs."""

    def options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
        positional, opts, i = [], {}, 0
        while i < len(argv):
            arg = argv[i]
            if arg.startswith("--") and "=" in arg:
                key, _, value = arg.partition("=")
                opts[key] = value
            elif arg.startswith("-") and len(arg) > 1:
                takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                opts[arg] = argv[i + 1] if takes_value else "(set)"
                i += takes_value
            else:
                positional.append(arg)
            i += 1
        return positional, opts

    old_pos, old = options(running)
    new_pos, new = options(expected)
    changes = []
    if old_pos != new_pos:
        changes.append(f"command {' '.join(old_pos)} → {' '.join(new_pos)}")
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            if is_secret_name(key):  # an API key or token: say that it changed, never what it is
                changes.append(f"{key} {MASK if key in old else 'absent'} → {MASK if key in new else 'absent'} "
                               "(a secret: values withheld)")
            else:
                changes.append(f"{key} {old.get(key, 'absent')} → {new.get(key, 'absent')}")
    return changes


def env_changes(running: dict[str, str], expected: dict[str, str], skip: set[str] = frozenset()) -> list[str]:
    """Names of the expected variables whose running value differs (values withheld)."""
    return sorted(name for name, value in expected.items() if name not in skip and running.get(name) != value)


DOCKER_DEFAULT_SHM = 64 * 1024 * 1024
_UNITS = {"b": 1, "k": 1024, "m": 1024 ** 2, "g": 1024 ** 3}


def docker_bytes(value: str) -> int:
    """``112g`` -> bytes, as docker reads --memory and --shm-size (binary units)."""
    value = value.strip().lower()
    unit = value[-1] if value and value[-1] in _UNITS else "b"
    return int(value.rstrip("bkmg")) * _UNITS[unit]


def human_bytes(n: int) -> str:
    for unit in ("g", "m", "k"):
        if n and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


# The docker run options of commands/docker.py, and which of them drift compares. A new option
# there must be listed here (tests/test_drift.py fails otherwise).
COMPARED_OPTIONS = {"--restart", "--network", "--ipc", "--gpus", "--memory", "--shm-size", "--ulimit", "--cap-add", "--device", "-v"}
NOT_COMPARED_OPTIONS = {"-d", "--name", "--env-file", "--label"}  # identity and bookkeeping, or compared as env


def settings_from_run_argv(argv: list[str]) -> dict[str, str]:
    """The container settings a ``docker run`` argv of ours asks for, as comparable text (our
    argv comes from commands/docker.py: ``--opt value`` pairs, the image after the last one)."""
    out: dict[str, str] = {"--restart": "no", "--network": "default", "--ipc": "private", "--gpus": "none", "--memory": "none",
                           "--shm-size": human_bytes(DOCKER_DEFAULT_SHM), "--cap-add": "", "--device": "", "-v": ""}
    caps, volumes, devices = [], [], []
    i = 2 if argv[:2] == ["docker", "run"] else 0
    while i < len(argv) - 1 and argv[i].startswith("-"):
        option, value = argv[i], argv[i + 1]
        if option == "-d":
            i += 1
            continue
        if option in ("--restart", "--network", "--ipc"):
            out[option] = value
        elif option == "--gpus":
            out[option] = "requested"
        elif option in ("--memory", "--shm-size"):
            out[option] = human_bytes(docker_bytes(value))
        elif option == "--ulimit":
            name, _, limits = value.partition("=")
            out[f"--ulimit {name}"] = limits
        elif option == "--cap-add":
            caps.append(value)
        elif option == "-v":
            volumes.append(value)
        elif option == "--device":
            devices.append(value.split(":")[0])
        i += 2
    out["--cap-add"], out["-v"] = ",".join(sorted(caps)), ",".join(sorted(volumes))
    out["--device"] = ",".join(sorted(devices))
    return out


def settings_from_host_config(config: dict) -> dict[str, str]:
    """The same settings of a running container, from ``docker inspect``'s HostConfig."""
    out = {
        "--restart": (config.get("RestartPolicy") or {}).get("Name") or "no",
        "--network": config.get("NetworkMode") or "default",
        "--ipc": config.get("IpcMode") or "private",
        "--gpus": "requested" if config.get("DeviceRequests") else "none",
        "--memory": human_bytes(config["Memory"]) if config.get("Memory") else "none",
        "--shm-size": human_bytes(config.get("ShmSize") or DOCKER_DEFAULT_SHM),
        "--cap-add": ",".join(sorted(config.get("CapAdd") or [])),
        "--device": ",".join(sorted(d.get("PathOnHost", "") for d in config.get("Devices") or [])),
        "-v": ",".join(sorted(config.get("Binds") or [])),
    }
    for limit in config.get("Ulimits") or []:
        out[f"--ulimit {limit.get('Name')}"] = f"{limit.get('Soft')}:{limit.get('Hard')}"
    return out


def settings_changes(running: dict[str, str], expected: dict[str, str]) -> list[str]:
    return [f"{key} {running.get(key, 'absent') or 'none'} → {expected.get(key, 'absent') or 'none'}"
            for key in sorted(set(running) | set(expected)) if running.get(key) != expected.get(key)]


def config_drift(host: str, cmd: list[str], env: dict[str, str], expected_argv: list[str],
                 expected_env: dict[str, str], env_skip: set[str],
                 host_config: dict | None = None, expected_run_argv: list[str] | None = None) -> list[str]:
    notices = []
    changed = argv_changes(cmd, expected_argv)
    if changed:
        notices.append(f"{host}: the engine runs with other arguments than the profile renders now: {'; '.join(changed)}")
    names = env_changes(env, expected_env, env_skip)
    if names:
        notices.append(f"{host}: environment differs from the profile for {', '.join(names)}")
    if host_config is not None and expected_run_argv is not None:
        container = settings_changes(settings_from_host_config(host_config), settings_from_run_argv(expected_run_argv))
        if container:
            notices.append(f"{host}: the container runs with other docker options than the profile renders now: "
                           f"{'; '.join(container)}")
    return notices


NOT_RECORDED = "=(not recorded)"


def replayable_overrides(recorded: list[str], env_given: frozenset) -> tuple[list[str], frozenset]:
    """The serve's --set that can be applied again, and the variables whose serve-time values were not
    recorded (``--env``, ``--set env.X``: often tokens) and are not given again now."""
    unknown = set()
    for override in recorded:
        if override.endswith(NOT_RECORDED):
            key = override[: -len(NOT_RECORDED)]
            unknown.add(key[4:] if key.startswith(("env ", "env.")) else key)
    replay = [o for o in recorded if not o.startswith("env ") and not o.endswith((NOT_RECORDED, f"={MASK}"))]
    return replay, frozenset(unknown) - env_given
