"""``sparkctl completion bash|zsh|fish``: the shell's completion script, and what it completes.

The script calls sparkctl back with ``_SPARKCTL_COMPLETE`` set (typer's own mechanism), so verbs
and options come from the CLI itself; ``--profile`` completes the profile names (recipes/ and
$SPARKCTL_RECIPES) and ``--hosts``/``--from`` the inventory's host names. A completer never
fails: a missing or broken inventory completes nothing.
"""

from __future__ import annotations

import json

import typer
from typer._completion_shared import get_completion_script

from sparkctl.errors import ConfigError

# The operations, config and transport (pydantic, paramiko, httpx, jinja2 under them) are imported
# inside the commands: `sparkctl --help` imports every cli module and must stay light
# (bench/cli_startup.py measures it).

SHELLS = ("bash", "zsh", "fish")
COMPLETE_VAR = "_SPARKCTL_COMPLETE"
_INSTALL = {
    "bash": 'echo \'eval "$(sparkctl completion bash)"\' >> ~/.bashrc',
    "zsh": 'echo \'eval "$(sparkctl completion zsh)"\' >> ~/.zshrc',
    "fish": "sparkctl completion fish > ~/.config/fish/completions/sparkctl.fish",
}


def complete_profiles(incomplete: str) -> list[str]:
    try:
        from sparkctl.config.profile import available_profiles

        return [name for name in available_profiles() if not name.startswith("_") and name.startswith(incomplete)]
    except Exception:  # completion must never print an error into the user's command line
        return []


def complete_hosts(incomplete: str) -> list[str]:
    """Host names, also after a comma: ``--hosts spark-1,sp<TAB>``."""
    try:
        from sparkctl.config.inventory import load_inventory, resolve_inventory_path

        names = [h.name for h in load_inventory(resolve_inventory_path(None)).hosts]
    except Exception:
        return []
    done, _, last = incomplete.rpartition(",")
    chosen = set(done.split(",")) if done else set()
    prefix = done + "," if done else ""
    return [prefix + name for name in names if name.startswith(last) and name not in chosen]


def completion(shell: str = typer.Argument(..., help="bash, zsh or fish.", autocompletion=lambda incomplete: [
        s for s in SHELLS if s.startswith(incomplete)]),
        json_flag: bool = typer.Option(False, "--json", help="The script inside one JSON document.")) -> None:
    """Print the shell completion script (verbs, options, profile and host names). Install it with:
    bash: eval "$(sparkctl completion bash)" in ~/.bashrc; zsh: the same in ~/.zshrc;
    fish: sparkctl completion fish > ~/.config/fish/completions/sparkctl.fish."""
    if shell not in SHELLS:
        raise ConfigError(f"{shell!r} is not a shell this knows (bash, zsh, fish)", field="SHELL")
    script = get_completion_script(prog_name="sparkctl", complete_var=COMPLETE_VAR, shell=shell)
    if json_flag:
        print(json.dumps({"shell": shell, "script": script, "install": _INSTALL[shell]}, indent=2))
    else:
        print(script)


def register(app: typer.Typer) -> None:
    app.command("completion")(completion)
