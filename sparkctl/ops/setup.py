"""``sparkctl setup``: prepare bare hosts for sparkctl, every host at once, idempotently.

Each step looks first (as the login user) and acts only when the host is not already as wanted;
it ends ``ok`` (already true), ``changed``, ``skipped`` (nothing to do here) or ``failed`` (with
the reason), the same shape as ``up``'s steps. Root comes only from ``ops/become`` (``sudo -n``,
or the password from ``--ask-become-pass`` on sudo's stdin).

Steps, per host: ``docker_group`` (the user in the docker group), ``folders`` (state, NVMe, model,
Engram and cache folders owned by the user), ``fabric`` (the fabric interfaces' addresses and MTU
9000: a netplan file applied on DGX OS, iproute2 elsewhere), ``nvidia_runtime`` (registered with
Docker by ``nvidia-ctk``, the engine reloaded); then across hosts ``ssh_mesh`` (each host's own key
authorized on every other, every other host's key pinned in its known_hosts under its name,
management and fabric addresses).
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from sparkctl.commands import setup as cmds
from sparkctl.config.inventory import fabric_plan
from sparkctl.ops import setup_mesh
from sparkctl.ops.become import Become, NeedsPassword
from sparkctl.ops.steps import CHANGED, FAILED, OK, PLANNED, SKIPPED, Look, Step, StepFailed, StepRun
from sparkctl.reporter import Reporter, StepRecord

STEPS = ("docker_group", "folders", "fabric", "nvidia_runtime", "ssh_mesh")
LOOK_TIMEOUT_S = 30


@dataclass
class HostSetup:
    """One host's steps (as reported) and what their looks found."""

    name: str
    steps: list[StepRecord] = field(default_factory=lambda: [StepRecord(n) for n in STEPS])
    needs: dict[str, str] = field(default_factory=dict)  # step -> why it must act (from the look)
    user: str = ""
    rootless: set[str] = field(default_factory=set)  # planned steps the login user can do without root
    run: StepRun | None = None  # the host's steps (all but the mesh) through the one runner

    def step(self, name: str) -> StepRecord:
        return next(s for s in self.steps if s.name == name)


@dataclass
class SetupReport:
    hosts: list[HostSetup]
    dry_run: bool = False
    seconds: float = 0.0
    message: str = ""  # why setup stopped before acting (sudo wants a password)

    @property
    def ok(self) -> bool:
        return not self.message and all(s.status != FAILED for h in self.hosts for s in h.steps)

    @property
    def changed(self) -> bool:
        return any(s.status == CHANGED for h in self.hosts for s in h.steps)

    def outcome(self, why: str) -> tuple[str, str]:
        """As one step's end (``up``'s setup, acting because ``why``): changed, ok, or StepFailed."""
        failures = [f"{h.name}: {s.name}: {s.reason}" for h in self.hosts for s in h.steps if s.status == FAILED]
        if failures:
            raise StepFailed("; ".join(failures))
        changed = summarise(self.hosts, CHANGED)
        return (CHANGED, "prepared " + changed) if changed else (OK, why)

    def to_json(self) -> dict:
        doc = {"ok": self.ok, "dry_run": self.dry_run, "seconds": round(self.seconds, 3),
               "hosts": [{"name": h.name, "steps": [s.to_json() for s in h.steps]} for h in self.hosts]}
        if self.message:
            doc["error"] = self.message
        return doc


def summarise(hosts: list[HostSetup], status: str) -> str:
    """The steps in ``status``, one entry per step: with its reason where one host has it, else with
    the hosts' names ("every host" when all do). Each host's own reasons were reported as its steps
    ended; a rack of eight must not repeat them all on one line."""
    by_step: dict[str, list[tuple[str, str]]] = {}
    for host in hosts:
        for step in host.steps:
            if step.status == status:
                by_step.setdefault(step.name, []).append((host.name, step.reason))
    entries = []
    for name, found in by_step.items():
        if len(found) == 1:
            entries.append(f"{found[0][0]}: {name} ({found[0][1]})")
        else:
            where = "every host" if len(found) == len(hosts) > 1 else ", ".join(h for h, _ in found)
            entries.append(f"{name} on {where}")
    return ", ".join(entries)


@dataclass
class SetupOptions:
    dry_run: bool = False
    only: tuple[str, ...] = ()  # `doctor --fix`: just these steps (default: all)


