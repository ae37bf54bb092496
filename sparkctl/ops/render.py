"""``sparkctl render``: every file and argv a deployment needs, per host, computed before anything runs.

``plan_render`` is pure: from the profile, the inventory, the selected hosts (rank order), the
engine's flag surface and the templates it returns a ``RenderPlan`` (env, docker argv, engine argv
and file contents per host, plus one sparkrun recipe). ``write_render`` puts the files under a
directory atomically. ``render`` is the one entry point the CLI calls: it loads what the plan
needs, and turns an engine_args error into one naming the recipe file (and line) that set it.

Layout of ``--out DIR``: ``DIR/<host>/{engine.env,compose.yaml,launch.sh}`` is what belongs in
``/var/lib/sparkctl/<profile>/`` on that host; ``DIR/recipe.yaml`` is the sparkrun recipe.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sparkctl import engines, launchers
from sparkctl.commands import docker
from sparkctl.commands.engine_flags import EngineFlags, check_env
from sparkctl.commands.env import container_env, without_api_key
from sparkctl.commands.ranks import RankInfo, Ranked
from sparkctl.secrets import MASK, is_secret_name, mask_argv, mask_env
from sparkctl.commands.shell import docker_run_script
from sparkctl.commands.sparkrun import RecipeHost, recipe_context
from sparkctl.commands.templates import TemplateSet
from sparkctl.config.profile import LoadedProfile
from sparkctl.errors import ConfigError, OperationFailed
from sparkctl.fileio import atomic_write, check_writable_folder

RECIPE_FILE_NAME = "recipe.yaml"
# engine.env may carry tokens passed with --env: readable by its owner only.
FILE_MODES = {docker.ENV_FILE_NAME: 0o600, docker.LAUNCH_FILE_NAME: 0o755}


@dataclass
class HostRender(Ranked):
    name: str
    rank: int
    env: dict[str, str]
    docker_argv: list[str]
    engine_argv: list[str]
    files: dict[str, str]  # path relative to the output directory -> content


@dataclass
class RenderPlan:
    profile: str
    engine: str
    hosts: list[HostRender]
    shared_files: dict[str, str]  # path relative to the output directory -> content
    notes: list[str] = field(default_factory=list)
    surface: str = ""  # what the options and variables were checked against

    def all_files(self) -> dict[str, str]:
        out: dict[str, str] = {}
        for host in self.hosts:
            out.update(host.files)
        out.update(self.shared_files)
        return out

    def to_json(self, written: dict[str, str] | None = None) -> dict:
        """``written``: relative path -> path as written (absent without --out)."""
        written = written or {}
        hosts = []
        for host in self.hosts:
            paths = list(host.files) + (list(self.shared_files) if host.rank == 0 else [])
            hosts.append(
                {
                    "name": host.name,
                    "rank": host.rank,
                    "env": mask_env(host.env),  # a key's value lives in engine.env (0600) only
                    "docker_argv": mask_argv(host.docker_argv),
                    "engine_argv": mask_argv(host.engine_argv),
                    "files": [written[p] for p in paths if p in written],
                }
            )
        return {"profile": self.profile, "hosts": hosts, "notes": self.notes, "checked_against": self.surface}


def plan_render(
    loaded: LoadedProfile,
    paths,
    hosts: list,
    flags: EngineFlags,
    templates: TemplateSet,
    notes: list[str] | None = None,
) -> RenderPlan:
    """The whole render, no I/O. ``hosts`` are HostViews in rank order (``select_hosts``)."""
    profile = loaded.profile
    engine = engines.get(profile.engine)
    notes = list(notes or [])
    rendered, specs = [], []
    for rank, host in enumerate(hosts):
        info = RankInfo(rank=rank, nnodes=len(hosts), head_address=hosts[0].fabric_address)
        host_render, spec = _render_host(profile, paths, host, info, engine, flags, templates, notes)
        rendered.append(host_render)
        specs.append(spec)
    head_serve = engine.head_serve_argv(profile, flags, RankInfo(0, len(hosts), hosts[0].fabric_address),
                                        rendered[0].engine_argv)
    recipe = templates.render(
        "recipe.yaml.j2",
        **recipe_context(
            profile,
            profile_file=Path(loaded.path).name,
            model_dir=paths.model_dir,
            hosts=[RecipeHost(h.name, h.address, rank) for rank, h in enumerate(hosts)],
            head_serve_argv=head_serve,
            # The recipe is 0644: the API key stays in engine.env, other secrets show masked.
            envs=[mask_env(without_api_key(h.env)) for h in rendered],
            container=specs[0],
        ),
    )
    notes += _secrets_note(rendered)
    return RenderPlan(profile.name, profile.engine, rendered, {RECIPE_FILE_NAME: recipe}, notes,
                      flags.source if flags.source.startswith("image ") else f"shipped list {Path(flags.source).name}")


def _render_host(profile, paths, host, info: RankInfo, engine, flags: EngineFlags, templates: TemplateSet,
                 notes: list[str]) -> tuple[HostRender, docker.ContainerSpec]:
    """One rank: its environment (warnings added to ``notes`` once), engine and docker argv, files."""
    env = container_env(profile, host, flags)
    for warning in check_env(flags, env, profile.env):
        if warning not in notes:
            notes.append(warning)
    engine_argv = engine.engine_argv(profile, flags, info)
    spec = docker.container_spec(profile, paths, info.rank, engine_argv, docker.rdma_devices(host, env))
    docker_argv = docker.docker_run_argv(spec)
    context = {
        "profile": profile.name,
        "host": host.name,
        "rank": info.rank,
        "nnodes": info.nnodes,
        "role": info.role,
        "remote_dir": docker.remote_profile_dir(profile.name, paths.state_dir),
        "env_file": spec.env_file,
        "container": spec.name,
    }
    files = {
        f"{host.name}/{docker.ENV_FILE_NAME}": templates.render("engine.env.j2", env=env, **context),
        f"{host.name}/{docker.COMPOSE_FILE_NAME}": templates.render(
            "compose.yaml.j2",
            c=spec,
            gpu=docker.gpu_request(spec.gpus),
            project=f"sparkctl-{profile.name}",
            **{**context, "env_file": docker.ENV_FILE_NAME},  # compose reads it next to itself
        ),
        f"{host.name}/{docker.LAUNCH_FILE_NAME}": templates.render(
            "launch.sh.j2", docker_run=docker_run_script(docker_argv, spec.image, engine_argv), **context
        ),
    }
    return HostRender(host.name, info.rank, env, docker_argv, engine_argv, files), spec


def _secrets_note(rendered: list[HostRender]) -> list[str]:
    secrets = sorted({name for h in rendered for name, value in h.env.items() if is_secret_name(name) and value})
    if not secrets:
        return []
    return [f"secrets {', '.join(secrets)}: their values live only in each host's {docker.ENV_FILE_NAME} "
            f"(mode 0600); {RECIPE_FILE_NAME} and the summary show {MASK}"]


def plan_single_box_render(loaded: LoadedProfile, paths, host, notes: list[str]) -> RenderPlan:
    """The single-box engine on its one host: natively (engine.env + launch.sh, the native launcher's
    files) or, with ``launcher: docker``, as the README's container (engine.env, compose.yaml, launch.sh)."""
    from sparkctl.commands import native, singlebox

    profile = loaded.profile
    remote_dir = docker.remote_profile_dir(profile.name, paths.state_dir)
    env_file = f"{remote_dir}/{docker.ENV_FILE_NAME}"
    title = f"the single-box engine's settings for profile {profile.name}"
    if not launchers.of(profile).runs_containers:  # the native launcher's files
        env = native.engine_env(profile)
        command = list(profile.native.command)
        files = {
            f"{host.name}/{docker.ENV_FILE_NAME}": native.env_file_text(env, title),
            f"{host.name}/{docker.LAUNCH_FILE_NAME}": native.launch_script(profile.native.workdir, command, env_file),
        }
        return RenderPlan(profile.name, profile.engine, [HostRender(host.name, 0, env, [], command, files)], {}, notes)
    env = singlebox.container_env(profile)
    argv = singlebox.container_argv(profile, env_file)
    launch = ("#!/bin/sh\n"
              f"# sparkctl render: the single-box engine of profile {profile.name} on {host.name}, in a container.\n"
              f"# This directory belongs at {remote_dir}/ on {host.name}. Same container as compose.yaml.\n"
              "set -eu\n" + docker_run_script(argv, profile.image.tag, []) + "\n")
    files = {
        f"{host.name}/{docker.ENV_FILE_NAME}": native.env_file_text(env, title),
        f"{host.name}/{docker.COMPOSE_FILE_NAME}": singlebox.compose_text(profile, docker.ENV_FILE_NAME),
        f"{host.name}/{docker.LAUNCH_FILE_NAME}": launch,
    }
    return RenderPlan(profile.name, profile.engine, [HostRender(host.name, 0, env, argv, [], files)], {}, notes)


