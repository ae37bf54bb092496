"""Is the machine that builds the image of the hosts' architecture? A GB10 box is arm64: an image
built on an x86 laptop would be pulled, started, and die with "exec format error" on every host."""

from __future__ import annotations

import platform

from sparkctl.errors import ConfigError
from sparkctl.remote.pool import fan_out, run_pool

_ALIASES = {"aarch64": "arm64", "arm64": "arm64", "x86_64": "amd64", "amd64": "amd64"}


def normalized(machine: str) -> str:
    """``uname -m`` / platform.machine() spelled as Docker spells platforms (arm64, amd64)."""
    return _ALIASES.get(machine.strip().lower(), machine.strip().lower())


def local_arch() -> str:
    return normalized(platform.machine())


def hosts_arch(inventory, *, connect_timeout: float = 10.0) -> dict[str, str]:
    """{host: arch} for every host that answers ``uname -m`` (a host that does not is left out:
    doctor is where an unreachable host is reported)."""
    def ask(conn):
        result = conn.run(["uname", "-m"], timeout=30)
        return normalized(result.stdout) if result.ok else None

    with run_pool(connect_timeout=connect_timeout) as pool:
        results = fan_out([inventory.ssh_target(h) for h in inventory.hosts], ask, pool=pool)
    return {r.name: r.value for r in results if r.ok and r.value}


def check_local_build(builder: str, hosts: dict[str, str]) -> None:
    """Refuse a local build whose images the hosts could not run, naming the fix."""
    foreign = sorted({arch for arch in hosts.values() if arch != builder})
    if foreign:
        names = ", ".join(name for name, arch in hosts.items() if arch != builder)
        head = next(iter(hosts))
        raise ConfigError(
            f"this machine builds {builder} images but {names} {'is' if len(names.split(', ')) == 1 else 'are'} "
            f"{'/'.join(foreign)}: the engine would fail there with 'exec format error'. Build on a host instead: "
            f"`sparkctl build ... --on {head}` (`sparkctl up` builds on the head by default)", field="--on")