class HostContext:
    """What one host's steps work with: its connection, its inventory entry, root through sudo."""

    def __init__(self, inventory, host, pool, become: Become):
        self.inventory, self.host, self.pool, self.become = inventory, host, pool, become
        self.target = inventory.ssh_target(host)

    @property
    def conn(self):
        return self.pool.get(self.target)

    def ask(self, argv: list[str], what: str) -> str:
        result = self.conn.run(argv, timeout=LOOK_TIMEOUT_S)
        if not result.ok:
            raise StepFailed(f"cannot {what}: {_last_line(result)}")
        return result.stdout

    def root(self, argv: list[str], what: str) -> str:
        result = self.become.run(self.conn, self.host.name, argv)
        if not result.ok:
            raise StepFailed(f"cannot {what}: {_last_line(result)}")
        return result.stdout

    def reconnect(self) -> None:
        """A new login session: group changes (the docker group) count only from the next login."""
        self.conn.close()


def _last_line(result) -> str:
    lines = (result.stderr.strip() or result.stdout.strip() or f"exit {result.exit_code}").splitlines()
    return lines[-1][:200]


# ---------------------------------------------------------------------------------------------
# The per-host steps: look() -> None (already true) or why it must act; act() does it.


def _folders(ctx: HostContext) -> list[str]:
    paths = ctx.inventory.model.paths
    wanted = [paths.state_dir, ctx.host.nvme_path, paths.model_dir, paths.engram_dir, paths.hf_cache]
    return list(dict.fromkeys(wanted))


def look_docker_group(ctx: HostContext, hs: HostSetup) -> str | None:
    user, groups, has_group = cmds.parse_groups(ctx.ask(cmds.GROUPS_ARGV, "read the user's groups"))
    hs.user = user
    if not has_group:
        raise StepFailed("no docker group: Docker is not installed (apt-get install docker.io, or DGX OS's docker-ce)")
    return None if "docker" in groups else f"{user} is not in the docker group"


def act_docker_group(ctx: HostContext, hs: HostSetup) -> str:
    ctx.root(cmds.add_to_group_argv(hs.user, "docker"), "add the user to the docker group")
    ctx.reconnect()
    return f"added {hs.user} to the docker group"


def _folder_states(ctx: HostContext) -> dict[str, str]:
    paths = _folders(ctx)
    return dict(zip(paths, ctx.ask(cmds.folders_look_argv(paths), "look at the folders").split()))


def look_folders(ctx: HostContext, hs: HostSetup) -> str | None:
    states = _folder_states(ctx)
    absent = [p for p, s in states.items() if s == "creatable"]
    foreign = [f"{p} ({s})" for p, s in states.items() if s not in ("ok", "creatable")]
    if not foreign:
        hs.rootless.add("folders")
    why = ([("to create: " + ", ".join(absent))] if absent else []) + (["not the user's: " + ", ".join(foreign)] if foreign else [])
    return "; ".join(why) or None


def act_folders(ctx: HostContext, hs: HostSetup) -> str:
    """Every folder a container bind-mounts exists before it is mounted, and is the user's: one
    Docker would create is root's, and the next look would find it not writable."""
    states = _folder_states(ctx)
    absent = [p for p, s in states.items() if s == "creatable"]
    foreign = [p for p, s in states.items() if s not in ("ok", "creatable")]
    user = hs.user or ctx.host.ssh_user or "$USER"
    if absent:
        ctx.ask(cmds.make_own_folders_argv(absent), "create the folders")
    if foreign:
        ctx.root(cmds.make_folders_argv(foreign, user), "create the folders")
    done = ([f"created {', '.join(absent)}"] if absent else []) + ([f"gave {user} {', '.join(foreign)}"] if foreign else [])
    return "; ".join(done) or "ok"


def _fabric_gaps(ctx: HostContext) -> tuple[bool, list[tuple[str, str]], list[str]]:
    plan = fabric_plan(ctx.host)
    netplan, links = cmds.parse_links(ctx.ask(cmds.LINKS_ARGV, "read the links"))
    gaps = []
    for name, address in plan:
        link = links.get(name)
        if link is None:
            raise StepFailed(f"{name} does not exist on this host: check `ip link` and the inventory's fabric_interfaces")
        if link["mtu"] != cmds.FABRIC_MTU:
            gaps.append(f"{name} mtu {link['mtu']}")
        if address not in link["addresses"]:
            gaps.append(f"{name} without {address}")
    return netplan, plan, gaps