def check_out_named(out_dir: str | Path) -> None:
    """A blank --out is refused: it would mean the current folder (or, joined with replica-N, its subfolders)."""
    if not str(out_dir).strip():
        raise ConfigError("name the folder to write into (e.g. --out rendered)", field="--out")


def check_render_out(plan: RenderPlan, out_dir: str | Path) -> None:
    """Refuse, before a file is written, an ``--out`` where some file of ``plan`` cannot go (a file
    where a folder must be, a folder where a file must be, a folder not writable): a render that
    stopped half way would leave some hosts' files of this render beside others' of an older one."""
    check_out_named(out_dir)
    out = Path(out_dir)
    for relative in plan.all_files():
        parts = Path(relative).parts
        places = [out] + [out.joinpath(*parts[:i]) for i in range(1, len(parts))]
        try:
            for place in places:
                if place.exists() and not place.is_dir():
                    raise ConfigError(f"{place} is a file where the render needs a folder", field="--out")
            if (out / relative).is_dir():
                raise ConfigError(f"{out / relative} is a folder where the render writes a file", field="--out")
            above = Path(os.path.abspath(out)).parents  # --out itself may be new, and its parents
            existing = next(p for p in [*reversed(places), *above] if p.exists())
        except OSError as err:
            raise ConfigError(f"cannot look at {out / relative}: {err.strerror or err}", field="--out") from None
        check_writable_folder(existing, "the render needs a folder", field="--out")


