"""Option groups: options that several verbs take together, declared once, and handed to the verb
as one value.

A group is a dataclass whose fields default to typer options (``DeploymentChoice``: --profile,
--hosts, --set, --env). A verb names the group as one parameter; ``@with_option_groups`` puts
the group's options in that place of the verb's signature, so parsing and help are exactly as if
each option were written out there, and calls the verb with the group built from what was given.
Typer has no such groups of its own: it reads the options off the signature, which is what is
rewritten here.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import typing
from dataclasses import dataclass
from typing import Optional

from sparkctl.cli.context import ENV_OPTION, HOSTS_OPTION, PROFILE_OPTION, SET_OPTION, split_hosts

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

# The default of a group parameter that follows options with defaults (Python wants one there);
# never used: the group is always built from its options.
GROUP = None


def with_option_groups(verb):
    """``verb`` as typer should see it: each parameter whose type is an option group replaced, in
    place, by the group's options; called with the group built from them."""
    hints = typing.get_type_hints(verb)
    groups: dict[str, type] = {}
    params: list[inspect.Parameter] = []
    for param in inspect.signature(verb).parameters.values():
        kind = hints.get(param.name, param.annotation)
        if dataclasses.is_dataclass(kind):
            groups[param.name] = kind
            field_types = typing.get_type_hints(kind)
            params += [inspect.Parameter(f.name, inspect.Parameter.KEYWORD_ONLY, default=f.default,
                                         annotation=field_types[f.name]) for f in dataclasses.fields(kind)]
        else:
            params.append(param.replace(kind=inspect.Parameter.KEYWORD_ONLY, annotation=kind))
    names = [p.name for p in params]
    if len(set(names)) != len(names):
        raise TypeError(f"{verb.__name__}: an option group's field has the name of another parameter")

    @functools.wraps(verb)
    def run(**given):
        for name, kind in groups.items():
            given[name] = kind(**{f.name: given.pop(f.name) for f in dataclasses.fields(kind)})
        return verb(**given)

    run.__signature__ = inspect.Signature(params)
    run.__annotations__ = {p.name: p.annotation for p in params}
    return run


@dataclass
class DeploymentChoice:
    """Which deployment a verb acts on: the profile with its overrides, and the hosts."""

    profile: str = PROFILE_OPTION
    hosts: Optional[str] = HOSTS_OPTION
    sets: list[str] = SET_OPTION
    envs: list[str] = ENV_OPTION

    def load(self):
        """The profile, with --set and --env applied (a LoadedProfile)."""
        from sparkctl.config.profile import load_profile

        return load_profile(self.profile, sets=self.sets, envs=self.envs)

    @property
    def wanted_hosts(self) -> list[str] | None:
        """--hosts as names (None: the profile's default choice)."""
        return split_hosts(self.hosts)
