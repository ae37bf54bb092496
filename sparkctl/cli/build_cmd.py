"""``sparkctl build`` and ``sparkctl distribute`` (alias ``share``): parse, call sparkctl.ops, print."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import typer

from sparkctl.cli.option_groups import with_option_groups
from sparkctl.cli.context import ENV_OPTION, JSON_OPTION, SET_OPTION, split_hosts, state
from sparkctl.cli.answer import finish
from sparkctl.cli.timeouts import CONNECT_TIMEOUT_OPTION
from sparkctl.errors import ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

PROFILE = typer.Option(None, "--profile", "-p", help="Build/distribute the image this profile runs (image.name, image.variant).")
IMAGE = typer.Option(None, "--image", help="An image chain: a name in images/ (or $SPARKCTL_IMAGES), or a chain folder.")
VARIANT = typer.Option(None, "--variant", help="A variant of the chain (e.g. engram-mem).")
DRY_RUN = typer.Option(False, "--dry-run", help="Print the plan and stop.")


@dataclass
class ImageChoice:
    """Which image a verb builds or sends: the one a profile runs, or a chain (and variant) by name."""

    profile: Optional[str] = PROFILE
    image: Optional[str] = IMAGE
    variant: Optional[str] = VARIANT

    def resolve(self, sets=(), envs=()):
        """(chain, variant); see ``resolve_image``."""
        return resolve_image(self.profile, self.image, self.variant, sets, envs)


def resolve_image(profile: str | None, image: str | None, variant: str | None, sets=(), envs=()):
    """(chain, variant) from --profile or --image/--variant."""
    from sparkctl.images.chain import chain_for_profile, load_chain

    if profile and image:
        raise ConfigError("give --profile or --image, not both", field="--image")
    if profile:
        from sparkctl.config.profile import load_profile

        loaded = load_profile(profile, sets=sets, envs=envs).profile
        if variant and variant != loaded.image.variant:
            raise ConfigError(f"profile {profile!r} runs variant {loaded.image.variant!r}; drop --variant or use --image",
                              field="--variant")
        return chain_for_profile(loaded)
    if not image:
        raise ConfigError("name the image: --profile P or --image NAME", field="--image")
    chain = load_chain(image)
    chain.variant(variant)  # validates the name
    return chain, variant


def warn(out, message: str) -> None:
    """One unwrapped line on stderr (CI logs are grepped; rich would wrap at 80 columns)."""
    out.console.print("warning: " + message, soft_wrap=True, markup=False, highlight=False, style="yellow")


def _parse_build_args(values: list[str]) -> dict[str, str]:
    from sparkctl.config.profile import parse_assignment

    out = {}
    for value in values:
        key, raw = parse_assignment(value, "--build-arg")
        out[key] = raw
    return out


@with_option_groups
def build(
    ctx: typer.Context,
    which: ImageChoice,
    context: Optional[str] = typer.Option(None, "--context", help="Build context folder (default: the chain's `context`, or $SPARKCTL_BUILD_CONTEXT)."),
    build_args: list[str] = typer.Option([], "--build-arg", help="Override a layer's build argument: NAME=VALUE (repeatable)."),
    dry_run: bool = DRY_RUN,
    no_cache: bool = typer.Option(False, "--no-cache", help="Rebuild every layer (ignore matching labels and docker's cache)."),
    on: Optional[str] = typer.Option(None, "--on", help="Build on this inventory host's engine (over SSH) instead of the local one."),
    prune_intermediate: bool = typer.Option(False, "--prune-intermediate", help="Afterwards, untag the intermediate layers and remove this chain's superseded images."),
    strict_patches: bool = typer.Option(False, "--strict-patches", help="Fail (exit 1) when a patch's destination does not exist in the image below it."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="With --on: record an unknown host key (like StrictHostKeyChecking=accept-new)."),
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Build an image chain: base, overlays, patch layer (and variant), skipping layers whose inputs are unchanged."""
    from sparkctl.images.plan import format_plan, plan_build

    st = state(ctx)
    out = st.output(json_flag)
    chain, variant = which.resolve(sets, envs)
    plan = plan_build(chain, variant, context=context, build_args=_parse_build_args(build_args))
    if dry_run or plan.missing:
        # Checked against listings here; a real build checks inside the image below the patch layer.
        for target in plan.patch_targets:
            if target.status == "missing":
                warn(out, target.message())
    if dry_run:  # the whole plan, every missing input with it; exit 2 when an input is missing
        out.result(dict(plan.to_json(), ok=not plan.missing), format_plan(plan))
        if plan.missing:
            out.info(f"error: {len(plan.missing)} build input(s) missing: pass --context DIR (docs/images.md)")
            raise typer.Exit(2)
        return
    if plan.missing:
        raise plan.missing_error()
    from sparkctl.ops.build import BuildOptions, engine_for, format_result, report_errors, run_build

    if on is None:
        _check_builder_arch(st, out, connect_timeout)
    options = BuildOptions(no_cache=no_cache, prune_intermediate=prune_intermediate, strict_patches=strict_patches)
    with engine_for(st, on, accept_new_host_keys=accept_new_host_keys, connect_timeout=connect_timeout) as engine:
        result = run_build(plan, engine, options, out)
    report_errors(result, out)
    finish(out, result.to_json(), format_result(result), result.ok)


