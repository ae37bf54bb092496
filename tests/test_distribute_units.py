"""Distribution, the pure and in-process parts: docker-save stream parsing and thin copies, the
one-reader/many-writers fan-out (slow and failing receivers), host facts and plans, ssh argv, routes."""

from __future__ import annotations

import hashlib
import io
import json
import socket
import tarfile
import threading
import time

import pytest

from sparkctl.commands.docker import IMAGE_STORE_FORMAT
from sparkctl.images import archive as A
from sparkctl.images.fanout import ByteQueue, SendResult, Sink, StreamAborted, stream_to_all
from sparkctl.images.inputs import chain_ids
from sparkctl.ops import distribute as D
from sparkctl.remote.target import SSHTarget
from sparkctl.remote.jsonlines import JsonLines

# A real `docker save` (Docker 20.10, legacy layout) of a 2-layer image: each layer's v1 json.
LEGACY_DIFF_IDS = ['sha256:54994741f460dde60d8b6a09d79279dc9e6b5e40bdc4581a69861f6aca3be10c', 'sha256:da94780f7f6a3e3eb71d69016e28cab3c4b65f4a7609056a294a1cd4f86bd918']
LEGACY_LOWER_JSON = '{"id":"48606fef9ebad99008cd35859b356603484b0e3d33248ca5befee5a02249f4f3","created":"1970-01-01T00:00:00Z","container_config":{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":null,"Cmd":null,"Image":"","Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":null},"os":"linux"}'
LEGACY_TOP_JSON = '{"id":"2aa3604f8cce075d4b7adb57be0eb928f7955554a28ef1d09314ffa9a1cd870d","parent":"48606fef9ebad99008cd35859b356603484b0e3d33248ca5befee5a02249f4f3","created":"2026-11-30T12:02:14.719565248Z","container":"d429114d013d0423795ebd1dae2e8e3a8c2cf73204b352dd9f43927320cd65b6","container_config":{"Hostname":"d429114d013d","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":["/bin/sh","-c","#(nop) ","ENTRYPOINT []"],"Image":"sha256:fecfa1782b0b8567cc4d863d67cc56fa40f3dd4b786a77290ce2f6f5989139a4","Volumes":null,"WorkingDir":"","Entrypoint":["/bin/sh","-c","echo stock vllm entrypoint"],"OnBuild":null,"Labels":{"org.sparkctl.chain":"sandbox","org.sparkctl.content":"ba57693e57ae0c343767e3927f50d8fbe9633c073b8d32a4dc9991e7566a5d95","org.sparkctl.inputs":"ba57693e57ae0c343767e3927f50d8fbe9633c073b8d32a4dc9991e7566a5d95","org.sparkctl.layer":"base"}},"docker_version":"20.10.24+dfsg1","config":{"Hostname":"","Domainname":"","User":"","AttachStdin":false,"AttachStdout":false,"AttachStderr":false,"Tty":false,"OpenStdin":false,"StdinOnce":false,"Env":["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],"Cmd":null,"Image":"sha256:fecfa1782b0b8567cc4d863d67cc56fa40f3dd4b786a77290ce2f6f5989139a4","Volumes":null,"WorkingDir":"","Entrypoint":null,"OnBuild":null,"Labels":{"org.sparkctl.chain":"sandbox","org.sparkctl.content":"ba57693e57ae0c343767e3927f50d8fbe9633c073b8d32a4dc9991e7566a5d95","org.sparkctl.inputs":"ba57693e57ae0c343767e3927f50d8fbe9633c073b8d32a4dc9991e7566a5d95","org.sparkctl.layer":"base"}},"architecture":"amd64","os":"linux"}'


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _oci_like_archive(layer_blobs: list[bytes], fmt=tarfile.PAX_FORMAT, long_names: bool = True) -> tuple[bytes, list[str]]:
    """A save-like tar: a long-named file (pax / GNU long-name headers), the layer blobs under
    blobs/sha256/<diff id>, and a manifest. Returns (bytes, diff IDs)."""
    buffer = io.BytesIO()
    diffs = [_digest(b) for b in layer_blobs]
    with tarfile.open(fileobj=buffer, mode="w", format=fmt) as tar:
        def add(name: str, data: bytes) -> None:
            info = tarfile.TarInfo(name)
            info.size, info.mtime = len(data), 1
            tar.addfile(info, io.BytesIO(data))

        if long_names:
            add("x" * 150 + "/long-name-before-the-layers.txt", b"keep me")
        for blob, diff in zip(layer_blobs, diffs):
            add(f"blobs/sha256/{diff.split(':')[1]}", blob)
        add("manifest.json", json.dumps([{"Layers": [f"blobs/sha256/{d.split(':')[1]}" for d in diffs]}]).encode())
    return buffer.getvalue(), diffs


