#!/usr/bin/env bash
# One smoke deploy, as a user runs it: the demo (sandbox + `sparkctl up` + a short bench), the
# smoke test against the endpoint, a second `up` that must change nothing, then the teardown
# (unless --keep: the caller tears down, e.g. a CI step that runs whatever happened before).
# Reports land in $RESULTS_DIR (default out/smoke): up-1.json, up-2.json, smoke, bench.json.
#
#   bash scripts/smoke-deploy.sh [--keep]
set -euo pipefail
cd "$(dirname "$0")/.."

export SANDBOX_NAME=${SANDBOX_NAME:-smoke}
export SANDBOX_HOSTS=${SANDBOX_HOSTS:-3}
export RESULTS_DIR=${RESULTS_DIR:-out/smoke}
export BENCH_ARGS=${BENCH_ARGS:---concurrency 1,2 --requests 4 --max-tokens 32 --prompt-tokens 64}
mkdir -p "$RESULTS_DIR"

if [ "${1:-}" != "--keep" ]; then
  trap 'bash scripts/demo.sh --down >/dev/null 2>&1 || true' EXIT
fi

bash scripts/demo.sh
sparkctl() { .venv/bin/python -m sparkctl "$@"; }
SPARKCTL_INVENTORY=$(cat "$RESULTS_DIR/inventory-path")
export SPARKCTL_INVENTORY
TP=(--set "tensor_parallel=$SANDBOX_HOSTS")

echo "== smoke: what an application needs from the endpoint" >&2
sparkctl --json smoke --profile sandbox "${TP[@]}" > "$RESULTS_DIR/smoke.json"
.venv/bin/python -c 'import json, sys; d = json.load(open(sys.argv[1])); print("smoke:", "ok" if d["ok"] else "FAILED", ", ".join(c["name"] for c in d["checks"]), file=sys.stderr)' "$RESULTS_DIR/smoke.json"

echo "== a second up changes nothing" >&2
started=$SECONDS
sparkctl --json up --profile sandbox "${TP[@]}" > "$RESULTS_DIR/up-2.json"
seconds=$((SECONDS - started))
.venv/bin/python - "$RESULTS_DIR/up-2.json" "$seconds" <<'PY'
import json, sys
doc = json.load(open(sys.argv[1]))
changed = [s["name"] for s in doc["steps"] if s["status"] != "ok"]
print(f"second up: {float(sys.argv[2]):.1f} s, " + (f"NOT converged: {changed}" if changed else "every step ok, nothing changed"), file=sys.stderr)
sys.exit(1 if changed or not doc["ok"] else 0)
PY
