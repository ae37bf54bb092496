"""``sparkctl top``: the serving cluster right now. Per host one remote command per refresh
(``sparkctl.commands.host_probe``: GB10, CPU, RAM, NVMe); per deployment the engine's own /metrics,
scraped at the start and the end of the refresh so counters become rates.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Callable, Optional

from sparkctl.commands import engine_metrics as em
from sparkctl.commands.host_probe import HostSample, host_probe_argv, parse_host_probe

PROBE_INTERVAL_S = 1.0  # the host probe's own sampling window (CPU busy, NVMe bytes/s)
PROBE_TIMEOUT_S = 15.0
FIRST_FRAME_INTERVAL_S = 0.25  # the live view's first frame: a shorter window, so the view shows at once


@dataclass
class HostView:
    name: str
    address: str
    sample: Optional[HostSample] = None
    error: Optional[str] = None
    waiting: Optional[str] = None  # the live view's frames before the first sample: what is awaited

    def to_json(self) -> dict:
        doc = {"name": self.name, "address": self.address, "ok": self.sample is not None, "error": self.error}
        doc.update(self.sample.to_json() if self.sample else {})
        return doc


@dataclass
class Snapshot:
    profile: Optional[str]
    endpoint: Optional[str]
    when: str
    hosts: list[HostView] = field(default_factory=list)
    engine: dict = field(default_factory=dict)  # {metric name: value} (sparkctl.commands.engine_metrics.summary)
    engine_kind: Optional[str] = None
    engine_error: Optional[str] = None
    waiting: Optional[str] = None  # the engine table's line before its first scrape

    @classmethod
    def waiting_for(cls, profile: Optional[str], endpoint: Optional[str], hosts, *, hosts_wait: str,
                    engine_wait: str) -> "Snapshot":
        """A frame from what is known before any host answered: the hosts' names, the endpoint if
        known, and what each part waits for."""
        return cls(profile, endpoint, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                   [HostView(h.name, h.address, waiting=hosts_wait) for h in hosts], waiting=engine_wait)

    @property
    def ok(self) -> bool:
        return self.engine_error is None and all(h.sample is not None for h in self.hosts)

    def to_json(self) -> dict:
        return {"ok": self.ok, "profile": self.profile, "endpoint": self.endpoint, "when": self.when,
                "hosts": [h.to_json() for h in self.hosts], "engine_kind": self.engine_kind,
                "engine": self.engine, "engine_error": self.engine_error,
                # each figure the view shows: its label and the raw metric(s) it comes from
                "engine_metrics": [{"label": label, "metric": metric, "value": value}
                                   for label, metric, value in engine_rows(self)] if not self.engine_error else []}


MAX_METRICS_BYTES = 32 * 1024 * 1024  # a /metrics page is tens of KB; a runaway one is cut, not held


def _scrape(endpoint: str, headers: Optional[dict], timeout_s: float = 5.0):
    """(samples, error) of the engine's /metrics. The standard library's HTTP client: importing httpx
    (and the CLI it brings) costs more than the whole first frame's scrape."""
    import urllib.error
    import urllib.request

    url = endpoint.rstrip("/") + "/metrics"
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=timeout_s) as response:
            body = response.read(MAX_METRICS_BYTES)
    except urllib.error.HTTPError as err:
        return None, f"{endpoint}/metrics answered HTTP {err.code}"
    except (urllib.error.URLError, OSError, ValueError) as err:
        reason = getattr(err, "reason", err)
        return None, f"{endpoint}/metrics: {type(reason).__name__}: {' '.join(str(reason).split())[:120]}"
    try:
        return em.parse_exposition(body.decode("utf-8", "replace")), None
    except ValueError as err:
        return None, f"{endpoint}/metrics is not Prometheus text ({str(err)[:120]})"


