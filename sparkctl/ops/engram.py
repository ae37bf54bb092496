"""``pack-engram``: plan which rows go to which host (pure), then cut and ship them.

Plan: config.json -> layout (primes, heads, per-rank rows) -> hosts by rank (``select_hosts``)
-> shard plans (byte ranges of the safetensors files) when the tensors are present.
Execute: the host program and what a host's shards need (``decide``), used by each host's step in
``ops/engram_pack.py`` (``pack``, ``verify``).
"""

from __future__ import annotations

import base64
import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl import engines
from sparkctl.commands.probes import free_space_argv, read_file_argv
from sparkctl.config.profile import select_hosts
from sparkctl.engram.config import load_engram_config, parse_config_text
from sparkctl.engram.hostside import looks_complete as hostside_looks_complete
from sparkctl.engram.layout import EngramConfig, EngramLayout, LayoutError, plan_layout
from sparkctl.engram.safetensors_index import (INDEX_NAME, SINGLE_NAME, collect_tensors, header_from_bytes,
                                               is_engram_tensor, load_tensors)
from sparkctl.engram.shards import ShardPlan, plan_shards
from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.images.relay import relay_zip
from sparkctl.model.agent import MANIFEST_NAME
from sparkctl.model.plan import kept_manifest_problem
from sparkctl.ops.steps import CHANGED, OK, StepFailed  # a report as a step's end (outcome)
from sparkctl.remote.pool import fan_out
from sparkctl.remote.transport import ship_agent


@dataclass
class PackPlan:
    profile: str
    checkpoint: str
    config: EngramConfig
    layout: EngramLayout
    hosts: list  # HostView per rank, rank order
    engram_dir: str
    shards: list[ShardPlan] | None  # None: config only (no tensors to cut)
    shard_layout: str = "tensors"  # "tensors" (vLLM) or packed.LAYOUT (SGLang): see shard_layout_for
    # How the hosts' source files were checked against the planned ones (said in every report).
    source_check: str = "sampled: size, header and 16 x 64 KiB of each source file"
    # host -> what the look that decided this plan's actions found there (``shard_actions``): the pack
    # that follows it in the same run takes it instead of asking the host again (each used once).
    looked: dict = field(default_factory=dict)

    @property
    def tp(self) -> int:
        return self.layout.tp

    def shard(self, layer: int, rank: int) -> ShardPlan | None:
        for s in self.shards or ():
            if s.layer == layer and s.rank == rank:
                return s
        return None

    def shards_of_rank(self, rank: int) -> list[ShardPlan]:
        return [s for s in self.shards or () if s.rank == rank]


def shard_layout_for(profile) -> str:
    """The file layout the profile's engine reads: the SGLang line's row store takes the packed file
    (header, weight and scale side by side per row); vLLM's Engram-on-disk patch the tensors' rows."""
    return engines.get(profile.engine).engram_shard_layout


def layout_for(config: EngramConfig, tp: int) -> EngramLayout:
    try:
        return plan_layout(config, tp)
    except LayoutError as err:
        raise ConfigError(str(err)) from None


def plan_pack(profile, inventory, wanted_hosts: list[str] | None, checkpoint: str) -> tuple[PackPlan, str | None]:
    """The whole pack, without I/O beyond reading config.json and the safetensors headers."""
    config = load_engram_config(checkpoint)
    layout = layout_for(config, profile.tensor_parallel)
    hosts, note = select_hosts(profile, inventory.hosts, wanted_hosts)
    root = str(Path(checkpoint).resolve())
    _check_local_manifest(root, config.layer_ids)
    tensors = load_tensors(root, lambda name: is_engram_tensor(name, config.layer_ids))
    kind = shard_layout_for(profile)
    shards = plan_shards(layout, tensors, root, config.source, kind) if tensors is not None else None
    plan = PackPlan(
        profile=profile.name, checkpoint=str(checkpoint), config=config, layout=layout, hosts=list(hosts),
        engram_dir=inventory.model.paths.engram_dir, shards=shards, shard_layout=kind,
    )
    return plan, note


