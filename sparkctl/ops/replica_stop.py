"""``stop`` of some of a replicated profile's hosts: what becomes of the router in front of them.

The router stays while any replica it routes to still runs, and the replicas being stopped leave
its worker list first (otherwise it keeps sending to them, retrying, until three health checks
have missed: ~30 s). It is stopped, before the replicas, when the whole set goes: every replica
has a host being stopped, or the replicas left alone run nothing any more. A replica left alone
whose hosts cannot be looked at counts as running: the router is never stopped in front of a
replica that may still serve.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl.commands import router as R
from sparkctl.commands.serve import parse_containers, remove_argv
from sparkctl.errors import OperationFailed
from sparkctl.ops.steps import check_result
from sparkctl.remote.pool import fan_out


@dataclass
class RouterVerdict:
    stop: bool  # stop the router (before the replicas)
    reason: str  # said to the user, and in --json
    leaving: list = field(default_factory=list)  # ops.replicas.Replica: out of the router when it stays

    def to_json(self) -> dict:
        return {"stop": self.stop, "reason": self.reason, "leaving": [r.name for r in self.leaving]}


def router_verdict(inventory, profile, chosen: list[str], *, pool, sets=()) -> RouterVerdict:
    """Whether stopping ``chosen`` (host names) stops the router, and which replicas leave it."""
    from sparkctl.ops.replicas import split_replicas
    from sparkctl.ops.status import gather_states

    replicas, _ = split_replicas(profile, inventory.hosts, None, sets)
    names = set(chosen)
    leaving = [r for r in replicas if names & set(r.hosts)]
    staying = [r for r in replicas if r not in leaving]
    if not staying:
        return RouterVerdict(True, "every replica is being stopped: the router goes first", leaving)
    looked = [h for h in inventory.hosts if any(h.name in r.hosts for r in staying)]
    states = {s.name: s for s in gather_states(inventory, looked, profile.name, pool=pool, images=False)}
    unknown = [r for r in staying if any(not states[n].reachable for n in r.hosts)]
    running = [r for r in staying if any(c.running for n in r.hosts for c in states[n].containers)]
    if not running and not unknown:
        return RouterVerdict(True, f"no other replica runs ({_names(staying)} stopped already): the router goes first",
                             leaving)
    why = [f"{_names(running)} still {'runs' if len(running) == 1 else 'run'} behind it"] if running else []
    why += [f"{r.name} cannot be looked at ({_first_error(r, states)})" for r in unknown if r not in running]
    return RouterVerdict(False, "the router stays: " + "; ".join(why), leaving)


def _names(replicas) -> str:
    return ", ".join(f"{r.name} ({', '.join(r.hosts)})" for r in replicas)


def _first_error(replica, states) -> str:
    return next(f"{n}: {states[n].error}" for n in replica.hosts if not states[n].reachable)


def take_out(inventory, profile, leaving, *, api_key=None, timeout_s: float = 15.0) -> list[str]:
    """The ``leaving`` replicas out of the router's worker list, in words. A router that does not
    answer is said, not an error: it drops a stopped replica itself after three missed health checks."""
    from sparkctl.httpclient import httpx
    from sparkctl.ops.router import RouterClient, RouterError
    from sparkctl.ops.replicas import split_replicas

    by_name = {h.name: h for h in inventory.hosts}
    first = split_replicas(profile, inventory.hosts)[0][0]
    client = RouterClient(R.endpoint(by_name[first.head].address, profile.router.port), api_key)
    said = []
    try:
        listed = {w["url"]: w for w in client.workers()}
        for replica in leaving:
            url = R.endpoint(by_name[replica.head].address, profile.serving.port)
            if url in listed:
                client.remove(listed[url]["id"])
                client.wait_for(url, present=False, timeout_s=timeout_s)
                said.append(f"{replica.name}: out of the router ({url})")
            else:
                said.append(f"{replica.name}: not in the router's list")
    except (RouterError, httpx.HTTPError, ValueError) as err:  # ValueError: an answer that is not the router's JSON
        said.append(f"the router did not answer ({err}); it drops the stopped replicas after three missed health checks")
    finally:
        client.close()
    return said


def stop_router(inventory, loaded, pool) -> str:
    """Remove the router container (on any host: it may have moved with the inventory). A host whose
    containers cannot be listed is an error naming it, never "no router there": it may be the one
    running the router, and stopping the replicas behind it would leave it sending to dead ends."""
    def one(conn):
        listed = conn.run(R.containers_argv(loaded.profile.name), timeout=60)
        check_result(listed, "list the router container")
        found = parse_containers(listed.stdout)
        if found:
            check_result(conn.run(remove_argv([c.name for c in found]), timeout=60), "remove the router container")
        return [c.name for c in found]

    results = fan_out([inventory.ssh_target(h) for h in inventory.hosts], one, pool=pool)
    removed = [f"{r.name}: {', '.join(r.value)}" for r in results if r.ok and r.value]
    failed = [r.error for r in results if not r.ok]
    if failed:
        done = f"; removed the router ({'; '.join(removed)})" if removed else ""
        raise OperationFailed(f"cannot stop the router: {'; '.join(failed)}{done}; the replicas were not stopped "
                              "(run stop again once the host answers)")
    return "removed the router (" + "; ".join(removed) + ")" if removed else "no router container"