def _feed(parser: A.SaveStreamParser, data: bytes, sizes) -> list[A.Segment]:
    out, pos, index = [], 0, 0
    while pos < len(data):
        size = sizes[index % len(sizes)]
        out += parser.feed(data[pos:pos + size])
        pos += size
        index += 1
    return out


# --- the docker save stream ---------------------------------------------------------------------


@pytest.mark.parametrize("fmt", [tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])
@pytest.mark.parametrize("sizes", [[1], [511, 513, 7], [1 << 20]])
def test_parser_returns_the_same_bytes_and_tags_layer_blobs(fmt, sizes):
    blobs = [b"a" * 3000, b"b" * 10, b"c" * 70000]
    data, diffs = _oci_like_archive(blobs, fmt)
    parser = A.SaveStreamParser(diffs)
    segments = _feed(parser, data, sizes if sizes != [1] else [1] * 1)  # byte-by-byte too
    assert b"".join(s.data for s in segments) == data
    assert parser.ended
    tagged = [(name, layers) for name, layers in parser.members if layers]
    chains = chain_ids(diffs)
    assert tagged == [(f"blobs/sha256/{d.split(':')[1]}", frozenset([c])) for d, c in zip(diffs, chains)]
    assert parser.members[0][0].endswith("/long-name-before-the-layers.txt")


def test_thin_copy_leaves_out_exactly_the_layers_present_and_stays_a_valid_tar():
    blobs = [b"base" * 5000, b"overlay" * 3000, b"patch" * 10]
    data, diffs = _oci_like_archive(blobs)
    chains = chain_ids(diffs)
    segments = _feed(A.SaveStreamParser(diffs), data, [4096])
    thin = b"".join(A.thin_copy(segments, set(chains[:2])))
    with tarfile.open(fileobj=io.BytesIO(thin)) as tar:
        names = tar.getnames()
        assert tar.extractfile(f"blobs/sha256/{diffs[2].split(':')[1]}").read() == blobs[2]
    assert f"blobs/sha256/{diffs[0].split(':')[1]}" not in names and "manifest.json" in names
    assert len(thin) < len(data) - len(blobs[0]) - len(blobs[1]) + 2048
    # A layer counts as present only with its whole chain: the same blob above another base is sent.
    assert b"".join(A.thin_copy(segments, {chains[1]})) != thin


def test_a_blob_at_two_chain_positions_is_dropped_only_when_both_are_present():
    same = b"same bytes" * 100
    data, diffs = _oci_like_archive([same, b"middle" * 50, same], long_names=False)
    chains = chain_ids(diffs)
    segments = _feed(A.SaveStreamParser(diffs), data, [1000])
    blob = f"blobs/sha256/{diffs[0].split(':')[1]}"

    def names(present):
        with tarfile.open(fileobj=io.BytesIO(b"".join(A.thin_copy(segments, present)))) as tar:
            return tar.getnames()

    assert names({chains[0]}).count(blob) == 2
    assert blob not in names({chains[0], chains[2]})


