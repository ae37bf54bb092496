"""``sparkctl up``: converge the cluster to a profile, step by step, each step skipped when already true.

The steps compose what the other verbs already do, in order:

1. **doctor**: every host's checks (``ops/doctor``); a failure stops ``up`` with its hints, except
   what a later step fixes (the image missing; the checkpoint, with ``--model-source``; the ports and
   memory the profile's own running engine holds, which the serve replaces).
2. **checkpoint**: with ``--model-source`` (a hub repo or a folder), the checkpoint present and
   verified on every host (``ops/model_sync``: each file hashed against the source's manifest; only
   what a host lacks or holds wrongly is sent; each host's ``copy`` told as a step of its own). Without it, skipped: doctor checked each copy's files
   and sizes.
3. **build**: the profile's image chain on the build host (``--build-on``, else the inventory's head),
   only when a layer's inputs changed (``ops/build.stale_layers``); unchanged layers are reused.
4. **distribute**: the build host's image to every host whose tag names another image ID (thin:
   only the layers a host lacks, so a changed patch file sends only the patch layer).
5. **engram**: with ``engram.mode: disk``, every rank's shards present and verified on its host
   (``ops/engram_pack``; each host's ``shards`` step cuts what is missing from its own checkpoint).
6. **serve**: only when the deployment is not running as the profile renders now (a container
   down, drift in image, arguments, environment or docker options, other hosts, endpoint down).
7. **smoke**: the endpoint answers the way an application uses it.

Before acting, ``up`` looks (read-only) and prints its plan: which steps will act and why;
``--dry-run`` stops there. The run holds the deploy lock (``ops/lock``) throughout, and each step
looks again before it acts, so a failed ``up`` run again continues from what is already true.
Each step ends ``ok`` (already true, nothing done), ``changed`` (it acted), ``skipped`` or ``failed``
(the step protocol of ``ops/steps.py``). The profile's launcher (``sparkctl/launchers/``) supplies
the image and serve steps: containers' in ``ops/docker_up.py`` (the replicas' in ``ops/replica_up.py``),
a host process's in ``ops/native_up.py`` (the single box: no image steps).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Optional

from sparkctl import launchers
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

        self.inventory, self.options, self.pool, self.out = inventory, options, pool, out
        self.reporter = reporter or Reporter()  # every step's look, start and end; the document is built from it
        self.become = None  # ops.become.Become for the setup step (None: sudo -n)
        self.loaded = load_profile(profile_name, sets=options.sets, envs=options.envs)
        self.profile = self.loaded.profile
        # the launcher's own plans: containers (serve_plan; replica_plan with replicas) or a host process (native_plan)
        self.serve_plan = self.replica_plan = self.replica_report = self.native_plan = None
        self.image_build_plan = None  # the image chain's build plan (the docker launcher's), made on first use
        self.launcher = launchers.of(self.profile)
        self.serving = self.launcher.plan_up(self)
        self.hosts = inventory.pick(self.serving.hosts)
        self.endpoint = self.serving.endpoint
        self.build_host = self._build_host()
        self.steps = StepRun(self.compose(), self, self.reporter)
        self.report = UpReport(self.profile.name, self.steps.records(), endpoint=self.endpoint)

    def compose(self) -> list[Step]:
        """up's steps, in order; the launcher supplies its image steps and its serve step."""
        from sparkctl.ops import up_setup

        image, serve = self.launcher.up_steps(self)
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
        engine_running = self.launcher.engine_running(self)
        # what a later step fixes: the image (build, distribute), the checkpoint (with --model-source),
        # the ports and memory the profile's own running engine holds (the serve replaces it)
        return report.outcome(lambda check: check.id == "image" or (check.id == "checkpoint" and bool(self.options.model_source))
                              or (check.id in ("ports", "memory") and engine_running))

    def act_checkpoint(self, look: Look) -> tuple[str, str]:
        return self.sync_checkpoint(dry_run=False).outcome()

    def act_smoke(self, look: Look) -> tuple[str, str]:
        """Does the endpoint answer as an application needs (``sparkctl smoke``)?"""
        from sparkctl.config.apikey import api_key_for
        from sparkctl.ops.smoke import run_smoke

        model = self.serving.served_model_name
        report = run_smoke(self.endpoint, model=model, api_key=api_key_for(self.profile), engine=self.profile.engine,
                           behind_router=self.profile.replicas > 1)
        return report.outcome(model)

    # -- shared --------------------------------------------------------------------------------------------