def plan_pack_on_hosts(profile, inventory, wanted_hosts: list[str] | None, checkpoint: str | None, pool,
                       full_check: bool = False) -> tuple[PackPlan, str | None, dict[str, str]]:
    """``--source on-hosts``: plan from the checkpoint copy on the hosts (config.json, index and
    headers read over SSH, a few KiB), and check that every host's copy is the same one: by size,
    header and sampled bytes, or with ``full_check`` by a sha256 of every Engram tensor byte (each host
    reads its tables once; a byte flipped anywhere in them is found).

    Returns (plan, note, problems) where problems maps a host to why it cannot cut its shards.
    """
    hosts, note = select_hosts(profile, inventory.hosts, wanted_hosts)
    given = checkpoint or inventory.model.paths.model_dir
    root = given.rstrip("/")
    targets = [inventory.ssh_target(h) for h in hosts]
    request = {"root": given, "full": full_check}
    # A full check reads every table byte: allow it an hour per host (sha256 runs at ~1 GB/s).
    described = fan_out(targets, lambda c: _host_json(c, "describe", request, timeout=3600 if full_check else 120),
                        pool=pool)
    problems = {r.name: r.error for r in described if not r.ok}
    problems.update(_kept_manifest_problems(described, root, targets, pool))
    reference = next((r for r in described if r.ok and r.name not in problems), None)
    if reference is None:
        raise OperationFailed("no host could describe its checkpoint copy: " + "; ".join(problems.values()))
    plan = _plan_from_description(profile, inventory, hosts, root, reference, full_check)
    for rank, result in enumerate(described):
        if result.ok and result is not reference and result.name not in problems:
            problem = _copy_problem(plan, rank, result, reference, full_check)
            if problem:
                problems[result.name] = problem
    return plan, note, problems


def _header_identity(path: str, entry: dict):
    """(tensors, identity) of one safetensors file from a host's ``describe`` entry."""
    return header_from_bytes(path, base64.b64decode(entry["prefix"]), base64.b64decode(entry["header"]),
                             entry["size"], entry["sample_sha256"])


def _plan_from_description(profile, inventory, hosts, root: str, reference, full_check: bool) -> PackPlan:
    """The plan, from what the reference host said of its copy (config, index, headers)."""
    desc, where = reference.value, f"{reference.name}:{root}"
    config = parse_config_text(desc["config"], f"{where}/config.json")
    layout = layout_for(config, profile.tensor_parallel)

    def read(path: str):
        entry = desc["headers"].get(path[len(root) + 1:])
        if entry is None:
            return None
        try:
            return _header_identity(path, entry)
        except ConfigError as err:
            raise ConfigError(f"on {reference.name}: {err}") from None

    has_single = desc["index"] is None and SINGLE_NAME in desc["headers"]
    if desc["index"] is None and not has_single:
        raise ConfigError(f"no {INDEX_NAME} or {SINGLE_NAME} in the checkpoint on {reference.name}", file=where)
    tensors = collect_tensors(root, desc["index"], has_single, read, lambda name: is_engram_tensor(name, config.layer_ids))
    kind = shard_layout_for(profile)
    plan = PackPlan(profile=profile.name, checkpoint=root, config=config, layout=layout, hosts=list(hosts),
                    engram_dir=inventory.model.paths.engram_dir,
                    shards=plan_shards(layout, tensors, root, config.source, kind), shard_layout=kind)
    if full_check:
        plan.source_check = (f"full: sha256 of every Engram tensor byte of each host's copy, compared with "
                             f"{reference.name}'s")
        for rel, entry in desc["headers"].items():
            if entry.get("content_error"):
                raise ConfigError(f"on {reference.name}: {entry['content_error']}", file=f"{where}/{rel}")
    return plan