def write_render(plan: RenderPlan, out_dir: str | Path) -> dict[str, str]:
    """Write every file under ``out_dir`` atomically (each place checked first, so a refused
    ``--out`` writes nothing); returns relative path -> path written."""
    check_render_out(plan, out_dir)
    out = Path(out_dir)
    written: dict[str, str] = {}
    for relative, content in plan.all_files().items():
        target = out / relative
        try:
            atomic_write(target, content, FILE_MODES.get(target.name, 0o644))
        except OSError as err:
            raise OperationFailed(f"cannot write {target}: {err.strerror or err}") from None
        written[relative] = str(target)
    return written


def locate_profile_error(err: ConfigError, loaded: LoadedProfile) -> ConfigError:
    """Name the recipe file (and line) behind a profile field, or the --set that introduced it."""
    if err.file or not err.field:
        return err
    from sparkctl.config.profile import available_profiles
    from sparkctl.config.yamlfile import load_yaml_file

    loc = tuple(err.field.split("."))
    for override in reversed(loaded.overrides):  # the last --set of a key is the one that counts
        # load_profile records "--set KEY=VALUE" as "KEY=VALUE" and "--env N=V" as "env N=V".
        option, assignment = ("--env", override[4:]) if override.startswith("env ") else ("--set", override)
        key = assignment.partition("=")[0].strip()
        key = f"env.{key}" if option == "--env" else key
        parts, field_parts = key.split("."), err.field.split(".")
        common = min(len(parts), len(field_parts))
        if parts[:common] == field_parts[:common]:  # the option set this field, or a field under or above it
            detail = f"{err.detail} (from {option} {shown_assignment(assignment)}; profile {loaded.profile.name!r})"
            return ConfigError(detail, file=loaded.path, field=err.field)  # the profile, no recipe line: the option did it
    known = available_profiles()
    known[Path(loaded.path).stem] = Path(loaded.path)
    for name in loaded.chain:
        path = known.get(name)
        if path is None:
            continue
        doc = load_yaml_file(path)
        if loc in doc.lines:
            suffix = "" if str(path) == loaded.path else f" (inherited by profile {loaded.profile.name!r})"
            return ConfigError(err.detail + suffix, file=str(path), field=err.field, line=doc.lines[loc])
    return ConfigError(err.detail, file=loaded.path, field=err.field)