def test_legacy_layer_folders_are_identified_by_recomputing_their_v1_ids():
    chains = chain_ids(LEGACY_DIFF_IDS)
    lower_id = json.loads(LEGACY_LOWER_JSON)["id"]
    top_id = json.loads(LEGACY_TOP_JSON)["id"]
    assert A.legacy_v1_chain(LEGACY_LOWER_JSON.encode(), chains) == chains[0]
    assert A.legacy_v1_chain(LEGACY_TOP_JSON.encode(), chains) == chains[1]
    # One changed byte, or the wrong candidates: no match (the layer would simply be sent).
    assert A.legacy_v1_chain(LEGACY_TOP_JSON.replace("amd64", "arm64").encode(), chains) is None
    assert A.legacy_v1_chain(LEGACY_LOWER_JSON.encode(), chains[1:]) is None
    # In a stream: <v1id>/json precedes <v1id>/layer.tar, so the layer tar is tagged at its header.
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for folder, text in sorted([(lower_id, LEGACY_LOWER_JSON), (top_id, LEGACY_TOP_JSON)]):
            for name, payload in (("VERSION", b"1.0"), ("json", text.encode()), ("layer.tar", b"L" * 2048)):
                info = tarfile.TarInfo(f"{folder}/{name}")
                info.size = len(payload)
                tar.addfile(info, io.BytesIO(payload))
    parser = A.SaveStreamParser(LEGACY_DIFF_IDS)
    _feed(parser, buffer.getvalue(), [700])
    assert dict(parser.members)[f"{lower_id}/layer.tar"] == frozenset([chains[0]])
    assert dict(parser.members)[f"{top_id}/layer.tar"] == frozenset([chains[1]])
    assert parser.identified == {lower_id: chains[0], top_id: chains[1]}


def test_base256_sizes_and_pax_records():
    field = bytes([0x80]) + (9 * 1024 ** 3).to_bytes(11, "big")
    assert A._octal(field) == 9 * 1024 ** 3
    assert A._octal(b"0000644\0") == 0o644
    assert A._pax_records(b"30 path=blobs/sha256/abcdefgh\n") == {"path": "blobs/sha256/abcdefgh"}


# --- one reader, many writers -------------------------------------------------------------------


class CountingSource:
    def __init__(self, data: bytes, chunk: int = 64 * 1024, fail_after: int | None = None):
        self.data, self.chunk, self.fail_after = data, chunk, fail_after
        self.reads = 0
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        for offset in range(0, len(self.data), self.chunk):
            if self.fail_after is not None and self.reads >= self.fail_after:
                raise OSError("docker save died")
            self.reads += 1
            yield self.data[offset:offset + self.chunk]


def _receiver(received: dict, delay: float = 0.0, fail_after: int | None = None):
    def send(sink: Sink) -> SendResult:
        buffer = bytearray()
        received.setdefault("cut", [])
        try:
            for index, chunk in enumerate(sink.chunks()):
                if fail_after is not None and index >= fail_after:
                    return SendResult(False, "connection closed by peer", "closed")
                if delay:
                    time.sleep(delay)
                buffer += chunk
        except StreamAborted:
            received["cut"].append(sink.name)
            raise
        received[sink.name] = bytes(buffer)
        return SendResult(True)
    return send


def _archive(mb: int = 4) -> tuple[bytes, list[str]]:
    return _oci_like_archive([bytes(range(256)) * (4096 * mb), b"top" * 1000])


def test_every_receiver_gets_the_stream_from_one_read():
    data, diffs = _archive()
    source = CountingSource(data)
    received: dict = {}
    sinks = [Sink(f"h{i}", queue_bytes=256 * 1024) for i in range(4)]
    result = stream_to_all(source, diffs, sinks, _receiver(received))
    assert source.passes == 1 and result.source_bytes == len(data)
    assert {s.state for s in sinks} == {"done"} and received == {"cut": [], **{f"h{i}": data for i in range(4)}}