def _copy_problem(plan: PackPlan, rank: int, result, reference, full_check: bool) -> str | None:
    """Why this host's copy is not the reference's for the files its rank cuts from (None: the same)."""
    name, root, other, desc = result.name, plan.checkpoint, result.value, reference.value
    if other["config"] != desc["config"]:
        return f"{name}: {root}/config.json differs from {reference.name}'s"
    for shard in plan.shards_of_rank(rank):
        for rel, want in shard.spec()["sources"].items():
            entry = other["headers"].get(rel)
            got = None
            if entry is not None:
                try:
                    got = _header_identity(rel, entry)[1].identity()
                except ConfigError as err:  # this host's copy is damaged: its problem, the others go on
                    return f"{name}: {root}/{rel}: {err.detail}"
            if full_check and got == want and entry.get("content_sha256") != desc["headers"][rel].get("content_sha256"):
                return (f"{name}: {root}/{rel} has other Engram tensor bytes than {reference.name}'s copy (full check: "
                        f"{entry.get('content_error') or 'sha256 differs'}); copy the same checkpoint to every host")
            if got != want:
                return (f"{name}: {root}/{rel} is missing or differs from {reference.name}'s copy "
                        f"(size, header or sampled contents); copy the same checkpoint to every host")
    return None


def _check_local_manifest(root: str, layer_ids) -> None:
    """A local checkpoint that keeps ``model sync``'s manifest (a host's copy, a hub download): the
    files the tables are cut from must be there, at the sizes it records."""
    try:
        with open(Path(root) / MANIFEST_NAME, encoding="utf-8") as handle:
            kept = json.load(handle)
        with open(Path(root) / INDEX_NAME, encoding="utf-8") as handle:
            weight_map = json.load(handle)["weight_map"]
        files = {f for n, f in weight_map.items() if isinstance(f, str) and is_engram_tensor(n, layer_ids)}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return  # no manifest, or an index the plan names the problem of itself
    sizes = {f: (Path(root, f).stat().st_size if Path(root, f).is_file() else None) for f in files}
    problem = kept_manifest_problem("here", root, kept, sizes)
    if problem:
        raise ConfigError(problem.removeprefix("here: "), file=str(Path(root) / MANIFEST_NAME))


def _kept_manifest_problems(described, root: str, targets, pool) -> dict[str, str]:
    """Hosts whose copy, by the manifest ``model sync`` keeps with it, lacks or holds wrongly a file the
    Engram tables are cut from (left out on purpose, truncated): a clear per-host problem up front."""
    def read_kept(connection):
        result = connection.run(read_file_argv(f"{root.rstrip('/')}/{MANIFEST_NAME}"), timeout=60)
        return json.loads(result.stdout) if result.exit_code == 0 else None

    by_name = {t.name: t for t in targets}
    ok = [r for r in described if r.ok]
    kept = {r.name: r for r in fan_out([by_name[r.name] for r in ok], read_kept, pool=pool)}
    pattern = re.compile(r"(?:^|\.)layers\.\d+\.engram\.")
    problems = {}
    for result in ok:
        found = kept.get(result.name)
        try:
            weight_map = json.loads(result.value.get("index") or "{}").get("weight_map") or {}
        except (ValueError, AttributeError):
            continue  # the plan names a broken index itself
        files = {f for n, f in weight_map.items() if isinstance(f, str) and pattern.search(n)}
        headers = result.value.get("headers") or {}
        sizes = {f: (headers.get(f) or {}).get("size") for f in files}
        problem = kept_manifest_problem(result.name, root.rstrip("/"), found.value if found and found.ok else None, sizes)
        if problem:
            problems[result.name] = problem
    return problems


def layout_json(plan: PackPlan) -> dict:
    """The ``--dry-run --json`` document (its shape is part of the CLI contract)."""
    layers = []
    for layer in plan.layout.layers:
        ranks = []
        for rank, rows in enumerate(layer.ranks):
            shard = plan.shard(layer.layer, rank)
            ranks.append({
                "rank": rank,
                "host": plan.hosts[rank].name,
                "start": rows.start,
                "end": rows.end,
                "bytes": shard.size if shard is not None else None,
            })
        layers.append({"layer": layer.layer, "rows": layer.rows, "heads": list(layer.heads), "ranks": ranks})
    return {"tp": plan.tp, "shard_layout": plan.shard_layout, "layers": layers}


def human_bytes(n: int | None) -> str:
    if n is None:
        return "-"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n} B"


