"""Stand-in commands a sandbox host carries where a DGX Spark has the real ones.

They print what a GB10 box prints, so the parsers of `doctor` and friends run on realistic text:
``nvidia-smi`` (the table, ``-L``, ``--query-gpu=...`` with ``--format=csv[,noheader][,nounits]``),
``ibdev2netdev`` (the four ConnectX-7 RDMA devices; the cabled port's twins follow their netdevs),
``nvidia-ctk`` (``runtime configure``: registers the nvidia runtime in the host's daemon.json),
``nvidia-container-runtime`` (registered with dockerd as the ``nvidia`` runtime; it runs runc) and
``dsv41-spark-engine`` (the single-box engine's stand-in, for the native launcher).

Each host's values live in ``.sandbox-host.env`` next to the scripts (the host's /usr/local/bin),
so a test can make one host look broken: ``cluster.set_standin(name, host, SPARK_DRIVER_VERSION=...)``.
"""

from __future__ import annotations

import hashlib
import shlex
import uuid

ENV_FILE = ".sandbox-host.env"

# The character devices a GB10 with its ConnectX-7 loaded has in /dev/infiniband (ib_uverbs'
# major 231, minors from 192; rdma_cm is misc 10:58): one uverbs node per RDMA device of
# ibdev2netdev's four. Real nodes, so `docker run --device /dev/infiniband` passes them as it
# would on a Spark; nothing opens them (the stand-in engine only looks for them, as NCCL would).
RDMA_NODES = {"uverbs0": (231, 192), "uverbs1": (231, 193), "uverbs2": (231, 194), "uverbs3": (231, 195),
              "rdma_cm": (10, 58)}

# What a DGX Spark reports (driver of the 2025 DGX OS image; unified memory, hence [N/A]).
GB10_DEFAULTS = {
    "SPARK_GPU_NAME": "NVIDIA GB10",
    "SPARK_DRIVER_VERSION": "580.95.05",
    "SPARK_CUDA_VERSION": "13.0",
    "SPARK_COMPUTE_CAP": "12.1",
    "SPARK_MEMORY_TOTAL": "[N/A]",
    "SPARK_GPU_BUS_ID": "0000000F:01:00.0",
    "SPARK_GPU_TEMP": "42",
    "SPARK_GPU_POWER": "4.73",
    # Empty: the fabric port's state follows the real link. "Up"/"Down" forces it.
    "SPARK_IBDEV_STATE": "",
    # Non-empty: nvidia-smi fails as it does when the driver is not loaded.
    "SPARK_NVSMI_FAIL": "",
}


def gpu_uuid(host_key: str) -> str:
    """A stable, per-host GPU UUID (real ones are random; stable ones make test output comparable)."""
    return "GPU-" + str(uuid.UUID(hashlib.sha1(host_key.encode()).hexdigest()[:32]))


def render_env(values: dict[str, str]) -> str:
    lines = ["# Values the sandbox's stand-in commands print for this host (shell syntax)."]
    for key in sorted(values):
        lines.append(f"{key}={shlex.quote(str(values[key]))}")
    return "\n".join(lines) + "\n"


def parse_env(text: str) -> dict[str, str]:
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "=" not in line:
            continue
        key, raw = line.split("=", 1)
        parts = shlex.split(raw) if raw else [""]
        values[key] = parts[0] if parts else ""
    return values


