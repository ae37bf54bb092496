"""The endpoint's API key: named by the profile, read on the control machine, never written in a recipe.

``serving.api_key_env`` names an environment variable of the machine running sparkctl that holds
the key; ``serving.api_key_file`` names a file holding it (the first line; the file must not be
readable by group or others, as ssh insists for its keys). The key reaches the engine only
through the host's ``engine.env`` (mode 0600: vLLM reads ``VLLM_API_KEY``) and goes to the
endpoint in ``Authorization: Bearer`` headers (health, status, bench, smoke); it is never printed.
"""

from __future__ import annotations

import os
import re
import stat
from typing import Mapping, Optional

from sparkctl.errors import ConfigError
from sparkctl.fileio import read_named_file

# What docker's --env-file would read differently or a header would not carry.
_UNSAFE = re.compile(r"[\s\"'`$#\\\x00-\x1f\x7f]")


def _checked(key: str, where: str, field: str) -> str:
    if not key:
        raise ConfigError(f"{where} is empty; it must hold the API key", field=field)
    if _UNSAFE.search(key):  # the key itself is never shown
        raise ConfigError(f"the API key in {where} contains whitespace, quotes, '$', '#', '\\' or control "
                          "characters (engine.env and HTTP headers cannot carry it as is)", field=field)
    return key


def _read_key_file(path_text: str) -> str:
    field = "serving.api_key_file"
    path = os.path.expanduser(path_text)
    try:
        info = os.stat(path)
    except OSError as err:
        raise ConfigError(f"cannot read {path}: {err.strerror or err}", field=field) from None
    if stat.S_ISREG(info.st_mode) and info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(f"{path} is accessible by group or others (mode {stat.S_IMODE(info.st_mode):04o}); "
                          f"chmod 600 {path}", field=field)
    # A regular file of at most 4 KiB, read without blocking: a FIFO, /dev/zero or a folder is refused.
    first = read_named_file(path, field=field, max_bytes=4096, what="API key file").partition("\n")[0]
    return _checked(first.rstrip("\r\n"), path, field)


def api_key_for(profile, environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
    """The key the profile names (a Profile or a LoadedProfile), or None when it names none."""
    serving = getattr(profile, "profile", profile).serving
    environ = os.environ if environ is None else environ
    if serving.api_key_env:
        name = serving.api_key_env
        if name not in environ:
            raise ConfigError(f"environment variable {name} is not set on this machine (it holds the API key)",
                              field="serving.api_key_env")
        return _checked(environ[name], f"environment variable {name}", "serving.api_key_env")
    if serving.api_key_file:
        return _read_key_file(serving.api_key_file)
    return None


def auth_headers(api_key: Optional[str]) -> dict:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}
