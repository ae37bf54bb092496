"""``sparkctl logs``: the engine containers' ``docker logs``, host by host or followed together."""

from __future__ import annotations

import threading
from typing import Callable

from sparkctl.commands.serve import logs_argv
from sparkctl.ops.status import HostState
from sparkctl.ops.steps import STEP_TIMEOUT_S, check_result
from sparkctl.remote.pool import fan_out


def collect_logs(inventory, states: list[HostState], *, pool, tail: int | None, max_workers: int = 16) -> dict[str, str]:
    """``docker logs`` of each state's container (host name -> text)."""
    by_name = {h.name: h for h in inventory.hosts}
    chosen = [s for s in states if s.container is not None]
    containers = {s.name: s.container.name for s in chosen}

    def read(conn):
        result = conn.run(logs_argv(containers[conn.target.name], tail), timeout=STEP_TIMEOUT_S * 2)
        check_result(result, "read the container's logs")
        return result.stdout

    results = fan_out([inventory.ssh_target(by_name[s.name]) for s in chosen], read, pool=pool, max_workers=max_workers)
    return {r.name: (r.value if r.ok else f"(error: {r.error})") for r in results}


def follow_logs(inventory, states: list[HostState], *, pool, tail: int | None, write: Callable[[str], None]) -> None:
    """``docker logs --follow`` on every chosen host at once, each line prefixed with the host name."""
    by_name = {h.name: h for h in inventory.hosts}
    chosen = [s for s in states if s.container is not None]
    width = max((len(s.name) for s in chosen), default=0)
    lock = threading.Lock()

    def one(state: HostState) -> None:
        buffer = b""

        def sink(data: bytes) -> None:
            nonlocal buffer
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            with lock:
                for line in lines:
                    write(f"{state.name:<{width}} | {line.decode('utf-8', 'replace')}")

        conn = pool.get(inventory.ssh_target(by_name[state.name]))
        try:
            conn.run_stream_out(logs_argv(state.container.name, tail, follow=True), sink)
        except Exception as err:  # the host went away: say so and let the others go on
            with lock:
                write(f"{state.name:<{width}} | (log stream ended: {err})")

    threads = [threading.Thread(target=one, args=(s,), daemon=True) for s in chosen]
    for thread in threads:
        thread.start()
    for thread in threads:
        while thread.is_alive():
            thread.join(0.5)