NVIDIA_SMI = r"""#!/bin/sh
# Stand-in nvidia-smi of a sparkctl sandbox host: prints what a DGX Spark (GB10) prints.
here=$(dirname "$0")
[ -r "$here/.sandbox-host.env" ] && . "$here/.sandbox-host.env"
: "${SPARK_GPU_NAME:=NVIDIA GB10}" "${SPARK_DRIVER_VERSION:=580.95.05}" "${SPARK_CUDA_VERSION:=13.0}"
: "${SPARK_COMPUTE_CAP:=12.1}" "${SPARK_MEMORY_TOTAL:=[N/A]}" "${SPARK_GPU_BUS_ID:=0000000F:01:00.0}"
: "${SPARK_GPU_UUID:=GPU-00000000-0000-0000-0000-000000000000}" "${SPARK_GPU_TEMP:=42}" "${SPARK_GPU_POWER:=4.73}"

if [ -n "$SPARK_NVSMI_FAIL" ]; then
  echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver. Make sure that the latest NVIDIA driver is installed and running."
  exit 9
fi

query="" format="csv" list=0
while [ $# -gt 0 ]; do
  case "$1" in
    --query-gpu=*) query=${1#--query-gpu=} ;;
    --query-gpu) shift; query=$1 ;;
    --format=*) format=${1#--format=} ;;
    --format) shift; format=$1 ;;
    -L|--list-gpus) list=1 ;;
    -i|--id) shift; [ "$1" = 0 ] || { echo "No devices were found"; exit 6; } ;;
    --id=*) [ "${1#--id=}" = 0 ] || { echo "No devices were found"; exit 6; } ;;
    --version)
      echo "NVIDIA-SMI version  : $SPARK_DRIVER_VERSION"
      echo "NVML version        : ${SPARK_DRIVER_VERSION%%.*}.95"
      echo "DRIVER version      : $SPARK_DRIVER_VERSION"
      echo "CUDA Version        : $SPARK_CUDA_VERSION"
      exit 0 ;;
    -h|--help) echo "NVIDIA System Management Interface -- v$SPARK_DRIVER_VERSION (sparkctl sandbox stand-in)"; exit 0 ;;
    *) echo "Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."; exit 2 ;;
  esac
  shift
done

if [ "$list" = 1 ]; then
  echo "GPU 0: $SPARK_GPU_NAME (UUID: $SPARK_GPU_UUID)"
  exit 0
fi

if [ -n "$query" ]; then
  header=1 units=1
  case ",$format," in *,noheader,*) header=0 ;; esac
  case ",$format," in *,nounits,*) units=0 ;; esac
  case ",$format," in *,csv,*) ;; *) echo "\"$format\" is not a valid format. Please run 'nvidia-smi -h' for help."; exit 2 ;; esac
  heads="" values="" sep=""
  old_ifs=$IFS; IFS=,
  for field in $query; do
    IFS=$old_ifs
    field=$(echo "$field" | tr -d ' ')
    unit=""
    case "$field" in
      name|gpu_name) v=$SPARK_GPU_NAME ;;
      driver_version) v=$SPARK_DRIVER_VERSION ;;
      compute_cap) v=$SPARK_COMPUTE_CAP ;;
      memory.total) v=$SPARK_MEMORY_TOTAL; unit=MiB ;;
      memory.used|memory.free|memory.reserved) v="[N/A]"; unit=MiB ;;
      uuid|gpu_uuid) v=$SPARK_GPU_UUID ;;
      index) v=0 ;;
      count) v=1 ;;
      pci.bus_id|gpu_bus_id) v=$SPARK_GPU_BUS_ID ;;
      persistence_mode) v=Enabled ;;
      temperature.gpu) v=$SPARK_GPU_TEMP ;;
      power.draw) v=$SPARK_GPU_POWER; unit=W ;;
      power.limit|enforced.power.limit) v="[N/A]"; unit=W ;;
      utilization.gpu) v=0; unit=% ;;
      utilization.memory) v="[N/A]"; unit=% ;;
      pstate) v=P0 ;;
      mig.mode.current|mig.mode.pending|serial|vbios_version|ecc.mode.current) v="[N/A]" ;;
      display_mode|display_active) v=Disabled ;;
      clocks.sm|clocks.max.sm) v=2418; unit=MHz ;;
      *) echo "Field \"$field\" is not a valid field to query."; exit 2 ;;
    esac
    h=$field
    if [ -n "$unit" ]; then
      h="$field [$unit]"
      case "$v" in "[N/A]"|"[Not Supported]") ;; *) [ "$units" = 1 ] && v="$v $unit" ;; esac
    fi
    heads="$heads$sep$h" values="$values$sep$v" sep=", "
    IFS=,
  done
  IFS=$old_ifs
  [ "$header" = 1 ] && echo "$heads"
  echo "$values"
  exit 0
fi

name=$SPARK_GPU_NAME bus=$SPARK_GPU_BUS_ID
date '+%a %b %e %H:%M:%S %Y'
echo "+-----------------------------------------------------------------------------------------+"
printf '| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|\n' "$SPARK_DRIVER_VERSION" "$SPARK_DRIVER_VERSION" "$SPARK_CUDA_VERSION"
echo "+-----------------------------------------+------------------------+----------------------+"
echo "| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |"
echo "| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |"
echo "|                                         |                        |               MIG M. |"
echo "|=========================================+========================+======================|"
printf '| %3s  %-26s %6s  |%19s %3s |%21s |\n' 0 "$name" On "$bus" On N/A
printf '| N/A   %2sC    P0 %22s  | %-22s |%7s%%%13s |\n' "$SPARK_GPU_TEMP" "${SPARK_GPU_POWER%%.*}W /  N/A" "Not Supported" 0 Default
printf '|%41s|%24s|%21s |\n' "" "" N/A
echo "+-----------------------------------------+------------------------+----------------------+"
echo
echo "+-----------------------------------------------------------------------------------------+"
echo "| Processes:                                                                              |"
echo "|  GPU   GI   CI              PID   Type   Process name                        GPU Memory |"
echo "|        ID   ID                                                               Usage      |"
echo "|=========================================================================================|"
echo "|  No running processes found                                                             |"
echo "+-----------------------------------------------------------------------------------------+"
"""

