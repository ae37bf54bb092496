#!/usr/bin/env bash
# The main job, end to end, on a local sandbox cluster (needs root): N hosts in network
# namespaces, each with a real sshd and a real Docker engine, stand-in GB10 tools and a stand-in
# engine that speaks vLLM's CLI and HTTP API. Same commands as on a rack of DGX Sparks.
#
#   bash scripts/demo.sh            # 4 hosts, profile "sandbox"; leaves the endpoint running
#   SANDBOX_HOSTS=3 bash scripts/demo.sh
#   bash scripts/demo.sh --down     # stop the engine and remove the sandbox
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
sparkctl() { .venv/bin/python -m sparkctl "$@"; }

NAME=${SANDBOX_NAME:-default}
HOSTS=${SANDBOX_HOSTS:-4}
PROFILE=sandbox
TP=(--set "tensor_parallel=$HOSTS")

if [ "${1:-}" = "--down" ]; then
  inventory=$(sparkctl sandbox status --name "$NAME" --json 2>/dev/null | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin).get("inventory",""))' || true)
  [ -n "$inventory" ] && sparkctl -i "$inventory" stop --profile "$PROFILE" "${TP[@]}" || true
  exec .venv/bin/python -m sparkctl sandbox down --name "$NAME"
fi

step() { printf '\n\033[1m== %s\033[0m\n' "$*" >&2; }

step "sandbox: $HOSTS hosts"
export SPARKCTL_INVENTORY
SPARKCTL_INVENTORY=$(sparkctl sandbox up --name "$NAME" --hosts "$HOSTS" --json | .venv/bin/python -c 'import json,sys; print(json.load(sys.stdin)["inventory"])')
sparkctl inventory check

step "checkpoint: a small synthetic DeepSeek-V4.1-Flash-shaped checkpoint on every host"
sparkctl sandbox make-checkpoint --sandbox "$NAME"

step "plan: per-rank memory of the real profiles, then of the sandbox"
for profile in tp4 tp8-300k tp8-1m sglang-tp4-1m; do
  sparkctl plan --profile "$profile" | tail -1 | sed "s/^/$profile: /"
done
sparkctl plan --profile "$PROFILE" "${TP[@]}"

step "build: the overlay-and-patch image chain, on the head's engine"
HEAD=$(sparkctl inventory show --json | .venv/bin/python -c 'import json,sys; print([h["name"] for h in json.load(sys.stdin)["hosts"] if h["role"]=="head"][0])')
sparkctl build --profile "$PROFILE" --on "$HEAD"

step "distribute: one docker save, streamed to every host that lacks the image"
sparkctl distribute --profile "$PROFILE" --from "$HEAD"

step "pack-engram: each host cuts its own Engram shards from its local checkpoint"
sparkctl pack-engram --profile "$PROFILE" "${TP[@]}" --source on-hosts
sparkctl pack-engram --profile "$PROFILE" "${TP[@]}" --source on-hosts --verify

step "doctor: every host, in parallel"
sparkctl doctor --profile "$PROFILE" "${TP[@]}"

step "render: what runs on every host"
sparkctl render --profile "$PROFILE" "${TP[@]}" --out "out/render-$PROFILE"

step "serve: start the engine on all ranks and wait until it is healthy"
sparkctl serve --profile "$PROFILE" "${TP[@]}"
sparkctl status --profile "$PROFILE" "${TP[@]}"

step "bench: TTFT / ITL / tok/s / latency at concurrency 1-2-4-8, and the SLO capacity"
sparkctl bench --profile "$PROFILE" "${TP[@]}" --concurrency 1,2,4,8

step "done"
echo "The endpoint keeps running. Try: SPARKCTL_INVENTORY=$SPARKCTL_INVENTORY .venv/bin/python -m sparkctl status --profile $PROFILE --set tensor_parallel=$HOSTS" >&2
echo "Remove everything: bash scripts/demo.sh --down" >&2
