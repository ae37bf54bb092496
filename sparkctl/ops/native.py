"""The native launcher: the single-box engine as a process on its one host (plan pure, steps over SSH).

``plan_native`` (pure) turns a profile with ``launcher: native`` into the files under
``<state_dir>/<profile>/`` (``engine.env``, ``launch.sh``, ``deployment.json``) and what serve needs
to know (endpoint, port, MIN_FREE_GIB, the checkpoint). ``guard_refusals`` (pure) is the start
guards of the single-box engine's README ("Two ways to run it", Native): the port taken (naming the
process or container), less than MIN_FREE_GIB available (naming who holds the unified pool), and a
checkpoint that is incomplete. The steps (``start_native``, ``wait_native``, ``stop_native``,
``native_state``, ``native_log_tail``) run the argv lists of ``sparkctl.commands.native`` on one
connection; the deploy lock and the audit line are the caller's, as for containers.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Optional

from sparkctl import launchers
from sparkctl.commands import native as N
from sparkctl.commands import probes
from sparkctl.commands.serve import DEPLOYMENT_FILE, url_host, write_file_argv
from sparkctl.errors import ConfigError
from sparkctl.reporter import Reporter

STEP_TIMEOUT_S = 60
LOG_TAIL = 40
GIB = 1 << 30
LOOPBACK = ("127.0.0.1", "localhost", "::1")

@dataclass(frozen=True)
class NativeFile:
    name: str
    content: str
    mode: int


@dataclass
class NativePlan:
    profile: str
    host: str
    address: str
    paths: N.NativePaths
    workdir: str
    command: list[str]
    env: dict[str, str]
    files: list[NativeFile]
    endpoint: str
    served_model_name: str
    port: int
    health_timeout_s: float
    min_free_gib: float
    model_dir: str
    stop_grace_s: int
    memory_back_timeout_s: int
    state_dir: str
    who: str
    when: str
    overrides: list[str] = field(default_factory=list)  # --set/--env as hosts may keep them
    folders: list[str] = field(default_factory=list)  # made as the login user before the start
    notes: list[str] = field(default_factory=list)

    @property
    def what(self) -> str:
        return f"serve {self.profile} on {self.host} (native)"

    def to_json(self) -> dict:
        from sparkctl.secrets import mask_env

        return {
            "profile": self.profile,
            "engine": "single-box",
            "launcher": "native",
            "host": self.host,
            "endpoint": self.endpoint,
            "served_model_name": self.served_model_name,
            "health_timeout_s": self.health_timeout_s,
            "dir": self.paths.directory,
            "workdir": self.workdir,
            "command": self.command,
            "env": mask_env(self.env),
            "files": [{"path": f"{self.paths.directory}/{f.name}", "mode": f"{f.mode:04o}", "bytes": len(f.content.encode())}
                      for f in self.files],
            "folders": self.folders,
            "pidfile": self.paths.pidfile,
            "log": self.paths.log,
            "guards": {"port": self.port, "min_free_gib": self.min_free_gib, "checkpoint": self.model_dir},
            "stop": {"signal": "SIGTERM", "grace_s": self.stop_grace_s, "then": "SIGKILL",
                     "memory_back_timeout_s": self.memory_back_timeout_s},
            "notes": self.notes,
        }


def require_reachable(listen: str, host) -> None:
    """A loopback-only engine (the single-box engine has no authentication: its README keeps the port
    on 127.0.0.1) is reachable by sparkctl only when sparkctl runs on the box itself."""
    if listen in LOOPBACK and host.address not in LOOPBACK:
        raise ConfigError(
            f"the engine would listen on {listen} only, but sparkctl reaches {host.name} at {host.address}; run "
            "sparkctl on the box (inventory address 127.0.0.1) or, behind a firewall, --set serving.host=0.0.0.0",
            field="serving.host")


def plan_native(loaded, inventory, *, wanted_hosts=None, who: str, when: str) -> NativePlan:
    """The native serve of ``loaded`` on its one host (no I/O)."""
    from sparkctl.config.profile import select_hosts

    profile = loaded.profile
    if launchers.of(profile).runs_containers or profile.native is None or profile.single_box is None:
        raise ConfigError("the native launcher serves the single-box engine (engine: single-box, launcher: native)",
                          field="launcher")
    (host,), note = select_hosts(profile, inventory.hosts, wanted_hosts)
    serving = profile.serving
    require_reachable(serving.host, host)
    state_dir = inventory.model.paths.state_dir
    paths = N.NativePaths(f"{state_dir}/{profile.name}")
    env = N.engine_env(profile)
    endpoint = f"http://{url_host(host.address)}:{serving.port}"
    record = {
        "profile": profile.name, "engine": profile.engine, "engine_version": profile.engine_version,
        "launcher": "native", "endpoint": endpoint, "served_model_name": serving.served_model_name,
        "hosts": [host.name], "host": host.name, "rank": 0, "role": "head",
        "workdir": profile.native.workdir, "command": profile.native.command,
        "overrides": loaded.recorded_overrides, "who": who, "when": when,
    }
    files = [
        NativeFile(N.ENV_NAME, N.env_file_text(env, f"the single-box engine's settings for profile {profile.name}"), 0o600),
        NativeFile(N.LAUNCH_NAME, N.launch_script(profile.native.workdir, profile.native.command, paths.env_file), 0o755),
        NativeFile(DEPLOYMENT_FILE, json.dumps(record, indent=2) + "\n", 0o644),
    ]
    return NativePlan(
        profile=profile.name, host=host.name, address=host.address, paths=paths, workdir=profile.native.workdir,
        command=list(profile.native.command), env=env, files=files, endpoint=endpoint,
        served_model_name=serving.served_model_name, port=serving.port,
        health_timeout_s=float(serving.health_timeout_s), min_free_gib=profile.single_box.min_free_gib,
        model_dir=profile.single_box.model_dir, stop_grace_s=profile.native.stop_grace_s,
        memory_back_timeout_s=profile.native.memory_back_timeout_s, state_dir=state_dir, who=who, when=when,
        overrides=loaded.recorded_overrides, notes=[note] if note else [],
        folders=N.engine_folders(profile.native.workdir),
    )


# ------------------------------------------------------------------------------------------ guards


def port_refusal(port: int, room: N.Room) -> Optional[str]:
    if port not in room.listeners:
        return None
    holders = room.listeners[port]
    named = [h.describe() for h in holders if not (h.command == "docker-proxy" and port in room.published)]
    if port in room.published:
        named.insert(0, f"container {room.published[port]} (publishes it)")
    who = ", ".join(named) or "a process sparkctl cannot see (another user's?)"
    return f"port {port} is taken by {who}; stop it or pick another port with --set serving.port=..."


def memory_refusal(min_free_gib: float, room: N.Room) -> Optional[str]:
    if room.mem_available >= min_free_gib * GIB:
        return None
    holding = "; ".join(h.describe() for h in room.top) or "nothing visible"
    return (f"{room.mem_available / GIB:.1f} GiB available, below MIN_FREE_GIB {min_free_gib:g} "
            f"(single_box.min_free_gib); holding the unified memory pool: {holding}")


def checkpoint_refusal(model_dir: str, checkpoint: probes.Checkpoint) -> Optional[str]:
    if not checkpoint.dir_exists:
        return f"checkpoint {model_dir} does not exist (single_box.model_dir)"
    if not checkpoint.config:
        return f"checkpoint {model_dir} is incomplete: no config.json"
    if checkpoint.index is None:
        return f"checkpoint {model_dir} is incomplete: no model.safetensors.index.json"
    if isinstance(checkpoint.index, str):
        return f"checkpoint {model_dir}: model.safetensors.index.json is {checkpoint.index}"
    missing = checkpoint.missing
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return (f"checkpoint {model_dir} is incomplete: {len(missing)} of {len(checkpoint.files)} shards the index "
                f"names are missing or empty ({shown}); finish the download")
    return None


def guard_refusals(plan: NativePlan, room: N.Room, checkpoint: probes.Checkpoint) -> list[str]:
    """Every reason the README's start guards would refuse, in the order start.sh checks them."""
    found = [port_refusal(plan.port, room), memory_refusal(plan.min_free_gib, room),
             checkpoint_refusal(plan.model_dir, checkpoint)]
    return [r for r in found if r]


