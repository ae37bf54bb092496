"""top: the rendered view of a snapshot, and one refresh against the sandbox's hosts over real SSH."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from sandbox_fixture import sandbox_cluster  # noqa: F401  (the session's cluster)
from sparkctl.commands.host_probe import HostSample
from sparkctl.ops import top as T


def snapshot() -> T.Snapshot:
    sample = HostSample(gpu_name="NVIDIA GB10", gpu_util_pct=93, gpu_temp_c=61, gpu_power_w=38.5,
                        gpu_memory_used_bytes=101_000_000_000, gpu_memory_total_bytes=128_000_000_000,
                        gpu_memory_unified=True, cpu_busy_pct=12.5, ram_used_bytes=101_000_000_000,
                        ram_total_bytes=128_000_000_000, load1=2.5, nvme_devices=("nvme0n1",),
                        nvme_read_bytes_per_s=2_400_000_000, nvme_write_bytes_per_s=0)
    snap = T.Snapshot("tp4", "http://spark-1:8000", "2026-11-30T00:00:00Z",
                      [T.HostView("spark-1", "10.0.0.1", sample), T.HostView("spark-2", "10.0.0.2", None, "spark-2: timed out")])
    snap.engine_kind = "vllm"
    snap.engine = {"vllm:num_requests_running": 3.0, "vllm:num_requests_waiting": 1.0, "vllm:kv_cache_usage_perc": 0.42,
                   "vllm:num_preemptions_total": 2.0, "prompt_tokens_per_s": 1234.5, "generation_tokens_per_s": 61.25,
                   "prefix_cache_hit_rate": 0.25, "spec_accept_length": 2.2}
    return snap


def test_the_view_shows_hosts_and_the_engine_by_metric_name():
    text = T.human(snapshot())
    row = next(line for line in text.splitlines() if "spark-1" in line)
    for cell in ("93", "101.0/128.0 (unified)", "61", "38.5", "12.5", "2.50", "2400.0", "0.0"):
        assert cell in row, (cell, row)
    assert "spark-2: timed out" in text
    rows = {label: (metric, value) for label, metric, value in T.engine_rows(snapshot())}
    assert rows["requests running"] == ("vllm:num_requests_running", "3")
    assert rows["KV cache usage"] == ("vllm:kv_cache_usage_perc", "42.0 %")
    assert rows["preemptions (since start)"] == ("vllm:num_preemptions_total", "2")
    assert rows["generation tokens/s"] == ("vllm:generation_tokens_total", "61.2")
    assert rows["prefix-cache hit rate"][1] == "25.0 %" and rows["spec-decode mean accepted length"][1] == "2.20"
    doc = snapshot().to_json()
    assert not doc["ok"] and doc["hosts"][0]["gpu_util_pct"] == 93 and doc["hosts"][1]["error"] == "spark-2: timed out"
    assert doc["engine"]["vllm:kv_cache_usage_perc"] == 0.42


def test_an_unreachable_engine_is_said_in_the_view():
    snap = T.Snapshot(None, "http://h:1", "now", engine_error="http://h:1/metrics: ConnectError: refused")
    assert "ConnectError: refused" in T.human(snap)


@pytest.mark.sandbox
def test_one_ssh_command_per_host_per_refresh(sandbox_cluster):  # noqa: F811
    from sparkctl.config.inventory import load_inventory
    from sparkctl.remote.pool import ConnectionPool

    inventory = load_inventory(Path(sandbox_cluster.info.inventory))
    calls: list[tuple[str, list[str]]] = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed_port = s.getsockname()[1]
    with ConnectionPool(connect_timeout=20) as pool:
        real_get = pool.get

        def counted_get(target):
            connection = real_get(target)
            if not getattr(connection, "_counted", False):
                real_run = connection.run

                def run(argv, **kwargs):
                    calls.append((target.name, list(argv)))
                    return real_run(argv, **kwargs)

                connection.run, connection._counted = run, True
            return connection

        pool.get = counted_get
        first = T.take_snapshot(inventory, inventory.hosts, f"http://127.0.0.1:{closed_port}", pool=pool)
        second = T.take_snapshot(inventory, inventory.hosts, None, pool=pool)
    names = [h.name for h in inventory.hosts]
    errors = [view.error for snap in (first, second) for view in snap.hosts if view.error]
    assert sorted(name for name, _ in calls) == sorted(names * 2), errors  # two refreshes, one command per host each
    for snap in (first, second):
        for view in snap.hosts:
            s = view.sample
            assert view.error is None and s is not None, view
            assert s.gpu_name == "NVIDIA GB10" and s.gpu_memory_unified and s.ram_total_bytes > 0
            assert s.cpu_busy_pct is not None
    assert first.engine_error.startswith(f"http://127.0.0.1:{closed_port}/metrics: Connection") and not first.ok


def test_the_view_names_figures_for_people_and_json_keeps_the_raw_names():
    text = T.human(snapshot())
    assert "KV cache usage" in text and "vllm:" not in text  # no Prometheus names in the view
    doc = snapshot().to_json()
    by_label = {m["label"]: m for m in doc["engine_metrics"]}
    assert by_label["KV cache usage"]["metric"] == "vllm:kv_cache_usage_perc"


def test_q_quits_the_live_view():
    """A real pseudo-terminal: `q` typed while the view waits ends it before the next refresh."""
    import io
    import os
    import pty
    import threading

    from rich.console import Console

    main_fd, child_fd = pty.openpty()
    taken = []

    def take(first=False, show=None):
        taken.append(first)
        return snapshot()

    threading.Timer(0.5, lambda: os.write(main_fd, b"q")).start()
    with os.fdopen(child_fd, "r", closefd=False) as keys:
        # Without `q` the view would refresh a second time after 5 s (stop_after=2 ends it then).
        count = T.watch(take, interval_s=5, console=Console(file=io.StringIO()), keys=keys, stop_after=2)
    assert count == 1 and taken == [True]  # quit before the 2nd refresh; the 1st frame is the short-window one
    os.close(main_fd)
    os.close(child_fd)


def test_the_first_frame_is_drawn_before_any_host_is_asked():
    """The live view draws what is known (host names, what it waits for) before `take` runs, and
    `take` may draw the hosts it found before their first sample."""
    import io

    from rich.console import Console

    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=True, color_system=None)  # a terminal: Live draws each frame
    hosts = [T.HostView("spark-1", "10.0.0.1"), T.HostView("spark-2", "10.0.0.2")]
    waiting = T.Snapshot.waiting_for("tp4", None, hosts, hosts_wait="connecting…", engine_wait="finding the deployment…")
    seen_by_take = []

    def take(first=False, show=None):
        seen_by_take.append(buffer.getvalue())
        show(T.Snapshot.waiting_for("tp4", "http://spark-1:8000", hosts[:1], hosts_wait="sampling…",
                                    engine_wait="first sample…"))
        seen_by_take.append(buffer.getvalue())
        return snapshot()

    assert T.watch(take, interval_s=0, console=console, waiting=waiting, stop_after=1, keys=io.StringIO()) == 1
    before, found = seen_by_take
    assert "spark-2" in before and "connecting…" in before and "finding the deployment…" in before
    assert "sampling…" in found and "http://spark-1:8000" in found
    assert "101.0/128.0 (unified)" in buffer.getvalue()  # then the sample
    assert "no answer" not in before  # a host not asked yet is not a host that failed


def test_a_first_refresh_that_fails_erases_the_first_frame_and_raises():
    """The profile is read by the first refresh, after the first frame: a bad one leaves its error
    line alone, not a frame of hosts still "connecting…" above it."""
    import io

    from rich.console import Console

    from sparkctl.errors import ConfigError

    buffer = io.StringIO()
    console = Console(file=buffer, width=160, force_terminal=True, color_system=None)
    waiting = T.Snapshot.waiting_for("tp4", None, [T.HostView("spark-1", "10.0.0.1")], hosts_wait="connecting…",
                                     engine_wait="finding the deployment…")

    def take(first=False, show=None):
        raise ConfigError("bogus: unknown field", field="--set")

    with pytest.raises(ConfigError):
        T.watch(take, interval_s=0, console=console, waiting=waiting, stop_after=1, keys=io.StringIO())
    drawn = buffer.getvalue()
    last_frame = drawn[drawn.rindex("hosts  "):drawn.rindex("q quits")]
    assert "spark-1" in last_frame and "connecting…" in last_frame  # drawn first
    after = drawn[drawn.rindex("q quits"):]
    assert after.count("\x1b[1A\x1b[2K") == last_frame.count("\n") + 1  # then every line of it erased
