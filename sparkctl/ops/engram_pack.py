"""pack-engram's execution: each host's shards a step of the one runner (``ops/steps.py``).

Each host's ``shards`` step looks first, on every host at once (``ops/host_steps.HostSteps``): the
free space, what its engram dir holds, and a re-hash of every shard that looks complete; the look
says what it will write and why (``ok`` when every shard is there and verified). A host that cannot
be looked at, or lacks room, stops the pack before anything is written anywhere: the other hosts'
steps end ``skipped``, saying which host stopped it. Then every host acts at once: its shards cut
there (``--source on-hosts``) or streamed to it, each host's bytes told to one ``Transfer``.
``--verify`` is a step that only looks (``verify``): each shard re-hashed on its host.

The document (``PackReport``) is what the steps found and did, host by host, as before.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Optional

from sparkctl.engram import hostside
from sparkctl.engram.shards import ShardStream
from sparkctl.errors import ConfigError
from sparkctl.ops.engram import (_DONE, REPLACE, SKIP, HostOutcome, PackPlan, PackReport, ShardAction, _check,
                                 _host_json, _probe, _run_host, decide, free_space, human_bytes)
from sparkctl.ops.host_steps import HostSteps
from sparkctl.ops.steps import CHANGED, OK, Look, Step, StepFailed
from sparkctl.output import Output
from sparkctl.remote.result import RemoteError
from sparkctl.transfer import Transfer

SHARDS, VERIFY = "shards", "verify"  # each host's one step: write its rank's shards / re-hash them


@dataclass
class HostPack:
    """One host's step context: the plan, its outcome (the document's row, filled by the step), what
    was found wrong with its checkpoint copy, its connection, its shards' actions, the transfer."""

    plan: PackPlan
    outcome: HostOutcome
    on_hosts: bool = False
    problem: Optional[str] = None
    conn: object = None
    actions: list[ShardAction] = field(default_factory=list)
    progress: Optional[Transfer] = None

    @property
    def name(self) -> str:
        return self.outcome.host


def _fails(hp: HostPack, error: str, cause: Optional[str]) -> StepFailed:
    """The host's row failed with ``error`` (as the document says it); the step's reason without the host's name."""
    hp.outcome.ok, hp.outcome.error, hp.outcome.cause = False, error, cause
    return StepFailed(error.removeprefix(f"{hp.name}: "))


def _remote(hp: HostPack, work):
    """``work()``; a host lost on the way keeps its cause (refused, timeout, ...) in the row."""
    try:
        return work()
    except RemoteError as err:
        hp.outcome.cause = err.cause
        raise


def _kept_look(hp: HostPack) -> Optional[dict]:
    """The look that made the plan's actions (``PackPlan.looked``), its free space read again: the shards
    it re-hashed are as they were, but the steps between (an image loaded, layers built on the same disk)
    may have used the room it saw. None when there is none: the pack looks itself."""
    kept = hp.plan.looked.pop(hp.name, None)
    if kept is None:
        return None
    return {**kept, "avail": _remote(hp, lambda: free_space(hp.conn, hp.plan.engram_dir))}


def look_shards(hp: HostPack) -> Look:
    """What the host holds of its rank's shards, re-hashed (or what the look that made the plan's actions
    found, in the same run: ``PackPlan.looked``); refused when its copy or its room is wrong."""
    if hp.problem:
        raise _fails(hp, hp.problem, "checkpoint")
    mine = hp.plan.shards_of_rank(hp.outcome.rank)
    state = _kept_look(hp) or _remote(hp, lambda: _probe(hp.conn, hp.plan.engram_dir, mine))
    hp.actions = [decide(s, state["shards"].get(s.name), can_resume=not hp.on_hosts) for s in mine]
    needed = sum(a.bytes_needed for a in hp.actions)
    out = hp.outcome
    out.avail, out.needed, out.xxhash = state["avail"], needed, state["xxhash"]
    out.shards = [{"file": a.shard.name, "action": a.action, "bytes": a.bytes_needed, "resumed_from": a.offset,
                   "reason": a.reason} for a in hp.actions]
    if needed > state["avail"]:
        raise _fails(hp, f"{hp.name}: not enough free space in {hp.plan.engram_dir}: {human_bytes(needed)} to write, "
                         f"{human_bytes(state['avail'])} free", "space")
    todo = [a for a in hp.actions if a.action != SKIP]
    if not todo:
        return Look(False, f"{len(hp.actions)} shard(s) present and verified")
    return Look(True, f"{'cut' if hp.on_hosts else 'write'} {len(todo)} of {len(hp.actions)} shard(s) "
                      f"({human_bytes(needed)}): " + ", ".join(f"{a.shard.name} ({a.reason})" for a in todo))


