"""``serve`` / ``status`` / ``stop`` of a profile with ``replicas: N``: parse done, call, print."""

from __future__ import annotations

from sparkctl.cli.answer import finish, line as _line, plan_answers
from sparkctl.config.apikey import api_key_for
from sparkctl.config.profile import load_profile
from sparkctl.errors import ConfigError
from sparkctl.ops.hcas import resolve_up_hcas
from sparkctl.ops.replica_serve import build_replica_plans, execute_serve_replicas
from sparkctl.ops.replica_status import gather_replica_status
from sparkctl.ops.replica_stop import RouterVerdict, router_verdict, stop_router, take_out


def is_replicated(profile: str, sets, envs) -> bool:
    return load_profile(profile, sets=sets, envs=envs).profile.replicas > 1


def parse_replicas(text) -> list[int] | None:
    """``--replica 2`` / ``1,3`` -> [1] / [0, 2] (indexes from 0); None: every replica."""
    if not text:
        return None
    try:
        numbers = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ConfigError(f"{text!r}: replica numbers, comma-separated, from 1", field="--replica") from None
    if not numbers or min(numbers) < 1:
        raise ConfigError(f"{text!r}: replica numbers start at 1", field="--replica")
    return [n - 1 for n in numbers]


def serve(out, inventory, profile: str, *, sets, envs, hosts, dry_run, timeout, parallel, only, break_lock,
          force_break_lock, pool_factory) -> None:
    plan = build_replica_plans(inventory, profile, sets=sets, envs=envs, wanted_hosts=hosts)
    if only and max(only) >= len(plan.replicas):
        raise ConfigError(f"profile {profile} has {len(plan.replicas)} replicas; there is no replica {max(only) + 1}",
                          field="--replica")
    if plan_answers(out, plan, format_replica_plan, dry_run):
        return
    with pool_factory() as pool:
        report = execute_serve_replicas(plan, inventory, pool=pool, reporter=out.reporter, parallel=parallel,
                                        timeout_s=timeout, restart=only, break_lock=break_lock, force_break_lock=force_break_lock)
    finish(out, report.to_json(), format_replica_report(report), report.ok)


def format_replica_plan(plan) -> str:
    lines = [f"profile {plan.profile.name}: {len(plan.replicas)} replicas behind the router at {plan.router_endpoint} "
             f"(policy {plan.profile.router.policy}, on {plan.router_host})"]
    for replica, serve in zip(plan.replicas, plan.serves):
        lines.append(f"  {replica.name}: {', '.join(replica.hosts)} (head {replica.head}, {serve.endpoint}, "
                     f"rendezvous port {serve.head_ports.get('rendezvous port', '-')})")
    lines.append("restart: one replica at a time, drained out of the router (--parallel: all at once)")
    return "\n".join(lines)


def format_replica_report(report) -> str:
    lines = []
    for outcome in report.replicas:
        doc = outcome.to_json()
        extra = ""
        if doc["drained_s"] is not None:
            extra += f", drained in {doc['drained_s']:.1f} s"
        if doc["out_of_router_s"] is not None:
            extra += f", out of the router {doc['out_of_router_s']:.1f} s"
        lines.append(f"{outcome.replica.name} ({', '.join(outcome.replica.hosts)}): {outcome.mode}{extra}"
                     + (f": FAILED: {outcome.error}" if outcome.error else ""))
    if report.router:
        lines.append(f"router: {report.router}")
    lines.append(f"endpoint {report.plan.router_endpoint}: " + ("serving" if report.ok else f"FAILED: {report.message}"))
    return "\n".join(lines)


def status(out, inventory, loaded, *, sets, envs, pool_factory) -> None:
    with pool_factory() as pool:
        inventory = resolve_up_hcas(inventory, pool)  # the drift check renders with it, as serve did
        report = gather_replica_status(inventory, loaded, pool=pool, sets=sets, envs=envs)
    finish(out, report.to_json(), format_replica_status(report), report.ok)


def format_replica_status(report) -> str:
    doc = report.to_json()
    lines = [f"profile {doc['profile']}: router {doc['endpoint']} ({doc['router']['state']}, policy "
             f"{doc['router']['policy']})"]
    for replica in doc["replicas"]:
        view = replica["router_view"]
        lines.append(f"  replica {replica['replica']} ({', '.join(replica['hosts'])}): {replica['state']}; "
                     f"router: {view}")
        lines += [f"    problem: {p}" for p in replica["problems"]]
        lines += [f"    drift: {d}" for d in replica["drift"]]
    if doc["health"]:
        health = doc["health"]
        lines.append("health (through the router): " + ("ok; models: " + ", ".join(health["models"]) if health["ok"]
                                                         else f"not serving ({health['stage']}: {health['detail']})"))
    names = tuple(f"replica {r['replica']} " for r in doc["replicas"])
    lines += [f"problem: {p}" for p in doc["problems"] if not p.startswith(names)]  # the replicas' own: above
    if doc["fix"]:
        lines.append(f"fix: {doc['fix']}")
    return "\n".join(lines)


def router_for_stop(out, inventory, loaded, chosen, pool, *, every_host: bool) -> dict:
    """Before the replicas stop: the router goes first when the whole set does; otherwise it stays,
    serving the replicas still running, and the ones being stopped leave its list. Said, and
    returned for --json."""
    if every_host:
        verdict = RouterVerdict(True, "every replica is being stopped: the router goes first")
    else:
        verdict = router_verdict(inventory, loaded.profile, [h.name for h in chosen], pool=pool)
    _line(out, verdict.reason)
    doc = verdict.to_json()
    if verdict.stop:
        doc["done"] = [stop_router(inventory, loaded, pool)]
        doc["summary"] = "removed" if doc["done"][0].startswith("removed") else "none"
    else:
        doc["done"] = take_out(inventory, loaded.profile, verdict.leaving, api_key=api_key_for(loaded.profile))
        gone = [r.name for r in verdict.leaving if f"{r.name}: out of the router" in " ".join(doc["done"])]
        doc["summary"] = "kept" + (f" without {' and '.join(gone)}" if gone else "")  # (the audit line's words)
    for line in doc["done"]:
        _line(out, line)
    return doc