def format_layout(plan: PackPlan) -> str:
    lines = [f"Engram layout for TP{plan.tp} ({plan.checkpoint}), shards go to {plan.engram_dir} on each host"]
    if plan.shard_layout != "tensors":
        lines.append("shard files: SGLang packed (a 4096-byte header, then each row's weight and scale bytes side by side)")
    for layer in plan.layout.layers:
        per_rank = layer.ranks[0].end_head - layer.ranks[0].first_head
        lines.append(f"layer {layer.layer}: {layer.rows} rows, {len(layer.heads)} hash heads, {per_rank} per rank")
        for rank, rows in enumerate(layer.ranks):
            shard = plan.shard(layer.layer, rank)
            lines.append(
                f"  rank {rank}  {plan.hosts[rank].name:<16} rows [{rows.start}, {rows.end})  "
                f"heads [{rows.first_head}, {rows.end_head})  {human_bytes(shard.size if shard else None)}"
            )
    if plan.shards is None:
        lines.append("(config only: no safetensors in the checkpoint directory, so no byte sizes)")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------
# Execute: probe every host, check space on all of them, then write (push) or cut (on-hosts).

SKIP, WRITE, RESUME, REPLACE = "skip", "write", "resume", "replace"
# What a shard's action becomes in the report once done.
_DONE = {WRITE: "written", RESUME: "resumed", REPLACE: "replaced", SKIP: "skipped"}

# What the host program's zip carries: it and the guard that ends it when pack-engram is gone.
HOST_MODULES = ("sparkctl.engram.hostside", "sparkctl.images.orphan")
_HOST_PROGRAM: bytes | None = None


def host_program() -> bytes:
    """``sparkctl.engram.hostside`` as a zip application: what a host runs with its own python3."""
    global _HOST_PROGRAM
    if _HOST_PROGRAM is None:
        _HOST_PROGRAM = relay_zip(HOST_MODULES, "sparkctl.engram.hostside")
    return _HOST_PROGRAM


def _run_host(conn, op: str, *args: str, stdin: bytes | None = None, chunks=None, timeout: float | None = 120,
              on_progress=None):
    """Run one operation of the host program on ``conn``'s host: shipped (``ship_agent``) into a new
    temporary folder for this run, which the program removes itself when it ends, or when the channel
    back to pack-engram closes (``hostside.main``), so a killed pack leaves nothing in /tmp. ``chunks``:
    stream them to its stdin instead of ``stdin``."""
    agent = ship_agent(conn, host_program(), prefix="sparkctl-engram", name="engram.pyz")
    argv = agent.argv([op, *args])
    if chunks is not None:
        result = conn.run_stream_in(argv, chunks, timeout=timeout, on_progress=on_progress)
    else:
        result = conn.run(argv, stdin=stdin, timeout=timeout)
    if result.exit_code == 127:  # no python3 there: nothing ran to remove the folder
        agent.remove()
    return result


def _host_json(conn, op: str, request: dict, *, timeout: float | None = 120) -> dict:
    """Run ``op`` with ``request`` on its stdin and read the one JSON document it prints."""
    result = _check(_run_host(conn, op, stdin=json.dumps(request).encode(), timeout=timeout), op)
    try:
        return json.loads(result.stdout)
    except ValueError:
        raise _RemoteFailure(f"{op}: unreadable answer {result.stdout[:200]!r}") from None


def parse_df_avail(stdout: str) -> int:
    lines = [line.strip() for line in stdout.splitlines() if line.strip()]
    try:
        return int(lines[-1])
    except (IndexError, ValueError):
        raise ValueError(f"unexpected df output: {stdout.strip()[:200]!r}") from None


@dataclass
class ShardAction:
    shard: ShardPlan
    action: str  # skip | write | resume | replace
    offset: int = 0  # resume: bytes already on the host
    reason: str = ""

    @property
    def bytes_needed(self) -> int:
        return 0 if self.action == SKIP else self.shard.size - self.offset


def looks_complete(shard: ShardPlan, entry: dict | None) -> bool:
    """A manifest for this exact spec next to a file of the planned size (the manifest is written
    only after the file was hashed, fsynced and renamed)."""
    return hostside_looks_complete(shard.spec(), entry)