def look_fabric(ctx: HostContext, hs: HostSetup) -> str | None:
    if not ctx.host.fabric_interfaces:
        raise _Skip("the inventory names no fabric_interfaces")
    if not ctx.host.fabric_addresses:
        raise _Skip("the inventory gives no fabric_addresses and no fabric_subnet to derive them")
    _, _, gaps = _fabric_gaps(ctx)
    return ", ".join(gaps) or None


def act_fabric(ctx: HostContext, hs: HostSetup) -> str:
    netplan, plan, _ = _fabric_gaps(ctx)
    if netplan:
        ctx.root(cmds.write_netplan_argv(cmds.netplan_yaml(plan)), f"write and apply {cmds.NETPLAN_FILE}")
    else:
        ctx.root(cmds.ip_fabric_argv(plan), "configure the fabric interfaces")
    _, _, gaps = _fabric_gaps(ctx)
    if gaps:
        raise StepFailed("still " + ", ".join(gaps) + " after configuring")
    how = f"through {cmds.NETPLAN_FILE}" if netplan else "with ip"
    return "configured " + ", ".join(f"{name} ({address}, mtu {cmds.FABRIC_MTU})" for name, address in plan) + f" {how}"


def _runtimes(ctx: HostContext) -> set[str] | None:
    """Docker's runtimes, or None when this user cannot ask Docker yet (not in the docker group)."""
    result = ctx.conn.run(cmds.RUNTIMES_ARGV, timeout=LOOK_TIMEOUT_S)
    if result.exit_code != 0:
        raise StepFailed(f"cannot ask Docker: {_last_line(result)}")
    return cmds.parse_runtimes(result.stdout)


def look_nvidia_runtime(ctx: HostContext, hs: HostSetup) -> str | None:
    runtimes = _runtimes(ctx)
    if runtimes is None:
        return "checked once the user is in the docker group"
    return None if "nvidia" in runtimes else "Docker has no nvidia runtime"


def act_nvidia_runtime(ctx: HostContext, hs: HostSetup) -> str | None:
    runtimes = _runtimes(ctx)
    if runtimes is None:
        raise StepFailed("this user still cannot ask Docker (docker group)")
    if "nvidia" in runtimes:
        return "ok"
    if not ctx.conn.run(cmds.CTK_PRESENT_ARGV, timeout=LOOK_TIMEOUT_S).ok:
        raise StepFailed("nvidia-ctk is not installed: install nvidia-container-toolkit")
    ctx.root(cmds.CONFIGURE_RUNTIME_ARGV, "register the nvidia runtime")
    ctx.root(cmds.RELOAD_DOCKER_ARGV, "reload Docker")
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if "nvidia" in (_runtimes(ctx) or set()):
                return "Docker had no nvidia runtime: registered (nvidia-ctk) and Docker reloaded"
        except StepFailed:  # the engine restarting
            pass
        time.sleep(0.5)
    raise StepFailed("Docker still lists no nvidia runtime 30 s after reloading")


class _Skip(Exception):
    """The step has nothing to do on this host (the reason says why)."""


LOOKS = {"docker_group": look_docker_group, "folders": look_folders, "fabric": look_fabric,
         "nvidia_runtime": look_nvidia_runtime}
ACTS = {"docker_group": act_docker_group, "folders": act_folders, "fabric": act_fabric,
        "nvidia_runtime": act_nvidia_runtime}
ROOT_STEPS = ("docker_group", "folders", "fabric", "nvidia_runtime")


# ---------------------------------------------------------------------------------------------
# The run: look everywhere, refuse early when sudo wants a password, act, then the mesh.


