#!/usr/bin/env bash
# The test command: installs what is missing, then runs the tiers (docs/ci.md says what is where).
#
#   bash scripts/test.sh                 every tier and one smoke deploy (= --all; CI runs it): the
#                                        quick tier first, then the other three side by side
#   bash scripts/test.sh --quick         the quick tier: no services, the CLI in process, fuzz at a
#                                        few examples, on every core (SPARKCTL_TEST_WORKERS: how
#                                        many processes); under a minute on 2 idle cores
#   bash scripts/test.sh --integration   real services as processes: a private dockerd, wheel
#                                        builds, stand-in engines, a fake model hub
#   bash scripts/test.sh --sandbox       the sandbox tests (root), in parallel processes, each
#                                        with sandbox clusters of its own
#   bash scripts/test.sh --smoke         one smoke deploy (scripts/smoke-deploy.sh)
#   bash scripts/test.sh --lowest        the lowest-versions job (scripts/lowest-versions.sh: every
#                                        dependency at its declared lower bound, the quick tests);
#                                        not part of --all (pip takes ~10 min); the workflow runs it
#   bash scripts/test.sh tests/test_plan.py -k fit    one plain pytest run of these arguments
#
# Tier flags combine (--quick --integration); other arguments go to every tier's pytest run
# (--all -ra: every tier, with -ra). Each tier prints its time; the last line adds the tiers'
# counts up.
set -euo pipefail
cd "$(dirname "$0")/.."

tiers=()
pytest_args=()
all=0
for arg in "$@"; do
  case "$arg" in
    --quick | --integration | --sandbox | --smoke | --lowest) tiers+=("${arg#--}") ;;
    --all) all=1 ;;
    *) pytest_args+=("$arg") ;;
  esac
done

bash scripts/setup.sh --test
# Python keeps the compiled tests (pytest's rewritten asserts) and modules between runs: with
# PYTHONDONTWRITEBYTECODE set, every test process compiles them all again (~10 s of CPU each).
unset PYTHONDONTWRITEBYTECODE
PYTEST=(.venv/bin/python -m pytest -q -p no:cacheprovider)