def _check_builder_arch(st, out, connect_timeout: float) -> None:
    """A local build must make images the hosts can run (GB10 is arm64); with no inventory there is
    nothing to compare with, and it is said."""
    from sparkctl.ops.build_arch import check_local_build, hosts_arch, local_arch

    try:
        inventory = st.inventory()
    except ConfigError:
        warn(out, f"no inventory: the hosts' architecture is not checked (this machine builds {local_arch()} images)")
        return
    check_local_build(local_arch(), hosts_arch(inventory, connect_timeout=connect_timeout))


@with_option_groups
def distribute(
    ctx: typer.Context,
    which: ImageChoice,
    hosts: Optional[str] = typer.Option(None, "--hosts", help="Comma-separated host names (default: every inventory host)."),
    source: Optional[str] = typer.Option(None, "--from", help="Send from this inventory host's engine, host to host over the fabric (it needs SSH to the others; else a retry goes through here)."),
    via_here: bool = typer.Option(False, "--via-here", help="With --from: pass the stream through this machine instead."),
    dry_run: bool = DRY_RUN,
    transport: str = typer.Option("auto", "--transport", help="Bulk stream over: auto (OpenSSH when installed), openssh, paramiko."),
    retries: int = typer.Option(1, "--retries", min=0, max=10, help="Times a failed host is tried again (each retry re-reads the image for it)."),
    thin: bool = typer.Option(True, "--thin/--full", help="Send only the layers a host lacks (default) or always the whole image."),
    bwlimit: Optional[float] = typer.Option(None, "--bwlimit", min=0.1, max=1e6, help="At most this many MB/s to each host (a shared management link)."),
    accept_new_host_keys: bool = typer.Option(False, "--accept-new-host-keys", help="Record unknown host keys (like StrictHostKeyChecking=accept-new)."),
    connect_timeout: float = CONNECT_TIMEOUT_OPTION,
    sets: list[str] = SET_OPTION,
    envs: list[str] = ENV_OPTION,
    json_flag: bool = JSON_OPTION,
) -> None:
    """Copy the image to every host that lacks it: one `docker save`, streamed to all hosts at once."""
    from sparkctl.ops.distribute import DistributeOptions, format_report, run_distribute

    if transport not in ("auto", "openssh", "paramiko"):
        raise ConfigError(f"--transport must be auto, openssh or paramiko, not {transport!r}", field="--transport")
    st = state(ctx)
    out = st.output(json_flag)
    chain, variant = which.resolve(sets, envs)
    inventory = st.inventory()
    options = DistributeOptions(
        tag=chain.final_tag(variant), hosts=split_hosts(hosts), source=source, via_here=via_here, dry_run=dry_run, transport=transport,
        retries=retries, thin=thin, accept_new_host_keys=accept_new_host_keys, bwlimit=bwlimit,
        connect_timeout=connect_timeout,
    )
    report = run_distribute(inventory, options, out)
    finish(out, report.to_json(), format_report(report), report.ok)


def register(app: typer.Typer) -> None:
    app.command("build")(build)
    app.command("distribute")(distribute)
    app.command("share", help="Alias of `distribute`.")(distribute)