def decide(shard: ShardPlan, entry: dict | None, *, can_resume: bool = True) -> ShardAction:
    """What to do with one shard given what the host has (``probe`` output, plus ``verified``:
    the host re-hashed a complete-looking shard against its manifest). Pure.

    Skipped only when complete *and* verified. An interrupted write resumes where it stopped when
    its partial belongs to the same spec; anything else is rewritten.
    """
    spec = shard.spec()
    entry = entry or {}
    if looks_complete(shard, entry):
        if entry.get("verified") is True:
            return ShardAction(shard, SKIP, reason="complete and verified")
        return ShardAction(shard, REPLACE, reason="complete but " + (entry.get("verify_detail") or "not verified"))
    partial = entry.get("partial")
    if can_resume and partial and entry.get("partial_spec") == spec and partial <= shard.size:
        return ShardAction(shard, RESUME, offset=partial, reason=f"interrupted at byte {partial}")
    if entry.get("final") is not None or entry.get("manifest") is not None:
        return ShardAction(shard, REPLACE, reason="present but from another plan or incomplete")
    return ShardAction(shard, WRITE, reason="absent")


@dataclass
class HostOutcome:
    host: str
    rank: int
    ok: bool
    error: str | None = None
    cause: str | None = None
    avail: int | None = None
    needed: int | None = None
    xxhash: bool | None = None
    shards: list[dict] | None = None

    def to_json(self) -> dict:
        return {"host": self.host, "rank": self.rank, "ok": self.ok, "error": self.error, "cause": self.cause,
                "free_bytes": self.avail, "needed_bytes": self.needed, "host_has_xxhash": self.xxhash,
                "shards": self.shards or []}


@dataclass
class PackReport:
    mode: str  # push | on-hosts | verify
    tp: int
    engram_dir: str
    hosts: list[HostOutcome]
    stage: str  # probe / space: refused before writing; write: a host failed while writing; done
    seconds: float = 0.0
    source_check: str | None = None  # how the source files were checked (on-hosts), see PackPlan

    @property
    def ok(self) -> bool:
        return all(h.ok for h in self.hosts)

    def outcome(self) -> tuple[str, str]:
        """As a step's end: ok (every shard verified), changed (shards written), or StepFailed."""
        if not self.ok:
            raise StepFailed("; ".join(h.error or f"{h.host}: failed" for h in self.hosts if not h.ok))
        written = [(h.host, sum(1 for s in h.shards or [] if s.get("action") != "skipped")) for h in self.hosts]
        count, shards = sum(n for _, n in written), sum(len(h.shards or []) for h in self.hosts)
        if not count:
            return OK, f"{shards} shard(s) present and verified on {len(self.hosts)} host(s)"
        return CHANGED, f"wrote {count} of {shards} shard(s) (" + ", ".join(f"{host}: {n}" for host, n in written) + ")"

    def to_json(self) -> dict:
        return {"ok": self.ok, "mode": self.mode, "tp": self.tp, "engram_dir": self.engram_dir, "stage": self.stage,
                "seconds": round(self.seconds, 3), "source_check": self.source_check,
                "hosts": [h.to_json() for h in self.hosts]}


class _RemoteFailure(RuntimeError):  # a host-side failure: a step's one-line reason
    def __init__(self, message: str, code: int | None = None):
        super().__init__(message)
        self.code = code


def _check(result, what: str):
    if result.exit_code == 127:
        raise _RemoteFailure(f"{what}: python3 (or sh/df) not found on the host; pack-engram needs python3 there", 127)
    if not result.ok:
        detail = " ".join(result.stderr.split())[-400:] or f"exit {result.exit_code}"
        raise _RemoteFailure(f"{what}: {detail}", result.exit_code)
    return result


# How long a look may take: a few seconds of listing, then, for the shards that look complete, a re-hash
# (sha256 runs at ~1 GB/s; allowed 10 MB/s, a slow disk's pace).
LOOK_TIMEOUT_S = 120
REHASH_BYTES_PER_S = 10e6


