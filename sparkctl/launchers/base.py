"""What every launcher answers: how a profile's engine is started, looked at and stopped on its hosts.

A launcher is chosen once, from the profile's ``launcher`` (``launchers.of(profile)``); the verbs
and ``up`` ask it instead of comparing names. Its operations live in ``ops/`` (containers:
``ops/serve``, ``ops/status``, ``ops/logs``, ``ops/stop``; a host process: ``ops/native*``); its
printed answers live in ``cli/`` (``cli_module``, imported by the CLI on first use, so this layer
imports nothing from ``cli/``).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class UpServe:
    """What ``up`` serves, as the launcher planned it: the serve step's plan and where it answers."""

    plan: object  # ops.serve.ServePlan, ops.native.NativePlan, or the first replica's ServePlan
    hosts: list[str]  # the deployment's hosts, in order
    endpoint: str  # what smoke asks (the router with replicas)
    served_model_name: str


class Launcher:
    """One way to run an engine on the hosts. Subclasses set the attributes and implement the methods."""

    name: str = ""
    runs_containers: bool = True  # an image, docker and container options are what it needs on a host
    # the module of ``cli/`` that runs and prints its verbs (serve, status, logs, stop): cli/serve_cmd.front
    cli_module: str = ""

    # -- up ------------------------------------------------------------------------------------------
    def plan_up(self, up) -> UpServe:
        """The serve ``up`` will converge on (no I/O); the launcher keeps its own plans on ``up``."""
        raise NotImplementedError

    def up_steps(self, up) -> tuple[list, object]:
        """``up``'s image steps (build, distribute, engram) and its serve step, as ``ops.steps.Step``s."""
        raise NotImplementedError

    def engine_running(self, up) -> bool:
        """Whether the profile's engine runs on ``up``'s hosts now (its ports and memory are the serve's to replace)."""
        raise NotImplementedError

    # -- stop --------------------------------------------------------------------------------------------
    def plan_stop(self, inventory, hosts, loaded, *, pool, max_workers: int = 16) -> dict:
        """``stop --dry-run``'s document: per host what stop would end, read without the lock."""
        raise NotImplementedError
