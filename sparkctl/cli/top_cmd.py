"""``sparkctl top``: a live view of the serving cluster (hosts and the engine's own metrics)."""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass
from typing import Optional

import typer

from sparkctl.cli.answer import finish, line
from sparkctl.cli.context import JSON_OPTION, split_hosts, state
from sparkctl.cli.option_groups import GROUP, with_option_groups
from sparkctl.cli.served import ServedLookup, require_deployment


@with_option_groups
def top(
    ctx: typer.Context,
    profile: Optional[str] = typer.Option(None, "--profile", "-p", help="The served profile (its deployment's hosts and endpoint)."),
    interval: float = typer.Option(3.0, "--interval", min=1.0, max=3600.0, help="Seconds between refreshes."),
    once: bool = typer.Option(False, "--once", help="One snapshot, printed, then exit (with --json: one JSON document)."),
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: the deployment's, else the inventory's; none with --endpoint alone)."),
    endpoint: Optional[str] = typer.Option(None, "--endpoint", help="Base URL of the engine (default: the deployment's)."),
    lookup: ServedLookup = GROUP,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Per host: GB10 utilisation and memory, CPU, RAM, NVMe throughput (one SSH command per host per refresh). `q` quits.
    Per deployment: the engine's /metrics (running/waiting, KV cache, tokens/s, prefix cache, spec decode, preemptions).
    """
    from sparkctl.errors import ConfigError
    from sparkctl.ops.top import human, watch

    st = state(ctx)
    out = st.output(json_flag)
    if out.json_mode and not once:
        raise ConfigError("--json prints one snapshot: add --once", field="--json")
    require_deployment(profile, endpoint)
    names = split_hosts(hosts)
    # --endpoint alone watches the engine only; hosts need the inventory
    inventory = st.inventory() if profile is not None or names else None
    if names:
        unknown = [n for n in names if n not in {h.name for h in inventory.hosts}]
        if unknown:
            raise ConfigError(f"no host {unknown[0]!r} in the inventory", field="--hosts")
    # The profile (pydantic models, recipes: ~1 s) is read by the first refresh, after the live
    # view's first frame is drawn from the inventory alone; a bad profile then erases that frame.
    watched = Watched(out, lookup, inventory, names, endpoint, profile)
    with ExitStack() as stack:
        take = watched.taker(stack)
        if once:
            snapshot = take()
            finish(out, snapshot.to_json(), human(snapshot), snapshot.ok)
            return
        watch(take, interval_s=interval, console=out.console, waiting=watched.first_frame())


@dataclass
class Watched:
    """What ``top`` watches, found once (on the first refresh, after the first frame is drawn from
    what is known without asking a host), then sampled every refresh."""

    out: object
    lookup: ServedLookup
    inventory: object
    names: Optional[list[str]]
    endpoint: Optional[str]
    profile: Optional[str]

    def first_frame(self):
        """The hosts' names (the named ones, else the inventory's) and the endpoint if named: drawn
        before any connection is opened (paramiko's import alone is ~1 s)."""
        from sparkctl.ops.top import Snapshot

        hosts = [] if self.inventory is None else [h for h in self.inventory.hosts if not self.names or h.name in self.names]
        finding = self.profile is not None and self.endpoint is None
        return Snapshot.waiting_for(self.profile, self.endpoint, hosts, hosts_wait="connecting…",
                                    engine_wait="finding the deployment…" if finding else "first sample…")

    def taker(self, stack: ExitStack):
        """``take(first, show)``: one snapshot; the first call opens the connections and finds the
        deployment (``show`` draws the hosts it found while their first sample is taken)."""
        from sparkctl.ops.top import FIRST_FRAME_INTERVAL_S, PROBE_INTERVAL_S, Snapshot, take_snapshot

        found: dict = {}

        def take(first: bool = False, show=None):
            if not found:
                from sparkctl.config.apikey import auth_headers

                loaded, api_key = self.lookup.profile(self.profile)
                found["headers"] = auth_headers(api_key)  # vLLM leaves /metrics open; a proxy in front may not
                found["pool"] = stack.enter_context(self.lookup.connections())
                found["endpoint"], found["hosts"] = _watched(self.out, self.inventory, loaded, self.names,
                                                             self.endpoint, found["pool"])
                if show is not None:
                    show(Snapshot.waiting_for(self.profile, found["endpoint"], found["hosts"], hosts_wait="sampling…",
                                              engine_wait="first sample…"))
            # The live view's first frame samples over a short window, so it shows at once; the
            # refreshes after it (and --once) use the full one.
            endpoint = found["endpoint"].rstrip("/") if found["endpoint"] else None
            # The first refresh is drawn again as each host answers; later ones replace the whole frame.
            return take_snapshot(self.inventory, found["hosts"], endpoint, pool=found["pool"], profile=self.profile,
                                 headers=found["headers"], interval_s=FIRST_FRAME_INTERVAL_S if first else PROBE_INTERVAL_S,
                                 show=show if first else None)

        return take


def _watched(out, inventory, loaded, names: list[str] | None, endpoint: str | None, pool):
    """The engine endpoint to read /metrics from and the hosts to show: --endpoint / --hosts, else
    the deployment's (every inventory host when nothing was deployed, said)."""
    deployed_hosts = None
    if loaded is not None and not (endpoint and names):  # (both named: nothing to find)
        from sparkctl.ops.top import find_watched

        named = [h for h in inventory.hosts if h.name in names] if names else None
        found, deployment = find_watched(inventory, loaded, pool=pool, hosts=named)
        if (deployment or {}).get("router") and endpoint is None:
            found = _first_replica_engine(inventory, loaded, deployment)
        if deployment is None and endpoint is None:
            line(out, f"note: no deployment of {loaded.name} found on the hosts asked: watching "
                      f"{'the named hosts' if names else 'every host'} and {found}")
        elif (deployment or {}).get("note"):
            line(out, f"note: {deployment['note']}")
        endpoint = endpoint or found
        deployed_hosts = (deployment or {}).get("hosts")
    if inventory is None:
        return endpoint, []
    wanted = set(names or deployed_hosts or [h.name for h in inventory.hosts])
    return endpoint, [h for h in inventory.hosts if h.name in wanted]


def _first_replica_engine(inventory, loaded, deployment) -> str:
    """The router has no engine /metrics: the engine figures come from replica 1's head (--endpoint
    picks another replica); the host rows cover every replica."""
    from sparkctl.commands.serve import url_host

    head = next(h for h in inventory.hosts if h.name == deployment["replicas"][0][0])
    return f"http://{url_host(head.address)}:{loaded.serving.port}"


def register(app: typer.Typer) -> None:
    """Add ``top`` to the top-level app (idempotent)."""
    if not any(c.name == "top" for c in app.registered_commands):
        app.command("top")(top)