def free_space(conn, engram_dir: str) -> int:
    """Bytes free in the engram dir now (one df): a df that fails or says nothing readable raises,
    never counts as room."""
    result = _check(conn.run(free_space_argv(engram_dir), timeout=60), f"df of {engram_dir}")
    try:
        return parse_df_avail(result.stdout)
    except ValueError as err:
        raise _RemoteFailure(f"df of {engram_dir}: {err}") from None


def _probe(conn, engram_dir: str, shards: list[ShardPlan]) -> dict:
    """Free space, what is in the engram dir, and a re-hash of every shard that looks complete
    (so a corrupted one is rewritten, never skipped): the listing and the re-hash are one run of the
    host program (``probe`` with ``verify``), not one each."""
    avail = free_space(conn, engram_dir)
    timeout = LOOK_TIMEOUT_S + sum(s.size for s in shards) / REHASH_BYTES_PER_S
    state = _host_json(conn, "probe", {"dest": engram_dir, "names": [s.name for s in shards],
                                       "verify": [s.spec() for s in shards]}, timeout=timeout)
    state["avail"] = avail
    for entry in state.pop("verified", []):
        if entry["file"] in state["shards"]:
            state["shards"][entry["file"]]["verified"] = entry["status"] == "ok"
            state["shards"][entry["file"]]["verify_detail"] = f"{entry['status']}: {entry['detail']}"
    return state


def _probe_all(plan: PackPlan, inventory, pool) -> list:
    """``_probe`` on every host of the plan, each for its rank's shards (one HostResult per host)."""
    ranks = {h.name: r for r, h in enumerate(plan.hosts)}
    return fan_out([inventory.ssh_target(h) for h in plan.hosts],
                   lambda c: _probe(c, plan.engram_dir, plan.shards_of_rank(ranks[c.target.name])), pool=pool)


def format_report(report: PackReport) -> str:
    lines = []
    title = {"push": "pack-engram", "on-hosts": "pack-engram --source on-hosts", "verify": "pack-engram --verify"}[report.mode]
    lines.append(f"{title}: TP{report.tp}, {report.engram_dir} ({report.seconds:.1f} s)")
    if report.source_check:
        lines.append(f"  source check: {report.source_check}")
    for host in report.hosts:
        state = "ok" if host.ok else "FAILED"
        extra = ""
        if host.avail is not None and report.mode != "verify":
            extra = f"  needs {human_bytes(host.needed)} of {human_bytes(host.avail)} free"
        lines.append(f"  rank {host.rank}  {host.host:<16} {state}{extra}")
        for shard in host.shards or []:
            if report.mode == "verify":
                algos = "+".join(shard.get("algorithms") or []) or "-"
                detail = f"  {shard['detail']}" if shard.get("detail") else ""
                lines.append(f"      {shard['file']:<24} {shard['status']:<10} {algos}{detail}")
            else:
                resumed = f" from byte {shard['resumed_from']}" if shard.get("resumed_from") else ""
                lines.append(f"      {shard['file']:<24} {shard['action']:<9} {human_bytes(shard.get('bytes'))}{resumed}")
        if host.error:
            lines.append(f"      error: {host.error}")
    if report.stage == "space":
        lines.append("nothing was written: free space on the hosts above first")
    elif report.stage == "probe":
        lines.append("nothing was written: some hosts could not be checked")
    return "\n".join(lines)


def shard_actions(plan: PackPlan, inventory, *, pool) -> dict[str, list[ShardAction]]:
    """What ``pack`` would do on each host (host -> one action per shard of its rank), writing nothing:
    the same probe and re-hash it starts with. Raises RuntimeError naming the hosts that could not be asked."""
    ranks = {h.name: r for r, h in enumerate(plan.hosts)}
    results = _probe_all(plan, inventory, pool)
    failed = [f"{r.name}: {r.error}" for r in results if not r.ok]
    if failed:
        raise RuntimeError("cannot look at the Engram shards on " + "; ".join(failed))
    plan.looked = {r.name: r.value for r in results}
    return {r.name: [decide(s, r.value["shards"].get(s.name), can_resume=False) for s in plan.shards_of_rank(ranks[r.name])]
            for r in results}