def act_shards(hp: HostPack, look: Look) -> tuple[str, str]:
    """Write what the look found missing; the row lists every shard, the skipped ones first."""
    done = _remote(hp, lambda: _write_host(hp, hp.actions, hp.progress))  # a failure: the row says it (_settle)
    order = {a.shard.name: i for i, a in enumerate(hp.actions)}
    hp.outcome.shards = sorted(done, key=lambda e: order[e["file"]])
    written = [e for e in done if e["action"] != "skipped"]
    return CHANGED, (f"{'cut' if hp.on_hosts else 'wrote'} {len(written)} of {len(done)} shard(s), "
                     f"{human_bytes(sum(e['bytes'] for e in written))}")


def _named(host: str, text: str) -> str:
    return text if text.startswith(f"{host}:") else f"{host}: {text}"


def _never_acts(hp: HostPack, look: Look) -> tuple[str, str]:
    raise AssertionError("verify only looks")  # its look never says act


def look_verify(hp: HostPack) -> Look:
    """Every shard of the host's rank re-hashed there: ok, or failed naming each bad shard."""
    mine = hp.plan.shards_of_rank(hp.outcome.rank)
    answer = _remote(hp, lambda: _host_json(hp.conn, "verify", {"dest": hp.plan.engram_dir,
                                                               "specs": [s.spec() for s in mine]}, timeout=None))
    out = hp.outcome
    out.xxhash, out.shards = answer["xxhash"], answer["shards"]
    bad = [s for s in out.shards if s["status"] != "ok"]
    if bad:
        out.ok = False
        out.error = "; ".join(f"{s['file']}: {s['status']}" + (f" ({s['detail']})" if s["detail"] else "") for s in bad)
        raise StepFailed(out.error)
    return Look(False, f"{len(out.shards)} shard(s) verified ({'xxh3-128' if out.xxhash else 'sha256'})")


def _host_steps(plan: PackPlan, inventory, step: Step, reporter, pool, **context) -> tuple[list[HostPack], HostSteps]:
    packs = [HostPack(plan, HostOutcome(h.name, rank, True), **context) for rank, h in enumerate(plan.hosts)]
    steps = HostSteps([step], {hp.name: hp for hp in packs}, {h.name: inventory.ssh_target(h) for h in plan.hosts},
                      reporter, pool=pool)
    return packs, steps


def _settle(packs: list[HostPack], steps: HostSteps, name: str) -> list[HostOutcome]:
    """Each host's row; a step that failed without filling it (a connection lost) fills it now."""
    for hp in packs:
        status, reason = steps.status(hp.name, name)
        if status == "failed" and hp.outcome.ok:
            hp.outcome.ok, hp.outcome.error = False, _named(hp.name, reason)
            hp.outcome.cause = hp.outcome.cause or steps.causes.get(hp.name)
    return [hp.outcome for hp in packs]


def pack(plan: PackPlan, inventory, *, pool, on_hosts: bool = False, out=None,
         problems: dict[str, str] | None = None) -> PackReport:
    """Every host's ``shards`` step: all looks, nothing written unless every host can take its shards,
    then all acts (over the run's ``pool``: the CLI's connections, or ``up``'s)."""
    if not plan.shards:
        raise ConfigError("the checkpoint has no safetensors files: nothing to pack (only --dry-run works on a config-only folder)",
                          file=plan.checkpoint)
    out = out or Output()
    started = time.monotonic()
    mode, source_check = ("on-hosts", plan.source_check) if on_hosts else ("push", None)
    packs, steps = _host_steps(plan, inventory, Step(SHARDS, look_shards, act_shards), out.reporter, pool,
                               on_hosts=on_hosts)
    for hp in packs:
        hp.problem = (problems or {}).get(hp.name)
    steps.look()
    rows = _settle(packs, steps, SHARDS)
    if not all(o.ok for o in rows):
        stage = "space" if all(o.cause == "space" or o.ok for o in rows) else "probe"
        steps.stop(f"not run: nothing is written while {', '.join(o.host for o in rows if not o.ok)} cannot take its shards")
        return PackReport(mode, plan.tp, plan.engram_dir, rows, stage, time.monotonic() - started, source_check)
    progress = Transfer(out.reporter, {hp.name: sum(a.bytes_needed for a in hp.actions) for hp in packs})
    for hp in packs:
        hp.progress = progress
    try:
        steps.act()
    finally:
        progress.close()
    for hp in packs:  # a host with nothing to write did not act: its row says its shards were skipped
        if steps.status(hp.name, SHARDS)[0] == OK:
            hp.outcome.shards = _skipped(hp.actions)
    rows = _settle(packs, steps, SHARDS)
    stage = "done" if all(o.ok for o in rows) else "write"
    return PackReport(mode, plan.tp, plan.engram_dir, rows, stage, time.monotonic() - started, source_check)