IBDEV2NETDEV = r"""#!/bin/sh
# Stand-in ibdev2netdev of a sparkctl sandbox host: the four ConnectX-7 RDMA devices of a DGX Spark.
# A device is Up when its netdev exists in this host and is up: the cabled port's twins
# (enp1s0f1np1 and enP2p1s0f1np1) here. SPARK_IBDEV_STATE, when set, forces the cabled ones.
here=$(dirname "$0")
[ -r "$here/.sandbox-host.env" ] && . "$here/.sandbox-host.env"
for pair in rocep1s0f0:enp1s0f0np0 rocep1s0f1:enp1s0f1np1 roceP2p1s0f0:enP2p1s0f0np0 roceP2p1s0f1:enP2p1s0f1np1; do
  hca=${pair%%:*} dev=${pair#*:}
  state=Down
  if ip -o link show dev "$dev" >/dev/null 2>&1; then
    if ip -o link show dev "$dev" 2>/dev/null | grep -q 'state UP'; then state=Up; fi
    if [ -n "$SPARK_IBDEV_STATE" ]; then state=$SPARK_IBDEV_STATE; fi
  fi
  echo "$hca port 1 ==> $dev ($state)"
done
"""

# `nvidia-ctk runtime configure --runtime=docker [--config=FILE]`: registers the nvidia runtime in
# Docker's daemon.json as the real NVIDIA Container Toolkit does (the engine reads it on reload).
NVIDIA_CTK = r"""#!/bin/sh
# Stand-in nvidia-ctk of a sparkctl sandbox host: only `runtime configure --runtime=docker`.
config=/etc/docker/daemon.json
[ "$1" = runtime ] && [ "$2" = configure ] || { echo "nvidia-ctk (sandbox stand-in): only 'runtime configure' is known" >&2; exit 2; }
shift 2
for arg in "$@"; do
  case "$arg" in
    --runtime=docker) ;;
    --runtime=*) echo "unsupported runtime ${arg#--runtime=}" >&2; exit 2 ;;
    --config=*) config=${arg#--config=} ;;
  esac
done
exec python3 - "$config" <<'PY'
import json, os, sys
path = sys.argv[1]
try:
    with open(path) as handle:
        config = json.load(handle)
except FileNotFoundError:
    config = {}
config.setdefault("runtimes", {})["nvidia"] = {"args": [], "path": "nvidia-container-runtime"}
os.makedirs(os.path.dirname(path), exist_ok=True)
with open(path + ".tmp", "w") as handle:
    json.dump(config, handle, indent=4)
os.chmod(path + ".tmp", 0o644)
os.replace(path + ".tmp", path)
print(f"INFO[0000] Wrote updated config to {path}")
print("INFO[0000] It is recommended that docker daemon be restarted.")
PY
"""


def container_runtime(runc_path: str) -> str:
    return (
        "#!/bin/sh\n"
        "# Stand-in nvidia-container-runtime of a sparkctl sandbox host: no GPU to inject, so plain runc.\n"
        f"exec {shlex.quote(runc_path)} \"$@\"\n"
    )


# Where a host keeps its own copy of the stand-in package (inside /usr/local/bin, the host's own
# folder): the checkout this machine runs from may be unreadable to the host's login user (a clone
# in a 0700 folder), and a host should not reach into this machine's files anyway.
STANDIN_SITE = ".sparkctl-standin"
HOST_BIN = "/usr/local/bin"


def single_box_engine() -> str:
    """The single-box engine as a host command: the system's python3 with the host's own copy of the
    stand-in package (``STANDIN_SITE``), so the native launcher has a program to start on a sandbox
    host. The system's python3 rather than sys.executable: a host has its own /root and /usr/local,
    where a venv's interpreter often lives (the stand-in needs only the standard library)."""
    import shutil
    import sys

    from sparkctl.standin.rootfs import PACKAGE_NAME

    python = shutil.which("python3", path="/usr/bin:/bin") or sys.executable
    site = f"{HOST_BIN}/{STANDIN_SITE}"
    return (
        "#!/bin/sh\n"
        "# Stand-in single-box engine of a sparkctl sandbox host (server/app.py --engine v41 on a box).\n"
        f"PYTHONPATH={shlex.quote(site)}${{PYTHONPATH:+:$PYTHONPATH}}\n"
        "export PYTHONPATH\n"
        f"exec {shlex.quote(python)} -m {PACKAGE_NAME} singlebox \"$@\"\n"
    )


def scripts(runc_path: str) -> dict[str, str]:
    """File name -> content, for the host's /usr/local/bin."""
    return {
        "nvidia-smi": NVIDIA_SMI,
        "ibdev2netdev": IBDEV2NETDEV,
        "nvidia-ctk": NVIDIA_CTK,
        "nvidia-container-runtime": container_runtime(runc_path),
        "dsv41-spark-engine": single_box_engine(),
    }


def make_rdma_nodes(folder: str, present: bool = True) -> list[str]:
    """Create (or, ``present=False``, remove) the stand-in /dev/infiniband nodes in ``folder``."""
    import os
    import stat

    os.makedirs(folder, mode=0o755, exist_ok=True)
    made = []
    for name, (major, minor) in RDMA_NODES.items():
        path = os.path.join(folder, name)
        if not present:
            if os.path.lexists(path):
                os.unlink(path)
            continue
        if not os.path.lexists(path):
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
        made.append(name)
    return made
