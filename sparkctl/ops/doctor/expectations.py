"""What doctor's checks compare a host against: the inventory's folders, and what a profile needs."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkctl import launchers
from sparkctl.ops.plan import plan_memory
from sparkctl.ops.serve import head_ports


@dataclass
class Expectations:
    """What the checks compare against; None/empty where no profile was given."""

    model_dir: str
    state_dir: str
    image_tag: str | None = None
    needs_nvidia_runtime: bool = False
    ulimits: dict[str, tuple[int, int]] = field(default_factory=dict)
    disk_need_bytes: int | None = None
    memory_budget_gb: float | None = None
    head_ports: dict[str, int] = field(default_factory=dict)
    worker_ports: dict[str, int] = field(default_factory=dict)
    reach_port: int = 22
    uses_docker: bool = True  # False for a native launcher: the engine runs as a process, no container


def expectations_for(inventory, profile) -> Expectations:
    model_dir, state_dir = inventory.model.paths.model_dir, inventory.model.paths.state_dir
    if profile is None:
        return Expectations(model_dir=model_dir, state_dir=state_dir)
    plan = plan_memory(profile)
    engram_bytes = profile.memory.engram_total_gb * 1e9 / profile.tensor_parallel if profile.engram.mode == "disk" else 0
    # A launcher without containers (native: the engine is a host process) needs no container limits
    # and no image on disk, and the memory it needs free is its start guard's floor
    # (single_box.min_free_gib), not a container plan's budget.
    native = not launchers.of(profile).runs_containers
    return Expectations(
        model_dir=model_dir,
        state_dir=state_dir,
        image_tag=None if native else profile.image.tag,
        uses_docker=not native,
        needs_nvidia_runtime=profile.container.gpus is not None,
        ulimits={} if native else {name: (lim.soft, lim.hard) for name, lim in profile.container.ulimits.items()},
        disk_need_bytes=int(engram_bytes + (0 if native else profile.image.size_gb * 1e9)),
        memory_budget_gb=profile.single_box.min_free_gib * 2**30 / 1e9 if native and profile.single_box else plan.budget_gb,
        head_ports=head_ports(profile, profile.tensor_parallel),  # what serve checks before its start
    )