def _host_step(name: str, wanted: tuple[str, ...]) -> Step:
    """One of LOOKS/ACTS as a step of the protocol; its context is (HostContext, HostSetup)."""

    def look(on) -> Look:
        ctx, hs = on
        if name not in wanted:
            return Look(False, "not asked for", {"skip": True})
        try:
            need = LOOKS[name](ctx, hs)
        except _Skip as why:
            return Look(False, str(why), {"skip": True})
        if need is None:
            return Look(False, "already so")
        hs.needs[name] = need
        return Look(True, need)

    def act(on, look: Look) -> tuple[str, str]:
        ctx, hs = on
        if name == "nvidia_runtime" and hs.run.status["docker_group"] == FAILED:
            return SKIPPED, "the docker group step failed"
        outcome = ACTS[name](ctx, hs)  # what it did, in words ("ok": nothing left to do by then)
        return (OK, "already so") if outcome == "ok" else (CHANGED, outcome)

    return Step(name, look, act)


def _host_run(ctx: HostContext, hs: HostSetup, wanted: tuple[str, ...], reporter: Reporter) -> StepRun:
    """A host's steps: every one tried (one failing does not stop the others), the plan's looks acted
    on as they are (root was asked for what they found), sudo wanting a password the verb's error."""
    return StepRun([_host_step(name, wanted) for name in STEPS[:-1]], (ctx, hs), reporter, host=hs.name,
                   keep_going=True, relook=False, cannot_look="", raise_on=(NeedsPassword,))


def _mesh(contexts: dict, report: SetupReport, dry_run: bool, wanted: tuple[str, ...], reporter: Reporter) -> None:
    """The SSH mesh, across the reachable hosts; each host's part reported as its ``ssh_mesh`` step."""
    names = [hs.name for hs in report.hosts]

    def every(status: str, reason: str, seconds: float = 0.0) -> None:
        for name in names:
            reporter.done("ssh_mesh", status, reason, seconds, name)

    if "ssh_mesh" not in wanted:
        return every(SKIPPED, "not asked for")
    if len(contexts) < 2:
        return every(SKIPPED, "one host: no peer to reach")
    started = time.monotonic()
    try:
        needs = setup_mesh.look(contexts)
        outcome = {} if dry_run else setup_mesh.act(contexts) if any(needs.values()) else {}
    except Exception as err:  # one host's failure leaves the mesh incomplete for all
        return every(FAILED, str(err).splitlines()[0][:200] if str(err) else type(err).__name__)
    for name in names:
        need, seconds = needs.get(name), time.monotonic() - started
        if need is None:
            reporter.done("ssh_mesh", OK, "every peer authorized and pinned", seconds, name)
        elif dry_run:
            reporter.looked("ssh_mesh", PLANNED, need, name, seconds)
        else:
            changed = outcome.get(name) == "changed"
            reporter.done("ssh_mesh", CHANGED if changed else OK,
                          f"authorized and pinned every peer (was: {need})" if changed else need, seconds, name)


def _check_sudo(contexts: dict, report: SetupReport, become: Become) -> None:
    """Before anything changes: every host that needs root must grant it (NeedsPassword if not)."""
    needing = [contexts[hs.name] for hs in report.hosts
               if any(n in ROOT_STEPS and n not in hs.rootless for n in hs.needs)]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(needing)))) as pool:
        list(pool.map(lambda ctx: become.check(ctx.conn, ctx.host.name), needing))


def run_setup(inventory, hosts, options: SetupOptions, *, pool, become: Become | None = None,
              reporter: Reporter | None = None) -> SetupReport:
    """Look at every host, then (unless ``options.dry_run``) act where needed; every step told to
    ``reporter``, whose record is the report. Raises NeedsPassword before any change when a host's
    sudo wants a password and none was given."""
    become, reporter = become or Become(), reporter or Reporter()
    started = time.monotonic()
    wanted = options.only or STEPS
    report = SetupReport([HostSetup(h.name) for h in hosts], dry_run=options.dry_run)
    contexts = {h.name: HostContext(inventory, h, pool, become) for h in hosts}
    for hs in report.hosts:
        hs.run = _host_run(contexts[hs.name], hs, wanted, reporter)
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as threads:
        list(threads.map(lambda hs: hs.run.look(), report.hosts))
        if not options.dry_run:
            _check_sudo(contexts, report, become)
            list(threads.map(lambda hs: hs.run.act(), report.hosts))
    reachable = {hs.name: contexts[hs.name] for hs in report.hosts if hs.run.lost is None}
    _mesh(reachable, report, options.dry_run, wanted, reporter)
    for hs in report.hosts:
        hs.steps = reporter.steps(list(STEPS), hs.name)
    report.seconds = time.monotonic() - started
    return report