def verify(plan: PackPlan, inventory, *, pool, out=None) -> PackReport:
    """Every host's ``verify`` step: its shards re-hashed (xxh3-128 where the host has xxhash, else sha256)."""
    if not plan.shards:
        raise ConfigError("the checkpoint has no safetensors files: --verify needs them to know what each shard should be",
                          file=plan.checkpoint)
    started = time.monotonic()
    packs, steps = _host_steps(plan, inventory, Step(VERIFY, look_verify, _never_acts), (out or Output()).reporter, pool)
    steps.look()
    return PackReport("verify", plan.tp, plan.engram_dir, _settle(packs, steps, VERIFY), "done", time.monotonic() - started)


# ---------------------------------------------------------------------------------------------- the writes


def _shard_line(host: str, entry: dict) -> str:
    mib = entry.get("bytes", 0) / 2**20
    rate = mib / entry["seconds"] if entry.get("seconds") else 0.0
    return f"{host}: {entry['file']} {entry['action']} ({mib:.1f} MiB, {entry.get('seconds', 0):.1f} s, {rate:.0f} MiB/s)"


def _push_shard(hp: HostPack, action: ShardAction, progress: Transfer) -> dict:
    """Send one shard to the host's receiver; a resume whose hash does not match restarts once."""
    host, conn = hp.name, hp.conn
    spec_json = json.dumps(action.shard.spec(), separators=(",", ":"))
    offset, kind, attempts = action.offset, action.action, 0
    while True:
        attempts += 1
        stream = ShardStream(action.shard, offset, sha256=not hp.outcome.xxhash)
        last = [0]

        def on_progress(sent: int) -> None:
            progress.advance(host, min(sent, action.shard.size - offset) - last[0])
            last[0] = min(sent, action.shard.size - offset)

        result = _run_host(conn, "receive", hp.plan.engram_dir, spec_json, str(offset), chunks=stream, timeout=None,
                           on_progress=on_progress)
        if result.ok:
            answer = json.loads(result.stdout)
            return {"file": action.shard.name, "action": _DONE[kind], "bytes": answer["bytes"],
                    "resumed_from": offset, "seconds": round(result.seconds, 3), "xxh3_128": answer["xxh3_128"]}
        if offset and attempts == 1 and result.exit_code in (hostside.EXIT_MISMATCH, hostside.EXIT_BAD_OFFSET):
            # The partial on the host was not a prefix of this shard: restart from byte 0.
            progress.advance(host, -last[0])
            offset, kind = 0, REPLACE
            continue
        _check(result, f"writing {action.shard.name}")


def _cut_on_host(hp: HostPack, actions: list[ShardAction], progress: Transfer) -> list[dict]:
    todo = [a for a in actions if a.action != SKIP]
    if not todo:
        return []
    answer = _host_json(hp.conn, "cut", {"root": hp.plan.checkpoint, "dest": hp.plan.engram_dir,
                                         "specs": [a.shard.spec() for a in todo]}, timeout=None)
    done = []
    for action, shard in zip(todo, answer["shards"]):
        progress.advance(hp.name, shard["bytes"])
        done.append({"file": shard["file"], "action": _DONE[action.action], "bytes": shard["bytes"], "resumed_from": 0,
                     "seconds": round(shard["seconds"], 3), "xxh3_128": shard["xxh3_128"]})
    return done


def _skipped(actions: list[ShardAction]) -> list[dict]:
    """The document's rows of the shards left as they were (complete and verified)."""
    return [{"file": a.shard.name, "action": "skipped", "bytes": 0, "resumed_from": 0, "seconds": 0.0,
             "xxh3_128": None} for a in actions if a.action == SKIP]


def _write_host(hp: HostPack, actions: list[ShardAction], progress: Transfer) -> list[dict]:
    """One host's shards: cut there (on-hosts) or pushed one by one; the skipped ones listed first."""
    done = _skipped(actions)
    if hp.on_hosts:
        entries = _cut_on_host(hp, actions, progress)
        for entry in entries:
            progress.note(_shard_line(hp.name, entry))
        return done + entries
    for action in actions:
        if action.action != SKIP:
            entry = _push_shard(hp, action, progress)
            progress.note(_shard_line(hp.name, entry))
            done.append(entry)
    return done
