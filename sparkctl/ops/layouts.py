"""``plan --compare``: the layouts a rack allows for a profile, each with its memory plan and what was measured.

A layout is a list of groups (replicas), each of ``tensor_parallel`` hosts: TP8, 2 x TP4, TP4 +
TP3 ... on eight hosts. Listed: every equal split (N x TPk, N = hosts // k) and every pair of
unequal groups that leaves less than a group's worth of hosts idle, each with the profile's memory
plan at that TP (``ops/plan.plan_memory``: does one rank fit, how many KV tokens per replica).
Measured throughput comes from ``recipes/measured/layouts.yaml`` (the sources' tables, cited
there), matched by engine and layout. Which load each suits follows the SGLang line's finding
("TP8 or 2 x TP4?"): the largest group answers one request fastest; more replicas hold more
requests at once (slots and KV pool add up) and prefill more prompts at once. Pure, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from sparkctl.config.yamlfile import load_yaml_file
from sparkctl.ops.plan import plan_memory
from sparkctl.resources import recipes_dir


@dataclass
class Layout:
    groups: tuple[int, ...]  # tensor_parallel of each replica, largest first
    plans: dict[int, object]  # tp -> ops.plan.MemoryPlan
    measured: list[dict] = field(default_factory=list)
    suits: str = ""

    @property
    def name(self) -> str:
        sizes = sorted(set(self.groups), reverse=True)
        if len(sizes) == 1:
            return f"TP{sizes[0]}" if len(self.groups) == 1 else f"{len(self.groups)} x TP{sizes[0]}"
        return " + ".join(f"TP{g}" for g in self.groups)

    @property
    def fits(self) -> bool:
        return all(self.plans[g].fits for g in set(self.groups))

    @property
    def servable_as(self) -> Optional[str]:
        """The --set that serves it as one profile (replicas are equal-sized), or None."""
        if len(set(self.groups)) != 1:
            return None
        return f"--set tensor_parallel={self.groups[0]} --set replicas={len(self.groups)}"

    def slots(self, max_num_seqs: int) -> int:
        return max_num_seqs * len(self.groups)

    def kv_tokens(self) -> int:
        return sum(self.plans[g].kv_tokens for g in self.groups) if self.fits else 0

    def to_json(self, max_num_seqs: int) -> dict:
        return {"layout": self.name, "groups": list(self.groups), "hosts": sum(self.groups), "fits": self.fits,
                "servable_as": self.servable_as, "slots": self.slots(max_num_seqs), "kv_tokens_total": self.kv_tokens(),
                "memory": {f"TP{g}": _plan_summary(self.plans[g]) for g in sorted(set(self.groups), reverse=True)},
                "measured": self.measured, "suits": self.suits}


def _plan_summary(plan) -> dict:
    doc = plan.to_json()
    return {"fits": doc["fits"], "used_gb": doc["used_gb"], "budget_gb": doc["budget_gb"],
            "kv_tokens": doc["kv_tokens"], "breaks": doc["breaks"]}


def candidate_groups(hosts: int) -> list[tuple[int, ...]]:
    """Equal splits for every TP (one group only when it takes every host), then unequal pairs that
    leave fewer idle hosts than the smaller group."""
    out = [tuple([k] * (hosts // k)) for k in range(hosts, 0, -1) if hosts // k > 1 or k == hosts]
    for a in range(hosts - 1, 1, -1):
        for b in range(a - 1, 0, -1):
            if a + b <= hosts and hosts - (a + b) < b:
                out.append((a, b))
    return out


def load_measured(path=None) -> list[dict]:
    doc = load_yaml_file(path or recipes_dir() / "measured" / "layouts.yaml").data
    return doc if isinstance(doc, list) else []


def aggregate(entry: dict) -> dict[int, float]:
    """Aggregate output tok/s by total concurrency: as measured, or per-request x C."""
    if entry.get("aggregate"):
        return {int(c): float(v) for c, v in entry["aggregate"].items()}
    return {int(c): round(float(v) * int(c), 2) for c, v in (entry.get("per_request") or {}).items()}


def measured_for(groups: tuple[int, ...], engine: str, table: list[dict]) -> list[dict]:
    if len(set(groups)) != 1:
        return []
    out, n = [], len(groups)
    for entry in table:
        shape = entry.get("layout") or {}
        if entry.get("engine") != engine or shape.get("tensor_parallel") != groups[0]:
            continue
        if shape.get("replicas") == n:
            out.append({"source": entry.get("source"), "aggregate_tok_s": aggregate(entry),
                        "prefill_8x32k_tok_s": entry.get("prefill_8x32k_tok_s"), "predicted": False})
        elif shape.get("replicas") == 1 and n > 1:  # N replicas at N x C = N x one replica at C (a router spreads it)
            predicted = {c * n: round(v * n, 2) for c, v in aggregate(entry).items()}
            out.append({"source": f"predicted: {n} x one replica at C/{n}, from {entry.get('source')}",
                        "aggregate_tok_s": predicted, "prefill_8x32k_tok_s": None, "predicted": True})
    return out


def _suits(layout: Layout, fitting: list[Layout]) -> str:
    if not layout.fits:
        plan = next(layout.plans[g] for g in layout.groups if not layout.plans[g].fits)
        term = plan.breaking_term.name if plan.breaking_term else "memory"
        if term == "weights":
            return f"does not fit: the weights alone exceed a rank's memory at TP{plan.tensor_parallel}"
        return (f"does not fit at TP{plan.tensor_parallel} ({term} breaks it); lower max_model_len or use "
                "larger groups")
    biggest = max(max(lay.groups) for lay in fitting)
    most = max(len(lay.groups) for lay in fitting)
    notes = []
    if max(layout.groups) == biggest:
        notes.append("one user at a time: the largest group answers a request fastest")
    if len(layout.groups) == most and most > 1:
        notes.append(f"many concurrent users and prefills: {len(layout.groups)} x the slots and KV pool, "
                     "prompts prefilled side by side")
    if len(set(layout.groups)) > 1:
        notes.append("uneven replicas: not one profile (replicas are equal); round_robin gives each the same "
                     "share, power_of_two balances by load")
    if not notes:
        notes.append("between the two: fewer, larger groups trade slots for speed per request")
    return "; ".join(notes)


def compare_layouts(profile, hosts: int, table: list[dict] | None = None) -> list[Layout]:
    table = load_measured() if table is None else table
    plans = {tp: plan_memory(profile.model_copy(update={"tensor_parallel": tp})) for tp in range(1, hosts + 1)}
    layouts = [Layout(groups, plans) for groups in candidate_groups(hosts)]
    fitting = [lay for lay in layouts if lay.fits]
    shown = fitting + [lay for lay in layouts if not lay.fits and sum(lay.groups) == hosts
                       and len(set(lay.groups)) == 1]  # an even split that does not fit: say why
    for layout in shown:
        layout.measured = measured_for(layout.groups, profile.engine, table)
        layout.suits = _suits(layout, fitting or shown)
    return shown


def format_compare(profile_name: str, hosts: int, layouts: list[Layout], max_num_seqs: int) -> str:
    lines = [f"layouts of {profile_name} on {hosts} hosts (memory plan per rank at each TP; slots = "
             f"max_num_seqs x replicas)"]
    for layout in layouts:
        doc = layout.to_json(max_num_seqs)
        memory = "; ".join(f"{tp}: {'fits' if m['fits'] else 'does NOT fit'}, {m['kv_tokens']:,} KV tokens/replica"
                           for tp, m in doc["memory"].items())
        lines.append(f"{doc['layout']:<12} hosts {doc['hosts']}, slots {doc['slots']}, {memory}")
        for measured in doc["measured"]:
            cells = "  ".join(f"c{c} {v:g}" for c, v in sorted(measured["aggregate_tok_s"].items()))
            kind = "predicted" if measured.get("predicted") else "measured"
            lines.append(f"  {kind} (aggregate tok/s): {cells}  [{measured['source']}]")
        if doc["servable_as"] and layout.fits:
            lines.append(f"  serve it: {doc['servable_as']}")
        lines.append(f"  suits: {doc['suits']}")
    return "\n".join(lines)