def find_watched(inventory, profile, *, pool, hosts=None) -> tuple[str, Optional[dict]]:
    """The deployment ``top`` watches: its endpoint and what ``find_target`` says of it. The first
    refresh waits for this, so it asks no more than it must: the deployment record of ``hosts`` (those
    the user named, else every host; at once), every rank's record naming the endpoint and the
    hosts; a host without one is asked for the profile's containers instead (a deployment whose
    records were lost), never for image IDs and layers as status is.

    A live rank 0's record wins (``_read_records`` says which is live) and once it is read the other
    hosts are not waited for; without one, the best of the others (``_best_record``), said in
    ``note``. A host that could not be asked is never read as "not deployed there": when no record
    was found and a host failed, this raises ``OperationFailed`` naming it."""
    from sparkctl.commands.serve import url_host
    from sparkctl.ops.status import find_deployment

    if getattr(profile, "replicas", 1) > 1:
        from sparkctl.ops.bench import replicated_target

        return replicated_target(inventory, profile)[::2]  # no host asked: the router's address
    records, failed, states = _read_records(inventory, profile, hosts or inventory.hosts, pool)
    chosen = _best_record(records)
    if chosen is not None:
        name, record, live = chosen
        about = {"profile": profile.name, "hosts": list(record.get("hosts") or [name])}
        why = f" ({'; '.join(failed)})" if failed else ""
        if record.get("rank") != 0:
            about["note"] = f"rank 0's deployment record was not read{why}: using {name}'s (rank {record.get('rank')})"
        elif live is False:
            about["note"] = (f"no running rank 0 found{why}: using {name}'s record, whose container "
                             f"{record.get('container')} is not running there")
        return record["endpoint"], about
    if failed:
        from sparkctl.errors import OperationFailed

        raise OperationFailed(f"cannot tell where {profile.name} is deployed: {'; '.join(failed)} "
                              "(name the engine with --endpoint, and the hosts with --hosts, to watch it anyway)")
    found = find_deployment(states, profile.serving.port, profile.serving.served_model_name)
    if found is not None and found.endpoint:
        return found.endpoint, {"profile": profile.name, "hosts": found.hosts}
    return f"http://{url_host(inventory.head.address)}:{profile.serving.port}", None


Found = tuple[str, dict, Optional[bool]]  # (host, its deployment record, is the record's rank live there)


def record_is_live(record: dict, containers) -> Optional[bool]:
    """Does the host still run what its record says it started? True when the container the record
    names runs there (docker's word); False when it does not (a record left by an older deployment, or
    a rank that died); None when the record names no container (the native launcher's host process)."""
    name = record.get("container")
    if record.get("launcher") == "native" or not name:
        return None
    return any(c.name == name and c.running for c in containers)


def _read_records(inventory, profile, asked, pool) -> tuple[list[Found], list[str], list]:
    """(host, record, live) of the hosts that hold one, the failures (in the inventory's order), and
    each answering host's containers where it had no record. A rank-0 record's host is asked whether
    it runs the record's container (unknown when its docker cannot say); reading stops at a live rank
    0's record, which names the endpoint and the hosts, so the first refresh never waits for the other
    hosts (a slow or unreachable one is named by the samples instead). A stale rank-0 record (its
    container gone) does not stop it."""
    from sparkctl.commands import facts
    from sparkctl.ops.ask import FactFailed
    from sparkctl.ops.status import HostState
    from sparkctl.ops.steps import ask, list_containers
    from sparkctl.remote.pool import fan_out_as_done

    state_dir = inventory.model.paths.state_dir

    def mine(conn):
        return [c for c in list_containers(conn, profile.name) if c.profile == profile.name]

    def live(conn, record):
        try:
            return record_is_live(record, mine(conn))
        except FactFailed:  # docker cannot answer there (its engine stopped): the record is all there is
            return None

    def look(conn):
        record = ask(conn, facts.DEPLOYMENT_RECORD, profile.name, state_dir)
        if record and record.get("profile") == profile.name and record.get("endpoint"):
            return record, live(conn, record) if record.get("rank") == 0 else None, []
        return None, None, mine(conn)

    by_name = {h.name: h for h in asked}
    records, failed, states = [], {}, []
    answers = fan_out_as_done([inventory.ssh_target(h) for h in asked], look, pool=pool)
    with contextlib.closing(answers):  # closed on the break: the slower hosts are not waited for
        for result in answers:
            if not result.ok:
                failed[result.name] = result.error
                continue
            record, live, containers = result.value
            if record:
                records.append((result.name, record, live))
                if record.get("rank") == 0 and live is not False:
                    break
            host = by_name[result.name]
            states.append(HostState(host.name, host.address, containers=containers))
    return records, [failed[h.name] for h in asked if h.name in failed], states


def _best_record(records: list[Found]) -> Optional[Found]:
    """The record to follow: a live (or, natively launched, not known dead) rank 0's, else the lowest
    rank's, else a rank 0's whose container is gone; the newest (its ``when``) among equals. None
    without records. The order the hosts answered in never decides."""
    def order(found: Found):
        _name, record, live = found
        rank = record.get("rank") if isinstance(record.get("rank"), int) else 1 << 30
        return (0, 0) if rank == 0 and live is not False else (2, 0) if rank == 0 else (1, rank)

    newest_first = sorted(records, key=lambda found: (str(found[1].get("when") or ""), found[0]), reverse=True)
    return min(newest_first, key=order) if records else None