def test_a_slow_receiver_is_detached_and_the_others_are_untouched():
    data, diffs = _archive(8)
    source = CountingSource(data)
    received: dict = {}
    aborted = threading.Event()
    slow = Sink("slow", queue_bytes=128 * 1024)
    slow.on_abort(aborted.set)
    fast = [Sink(f"fast{i}", queue_bytes=128 * 1024) for i in range(3)]
    send_fast, send_slow = _receiver(received), _receiver(received, delay=0.5)
    started = time.monotonic()
    result = stream_to_all(source, diffs, fast + [slow], lambda s: (send_slow if s.name == "slow" else send_fast)(s),
                           stall_timeout=0.3)
    assert source.passes == 1
    assert slow.state == "lagged" and slow.cause == "lagged" and "fell behind" in slow.error and aborted.is_set()
    assert "slow" not in received and received["cut"] == ["slow"]  # its sender saw the cut, not an end
    assert all(received[s.name] == data for s in fast) and {s.state for s in fast} == {"done"}
    # Kept in step with the slow receiver the round would last 0.5 s a chunk (64 s for 128 chunks);
    # detached after its 0.3 s stall it ends in about a second.
    paced_by_the_slow_one = 0.5 * len(data) / source.chunk
    assert result.seconds < paced_by_the_slow_one / 10 and time.monotonic() - started < paced_by_the_slow_one / 10


def test_a_receiver_that_keeps_the_reader_waiting_too_often_is_detached():
    data, diffs = _archive(8)
    received: dict = {}
    slow = Sink("slow", queue_bytes=64 * 1024)
    # The fast receiver's queue holds the whole archive, so it can never keep the reader waiting: on
    # a loaded machine a 64 KiB queue let a starved fast thread be counted as lagging too.
    sinks = [Sink("fast", queue_bytes=2 * len(data)), slow]
    stream_to_all(CountingSource(data, chunk=16 * 1024), diffs, sinks,
                  lambda s: _receiver(received, delay=0.02 if s.name == "slow" else 0)(s),
                  stall_timeout=30, lag_fraction=0.3, lag_grace=0.5)
    assert slow.state == "lagged" and received["fast"] == data


def test_a_failing_receiver_fails_alone():
    data, diffs = _archive()
    received: dict = {}
    sinks = [Sink("ok1"), Sink("broken", queue_bytes=64 * 1024), Sink("ok2")]
    stream_to_all(CountingSource(data), diffs, sinks,
                  lambda s: _receiver(received, fail_after=3 if s.name == "broken" else None)(s))
    states = {s.name: (s.state, s.cause) for s in sinks}
    assert states == {"ok1": ("done", None), "broken": ("failed", "closed"), "ok2": ("done", None)}
    assert received["ok1"] == received["ok2"] == data


def test_thin_receivers_get_their_own_cut_of_the_one_stream():
    data, diffs = _archive()
    chains = chain_ids(diffs)
    received: dict = {}
    sinks = [Sink("empty"), Sink("has-base", frozenset(chains[:1]))]
    stream_to_all(CountingSource(data), diffs, sinks, _receiver(received))
    assert received["empty"] == data
    expected = b"".join(A.thin_copy(A.SaveStreamParser(diffs).feed(data), set(chains[:1])))
    assert received["has-base"] == expected and len(expected) < len(data) // 2
    assert sinks[1].bytes_skipped == len(data) - len(expected)