# ------------------------------------------------------------------------------------------- steps


def _check(result, what: str) -> str:
    if not result.ok:
        lines = (result.stderr.strip() or result.stdout.strip() or f"exit code {result.exit_code}").splitlines()
        raise RuntimeError(f"cannot {what}: {lines[-1]}")
    return result.stdout


def read_room(conn, port: int) -> N.Room:
    return N.parse_room(_check(conn.run(N.room_argv([port]), timeout=STEP_TIMEOUT_S), "inspect ports and memory"))


def read_checkpoint(conn, model_dir: str) -> probes.Checkpoint:
    return probes.parse_checkpoint(_check(conn.run(probes.checkpoint_argv(model_dir), timeout=STEP_TIMEOUT_S),
                                          "inspect the checkpoint"))


def native_state(conn, paths: N.NativePaths, profile: str) -> N.ProcessState:
    return N.parse_state(_check(conn.run(N.state_argv(paths, profile), timeout=STEP_TIMEOUT_S), "read the pidfile"))


def native_log_tail(conn, paths: N.NativePaths, lines: int = LOG_TAIL) -> str:
    result = conn.run(N.log_tail_argv(paths, lines), timeout=STEP_TIMEOUT_S)
    return result.stdout if result.ok else (result.stderr.strip() or f"(no log at {paths.log})")


