"""Where one engine process sits in the multi-node job: the input every engine builder takes."""

from __future__ import annotations

from dataclasses import dataclass


def role_of(rank: int) -> str:
    """Rank 0 is the head (API, rendezvous); every other rank is a worker."""
    return "head" if rank == 0 else "worker"


class Ranked:
    """Anything placed at a ``rank``: its role follows from it."""

    rank: int

    @property
    def role(self) -> str:
        return role_of(self.rank)


@dataclass(frozen=True)
class RankInfo(Ranked):
    rank: int  # 0 is the head: it serves the API and hosts the rendezvous
    nnodes: int  # one DGX Spark = one GPU = one rank
    head_address: str  # rank 0's fabric address: where the other ranks meet it

    @property
    def is_head(self) -> bool:
        return self.rank == 0


def core_flag_owners(core_flags: dict[str, str]) -> dict[str, str]:
    """Profile field -> flag, turned into flag -> why engine_args may not set it."""
    return {flag: f"from the profile field {field}; set that instead, e.g. --set {field}=..." for field, flag in core_flags.items()}


def host_port(address: str, port: int) -> str:
    """``HOST:PORT`` with an IPv6 address bracketed, as both engines and Ray parse it."""
    return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
