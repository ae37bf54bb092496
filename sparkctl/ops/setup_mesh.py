"""``setup``'s ``ssh_mesh`` step: every host reaches every other over SSH with pinned host keys.

Each host keeps its own key (``~/.ssh/id_ed25519``, made there if missing: no private key leaves a
host); every other host's public key goes into its ``authorized_keys``. Host keys are pinned both
ways from what this machine verified when it connected (its known_hosts): each host's
``known_hosts`` gets every other host's key under its name, management address and fabric
addresses. Nothing is ever accepted blindly (no StrictHostKeyChecking=no).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from sparkctl.commands import setup as cmds

AUTHORIZED, KNOWN_HOSTS = cmds.AUTHORIZED, cmds.KNOWN_HOSTS


def host_key_line(host, key) -> str:
    names = ",".join(dict.fromkeys([host.name, host.address, *host.fabric_addresses]))
    return f"{names} {key.get_name()} {key.get_base64()}"


def _public(line: str) -> str:
    """"type base64" of a public key line (the comment dropped)."""
    return " ".join(line.split()[:2])


def read_state(ctx) -> tuple[str, set[str], set[str]]:
    """(own public key or "", authorized keys as "type base64", known_hosts lines)."""
    out = ctx.ask(cmds.MESH_READ_ARGV, "read the SSH files")
    own, _, rest = out.partition("--\n")
    authorized, _, known = rest.partition("--\n")
    return (_public(own.strip()) if own.strip() else "",
            {_public(line) for line in authorized.splitlines() if line.strip() and not line.startswith("#")},
            {line.strip() for line in known.splitlines() if line.strip()})


def wanted_lines(contexts: dict, own_keys: dict[str, str], name: str) -> tuple[list[str], list[str]]:
    """(authorized keys, known_hosts lines) host ``name`` needs: those of every other host."""
    authorized = [own_keys[other] for other in contexts if other != name and own_keys.get(other)]
    known = [host_key_line(ctx.host, ctx.conn.server_key()) for other, ctx in contexts.items() if other != name]
    return authorized, known


def look(contexts: dict) -> dict[str, str | None]:
    """Host -> why it must change (None: every peer already authorized and pinned)."""
    states = _parallel(contexts, read_state)
    own = {name: state[0] for name, state in states.items()}
    needs = {}
    for name, (key, authorized, known) in states.items():
        want_auth, want_known = wanted_lines(contexts, own, name)
        gaps = []
        if not key:
            gaps.append("no key of its own")
        missing_peers = [o for o in contexts if o != name and not own.get(o)]
        if [k for k in want_auth if k not in authorized] or missing_peers:
            gaps.append("peers' keys not authorized")
        if [line for line in want_known if line not in known]:
            gaps.append("peers' host keys not pinned")
        needs[name] = ", ".join(gaps) or None
    return needs


def act(contexts: dict) -> dict[str, str]:
    """Make the mesh; host -> "changed" or "ok"."""
    created = {}

    def own_key(ctx):
        result = ctx.conn.run(cmds.OWN_KEY_ARGV, timeout=60)
        if not result.ok:
            raise RuntimeError(f"cannot make the host's SSH key: {result.stderr.strip()[-200:]}")
        created[ctx.host.name] = "created" in result.stderr
        return _public(result.stdout.strip())

    own = _parallel(contexts, own_key)

    def append(ctx) -> str:
        want_auth, want_known = wanted_lines(contexts, own, ctx.host.name)
        added = int(ctx.ask(cmds.append_lines_argv(AUTHORIZED, want_auth), "authorize the peers' keys").strip() or 0)
        added += int(ctx.ask(cmds.append_lines_argv(KNOWN_HOSTS, want_known), "pin the peers' host keys").strip() or 0)
        return "changed" if added or created.get(ctx.host.name) else "ok"

    return _parallel(contexts, append)


def _parallel(contexts: dict, fn) -> dict:
    with ThreadPoolExecutor(max_workers=max(1, min(16, len(contexts)))) as pool:
        results = dict(zip(contexts, pool.map(fn, contexts.values())))
    return results
