#!/usr/bin/env bash
# Installs what sparkctl and its tests need on a Debian machine (as root) and creates .venv.
# Idempotent: a second run only checks. Used by the README's two commands and by CI.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(python3 python3-venv python3-pip docker.io openssh-server iproute2 debootstrap busybox-static psmisc rsync sudo)
# `--test` (scripts/test.sh): what only the tests need, e.g. the browser report.html is checked in.
if [ "${1:-}" = "--test" ]; then
  APT_PACKAGES+=(chromium)
fi

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || missing+=("$pkg")
done
if ((${#missing[@]})); then
  if [ "$(id -u)" -ne 0 ]; then
    echo "setup: missing Debian packages (${missing[*]}); run as root" >&2
    exit 2
  fi
  echo "setup: installing ${missing[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# The engines inside sandbox hosts are started by sparkctl itself; the machine's own
# docker/ssh services are not needed, so they are left as they are.

PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
if ! .venv/bin/python -c "import sparkctl, pytest, numpy" 2>/dev/null || [ pyproject.toml -nt .venv/.installed ]; then
  .venv/bin/python -m pip install -q --upgrade pip >/dev/null
  .venv/bin/python -m pip install -q -e '.[test]'
  touch .venv/.installed
fi