def take_snapshot(inventory, hosts, endpoint: Optional[str], *, pool, profile: Optional[str] = None,
                  headers: Optional[dict] = None, interval_s: float = PROBE_INTERVAL_S,
                  show: Optional[Callable[[Snapshot], None]] = None) -> Snapshot:
    """One refresh: every host's probe and the engine's /metrics twice (counters into rates). With
    ``show``, the snapshot is drawn again as each host answers (the first frame fills host by host,
    a slow or unreachable host never holds back the others)."""
    from sparkctl.remote.pool import fan_out_as_done

    snapshot = Snapshot(profile, endpoint, datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
                        [HostView(h.name, h.address, waiting="sampling…") for h in hosts],
                        waiting="first sample…" if show is not None else None)
    before, error = _scrape(endpoint, headers) if endpoint else (None, "no endpoint")
    started = time.monotonic()

    def probe(conn):
        result = conn.run(host_probe_argv(interval_s), timeout=PROBE_TIMEOUT_S)
        if not result.ok and "@@sparkctl-top:meminfo" not in result.stdout:
            raise RuntimeError(f"host probe exited {result.exit_code}: {' '.join(result.stderr.split())[:160]}")
        return parse_host_probe(result.stdout, interval_s)

    views = {v.name: v for v in snapshot.hosts}
    for result in fan_out_as_done([inventory.ssh_target(h) for h in hosts], probe, pool=pool):
        view = views[result.name]
        view.waiting, view.sample, view.error = None, result.value if result.ok else None, None if result.ok else result.error
        if show is not None:
            show(snapshot)
    snapshot.waiting = None
    if endpoint:
        if time.monotonic() - started < interval_s:  # no hosts to wait for: keep the rate window
            time.sleep(interval_s - (time.monotonic() - started))
        after, error = _scrape(endpoint, headers)
        seconds = time.monotonic() - started
        if after is not None:
            snapshot.engine_kind = em.detect_engine(after)
            if snapshot.engine_kind is None:
                error = f"{endpoint}/metrics has no vLLM or SGLang metric"
            else:
                snapshot.engine = em.summary(snapshot.engine_kind, after, before, seconds if before else None)
    snapshot.engine_error = error
    return snapshot


# ---------------------------------------------------------------------------------------------- rendering


def _gb(value: Optional[float]) -> str:
    return "-" if value is None else f"{value / 1e9:.1f}"


