#!/usr/bin/env bash
# The lowest-versions job: installs sparkctl with every runtime dependency at the lower bound that
# pyproject.toml declares, on the oldest Python it allows, in a venv of its own, and runs the quick
# tests there. A lower bound that is too low (an import or an option the old version lacks, a
# warning on every command) fails here instead of on a user's machine.
#
#   bash scripts/lowest-versions.sh                 # the default quick tests
#   bash scripts/lowest-versions.sh tests/test_x.py # other tests
#
# PYTHON: the interpreter (default: python3.10 when there is one, else python3).
# LOWEST_VENV: where the venv goes (default .venv-lowest; recreated each run).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${PYTHON:-}" ]; then
  PYTHON=python3
  for candidate in python3.10 "$HOME/.pyenv/versions/3.10.13/bin/python3.10"; do
    if "$candidate" -c "" >/dev/null 2>&1; then PYTHON=$candidate; break; fi  # (a pyenv shim exists but may fail)
  done
fi
VENV=${LOWEST_VENV:-.venv-lowest}
rm -rf "$VENV"
"$PYTHON" -m venv "$VENV"
"$VENV/bin/python" -m pip install -q --upgrade pip >/dev/null
constraints="$VENV/lowest-constraints.txt"
"$VENV/bin/python" scripts/lowest_constraints.py pyproject.toml > "$constraints"
echo "lowest-versions: $("$VENV/bin/python" --version) with" $(tr '\n' ' ' < "$constraints") >&2
"$VENV/bin/python" -m pip install -q -c "$constraints" -e '.[test]'
# What was really installed must be the lower bounds (a resolver that moved one up hides the test).
"$VENV/bin/python" - "$constraints" <<'PY'
import sys
from importlib.metadata import version
wrong = []
for line in open(sys.argv[1]):
    name, wanted = line.strip().split("==")
    name = name.split("[")[0]
    def norm(v):  # 3.4 == 3.4.0
        parts = v.split(".")
        while len(parts) > 1 and parts[-1] == "0":
            parts.pop()
        return parts
    if norm(version(name)) != norm(wanted):
        wrong.append(f"{name} {version(name)} (wanted {wanted})")
if wrong:
    sys.exit("lowest-versions: not at the lower bound: " + ", ".join(wrong))
PY
if [ "$#" -eq 0 ]; then
  set -- tests/test_lowest_versions.py tests/test_cli_contract.py tests/test_config.py tests/test_bad_input.py \
         tests/test_render_cli.py tests/test_plan.py tests/test_first_hour.py
fi
# -W error::DeprecationWarning is not used: third-party warnings are not ours to fail on; the
# test_lowest_versions module asserts that a command prints no warning at all.
exec "$VENV/bin/python" -m pytest -q -p no:cacheprovider -m "not sandbox" "$@"
