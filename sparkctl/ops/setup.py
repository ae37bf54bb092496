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
from dataclasses import dataclass, field
from typing import Callable

from sparkctl.commands import setup as cmds
from sparkctl.ops.become import Become, NeedsPassword
from sparkctl.ops.up import CHANGED, FAILED, OK, PLANNED, SKIPPED, UpStep

STEPS = ("docker_group", "folders", "fabric", "nvidia_runtime", "ssh_mesh")
LOOK_TIMEOUT_S = 30
Say = Callable[[str], None]


class StepFailed(Exception):
    """The step cannot do its work on this host; the message is the reason."""


@dataclass
class HostSetup:
    """One host's steps and what their looks found."""

    name: str
    steps: list[UpStep] = field(default_factory=lambda: [UpStep(n) for n in STEPS])
    needs: dict[str, str] = field(default_factory=dict)  # step -> why it must act (from the look)
    user: str = ""
    rootless: set[str] = field(default_factory=set)  # planned steps the login user can do without root

    def step(self, name: str) -> UpStep:
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

    def to_json(self) -> dict:
        doc = {"ok": self.ok, "dry_run": self.dry_run, "seconds": round(self.seconds, 3),
               "hosts": [{"name": h.name, "steps": [s.to_json() for s in h.steps]} for h in self.hosts]}
        if self.message:
            doc["error"] = self.message
        return doc


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


def act_docker_group(ctx: HostContext, hs: HostSetup) -> None:
    ctx.root(cmds.add_to_group_argv(hs.user, "docker"), "add the user to the docker group")
    ctx.reconnect()


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


def act_folders(ctx: HostContext, hs: HostSetup) -> None:
    """Every folder a container bind-mounts exists before it is mounted, and is the user's: one
    Docker would create is root's, and the next look would find it not writable."""
    states = _folder_states(ctx)
    absent = [p for p, s in states.items() if s == "creatable"]
    foreign = [p for p, s in states.items() if s not in ("ok", "creatable")]
    if absent:
        ctx.ask(cmds.make_own_folders_argv(absent), "create the folders")
    if foreign:
        ctx.root(cmds.make_folders_argv(foreign, hs.user or ctx.host.ssh_user or "$USER"), "create the folders")


def _fabric_gaps(ctx: HostContext) -> tuple[bool, list[tuple[str, str]], list[str]]:
    from sparkctl.config.inventory import fabric_plan

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


def act_fabric(ctx: HostContext, hs: HostSetup) -> None:
    netplan, plan, _ = _fabric_gaps(ctx)
    if netplan:
        ctx.root(cmds.write_netplan_argv(cmds.netplan_yaml(plan)), f"write and apply {cmds.NETPLAN_FILE}")
    else:
        ctx.root(cmds.ip_fabric_argv(plan), "configure the fabric interfaces")
    _, _, gaps = _fabric_gaps(ctx)
    if gaps:
        raise StepFailed("still " + ", ".join(gaps) + " after configuring")


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


def _timed(step: UpStep, fn):
    started = time.monotonic()
    try:
        return fn()
    finally:
        step.seconds += time.monotonic() - started


def _attempt(step: UpStep, fn) -> tuple[bool, object]:
    """(True, ``fn()``) timed on ``step``, or (False, None) with the step skipped or failed as it said."""
    try:
        return True, _timed(step, fn)
    except _Skip as why:  # only a look says this: the step does not apply here
        step.status, step.reason = SKIPPED, str(why)
    except StepFailed as err:
        step.status, step.reason = FAILED, str(err)
    return False, None


def _look_host(ctx: HostContext, hs: HostSetup, wanted: tuple[str, ...]) -> None:
    for name in STEPS[:-1]:
        step = hs.step(name)
        if name not in wanted:
            step.status, step.reason = SKIPPED, "not asked for"
            continue
        looked, need = _attempt(step, lambda: LOOKS[name](ctx, hs))
        if not looked:
            continue
        if need is None:
            step.status, step.reason = OK, "already so"
        else:
            step.status, step.reason = PLANNED, need
            hs.needs[name] = need


