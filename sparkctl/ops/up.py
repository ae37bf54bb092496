"""``sparkctl up``: converge the cluster to a profile, step by step, each step skipped when already true.

The steps compose what the other verbs already do, in order:

1. **doctor**: every host's checks (``ops/doctor``); a failure stops ``up`` with its hints, except
   what a later step fixes (the image missing; the checkpoint, with ``--model-source``; the ports and
   memory the profile's own running engine holds, which the serve replaces).
2. **checkpoint**: with ``--model-source`` (a hub repo or a folder), the checkpoint present and
   verified on every host (``ops/model_sync``: each file hashed against the source's manifest; only
   what a host lacks or holds wrongly is sent). Without it, skipped: doctor checked each copy's files
   and sizes.
3. **build**: the profile's image chain on the build host (``--build-on``, else the inventory's head),
   only when a layer's inputs changed (``ops/build.stale_layers``); unchanged layers are reused.
4. **distribute**: the build host's image to every host whose tag names another image ID (thin:
   only the layers a host lacks, so a changed patch file sends only the patch layer).
5. **engram**: with ``engram.mode: disk``, every rank's shards present and verified on its host
   (``ops/engram``; each host cuts what is missing from its own checkpoint).
6. **serve**: only when the deployment is not running as the profile renders now (a container
   down, drift in image, arguments, environment or docker options, other hosts, endpoint down).
7. **smoke**: the endpoint answers the way an application uses it.

Before acting, ``up`` looks (read-only) and prints its plan: which steps will act and why;
``--dry-run`` stops there. The run holds the deploy lock (``ops/lock``) throughout, and each step
looks again before it acts, so a failed ``up`` run again continues from what is already true.
Each step ends ``ok`` (already true, nothing done), ``changed`` (it acted), ``skipped`` or ``failed``
(the step protocol of ``ops/steps.py``). A native profile (the single box) has no image steps: its
serve step is the native launcher's (``ops/native_up.py``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from sparkctl.commands import facts
from sparkctl.ops.steps import (CHANGED, FAILED, OK, PLANNED, SKIPPED, Look, Step, StepFailed, StepRun,  # noqa: F401
                                ask, step_error)
from sparkctl.reporter import Reporter, StepRecord

STEPS = ("setup", "doctor", "checkpoint", "build", "distribute", "engram", "serve", "smoke")
CHECKS = ("doctor", "smoke")  # steps that only look: they never change anything (setup looks too, but acts)
UNDER_LOCK = STEPS[1:]  # setup runs before the deploy lock: a bare host has no state folder to hold it in

UpStep = StepRecord  # a step as reported: name, status, reason, seconds


@dataclass
class UpReport:
    profile: str
    steps: list[StepRecord]
    dry_run: bool = False
    seconds: float = 0.0
    endpoint: Optional[str] = None
    message: str = ""  # why up stopped before its steps (the deploy lock)

    @property
    def ok(self) -> bool:
        return not self.message and all(s.status != FAILED for s in self.steps)

    def step(self, name: str) -> StepRecord:
        return next(s for s in self.steps if s.name == name)

    def to_json(self) -> dict:
        # A refusal before any step (the deploy lock) is the answer: the document says it, not only stderr.
        return {"profile": self.profile, "ok": self.ok, "error": self.message or None,
                "steps": [s.to_json() for s in self.steps]}


@dataclass
class UpOptions:
    sets: tuple[str, ...] = ()
    envs: tuple[str, ...] = ()
    hosts: Optional[list[str]] = None  # --hosts: the deployment's hosts (default: the profile's selection)
    build_on: Optional[str] = None  # default: the inventory's head
    health_timeout_s: Optional[float] = None
    break_lock: bool = False
    force_break_lock: bool = False
    model_source: Optional[str] = None  # --model-source: hf:OWNER/NAME[@REV] or a folder (see docs/model.md)
    model_from: Optional[str] = None  # --model-from: the inventory host holding that folder
    parallel: bool = False  # replicas: restart every replica at once instead of one at a time
    no_setup: bool = False  # --no-setup: refuse hosts that need `sparkctl setup` instead of running it
    context: Optional[str] = None  # --context: the image chain's build context folder (as `build --context`)


class Up:
    """One ``up`` run: the looks (read-only), then the steps under the deploy lock."""

    def __init__(self, inventory, profile_name: str, options: UpOptions, *, pool, out, reporter: Optional[Reporter] = None):
        from sparkctl.config.profile import load_profile
        from sparkctl.ops.serve import build_plan

        self.inventory, self.options, self.pool, self.out = inventory, options, pool, out
        self.reporter = reporter or Reporter()  # every step's look, start and end; the document is built from it
        self.become = None  # ops.become.Become for the setup step (None: sudo -n)
        self.loaded = load_profile(profile_name, sets=options.sets, envs=options.envs)
        self.profile = self.loaded.profile
        self.replica_plan = self.replica_report = self.native_plan = None
        if self.profile.launcher == "native":  # the engine as a host process (ops/native_up.py)
            from sparkctl.ops import native_up

            self.native_plan = native_up.plan(self)
            self.serve_plan = None
            wanted = [self.native_plan.host]
        elif self.profile.replicas > 1:  # every replica served, the router in front (ops/replica_up.py)
            from sparkctl.ops.replica_serve import build_replica_plans

            self.replica_plan = build_replica_plans(inventory, profile_name, sets=options.sets, envs=options.envs,
                                                    wanted_hosts=options.hosts)
            self.serve_plan = self.replica_plan.serves[0]
            wanted = [name for replica in self.replica_plan.replicas for name in replica.hosts]
        else:
            self.serve_plan = build_plan(inventory, profile_name, sets=options.sets, envs=options.envs,
                                         wanted_hosts=options.hosts)
            wanted = [p.name for p in self.serve_plan.hosts]
        self.hosts = inventory.pick(wanted)
        self.endpoint = (self.replica_plan.router_endpoint if self.replica_plan
                         else (self.native_plan or self.serve_plan).endpoint)
        self.build_host = self._build_host()
        self._image_plan = None
        self.steps = StepRun(self.compose(), self, self.reporter)
        self.report = UpReport(self.profile.name, self.steps.records(), endpoint=self.endpoint)

    def compose(self) -> list[Step]:
        """up's steps, in order; the launcher (native) and the layout (replicas) supply their own."""
        from sparkctl.ops import native_up, replica_up, up_setup

        if self.native_plan is not None:  # no image: build, distribute and engram do not apply
            image = [Step(name, native_up.look_no_image, native_up.never) for name in ("build", "distribute", "engram")]
            serve = Step("serve", native_up.look_serve, native_up.act_serve)
        else:
            image = [Step("build", Up.look_build, Up.act_build), Step("distribute", Up.look_distribute, Up.act_distribute),
                     Step("engram", Up.look_engram, Up.act_engram)]
            serve = Step("serve", Up.look_serve, Up.act_serve)
            if self.replica_plan is not None:
                image[2] = Step("engram", replica_up.look_engram, replica_up.act_engram)
                serve = Step("serve", replica_up.look_serve, replica_up.act_serve)
        return [Step("setup", up_setup.look_setup, up_setup.act_setup, gate="looks once setup has prepared the hosts"),
                Step("doctor", Up.look_doctor, Up.act_doctor),
                Step("checkpoint", Up.look_checkpoint, Up.act_checkpoint), *image, serve,
                Step("smoke", Up.look_smoke, Up.act_smoke)]

    def _build_host(self):
        return self.inventory.host(self.options.build_on or self.inventory.head.name, field="--build-on")

    # -- the plan --------------------------------------------------------------------------------------

    def plan(self, names=STEPS) -> UpReport:
        """Look at the steps without changing anything; each says whether it will act and why."""
        self.steps.look(names)
        self._revise_plan()
        self.report.steps = self.steps.records()
        return self.report

    def _revise_plan(self) -> None:
        """What a step about to act changes for the looks after it (they saw the old image, the old copies)."""
        now = {r.name: r for r in self.steps.records()}
        if now["build"].status == PLANNED:
            if now["distribute"].status == OK:
                self.steps.set("distribute", PLANNED, "the image changes: copy its new layers to the other hosts")
            if now["serve"].status == OK:
                self.steps.set("serve", PLANNED, "the image changes: the engines restart on it")
        if now["checkpoint"].status == PLANNED and now["engram"].status == FAILED:  # the copies it cuts from change
            self.steps.set("engram", PLANNED, f"looks again after the checkpoint step ({now['engram'].reason})")

    def look_doctor(self) -> Look:
        return Look(True, f"check {len(self.hosts)} host(s) for what {self.profile.name} needs")

    def look_smoke(self) -> Look:
        return Look(True, f"ask {self.endpoint} what an application asks")

    def look_build(self) -> Look:
        from sparkctl.ops.build import stale_layers

        plan = self.image_plan()
        with self.build_engine() as engine:
            stale = stale_layers(plan, engine)
        if not stale:
            return Look(False, f"{plan.image} on {self.build_host.name} is built from the current inputs")
        return Look(True, f"build {', '.join(stale)} of {plan.image} on {self.build_host.name} (inputs changed or absent)",
                    {"stale": stale})

    def look_distribute(self) -> Look:
        from sparkctl.remote.pool import fan_out

        tag = self.serve_plan.image
        targets = [self.inventory.ssh_target(h) for h in {self.build_host.name: self.build_host, **{h.name: h for h in self.hosts}}.values()]
        results = fan_out(targets, lambda conn: ask(conn, facts.IMAGE_ID, tag), pool=self.pool)
        unreachable = [f"{r.name}: {r.error}" for r in results if not r.ok]
        if unreachable:
            raise StepFailed("cannot ask for the image on " + "; ".join(unreachable))
        ids = {r.name: r.value for r in results}
        source = ids.get(self.build_host.name)
        behind = [h.name for h in self.hosts if h.name != self.build_host.name and (source is None or ids[h.name] != source)]
        if not behind:
            return Look(False, f"{tag} is {source[7:19]} on every host")
        return Look(True, f"copy {tag} from {self.build_host.name} to {', '.join(behind)} (absent or another image)",
                    {"hosts": behind})

    def look_checkpoint(self) -> Look:
        from sparkctl.model.plan import human, parse_source

        if not self.options.model_source:
            return Look(False, "no --model-source: doctor checked each copy's files and sizes", {"skip": True})
        if parse_source(self.options.model_source).kind == "hub":  # known only once downloaded
            return Look(True, f"download {self.options.model_source} here once (resumes), then check and repair every host")
        report = self.sync_checkpoint(dry_run=True)
        failed = [f"{h.name}: {h.error}" for h in report.hosts if h.status == "failed"]
        if failed:
            raise StepFailed("; ".join(failed))
        behind = [h for h in report.hosts if h.status == "planned"]
        if not behind:
            return Look(False, f"present and verified on {len(report.hosts)} host(s) ({report.files} files, {report.algo})")
        return Look(True, f"copy what differs from {report.source} to " + ", ".join(f"{h.name} ({human(h.to_send)})" for h in behind))

    def sync_checkpoint(self, *, dry_run: bool):
        from sparkctl.ops.model_sync import SyncOptions, run_sync

        options = SyncOptions(source=self.options.model_source, from_host=self.options.model_from,
                              hosts=[h.name for h in self.hosts], dry_run=dry_run,
                              accept_new_host_keys=self.pool.accept_new_host_keys,
                              connect_timeout=self.pool.connect_timeout, engram_mode=self.profile.engram.mode,
                              engine=self.profile.engine)
        return run_sync(self.inventory, options, None if dry_run else self.out, pool=self.pool)

    def look_engram(self) -> Look:
        from sparkctl.ops import engram as ops

        if self.profile.engram.mode != "disk":
            return Look(False, f"Engram is kept in memory (engram.mode={self.profile.engram.mode}): no shards", {"skip": True})
        plan, _, problems = ops.plan_pack_on_hosts(self.profile, self.inventory, [h.name for h in self.hosts], None, self.pool)
        if problems:
            raise StepFailed("; ".join(problems.values()))
        actions = ops.shard_actions(plan, self.inventory, pool=self.pool)
        todo = {host: [a for a in acts if a.action != ops.SKIP] for host, acts in actions.items()}
        shards = sum(len(acts) for acts in actions.values())
        if not any(todo.values()):
            return Look(False, f"{shards} shard(s) present and verified on {len(actions)} host(s)")
        parts = [f"{host}: {', '.join(f'{a.shard.name} ({a.reason})' for a in acts)}" for host, acts in todo.items() if acts]
        return Look(True, f"cut {sum(map(len, todo.values()))} of {shards} shard(s) on the hosts: " + "; ".join(parts),
                    {"plan": plan})

    def look_serve(self) -> Look:
        from sparkctl.ops.status import gather_status

        status = gather_status(self.inventory, self.inventory.hosts, self.profile, pool=self.pool,
                               expected_for=self.expected_for, env_given=frozenset(e.partition("=")[0] for e in self.options.envs))
        deployment = status.deployment
        wanted = [h.name for h in self.serve_plan.hosts]
        if deployment is None:
            return Look(True, f"{self.profile.name} is not deployed", {"status": status})
        if deployment.hosts != wanted:
            return Look(True, f"deployed on {', '.join(deployment.hosts)}, the profile wants {', '.join(wanted)}",
                        {"status": status})
        if status.problems or status.drift:
            return Look(True, (status.problems + status.drift)[0], {"status": status})
        return Look(False, f"{self.profile.name} runs as the profile renders now and {deployment.endpoint} serves it",
                    {"status": status})

    def expected_for(self, names: list[str], recorded: list[str]):
        """What the profile renders now with this run's --set/--env (not the last serve's)."""
        from sparkctl.ops.render import render

        plan, _ = render(self.inventory, self.profile.name, sets=self.options.sets, envs=self.options.envs,
                         wanted_hosts=names)
        return {h.name: (h.engine_argv, h.env, h.docker_argv) for h in plan.hosts}

    # -- the run -----------------------------------------------------------------------------------------

    def run(self, on_plan: Callable[[UpReport], None] = lambda plan: None) -> UpReport:
        """Setup first, then under the deploy lock the plan (``on_plan`` shows it) and every other step in
        order; stops at the first failure. A step reuses the plan's look while no step before it changed anything."""
        from sparkctl.ops.lock import LockRefused, deploy_lock

        started = time.monotonic()
        what = f"up {self.profile.name} on {', '.join(h.name for h in self.hosts)}"
        self.steps.look(["setup"])
        self.steps.act(["setup"])
        try:
            if self.steps.failed is not None:  # every other step: not run
                self.steps.act(UNDER_LOCK)
                return self.report
            with deploy_lock(self.inventory, self.pool, verb="up", what=what, break_lock=self.options.break_lock,
                             force_break=self.options.force_break_lock, reporter=self.reporter) as held:
                try:
                    on_plan(self.plan(UNDER_LOCK))
                    self.steps.act(UNDER_LOCK)
                finally:
                    self._finish(started)
                    held.audit_fields = {
                        "profile": self.profile.name, "hosts": [h.name for h in self.hosts],
                        "steps": [f"{s.name}:{s.status}" for s in self.report.steps],
                        "result": "ok" if self.report.ok else "failed", "seconds": f"{self.report.seconds:.1f}",
                        "overrides": self.loaded.recorded_overrides or None,
                    }
        except LockRefused as err:
            self.report.message = str(err)
        finally:
            self._finish(started)
        return self.report

    def _finish(self, started: float) -> None:
        self.report.steps = self.steps.records()
        self.report.seconds = time.monotonic() - started

    # -- the acts: each runs when its look said it must; returns (status, reason) or raises StepFailed ----------

    def act_doctor(self, look: Look) -> tuple[str, str]:
        from sparkctl.ops.doctor.run import run_doctor

        report = run_doctor(self.inventory, self.hosts, self.profile, accept_new_host_keys=self.pool.accept_new_host_keys,
                            connect_timeout=self.pool.connect_timeout, pool=self.pool,
                            reporter=self.reporter)  # each host's checks, as in `sparkctl doctor`
        engine_running = self.look_serve_quiet()
        # what a later step fixes: the image (build, distribute), the checkpoint (with --model-source),
        # the ports and memory the profile's own running engine holds (the serve replaces it)
        return report.outcome(lambda check: check.id == "image" or (check.id == "checkpoint" and bool(self.options.model_source))
                              or (check.id in ("ports", "memory") and engine_running))

    def look_serve_quiet(self) -> bool:
        """Whether the profile's engine runs now (its ports and memory are the serve's to replace)."""
        from sparkctl.ops.status import gather_states

        if self.native_plan is not None:
            from sparkctl.ops import native_up

            return native_up.engine_running(self)

        states = gather_states(self.inventory, self.hosts, self.profile.name, pool=self.pool)
        return any(s.container is not None and s.container.running for s in states)

    def act_checkpoint(self, look: Look) -> tuple[str, str]:
        return self.sync_checkpoint(dry_run=False).outcome()

    def act_build(self, look: Look) -> tuple[str, str]:
        from sparkctl.ops.build import BuildOptions, run_build

        with self.build_engine() as engine:
            return run_build(self.image_plan(), engine, BuildOptions(), self.out).outcome(self.build_host.name)

    def act_distribute(self, look: Look) -> tuple[str, str]:
        from sparkctl.ops.distribute import DistributeOptions, run_distribute

        options = DistributeOptions(tag=self.serve_plan.image, hosts=look.detail["hosts"], source=self.build_host.name,
                                    accept_new_host_keys=self.pool.accept_new_host_keys)
        return run_distribute(self.inventory, options, self.out, pool=self.pool).outcome(self.build_host.name)

    def act_engram(self, look: Look) -> tuple[str, str]:
        from sparkctl.ops import engram as ops

        return ops.pack(look.detail["plan"], self.inventory, on_hosts=True, out=self.out, pool=self.pool).outcome()

    def act_serve(self, look: Look) -> tuple[str, str]:
        from sparkctl.ops.serve import HostOutcome, ServeReport, serve_locked

        self.reporter.note(f"serving: {look.reason}")
        plan = self.serve_plan
        report = ServeReport(plan, [HostOutcome(h.name, h.rank) for h in plan.hosts])
        serve_locked(plan, self.inventory, report, pool=self.pool, reporter=self.reporter,
                     timeout_s=self.options.health_timeout_s)
        return report.outcome(look.reason)

    def act_smoke(self, look: Look) -> tuple[str, str]:
        """Does the endpoint answer as an application needs (``sparkctl smoke``)?"""
        from sparkctl.config.apikey import api_key_for
        from sparkctl.ops.smoke import run_smoke

        model = (self.native_plan or self.serve_plan).served_model_name
        report = run_smoke(self.endpoint, model=model, api_key=api_key_for(self.profile), engine=self.profile.engine,
                           behind_router=self.profile.replicas > 1)
        return report.outcome(model)

    # -- shared --------------------------------------------------------------------------------------------

    def image_plan(self):
        if self._image_plan is None:
            from sparkctl.images.chain import chain_for_profile
            from sparkctl.images.plan import plan_build

            chain, variant = chain_for_profile(self.profile)
            self._image_plan = plan_build(chain, variant, context=self.options.context)
            if self._image_plan.missing:
                raise self._image_plan.missing_error()
        return self._image_plan

    def build_engine(self):
        """The build host's Docker engine, over this run's SSH connection."""
        import contextlib

        from sparkctl.images.engine import CliEngine

        connection = self.pool.get(self.inventory.ssh_target(self.build_host))
        connection.connect()
        return contextlib.nullcontext(CliEngine(connection))