def shown_assignment(assignment: str) -> str:
    """A --set/--env NAME=VALUE as a message may show it: a secret-looking name's value masked."""
    key, sep, value = assignment.partition("=")
    return f"{key}={MASK}" if sep and value and is_secret_name(key.strip()) else assignment


def engine_surface(profile, image_id: str | None = None) -> EngineFlags:
    """What the profile's engine accepts: the surface read from the image (``image_id``, else the
    last image read that carried the profile's tag), else the shipped lists for its version."""
    from sparkctl.commands.engine_flags import load_engine_flags
    from sparkctl.images import surface

    doc = surface.load(image_id, profile.engine) if image_id else surface.latest_for_tag(profile.image.tag, profile.engine)
    if doc is None:
        return with_overlay(load_engine_flags(profile.engine, profile.engine_version), profile)
    surface.check_version(doc, profile.engine, profile.engine_version)
    return with_overlay(surface.as_engine_flags(doc), profile)


def with_overlay(spec: EngineFlags, profile) -> EngineFlags:
    """The surface plus the switches of the image chain's overlay (images/<chain>/switches.txt,
    with the names read from the image's adapter folders when the surface has them)."""
    import dataclasses

    from sparkctl.images.chain import available_chains, load_chain

    if profile.image.name not in available_chains():
        return spec
    declared = load_chain(profile.image.name).switches()
    if declared is None:
        return spec
    names, prefixes = declared
    if spec.switches:
        # read from the built image (what its adapter folders read), plus the chain's list: a switch
        # read inside the engine's own package (the tp4 variant's RoCEnante patch) is not scanned
        return dataclasses.replace(spec, switches=spec.switches | names, switch_prefixes=prefixes,
                                   switches_source=f"{spec.switches_source} and images/{profile.image.name}/switches.txt")
    return dataclasses.replace(spec, switches=names, switch_prefixes=prefixes,
                               switches_source=f"images/{profile.image.name}/switches.txt")


def render(
    inventory,
    profile_name: str,
    *,
    sets: list[str] = (),
    envs: list[str] = (),
    wanted_hosts: list[str] | None = None,
    out_dir: str | None = None,
) -> tuple[RenderPlan, dict[str, str]]:
    """Load, plan and (with ``out_dir``) write. Returns the plan and the files written."""
    from sparkctl.config.profile import load_profile, select_hosts

    loaded = load_profile(profile_name, sets=sets, envs=envs)
    profile = loaded.profile
    hosts, note = select_hosts(profile, inventory.hosts, wanted_hosts)
    try:
        if not engines.get(profile.engine).has_flag_surface:  # the single-box engine: its own server
            plan = plan_single_box_render(loaded, inventory.model.paths, hosts[0], [note] if note else [])
            written = write_render(plan, out_dir) if out_dir is not None else {}
            return plan, written
        flags = engine_surface(profile)
        plan = plan_render(loaded, inventory.model.paths, hosts, flags, TemplateSet.default(), [note] if note else [])
    except ConfigError as err:
        raise locate_profile_error(err, loaded) from None
    written = write_render(plan, out_dir) if out_dir is not None else {}
    return plan, written
