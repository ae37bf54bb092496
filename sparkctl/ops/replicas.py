"""Replicas: the inventory's hosts cut into ``replicas`` groups of ``tensor_parallel`` hosts.

Each group is one deployment of the profile (its own head = rank 0, its own rank numbering, its
own rendezvous at its head), and the router (``sparkctl.ops.router``) spreads requests over
them. Groups follow inventory order: hosts 1..TP are replica 1, the next TP replica 2, ...; a
host with ``role: head`` inside a group is that group's rank 0. Replica ``i`` (from 0) meets its
ranks on ``distributed.master_port + i`` (and ``ray_port + i``), so two replicas never share a
rendezvous port even when a test machine puts two heads behind one address.

Pure: no I/O. ``replica_sets`` are the ``--set`` assignments a replica adds to the user's, so
render, serve, status and drift all see the same per-replica profile.
"""

from __future__ import annotations

from dataclasses import dataclass

from sparkctl.config.inventory import pick_hosts
from sparkctl.errors import ConfigError


@dataclass(frozen=True)
class Replica:
    index: int  # from 0; shown as "replica 1", "replica 2", ...
    hosts: tuple[str, ...]  # rank order: the replica's head first
    sets: tuple[str, ...]  # the user's --set plus this replica's own (its rendezvous ports)

    @property
    def name(self) -> str:
        return f"replica {self.index + 1}"

    @property
    def head(self) -> str:
        return self.hosts[0]

    def to_json(self) -> dict:
        return {"replica": self.index + 1, "head": self.head, "hosts": list(self.hosts),
                "settings": [s for s in self.sets if s.startswith("distributed.")]}


def replica_sets(profile, index: int, sets=()) -> tuple[str, ...]:
    """The user's ``--set`` and, for every replica after the first, its own rendezvous ports."""
    own = []
    if index:
        own = [f"distributed.master_port={profile.distributed.master_port + index}",
               f"distributed.ray_port={profile.distributed.ray_port + index}"]
    return tuple(sets) + tuple(own)


def split_replicas(profile, hosts, wanted: list[str] | None = None, sets=()) -> tuple[list[Replica], str | None]:
    """The replicas of ``profile`` on the inventory's ``hosts`` (or the ``--hosts`` named), and a note
    when hosts are left over. Raises ConfigError naming the count that does not divide."""
    tp, count = profile.tensor_parallel, profile.replicas
    need = tp * count
    note = None
    if wanted:
        picked = pick_hosts(hosts, wanted)
        if len(wanted) != need:
            raise ConfigError(f"--hosts names {len(wanted)} hosts; {count} replicas of tensor_parallel {tp} need "
                              f"{need} ({len(wanted)} hosts do not cut into {count} groups of {tp})", field="--hosts")
    else:
        if len(hosts) < need:
            raise ConfigError(f"profile {profile.name!r} needs {need} hosts ({count} replicas x tensor_parallel {tp}) "
                              f"but the inventory has {len(hosts)} ({len(hosts)} hosts do not cut into {count} groups "
                              f"of {tp})", field="replicas")
        picked = list(hosts[:need])
        if len(hosts) > need:
            note = (f"profile {profile.name!r} uses {need} of {len(hosts)} hosts ({count} replicas x {tp}); "
                    f"left out: {', '.join(h.name for h in hosts[need:])}")
    replicas = []
    for index in range(count):
        group = picked[index * tp:(index + 1) * tp]
        group.sort(key=lambda h: not h.is_head)  # a role: head host in a group is its rank 0 (stable otherwise)
        replicas.append(Replica(index, tuple(h.name for h in group), replica_sets(profile, index, sets)))
    return replicas, note


def replica_of(replicas: list[Replica], host: str) -> Replica | None:
    return next((r for r in replicas if host in r.hosts), None)
