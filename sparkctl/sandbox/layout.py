"""The sandbox's names, addresses and files, computed without touching the machine.

Everything ``cluster.up`` creates is named here first: state folders, network namespaces, bridges,
veth names (the kernel caps interface names at 15 characters), addresses on the two links, and
the text of ``inventory.yaml``. Pure functions only, so the arithmetic is unit-tested without root.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import os
import re
from dataclasses import asdict, dataclass, field

# Not under /var/lib/sparkctl: that folder is each host's own inside the sandbox (bound per host),
# so the sandbox's state (host keys, authorized keys) must live elsewhere to stay visible.
DEFAULT_ROOT = "/var/lib/sparkctl-sandbox"
# Held while a sandbox picks its subnets and creates its bridges: the network is the machine's,
# whatever state root each sandbox has (cluster._network_claim).
NETWORK_LOCK = "/run/lock/sparkctl-sandbox-network.lock"
HOST_STATE_DIR = "/var/lib/sparkctl"
ROOT_ENV = "SPARKCTL_SANDBOX_ROOT"
DEFAULT_NAME = "default"
DEFAULT_HOSTS = 4
# Each host has two addresses on the fabric subnet (one per twin netdev, see FABRIC_TWINS): host N's
# first twin at .(11 + N - 1), its second at TWIN_OFFSET above it, so one /24 holds 100 hosts.
MAX_HOSTS = 100
TWIN_OFFSET = 100
DEFAULT_MGMT_SUBNET = "10.231.0.0/24"
DEFAULT_FABRIC_SUBNET = "10.232.0.0/24"

# Host N (1-based) gets the subnet's address FIRST_HOST_OFFSET + N - 1: .11, .12, ...
CONTROL_OFFSET = 1
FIRST_HOST_OFFSET = 11
# An address on the management bridge that never answers (a static neighbour entry pointing at a
# MAC nobody owns): connecting to it times out, as a powered-off box on a real switch would.
BLACKHOLE_OFFSET = 250
BLACKHOLE_MAC = "02:00:5e:00:0b:fa"

# The names a DGX Spark gives its links: the 10 GbE management port and the cabled ConnectX-7 port.
# A cabled CX7 port shows as two RDMA devices with two netdevs ("twins": the GB10 reaches the NIC
# through two PCIe x4 links), e.g. rocep1s0f1/enp1s0f1np1 and roceP2p1s0f1/enP2p1s0f1np1 in NVIDIA's
# two-Spark playbook. Both are Up and both carry traffic.
MGMT_IFACE = "enP7s7"
FABRIC_TWINS = (("rocep1s0f1", "enp1s0f1np1"), ("roceP2p1s0f1", "enP2p1s0f1np1"))
FABRIC_IFACE = FABRIC_TWINS[0][1]
FABRIC_TWIN_IFACE = FABRIC_TWINS[1][1]
FABRIC_HCA = FABRIC_TWINS[0][0]
FABRIC_MTU = 9000
# A fresh box's MTU, before anyone configured the fabric.
DEFAULT_MTU = 1500

# The login every sandbox host offers: an ordinary user with sudo, as DGX OS's `nvidia`. Root is
# not reachable over SSH; what needs root goes through sudo.
USER = "nvidia"
USER_UID = 1000
USER_HOME = "/home/nvidia"
IFNAMSIZ = 15

STATE_VERSION = 1

_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,31}\Z")
_SHORT_TAG_RE = re.compile(r"^[a-z0-9]{1,6}\Z")


class LayoutError(ValueError):
    """A request the sandbox cannot satisfy as asked (bad name, subnet too small, ...)."""


def state_root() -> str:
    root = os.path.abspath(os.environ.get(ROOT_ENV) or DEFAULT_ROOT)
    if root == HOST_STATE_DIR or root.startswith(HOST_STATE_DIR + "/"):
        from sparkctl.errors import ConfigError

        raise ConfigError(f"{root} is inside {HOST_STATE_DIR}, which every sandbox host replaces with its own folder", field=ROOT_ENV)
    return root


def check_name(name: str) -> str:
    if not _NAME_RE.match(name):
        raise LayoutError(
            f"sandbox name {name!r} is not valid: use lower-case letters, digits and '-', at most 32 characters"
        )
    return name


def interface_tag(name: str) -> str:
    """A short, stable tag for interface names: the name itself when it fits, else a hash of it."""
    if _SHORT_TAG_RE.match(name):
        return name
    return hashlib.sha1(name.encode()).hexdigest()[:6]


# A Unix socket's path lives in sockaddr_un.sun_path: 108 bytes with its terminating NUL (Linux's
# UNIX_PATH_MAX), so 107 bytes of path at most. Each host's dockerd listens under the state root.
UNIX_PATH_MAX = 108


def long_socket_paths(layout: "SandboxLayout") -> list[str]:
    """The Unix socket paths of ``layout`` (each host's Docker socket) that do not fit in sun_path."""
    return [h.docker_socket for h in layout.hosts if len(os.fsencode(h.docker_socket)) >= UNIX_PATH_MAX]


def check_socket_paths(layout: "SandboxLayout") -> None:
    """LayoutError naming the state root when a host's Docker socket path would pass the limit: its
    dockerd would start, but nothing could ever connect to it."""
    long = long_socket_paths(layout)
    if long:
        worst = max(long, key=lambda p: len(os.fsencode(p)))
        over = len(os.fsencode(worst)) + 1 - UNIX_PATH_MAX
        root = os.path.dirname(layout.root)
        raise LayoutError(f"{ROOT_ENV}={root} is too long: each host's Docker socket lives under it and {worst} is "
                          f"{len(os.fsencode(worst))} bytes, {over} over the {UNIX_PATH_MAX}-byte Unix socket limit "
                          f"(with its NUL); use a root at least {over} bytes shorter")


def host_name(index: int) -> str:
    """Host names follow the real rack's habit: spark-1, spark-2, ..."""
    return f"spark-{index}"


@dataclass(frozen=True)
class HostLayout:
    name: str
    index: int  # 1-based
    address: str
    fabric_address: str
    netns: str
    veth_mgmt: str  # root-namespace end, attached to the management bridge
    veth_fabric: str  # root-namespace end, attached to the fabric bridge
    dir: str
    fabric_twin_address: str = ""  # the second twin netdev's address (see FABRIC_TWINS)
    veth_fabric_twin: str = ""  # root-namespace end of the second twin, on the fabric bridge too

    @property
    def fabric_addresses(self) -> tuple[str, ...]:
        return (self.fabric_address, self.fabric_twin_address)

    @property
    def fabric_links(self) -> tuple[tuple[str, str, str], ...]:
        """(root-namespace veth, netdev inside the host, address) for both twins."""
        return ((self.veth_fabric, FABRIC_IFACE, self.fabric_address),
                (self.veth_fabric_twin, FABRIC_TWIN_IFACE, self.fabric_twin_address))

    # Per-host folders and files (absolute paths on the control machine).
    @property
    def nvme_dir(self) -> str:
        return os.path.join(self.dir, "nvme")

    @property
    def run_dir(self) -> str:
        """Bound over /var/run inside the host, so /var/run/docker.sock is this host's own."""
        return os.path.join(self.dir, "run")

    @property
    def home_dir(self) -> str:
        """Bound over /home inside the host (the user's home is ``user_home``)."""
        return os.path.join(self.dir, "home")

    @property
    def user_home(self) -> str:
        return os.path.join(self.home_dir, USER)

    @property
    def root_home(self) -> str:
        """Bound over /root inside the host."""
        return os.path.join(self.dir, "root")

    @property
    def etc_dir(self) -> str:
        """Bound over /etc inside the host: the host's own users, groups, sudoers, docker and network
        settings (a copy of this machine's /etc made when the host is created, then the host's)."""
        return os.path.join(self.dir, "etc")

    @property
    def var_lib_dir(self) -> str:
        """Bound over /var/lib/sparkctl inside the host: deployed files, the deploy lock, the audit log."""
        return os.path.join(self.dir, "var-lib-sparkctl")

    @property
    def bin_dir(self) -> str:
        """Bound over /usr/local/bin inside the host: the stand-in nvidia-smi and friends."""
        return os.path.join(self.dir, "bin")

    @property
    def infiniband_dir(self) -> str:
        """Bound over /dev/infiniband inside the host: stand-in verbs devices (``standins.make_rdma_nodes``)."""
        return os.path.join(self.dir, "infiniband")

    @property
    def etc_hosts(self) -> str:
        return os.path.join(self.dir, "etc", "hosts")

    @property
    def docker_data(self) -> str:
        return os.path.join(self.dir, "docker")

    @property
    def docker_config(self) -> str:
        """/etc/docker/daemon.json inside the host."""
        return os.path.join(self.etc_dir, "docker", "daemon.json")

    @property
    def docker_socket(self) -> str:
        """The host's engine socket as seen from the control machine (unix://<this> for docker-py)."""
        return os.path.join(self.run_dir, "docker.sock")

    @property
    def host_key(self) -> str:
        return os.path.join(self.dir, "ssh", "ssh_host_ed25519_key")

    @property
    def pid_dir(self) -> str:
        return os.path.join(self.dir, "pids")

    @property
    def log_dir(self) -> str:
        return os.path.join(self.dir, "logs")

    def pidfile(self, service: str) -> str:
        if service == "dockerd":  # dockerd's own default, /var/run/docker.pid: the host reloads it by that
            return os.path.join(self.run_dir, "docker.pid")
        return os.path.join(self.pid_dir, f"{service}.pid")

    def logfile(self, service: str) -> str:
        return os.path.join(self.log_dir, f"{service}.log")

    @property
    def netns_path(self) -> str:
        return f"/run/netns/{self.netns}"


@dataclass(frozen=True)
class SandboxLayout:
    name: str
    root: str  # the sandbox's state folder
    tag: str
    mgmt_subnet: str
    fabric_subnet: str
    bridge_mgmt: str
    bridge_fabric: str
    control_address: str
    blackhole_address: str
    hosts: tuple[HostLayout, ...] = field(default_factory=tuple)
    # A bare sandbox starts as a rack on its first day: the user is not in the docker group, no
    # sparkctl folders, fabric netdevs without addresses at MTU 1500, no host-to-host keys, and no
    # nvidia runtime registered with Docker. `sparkctl setup` is what prepares it.
    bare: bool = False
    # sudo asks the user's password (kept in ``sudo_password_file``) instead of NOPASSWD.
    password_sudo: bool = False

    @property
    def cluster(self) -> str:
        return f"sandbox-{self.name}"

    @property
    def state_file(self) -> str:
        return os.path.join(self.root, "state.json")

    @property
    def inventory(self) -> str:
        return os.path.join(self.root, "inventory.yaml")

    @property
    def known_hosts(self) -> str:
        return os.path.join(self.root, "known_hosts")

    @property
    def identity_file(self) -> str:
        return os.path.join(self.root, "id_ed25519")

    @property
    def hosts_identity_file(self) -> str:
        """The key every host has as its own ~/.ssh/id_ed25519, so the hosts reach each other over
        SSH as on a real cluster (NVIDIA's setup gives every Spark passwordless SSH to the others)."""
        return os.path.join(self.root, "hosts_id_ed25519")

    @property
    def authorized_keys(self) -> str:
        return os.path.join(self.root, "authorized_keys")

    @property
    def sudo_password_file(self) -> str:
        """The user's sudo password of a password-sudo sandbox (mode 0600, this machine's root only)."""
        return os.path.join(self.root, "sudo_password")

    def host(self, name: str) -> HostLayout:
        for host in self.hosts:
            if host.name == name:
                return host
        raise LayoutError(f"sandbox {self.name!r} has no host {name!r} (hosts: {', '.join(h.name for h in self.hosts)})")

    def to_state(self) -> dict:
        data = asdict(self)
        data["version"] = STATE_VERSION
        return data

    @classmethod
    def from_state(cls, data: dict) -> "SandboxLayout":
        if data.get("version") != STATE_VERSION:
            raise LayoutError(f"sandbox state version {data.get('version')!r} is not {STATE_VERSION}; run `sandbox down` first")
        hosts = tuple(HostLayout(**h) for h in data["hosts"])
        fields = {k: v for k, v in data.items() if k not in ("version", "hosts")}
        return cls(hosts=hosts, **fields)


def _subnet(value: str, what: str) -> ipaddress.IPv4Network:
    try:
        net = ipaddress.ip_network(value, strict=True)
    except ValueError as err:
        raise LayoutError(f"{what} subnet {value!r} is not a network address with a prefix (e.g. 10.231.0.0/24): {err}") from None
    if not isinstance(net, ipaddress.IPv4Network):
        raise LayoutError(f"{what} subnet {value!r}: only IPv4 subnets are supported")
    if net.prefixlen > 24:
        raise LayoutError(f"{what} subnet {value!r} is smaller than a /24; the hosts live at .11 and up, .250 is reserved")
    return net


def plan(
    name: str,
    hosts: int,
    *,
    root: str | None = None,
    mgmt_subnet: str = DEFAULT_MGMT_SUBNET,
    fabric_subnet: str = DEFAULT_FABRIC_SUBNET,
    bare: bool = False,
    password_sudo: bool = False,
) -> SandboxLayout:
    """The full layout of sandbox ``name`` with ``hosts`` hosts. No I/O."""
    check_name(name)
    if not 1 <= hosts <= MAX_HOSTS:
        raise LayoutError(f"--hosts must be between 1 and {MAX_HOSTS}, not {hosts}")
    mgmt = _subnet(mgmt_subnet, "management")
    fabric = _subnet(fabric_subnet, "fabric")
    if mgmt.overlaps(fabric):
        raise LayoutError(f"management subnet {mgmt} and fabric subnet {fabric} overlap; pick two separate subnets")
    sandbox_dir = os.path.join(root or state_root(), name)
    tag = interface_tag(name)
    prefix = f"spk{tag}"
    host_layouts = []
    for index in range(1, hosts + 1):
        hname = host_name(index)
        host_layouts.append(
            HostLayout(
                name=hname,
                index=index,
                address=str(mgmt.network_address + FIRST_HOST_OFFSET + index - 1),
                fabric_address=str(fabric.network_address + FIRST_HOST_OFFSET + index - 1),
                netns=f"sparkctl-{name}-{hname}",
                veth_mgmt=f"{prefix}m{index}",
                veth_fabric=f"{prefix}f{index}",
                dir=os.path.join(sandbox_dir, "hosts", hname),
                fabric_twin_address=str(fabric.network_address + FIRST_HOST_OFFSET + TWIN_OFFSET + index - 1),
                veth_fabric_twin=f"{prefix}g{index}",
            )
        )
    layout = SandboxLayout(
        name=name,
        root=sandbox_dir,
        tag=tag,
        mgmt_subnet=str(mgmt),
        fabric_subnet=str(fabric),
        bridge_mgmt=f"{prefix}m",
        bridge_fabric=f"{prefix}f",
        control_address=str(mgmt.network_address + CONTROL_OFFSET),
        blackhole_address=str(mgmt.network_address + BLACKHOLE_OFFSET),
        hosts=tuple(host_layouts),
        bare=bare,
        password_sudo=password_sudo,
    )
    for ifname in [layout.bridge_mgmt, layout.bridge_fabric] + [
        n for h in layout.hosts for v in (h.veth_mgmt, h.veth_fabric, h.veth_fabric_twin) for n in (v, peer_name(v))
    ]:
        assert len(ifname) <= IFNAMSIZ, ifname
    return layout


def peer_name(veth: str) -> str:
    """The temporary name of a veth's far end before it moves into the host and is renamed."""
    return veth + "p"


def stable_mac(netns: str, ifname: str) -> str:
    """A fixed, locally administered MAC per host interface: like real NICs, it survives a rebuild,
    so neighbours' ARP caches stay valid when `up` recreates a broken host."""
    digest = hashlib.sha1(f"{netns}/{ifname}".encode()).digest()
    return "02:" + ":".join(f"{b:02x}" for b in digest[:5])


def prefix_len(subnet: str) -> int:
    return ipaddress.ip_network(subnet).prefixlen


# ---------------------------------------------------------------------------------------------
# Files the sandbox writes


_PLAIN_YAML_RE = re.compile(r"^[A-Za-z0-9/._@-]+\Z")


def _yaml_str(value: str) -> str:
    """A YAML scalar for ``value``: bare when unambiguous, else a JSON string (valid YAML)."""
    if _PLAIN_YAML_RE.match(value) and value.lower() not in ("yes", "no", "on", "off", "true", "false", "null", "~"):
        return value
    return json.dumps(value)


def render_inventory(layout: SandboxLayout) -> str:
    """inventory.yaml in the shape the config loader validates (absolute paths, known keys only)."""
    lines = [
        f"# Written by `sparkctl sandbox up` for sandbox {layout.name!r}; rewritten on every `up`.",
        f"cluster: {_yaml_str(layout.cluster)}",
        f"known_hosts: {_yaml_str(layout.known_hosts)}",
        "defaults:",
        f"  ssh: {{user: {USER}, port: 22, identity_file: {_yaml_str(layout.identity_file)}}}",
        "  nvme_path: /mnt/nvme",
        f"  fabric_interfaces: [{', '.join(dev for _, dev in FABRIC_TWINS)}]",
        f"  hcas: [{', '.join(hca for hca, _ in FABRIC_TWINS)}]",
        f"  fabric_subnet: {layout.fabric_subnet}",
        "paths:",
        "  model_dir: /mnt/nvme/models/DeepSeek-V4.1-Flash",
        "  engram_dir: /mnt/nvme/engram",
        "  hf_cache: /mnt/nvme/hf-cache",
        "hosts:",
    ]
    for host in layout.hosts:
        lines.append(f"  - name: {host.name}")
        lines.append(f"    address: {host.address}")
        if host.index == 1:
            lines.append("    role: head")
        lines.append(f"    fabric_addresses: [{', '.join(host.fabric_addresses)}]")
    return "\n".join(lines) + "\n"


def render_known_hosts(layout: SandboxLayout, public_keys: dict[str, str]) -> str:
    """known_hosts lines for every host's management address; ``public_keys`` maps host -> "type base64"."""
    lines = []
    for host in layout.hosts:
        key = public_keys.get(host.name)
        if key:
            lines.append(f"{host.address} {key}")
    return "\n".join(lines) + ("\n" if lines else "")


def render_etc_hosts(layout: SandboxLayout) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    for host in layout.hosts:
        lines.append(f"{host.address}\t{host.name}")
    return "\n".join(lines) + "\n"
