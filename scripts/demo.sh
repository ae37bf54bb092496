#!/usr/bin/env bash
# The main job on the embedded default: validate the example inventory, show the memory plan of
# every profile, and render what would run on every host of the TP8-1M deployment.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
sparkctl() { .venv/bin/python -m sparkctl "$@"; }
INVENTORY=${SPARKCTL_INVENTORY:-inventory.example.yaml}
OUT=${OUT:-out/render-tp8-1m}

sparkctl -i "$INVENTORY" inventory check
sparkctl profiles
for profile in tp4 tp8-300k tp8-1m sglang-tp4-1m; do
  echo
  sparkctl plan --profile "$profile"
done
echo
sparkctl -i "$INVENTORY" render --profile tp8-1m --out "$OUT"
echo "rendered files: $OUT"
