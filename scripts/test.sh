#!/usr/bin/env bash
# The test command: installs what is missing, then runs the whole suite (the sandbox tests
# bring up their own cluster of network namespaces with real sshd and dockerd; they need root).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
