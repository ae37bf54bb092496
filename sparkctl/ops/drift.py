"""What changed between the running deployment and what it would be now (``sparkctl status``).

A deployment drifts without anyone touching its containers: a new image is distributed under the
same tag, a recipe is edited, a variable is changed. None of this stops it serving, so these are
*notices* (status still exits 0) — except ranks running different images, which is the kind of
mismatch that hangs a NCCL rendezvous or corrupts results, and is a problem.

Pure functions: the containers come from ``docker inspect`` (``Config.Cmd`` is the engine argv,
since the images have an empty ENTRYPOINT; ``Config.Env`` holds engine.env's values), the
expected values from the same render ``serve`` used. Environment values are never printed: they
may be tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Drift:
    problems: list[str] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)


def short_id(image_id: str) -> str:
    return image_id.removeprefix("sha256:")[:12] or "?"


def image_drift(running: dict[str, str], tag_now: dict[str, str | None],
                layers: dict[str, tuple[str, ...] | None], tag: str) -> Drift:
    """``running``: host -> image ID its container runs; ``tag_now``: host -> the ID ``tag`` names
    there now (None: the tag is gone); ``layers``: host -> the running image's layer diff IDs
    (None: unknown). Ranks are compared by content (layers), not by ID: the same files imported
    or built on each host get different IDs."""
    drift = Drift()
    known = {host: content for host, content in layers.items() if content is not None}
    if len(set(known.values())) > 1:
        drift.problems.append("the ranks run images of different content: " + ", ".join(
            f"{host} {short_id(running[host])}" for host in known)
            + " (`sparkctl distribute`, then `sparkctl serve` again)")
    for host, image in running.items():
        now = tag_now.get(host, image)
        if now is None:
            drift.notices.append(f"{host}: runs {short_id(image)}; {tag} is no longer on the host")
        elif now != image:
            drift.notices.append(f"{host}: runs {short_id(image)} but {tag} is {short_id(now)} now "
                                 "(distributed since the serve): `sparkctl serve` again to run it")
    return drift


def argv_changes(running: list[str], expected: list[str], limit: int = 4) -> list[str]:
    """The options whose values differ, as ``--flag old → new`` (``absent`` on either side)."""

    def options(argv: list[str]) -> tuple[list[str], dict[str, str]]:
        positional, opts, i = [], {}, 0
        while i < len(argv):
            arg = argv[i]
            if arg.startswith("--") and "=" in arg:
                key, _, value = arg.partition("=")
                opts[key] = value
            elif arg.startswith("-") and len(arg) > 1:
                takes_value = i + 1 < len(argv) and not argv[i + 1].startswith("--")
                opts[arg] = argv[i + 1] if takes_value else "(set)"
                i += takes_value
            else:
                positional.append(arg)
            i += 1
        return positional, opts

    old_pos, old = options(running)
    new_pos, new = options(expected)
    changes = []
    if old_pos != new_pos:
        changes.append(f"command {' '.join(old_pos)} → {' '.join(new_pos)}")
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            changes.append(f"{key} {old.get(key, 'absent')} → {new.get(key, 'absent')}")
    if len(changes) > limit:
        changes = changes[:limit] + [f"and {len(changes) - limit} more"]
    return changes


def env_changes(running: dict[str, str], expected: dict[str, str], skip: set[str] = frozenset()) -> list[str]:
    """Names of the expected variables whose running value differs (values withheld)."""
    return sorted(name for name, value in expected.items() if name not in skip and running.get(name) != value)


def config_drift(host: str, cmd: list[str], env: dict[str, str], expected_argv: list[str],
                 expected_env: dict[str, str], env_skip: set[str]) -> list[str]:
    notices = []
    changed = argv_changes(cmd, expected_argv)
    if changed:
        notices.append(f"{host}: the engine runs with other arguments than the profile renders now: {'; '.join(changed)}")
    names = env_changes(env, expected_env, env_skip)
    if names:
        notices.append(f"{host}: environment differs from the profile for {', '.join(names)}")
    return notices