if ((${#tiers[@]} == 0 && !all)) && ((${#pytest_args[@]})); then
  exec "${PYTEST[@]}" "${pytest_args[@]}"
fi
full_run=0
if ((${#tiers[@]} == 0)); then
  tiers=(quick integration sandbox smoke)
  full_run=1
fi

log_dir=$(mktemp -d "${TMPDIR:-/tmp}/sparkctl-tests-XXXXXX")
declare -A pids=()  # the tiers run side by side: tier -> its process group (the group leader's pid)
# Ctrl-C, a hang-up or a kill of this script ends the side-by-side tiers too: each runs in a process
# group of its own (a background job of a script never sees the terminal's Ctrl-C), so it is asked
# here -- SIGINT first, which pytest turns into its teardown (sandbox clusters, private dockerd),
# then SIGTERM, then SIGKILL, each after SPARKCTL_TEST_STOP_GRACE_S seconds (default 30). A tier run
# in the foreground (the quick tier, or any tier run alone) gets the terminal's Ctrl-C itself; a
# SIGTERM or SIGHUP sent to this script alone waits for that tier to end (bash runs a trap between
# commands), so stop such a run by its process group (`kill -- -PGID`).
stop_grace_s=${SPARKCTL_TEST_STOP_GRACE_S:-30}

tiers_alive() {  # tiers_alive: is any process left in a side-by-side tier's group?
  local pid
  for pid in "${pids[@]}"; do kill -0 -- "-$pid" 2>/dev/null && return 0; done
  return 1
}

stop_tiers() {  # stop_tiers: the side-by-side tiers' process groups ended (asked, then made to)
  local signal pid waited
  for signal in INT TERM KILL; do
    tiers_alive || return 0
    echo "test.sh: sending SIG$signal to the tiers still running (${!pids[*]})" >&2
    for pid in "${pids[@]}"; do kill -s "$signal" -- "-$pid" 2>/dev/null || true; done
    for ((waited = 0; waited < stop_grace_s * 10; waited++)); do
      tiers_alive || return 0
      sleep 0.1
    done
  done
}

on_signal() {  # on_signal SIGNAL: end the tiers, clean up, then die of SIGNAL as the caller expects
  trap - INT TERM HUP
  stop_tiers
  wait || true
  rm -rf "$log_dir"
  kill -s "$1" "$$"
}
trap 'rm -rf "$log_dir"' EXIT
for signal in INT TERM HUP; do
  trap "on_signal $signal" "$signal"
done
summary=()
failed=0
totals=(0 0 0 0)  # passed failed errors skipped
ran_pytest=0

count() {  # count WORD LINE: the number before WORD in pytest's closing line (0 if absent)
  local found
  found=$(grep -oE "[0-9]+ $1" <<<"$2" | head -n1 | cut -d' ' -f1)
  echo "${found:-0}"
}

run_pytest_tier() {  # run_pytest_tier NAME PYTEST-ARGS...: one tier, its closing line kept
  local name=$1 status last
  shift
  echo "== tier $name" >&2
  ran_pytest=1
  set +e
  # tee -i: a Ctrl-C (or on_signal's SIGINT) reaches pytest, whose teardown still writes through tee
  "${PYTEST[@]}" "$@" ${pytest_args[@]+"${pytest_args[@]}"} 2>&1 | tee -i "$log_dir/$name.log"
  status=${PIPESTATUS[0]}
  set -e
  ((status == 5)) && status=0  # no test selected in this tier (e.g. a -k that matches none here)
  last=$(grep -E "^=*.* in [0-9.]+s( \([0-9:]+\))? *=*$" "$log_dir/$name.log" | tail -n1 || true)
  totals[0]=$((totals[0] + $(count passed "$last")))
  totals[1]=$((totals[1] + $(count failed "$last")))
  totals[2]=$((totals[2] + $(count error "$last")))
  totals[3]=$((totals[3] + $(count skipped "$last")))
  ((status == 0)) || failed=1
  tier_result="${last//=/}"
  return 0
}

xdist_args() {  # xdist_args N: pytest-xdist's arguments for N processes, a file to each (none for 1)
  (($1 > 1)) && echo "-n $1 --dist loadfile"
  return 0
}

run_tier() {  # run_tier TIER: one tier; its time and result join the summary, its counts the totals
  local tier=$1 started
  started=$(date +%s)
  tier_result=""
  case "$tier" in
    quick)
      profile=quick
      ((full_run)) && profile=full  # the full run gives the fuzz properties their full count
      # On every core (pytest-xdist; worksteal evens out the few slow files).
      run_pytest_tier quick -m "not integration and not sandbox" "--hypothesis-profile=$profile" \
        -n "${SPARKCTL_TEST_WORKERS:-auto}" --dist worksteal ;;
    integration)
      # Much of it waits (stand-ins' modeled delays, a dockerd's builds, pip): one process per core
      # (SPARKCTL_INTEGRATION_WORKERS: how many), a file kept in one process so its dockerd, wheel
      # and engines are made once.
      run_pytest_tier integration -m "integration and not sandbox" \
        -n "${SPARKCTL_INTEGRATION_WORKERS:-auto}" --dist loadfile ;;
    sandbox)
      # Partly waiting (engines loading, health polls, SSH, the faults' timeouts), so more processes than
      # cores: 4, twice the 2 cores measured (docs/ci.md: with 3, a fifth of the run's CPU-seconds went
      # idle in spells where every process waited at once; with 4 half as many, for the same work).
      # Each brings up clusters of its own (tests/sandbox_fixture.py), a file stays in one process (its
      # sites are built once), except the fault matrix, in four parts; the heaviest parts go first
      # (tests/conftest.py, sandbox_part). SPARKCTL_SANDBOX_WORKERS: how many (1: the whole tier in one process).
      run_pytest_tier sandbox -m sandbox $(xdist_args "${SPARKCTL_SANDBOX_WORKERS:-4}") ;;
    lowest)
      echo "== tier lowest (scripts/lowest-versions.sh)" >&2
      if bash scripts/lowest-versions.sh; then tier_result="lowest versions ok"; else tier_result="lowest versions FAILED"; failed=1; fi ;;
    smoke)
      echo "== tier smoke (scripts/smoke-deploy.sh)" >&2
      if bash scripts/smoke-deploy.sh; then tier_result="smoke deploy ok"; else tier_result="smoke deploy FAILED"; failed=1; fi ;;
  esac
  summary+=("$(printf '%-12s %6ss  %s' "$tier" "$(($(date +%s) - started))" "$tier_result")")
}

run_in_background() {  # run_in_background TIER: run_tier in a subshell; output and counts kept in $log_dir
  local tier=$1
  (
    totals=(0 0 0 0) failed=0 ran_pytest=0 summary=()
    run_tier "$tier"
    printf '%s\n' "${totals[*]}" "$failed" "$ran_pytest" "${summary[0]}" >"$log_dir/$tier.state"
  ) >"$log_dir/$tier.out" 2>&1
}

# The full run: the quick tier first (every core, the first answer), then the tiers that mostly
# wait (integration's dockerd and builds, the sandbox clusters' SSH and health polls, the smoke
# deploy) side by side, each tier's output printed whole when it ends. Run one after another they
# add up to ~25 minutes on 2 cores; together the sandbox tier sets the time alone.
# SPARKCTL_TIERS_TOGETHER=0: one after another.
together=()
if ((full_run)) && [ "${SPARKCTL_TIERS_TOGETHER:-1}" = 1 ]; then
  together=(integration sandbox smoke)
fi
for tier in "${tiers[@]}"; do
  [[ " ${together[*]} " == *" $tier "* ]] || run_tier "$tier"
done
if ((${#together[@]})); then
  echo "== tiers ${together[*]}: side by side; each prints its output when it ends" >&2
  set -m  # job control while they start: each tier a process group of its own, which on_signal ends whole
  for tier in "${together[@]}"; do
    run_in_background "$tier" </dev/null &  # (a background group reading the terminal would be stopped)
    pids[$tier]=$!
  done
  set +m
  for tier in "${together[@]}"; do
    wait "${pids[$tier]}" || true
    unset "pids[$tier]"  # ended: its group id may be another process's from now on
    cat "$log_dir/$tier.out" >&2
    if ! mapfile -t state <"$log_dir/$tier.state" || ((${#state[@]} < 4)); then
      summary+=("$(printf '%-12s %6s  %s' "$tier" "?" "ended without a result (see its output above)")")
      failed=1
      continue
    fi
    read -r -a counts <<<"${state[0]}"
    for i in 0 1 2 3; do totals[i]=$((totals[i] + counts[i])); done
    ((state[1] == 0)) || failed=1
    ((state[2] == 0)) || ran_pytest=1
    summary+=("${state[3]}")
  done
fi

echo >&2
echo "== tiers (load average at the end: $(cut -d' ' -f1-3 /proc/loadavg))" >&2
printf '%s\n' "${summary[@]}" >&2
rm -rf "$log_dir"
if ((ran_pytest)); then  # the one closing line for all tiers together
  echo "tests: ${totals[0]} passed, $((totals[1] + totals[2])) failed, ${totals[3]} skipped"
fi
exit "$failed"