class GuardRefused(Exception):
    def __init__(self, reasons: list[str]):
        super().__init__("; ".join(reasons))
        self.reasons = reasons


@dataclass
class StopOutcome:
    state: str  # stopped (nothing ran) | stale | terminated | killed
    pid: Optional[int] = None
    mem_available: Optional[int] = None
    memory_back: Optional[bool] = None  # None: nothing was stopped, nothing to wait for
    memory_wait_s: float = 0.0

    def to_json(self) -> dict:
        return {"state": self.state, "pid": self.pid, "memory_back": self.memory_back,
                "mem_available_gib": None if self.mem_available is None else round(self.mem_available / GIB, 2),
                "memory_wait_s": round(self.memory_wait_s, 1)}


def wait_memory_back(conn, min_free_gib: float, timeout_s: float, poll_s: float = 1.0) -> tuple[bool, int, float]:
    """Poll MemAvailable until it reaches the start guard's floor again (the README's stop.sh: "wait
    for the memory to come back"): the unified pool is released by the driver after the process ends."""
    started = time.monotonic()
    while True:
        available = probes.parse_meminfo(_check(conn.run(probes.MEMINFO_ARGV, timeout=STEP_TIMEOUT_S),
                                                "read /proc/meminfo"))["MemAvailable"]
        waited = time.monotonic() - started
        if available >= min_free_gib * GIB:
            return True, available, waited
        if waited >= timeout_s:
            return False, available, waited
        time.sleep(poll_s)


def stop_native(conn, paths: N.NativePaths, profile: str, *, grace_s: int, min_free_gib: float,
                memory_timeout_s: float, reporter: Optional[Reporter] = None, host: str = "") -> StopOutcome:
    """SIGTERM, SIGKILL after ``grace_s``, then wait for the memory; idempotent. Its note goes to
    ``reporter`` (None: recorded nowhere), about ``host`` when given."""
    result = conn.run(N.stop_argv(paths, profile, grace_s), timeout=grace_s + 30 + STEP_TIMEOUT_S)
    state = N.parse_state(result.stdout)
    if not result.ok:
        raise RuntimeError(f"cannot stop pid {state.pid}: it outlived SIGKILL" if state.state == "unkillable"
                           else f"cannot stop the engine: {(result.stderr or result.stdout).strip()}")
    outcome = StopOutcome(state.state, state.pid)
    if state.state in ("terminated", "killed"):
        (reporter or Reporter()).note(f"pid {state.pid} {state.state}; waiting for MemAvailable >= "
                                      f"{min_free_gib:g} GiB (up to {memory_timeout_s:g} s)", host or None)
        outcome.memory_back, outcome.mem_available, outcome.memory_wait_s = wait_memory_back(conn, min_free_gib,
                                                                                             memory_timeout_s)
    return outcome