def _act_host(ctx: HostContext, hs: HostSetup, say: Say) -> None:
    for name in STEPS[:-1]:
        step = hs.step(name)
        if step.status != PLANNED:
            continue
        if name == "nvidia_runtime" and hs.step("docker_group").status == FAILED:
            step.status, step.reason = SKIPPED, "the docker group step failed"
            continue
        acted, outcome = _attempt(step, lambda: ACTS[name](ctx, hs))
        if acted and outcome == "ok":
            step.status, step.reason = OK, "already so"
        elif acted:
            step.status, step.reason = CHANGED, outcome if isinstance(outcome, str) else hs.needs[name]
        say(f"{hs.name:<12} {name:<15} {step.status:<8} {step.reason}")


def _mesh(contexts: dict, report: SetupReport, dry_run: bool, wanted: tuple[str, ...], say: Say) -> None:
    from sparkctl.ops import setup_mesh

    steps = {hs.name: hs.step("ssh_mesh") for hs in report.hosts}
    if "ssh_mesh" not in wanted:
        for step in steps.values():
            step.status, step.reason = SKIPPED, "not asked for"
        return
    if len(contexts) < 2:
        for step in steps.values():
            step.status, step.reason = SKIPPED, "one host: no peer to reach"
        return
    started = time.monotonic()
    try:
        needs = setup_mesh.look(contexts)
        outcome = {} if dry_run else setup_mesh.act(contexts) if any(needs.values()) else {}
    except Exception as err:  # one host's failure leaves the mesh incomplete for all
        for step in steps.values():
            step.status, step.reason = FAILED, str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        return
    for name, step in steps.items():
        step.seconds = time.monotonic() - started
        need = needs.get(name)
        if need is None:
            step.status, step.reason = OK, "every peer authorized and pinned"
        elif dry_run:
            step.status, step.reason = PLANNED, need
        else:
            step.status, step.reason = (CHANGED if outcome.get(name) == "changed" else OK), need
            say(f"{name:<12} {'ssh_mesh':<15} {step.status:<8} {need}")


def _check_sudo(contexts: dict, report: SetupReport, become: Become) -> None:
    """Before anything changes: every host that needs root must grant it (NeedsPassword if not)."""
    from concurrent.futures import ThreadPoolExecutor

    needing = [contexts[hs.name] for hs in report.hosts
               if any(n in ROOT_STEPS and n not in hs.rootless for n in hs.needs)]
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(needing)))) as pool:
        list(pool.map(lambda ctx: become.check(ctx.conn, ctx.host.name), needing))


def run_setup(inventory, hosts, options: SetupOptions, *, pool, become: Become | None = None,
              say: Say = lambda _: None) -> SetupReport:
    """Look at every host, then (unless ``options.dry_run``) act where needed. Raises NeedsPassword
    before any change when a host's sudo wants a password and none was given."""
    from concurrent.futures import ThreadPoolExecutor

    become = become or Become()
    started = time.monotonic()
    wanted = options.only or STEPS
    report = SetupReport([HostSetup(h.name) for h in hosts], dry_run=options.dry_run)
    contexts = {h.name: HostContext(inventory, h, pool, become) for h in hosts}
    by_name = {hs.name: hs for hs in report.hosts}
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as threads:
        list(threads.map(lambda hs: _guarded(hs, lambda: _look_host(contexts[hs.name], hs, wanted)), report.hosts))
        if not options.dry_run:
            _check_sudo(contexts, report, become)
            list(threads.map(lambda hs: _guarded(hs, lambda: _act_host(contexts[hs.name], hs, say)), report.hosts))
    reachable = {n: c for n, c in contexts.items() if not _unreachable(by_name[n])}
    _mesh(reachable, report, options.dry_run, wanted, say)
    report.seconds = time.monotonic() - started
    return report


def _guarded(hs: HostSetup, fn) -> None:
    """A host that cannot be reached fails every step not yet decided, with the reason."""
    from sparkctl.remote.result import RemoteError

    try:
        fn()
    except NeedsPassword:
        raise
    except RemoteError as err:
        for step in hs.steps:
            if step.status in (PLANNED,) or not step.reason:
                step.status, step.reason = FAILED, str(err)


def _unreachable(hs: HostSetup) -> bool:
    return all(s.status == FAILED for s in hs.steps)