@pytest.mark.parametrize("source, message", [
    (lambda data: CountingSource(data, fail_after=5), "reading the image failed: docker save died"),
    (lambda data: CountingSource(data[: len(data) // 2]), "ended before the end of the archive"),
])
def test_a_broken_source_fails_every_receiver(source, message):
    data, diffs = _archive()
    sinks = [Sink("a"), Sink("b")]
    result = stream_to_all(source(data), diffs, sinks, _receiver({}))
    assert message in result.source_error
    assert [(s.state, s.cause) for s in sinks] == [("failed", "source")] * 2


def test_byte_queue_bounds_and_abort():
    q = ByteQueue(10)
    assert q.put(b"x" * 8, 0.1) and not q.put(b"y" * 8, 0.1)  # full: times out
    assert q.get() == b"x" * 8 and q.put(b"y" * 8, 0.1)
    assert q.put(b"z" * 50, 0.1) is False  # bigger than the bound: waits for the queue to drain
    q.abort()
    assert q.get() is None and q.put(b"a", 0.1) is False


# --- facts and plans ----------------------------------------------------------------------------


def _facts(images=(), containerd=False) -> D.ImageStore:
    return D.ImageStore("h", "overlay2", containerd, "20.10.24", [D.ImageEntry(*i) for i in images])


SOURCE = D.SourceImage("img:latest", "sha256:new", ("sha256:l1", "sha256:l2", "sha256:l3"), ("reg/img@sha256:d1",))


def test_plans():
    chains = chain_ids(list(SOURCE.layers))
    plan = D.plan_host(SOURCE, _facts([("sha256:new", ("img:latest",), (), SOURCE.layers)]))
    assert (plan.action, plan.mode, plan.retag) == ("skip", "none", None)
    plan = D.plan_host(SOURCE, _facts([("sha256:new", (), (), SOURCE.layers), ("sha256:old", ("img:latest",), (), ())]))
    assert (plan.action, plan.retag) == ("skip", "sha256:new")
    plan = D.plan_host(SOURCE, _facts([("sha256:pulled", ("other:tag",), ("reg/img@sha256:d1",), ("sha256:x",))]))
    assert (plan.action, plan.retag, plan.reason) == ("skip", "sha256:pulled", "has the image by a shared RepoDigest")
    older = ("sha256:old", ("img:latest",), (), ("sha256:l1", "sha256:l2", "sha256:old3"))
    plan = D.plan_host(SOURCE, _facts([older]))
    assert (plan.action, plan.mode, plan.present, plan.layers_present) == ("send", "thin", frozenset(chains[:2]), 2)
    assert D.plan_host(SOURCE, _facts([older]), thin=False).mode == "full"
    assert D.plan_host(SOURCE, _facts([older], containerd=True)).mode == "full"
    # Same diff IDs on another base are other chains: nothing in common.
    assert D.plan_host(SOURCE, _facts([("sha256:o", (), (), ("sha256:other", "sha256:l2"))])).mode == "full"
    assert D.plan_host(SOURCE, _facts()).mode == "full"


def test_facts_are_parsed_from_the_one_round_trip(tmp_path):
    from pathlib import Path

    info = (Path(__file__).parent / "data" / "captured" / "docker-info-20.10-debian12.json").read_text()
    lines = [json.dumps({"id": "sha256:a", "tags": ["img:latest"], "digests": None, "layers": ["sha256:l1"]}),
             json.dumps({"id": "sha256:b", "tags": None, "digests": [], "layers": ["sha256:l1", "sha256:l2"]})]
    facts = D.parse_facts("h", info + "\n" + D.IMAGES_MARK + "\n" + "\n".join(lines) + "\n")
    assert (facts.driver, facts.containerd_store) == ("overlay2", False)
    assert facts.tagged("img:latest").id == "sha256:a" and facts.chain_ids() == set(chain_ids(["sha256:l1", "sha256:l2"]))
    assert D.is_containerd_store({"Driver": "overlayfs", "DriverStatus": [["driver-type", "io.containerd.snapshotter.v1"]]})
    assert not D.is_containerd_store(json.loads(info))
    assert D.image_store_argv()[:2] == ["sh", "-c"] and D.image_store_argv()[-1] == IMAGE_STORE_FORMAT


# --- routes and the OpenSSH command -------------------------------------------------------------


TARGET = SSHTarget(name="spark-2", address="10.0.0.12", port=22, user="root", identity_file="/keys/id",
                   known_hosts="/inv/known_hosts")


def test_client_argv_is_exact(monkeypatch):
    monkeypatch.setenv("HOME", "/home/u")
    route = D.Route("spark-2", TARGET, "10.0.0.12")
    assert D.client_argv(route, ["docker", "load"]) == [
        "ssh", "-T", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes", "-o", "ConnectTimeout=10",
        "-o", "ServerAliveInterval=5", "-o", "ServerAliveCountMax=3", "-o", "Compression=no", "-o", "LogLevel=ERROR",
        "-o", "ClearAllForwardings=yes", "-c", "aes128-gcm@openssh.com,aes256-gcm@openssh.com,chacha20-poly1305@openssh.com,aes128-ctr",
        "-o", "UserKnownHostsFile=/inv/known_hosts /home/u/.ssh/known_hosts",
        "-p", "22", "-l", "root", "-i", "/keys/id", "-o", "IdentitiesOnly=yes", "--", "10.0.0.12", "docker load"]
    fabric = D.Route("spark-2", TARGET, "10.1.0.12", via_fabric=True)
    argv = D.client_argv(fabric, ["docker", "save", "a b:c"])
    assert argv[-2:] == ["10.1.0.12", "docker save 'a b:c'"] and "HostKeyAlias=10.0.0.12" in argv
    other_port = D.Route("x", SSHTarget(name="x", address="10.0.0.5", port=2222), "10.1.0.5", via_fabric=True)
    assert other_port.host_key_alias() == "[10.0.0.5]:2222"


def test_choose_route_prefers_a_reachable_fabric_address():
    seen = []

    def probe(address, port):
        seen.append((address, port))
        return address == "10.1.0.12"

    assert D.choose_route("s", TARGET, ("10.1.0.12",), "openssh", probe).address == "10.1.0.12"
    assert D.choose_route("s", TARGET, ("10.9.0.12",), "openssh", probe).address == "10.0.0.12"
    assert D.choose_route("s", TARGET, ("10.1.0.12",), "paramiko", probe).address == "10.1.0.12"
    assert D.choose_route("s", TARGET, (), "openssh", probe).address == "10.0.0.12"
    assert seen == [("10.1.0.12", 22), ("10.9.0.12", 22), ("10.1.0.12", 22)]


def _server(greeting: bytes | None):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(4)

    def serve():
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:
                return
            if greeting:
                conn.sendall(greeting)
            time.sleep(2)
            conn.close()

    threading.Thread(target=serve, daemon=True).start()
    return sock


def test_reachable_wants_an_ssh_greeting_not_just_a_tcp_accept():
    ssh, silent = _server(b"SSH-2.0-OpenSSH_9.2\r\n"), _server(None)
    try:
        # A greeting is waited for at most its timeout: a generous one here, so a loaded machine that is
        # slow to schedule the greeting thread does not look like a silent server.
        assert D.reachable("127.0.0.1", ssh.getsockname()[1], timeout=10)
        assert not D.reachable("127.0.0.1", silent.getsockname()[1], timeout=0.3)
        closed = socket.socket()
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        closed.close()
        assert not D.reachable("127.0.0.1", port)
    finally:
        ssh.close()
        silent.close()


def test_report_json_has_exactly_the_documented_keys():
    report = D.DistributionReport("img:1", "sha256:x", [D.HostReport("a", "loaded", "thin", 10, 1.23456, None)])
    assert report.to_json() == {"image": "img:1", "image_id": "sha256:x", "hosts": [
        {"name": "a", "status": "loaded", "mode": "thin", "bytes_sent": 10, "seconds": 1.235, "error": None}]}


# ---------------------------------------------------------------------------------------------- --from HOST: the relay


def test_relay_spec_sends_only_verified_keys_and_argv_lists():
    import paramiko

    from sparkctl.config.inventory import HostView

    key = paramiko.RSAKey.generate(1024)  # stands for the key this machine verified on spark-2
    host = HostView(name="spark-2", address="10.0.0.12", role="worker", index=1, ssh_user="root", ssh_port=22,
                    identity_file="/keys/id", proxy_jump=None, nvme_path="/mnt/nvme", fabric_addresses=("10.1.0.12",),
                    fabric_interfaces=(), hcas=())
    source = D.SourceImage("img:1", "sha256:" + "1" * 64, ("sha256:l1", "sha256:l2"))
    plan = D.HostPlan("spark-2", "send", "thin", "", present=frozenset({"sha256:l1"}))
    options = D.DistributeOptions(tag="img:1", bwlimit=50.0)
    spec = D.relay_spec(source, [plan], {"spark-2": host}, {"spark-2": TARGET}, {"spark-2": key}, options)
    assert spec["known_hosts"] == f"spark-2 ssh-rsa {key.get_base64()}\n"
    (target,) = spec["targets"]
    assert target["argv"] == [
        "ssh", "-o", "UserKnownHostsFile={known_hosts}", *D.BULK_SSH_OPTIONS, "-o", "HostKeyAlias=spark-2",
        "-p", "22", "-l", "root", "--", "10.1.0.12", "docker load"]
    assert "-i" not in target["argv"]  # the source host's own key, not a path on this machine
    assert target["present"] == ["sha256:l1"] and target["where"] == "10.1.0.12"
    assert (spec["tag"], spec["diff_ids"], spec["bwlimit"]) == ("img:1", ["sha256:l1", "sha256:l2"], 50.0)
    json.dumps(spec)  # it travels as one argv element


def test_relay_output_is_cut_into_documents_across_reads():
    docs = []
    lines = JsonLines(docs.append)
    payload = b'{"progress": {"a": 1}}\n\n{"done": {}, "source_bytes": 7}\n'
    for i in range(0, len(payload), 5):
        lines(payload[i:i + 5])
    assert docs == [{"progress": {"a": 1}}, {"done": {}, "source_bytes": 7}]


def test_the_relay_zip_needs_only_the_standard_library(tmp_path):
    import subprocess
    import sys

    from sparkctl.images.relay import relay_zip

    program = tmp_path / "relay.pyz"
    program.write_bytes(relay_zip())
    # -I: no site-packages, no user site, no PYTHONPATH: only the zip and the standard library.
    probe = ("import sys; sys.path.insert(0, sys.argv[1]); import sparkctl.images.relay as r; "
             "print(r.__file__.startswith(sys.argv[1]))")
    result = subprocess.run([sys.executable, "-I", "-c", probe, str(program)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr
    # Run as the host runs it: a missing image is a clean exit with docker's message, not a traceback in the middle.
    fake_bin = tmp_path / "bin"
    fake_bin.mkdir()
    (fake_bin / "docker").write_text("#!/bin/sh\necho 'Error: No such image: img:1' >&2\nexit 1\n")
    (fake_bin / "docker").chmod(0o755)
    spec = {"tag": "img:1", "diff_ids": [], "known_hosts": "", "targets": [
        {"name": "x", "argv": ["sh", "-c", "cat >/dev/null"], "where": "x", "present": []}],
        "queue_bytes": 1 << 20, "stall_timeout": 5, "lag_fraction": 0.5, "bwlimit": None}
    run = subprocess.run([sys.executable, "-I", str(program), json.dumps(spec)], capture_output=True, text=True,
                         timeout=60, env={"PATH": f"{fake_bin}:/usr/bin:/bin"})
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout.strip().splitlines()[-1])
    assert done["done"]["x"]["state"] == "failed" and "No such image: img:1" in done["source_error"]
