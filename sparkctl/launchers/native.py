"""The native launcher: the single-box engine as a process on its one host (``launcher: native``).

Its operations are ``ops/native`` (the steps on one connection) and ``ops/native_deploy`` (serve,
stop, status, logs under the deploy lock); ``up``'s serve step is ``ops/native_up`` (no image
steps); its verbs are printed by ``cli/native_cmd``.
"""

from __future__ import annotations

from sparkctl.launchers.base import Launcher, UpServe
from sparkctl.ops import native_up
from sparkctl.ops.native_deploy import plan_native_stop
from sparkctl.ops.steps import Step


class Native(Launcher):
    name = "native"
    runs_containers = False
    cli_module = "sparkctl.cli.native_cmd"

    def plan_up(self, up) -> UpServe:
        up.native_plan = plan = native_up.plan(up)
        return UpServe(plan, [plan.host], plan.endpoint, plan.served_model_name)

    def up_steps(self, up) -> tuple[list[Step], Step]:
        # no image: build, distribute and engram do not apply (each says why)
        image = [Step(name, native_up.look_no_image, native_up.never) for name in ("build", "distribute", "engram")]
        return image, Step("serve", native_up.look_serve, native_up.act_serve)

    def engine_running(self, up) -> bool:
        return native_up.engine_running(up)

    def plan_stop(self, inventory, hosts, loaded, *, pool, max_workers: int = 16) -> dict:
        return plan_native_stop(hosts, loaded)


LAUNCHER = Native()