def start_native(conn, plan: NativePlan, *, reporter: Optional[Reporter] = None) -> int:
    """Guards, files, start; the pid. A running engine of this profile is stopped first (as serve
    replaces a profile's containers), and its memory waited for, before the guards look. Its
    progress goes to ``reporter`` as notes (None: recorded nowhere)."""
    reporter = reporter or Reporter()
    current = native_state(conn, plan.paths, plan.profile)
    if current.running:
        reporter.note(f"stopping the running engine of {plan.profile} (pid {current.pid}) first")
        stopped = stop_native(conn, plan.paths, plan.profile, grace_s=plan.stop_grace_s, min_free_gib=plan.min_free_gib,
                              memory_timeout_s=plan.memory_back_timeout_s, reporter=reporter)
        if stopped.memory_back is False:
            reporter.note(f"the memory did not come back within {plan.memory_back_timeout_s} s")
    reporter.note(f"guards on {plan.host}: port {plan.port}, MemAvailable >= {plan.min_free_gib:g} GiB, checkpoint {plan.model_dir}")
    refusals = guard_refusals(plan, read_room(conn, plan.port), read_checkpoint(conn, plan.model_dir))
    if refusals:
        raise GuardRefused(refusals)
    if plan.folders:
        _check(conn.run(N.make_folders_argv(plan.workdir, plan.folders), timeout=STEP_TIMEOUT_S),
               f"create {', '.join(plan.folders)} in native.workdir {plan.workdir}")
    for f in plan.files:
        _check(conn.run(write_file_argv(plan.paths.directory, f.name, f.mode), stdin=f.content.encode(),
                        timeout=STEP_TIMEOUT_S), f"write {plan.paths.directory}/{f.name}")
    result = conn.run(N.start_argv(plan.paths, plan.profile), timeout=STEP_TIMEOUT_S)
    state = N.parse_state(result.stdout)
    if result.exit_code == N.ALREADY_RUNNING:
        raise RuntimeError(f"the engine of {plan.profile} is already running (pid {state.pid})")
    _check(result, "start the engine")
    reporter.note(f"started {plan.command[0]} as pid {state.pid}; log {plan.paths.log}")
    return state.pid


def why_not_alive(state: N.ProcessState, plan: NativePlan, pid: Optional[int]) -> Optional[str]:
    """None while the engine process serve started (``pid``; None: whichever runs) still runs; else
    what happened, naming the host. Nothing restarts it on its own, so another pid was started by hand."""
    where = f"{plan.host}: the engine process ({plan.paths.pidfile})"
    if not state.running:
        return f"{where} is gone ({state.state}{f', pid {state.pid}' if state.pid else ''})"
    if pid is not None and state.pid != pid:
        return f"{where} was replaced: pid {state.pid} runs, serve started pid {pid}"
    return None


def wait_native(conn, plan: NativePlan, *, timeout_s: Optional[float] = None, on_attempt=None, pid: Optional[int] = None):
    """The health wait (20 minutes by default), ending early when the process ``pid`` (the one serve
    started) dies or is replaced. Returns (WaitResult, the log tail when it failed)."""
    from sparkctl.ops.health import wait_healthy

    def check_alive() -> Optional[str]:
        return why_not_alive(native_state(conn, plan.paths, plan.profile), plan, pid)

    limit = plan.health_timeout_s if timeout_s is None else timeout_s
    waited = wait_healthy(plan.endpoint, plan.served_model_name, timeout_s=limit, check_alive=check_alive,
                          on_attempt=on_attempt, alive_every_s=3.0, first_alive_s=1.0)
    return waited, (None if waited.ok else native_log_tail(conn, plan.paths))