def _num(value: Optional[float], fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


ENGINE_ROWS = [  # (role in engine_metrics' tables, or a derived figure; label; format)
    ("running", "requests running", "{:.0f}"),
    ("waiting", "requests waiting", "{:.0f}"),
    ("kv_cache_usage", "KV cache usage", "pct"),
    ("prompt_tokens_per_s", "prompt tokens/s", "{:.1f}"),
    ("generation_tokens_per_s", "generation tokens/s", "{:.1f}"),
    ("prefix_cache_hit_rate", "prefix-cache hit rate", "pct"),
    ("spec_accept_length", "spec-decode mean accepted length", "{:.2f}"),
    ("preemptions", "preemptions (since start)", "{:.0f}"),
]
DERIVED_FROM = {  # what a derived figure is computed from, shown beside it
    "prompt_tokens_per_s": "prompt_tokens", "generation_tokens_per_s": "generation_tokens",
    "prefix_cache_hit_rate": ("prefix_cache_hits", "prefix_cache_queries", "prefix_cache_hit_rate"),
    "spec_accept_length": ("spec_accepted_tokens", "spec_verify_calls", "spec_accept_length"),
}


def engine_rows(snapshot: Snapshot) -> list[tuple[str, str, str]]:
    """(label, the metric it comes from as the engine exposes it, value text) for the engine table."""
    registered = em.metric_names(snapshot.engine_kind)
    names = {role: em.exposed_name({}, name) if role in em.COUNTERS else name for role, name in registered.items()}
    rows = []
    for key, label, how in ENGINE_ROWS:
        if key in DERIVED_FROM:
            value = snapshot.engine.get(key)
            roles = DERIVED_FROM[key] if isinstance(DERIVED_FROM[key], tuple) else (DERIVED_FROM[key],)
            source = ", ".join(names[r] for r in roles if r in names)
        else:
            source = names.get(key, "")
            value = snapshot.engine.get(source)
        text = "-" if value is None else (f"{100 * value:.1f} %" if how == "pct" else how.format(value))
        rows.append((label, source, text))
    return rows


def render(snapshot: Snapshot, footer: bool = False):
    """A rich renderable of one snapshot (``footer``: the live view's key help)."""
    from rich.console import Group
    from rich.table import Table

    hosts = Table(title=f"hosts  {snapshot.when}", title_justify="left", expand=False)
    for column in ("host", "GB10 util %", "GB10 mem GB", "temp °C", "power W", "CPU %", "RAM GB", "load",
                   "NVMe read MB/s", "NVMe write MB/s"):
        hosts.add_column(column, justify="left" if column == "host" else "right")
    for view in snapshot.hosts:
        s = view.sample
        if s is None:
            said = f"[dim]{view.waiting}[/dim]" if view.waiting else f"[red]{view.error or 'no answer'}[/red]"
            hosts.add_row(view.name, said, *[""] * 8)
            continue
        gpu_mem = f"{_gb(s.gpu_memory_used_bytes)}/{_gb(s.gpu_memory_total_bytes)}" + (" (unified)" if s.gpu_memory_unified else "")
        hosts.add_row(view.name, _num(s.gpu_util_pct, "{:.0f}") if s.gpu_error is None else f"[red]{s.gpu_error[:40]}[/red]",
                      gpu_mem if s.gpu_error is None else "-", _num(s.gpu_temp_c, "{:.0f}"), _num(s.gpu_power_w),
                      _num(s.cpu_busy_pct), f"{_gb(s.ram_used_bytes)}/{_gb(s.ram_total_bytes)}", _num(s.load1, "{:.2f}"),
                      _num(None if s.nvme_read_bytes_per_s is None else s.nvme_read_bytes_per_s / 1e6),
                      _num(None if s.nvme_write_bytes_per_s is None else s.nvme_write_bytes_per_s / 1e6))
    engine = Table(title=f"engine  {snapshot.endpoint or ''}  {snapshot.engine_kind or ''}", title_justify="left")
    engine.add_column("what")  # the raw Prometheus names are in --json (and `engine_metrics` below)
    engine.add_column("value", justify="right")
    if snapshot.waiting:
        engine.add_row(f"[dim]{snapshot.waiting}[/dim]", "")
    elif snapshot.engine_error:
        engine.add_row("[red]unavailable[/red]", snapshot.engine_error)
    else:
        for label, _metric, value in engine_rows(snapshot):
            engine.add_row(label, value)
    parts = [hosts, engine] if snapshot.hosts else [engine]
    if footer:
        from rich.text import Text

        parts.append(Text("q quits", style="dim"))
    return Group(*parts)


def human(snapshot: Snapshot) -> str:
    from rich.console import Console

    import io

    console = Console(width=160, record=True, file=io.StringIO(), color_system=None)
    console.print(render(snapshot))
    return console.export_text()


QUIT_KEYS = ("q", "Q")


def watch(take, *, interval_s: float, console, stop_after: Optional[int] = None, keys=None,
          waiting: Optional[Snapshot] = None) -> int:
    """Refresh a live view every ``interval_s`` seconds until ``q`` (or Ctrl-C, or ``stop_after``
    refreshes). ``waiting`` (a frame of what is known before any host answered) is drawn at once;
    ``take(first=..., show=...)`` may draw more such frames with ``show`` while its facts arrive.
    The first frame is taken with a short sampling window so it comes soon."""
    from rich.live import Live

    from sparkctl.ops.keys import single_keys

    count = 0
    with single_keys(keys) as pressed, Live(console=console, auto_refresh=False, screen=False) as live:
        def show(snapshot: Snapshot) -> None:
            live.update(render(snapshot, footer=True), refresh=True)

        try:
            if waiting is not None:
                show(waiting)
            while stop_after is None or count < stop_after:
                started = time.monotonic()
                show(take(first=count == 0, show=show))
                count += 1
                if pressed.wait(interval_s - (time.monotonic() - started)) in QUIT_KEYS:
                    break
        except KeyboardInterrupt:
            pass
        except BaseException:
            # the first refresh failed (a bad profile, no host to ask): its error line is all that
            # stays, not a frame of hosts still "connecting…"
            live.transient = count == 0
            raise
    return count
