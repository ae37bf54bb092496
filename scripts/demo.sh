#!/usr/bin/env bash
# The main job, end to end, on a local sandbox cluster (needs root): N hosts in network
# namespaces, each with a real sshd and a real Docker engine, stand-in GB10 tools and a stand-in
# engine that speaks vLLM's CLI and HTTP API. Then one command, as on a rack of DGX Sparks:
# `sparkctl up` (doctor, build, distribute, Engram shards, serve, smoke), and a benchmark.
#
#   bash scripts/demo.sh            # 4 hosts, profile "sandbox"; leaves the endpoint running
#   SANDBOX_HOSTS=3 bash scripts/demo.sh
#   bash scripts/demo.sh --down     # stop the engine and remove the sandbox
#
# RESULTS_DIR (optional): where the run's JSON reports go (up-1.json, bench.json, inventory-path);
# BENCH_ARGS (optional): the benchmark's options (default: concurrency 1,2,4,8).
# SANDBOX_MGMT_SUBNET / SANDBOX_FABRIC_SUBNET (optional): the sandbox's subnets, when the defaults are taken.
# SANDBOX_BARE=0: start from prepared hosts; by default the hosts start bare (a rack's first day:
# the login `nvidia` not in the docker group, no folders, no fabric addresses) and `up` runs setup.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
sparkctl() { .venv/bin/python -m sparkctl "$@"; }

NAME=${SANDBOX_NAME:-default}
HOSTS=${SANDBOX_HOSTS:-4}
PROFILE=sandbox
TP=(--set "tensor_parallel=$HOSTS")
RESULTS=${RESULTS_DIR:-}
read -r -a BENCH <<< "${BENCH_ARGS:---concurrency 1,2,4,8}"

if [ "${1:-}" = "--down" ]; then
  inventory=$(sparkctl sandbox status --name "$NAME" --json 2>/dev/null | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin).get("inventory",""))' || true)
  [ -n "$inventory" ] && sparkctl -i "$inventory" stop --yes --profile "$PROFILE" "${TP[@]}" || true
  exec .venv/bin/python -m sparkctl sandbox down --yes --name "$NAME"
fi

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }
keep() { if [ -n "$RESULTS" ]; then mkdir -p "$RESULTS" && tee "$RESULTS/$1"; else cat; fi; }

step "sandbox: $HOSTS hosts"
export SPARKCTL_INVENTORY
SUBNETS=()
[ -n "${SANDBOX_MGMT_SUBNET:-}" ] && SUBNETS+=(--mgmt-subnet "$SANDBOX_MGMT_SUBNET")
[ -n "${SANDBOX_FABRIC_SUBNET:-}" ] && SUBNETS+=(--fabric-subnet "$SANDBOX_FABRIC_SUBNET")
[ "${SANDBOX_BARE:-1}" = 1 ] && SUBNETS+=(--bare)
SPARKCTL_INVENTORY=$(sparkctl sandbox up --name "$NAME" --hosts "$HOSTS" "${SUBNETS[@]}" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["inventory"])')
printf '%s\n' "$SPARKCTL_INVENTORY" | keep inventory-path >/dev/null
sparkctl inventory check

step "checkpoint: a small synthetic DeepSeek-V4.1-Flash-shaped checkpoint on every host"
sparkctl sandbox make-checkpoint --sandbox "$NAME"

step "plan: per-rank memory of the real profiles, then of the sandbox"
for profile in tp4 tp8-300k tp8-1m sglang-tp4-1m; do
  # a profile that does not fit exits 1 with the reason on its last line: show it, go on
  { sparkctl plan --profile "$profile" || true; } | tail -1 | sed "s/^/$profile: /"
done
sparkctl plan --profile "$PROFILE" "${TP[@]}"

step "up: setup (bare hosts, through sudo -n), doctor, build, distribute, Engram shards, serve, smoke (each step skipped when already true)"
sparkctl --json up --profile "$PROFILE" "${TP[@]}" | keep up-1.json | .venv/bin/python -c '
import json, sys
doc = json.load(sys.stdin)
for s in doc["steps"]:
    print("  %-10s %-8s %6.1f s  %s" % (s["name"], s["status"], s["seconds"], s["reason"][:160]))
sys.exit(0 if doc["ok"] else 1)'
sparkctl status --profile "$PROFILE" "${TP[@]}"

step "bench: TTFT / ITL / tok/s / latency per concurrency, and the SLO capacity"
if [ -n "$RESULTS" ]; then
  sparkctl --json bench --profile "$PROFILE" "${TP[@]}" "${BENCH[@]}" | keep bench.json >/dev/null
  echo "bench results: $RESULTS/bench.json" >&2
else
  sparkctl bench --profile "$PROFILE" "${TP[@]}" "${BENCH[@]}"
fi

step "done"
echo "The endpoint keeps running. Try: SPARKCTL_INVENTORY=$SPARKCTL_INVENTORY .venv/bin/python -m sparkctl up --profile $PROFILE --set tensor_parallel=$HOSTS  (nothing to do)" >&2
echo "Remove everything: bash scripts/demo.sh --down" >&2
