"""Property-based: generated YAML and option values thrown at inventory and profile loading through the
real CLI entry point (in process, for speed). Whatever comes in: exit 0 or 2 (plan: 1 only with a
plan that does not fit), at most one error line, no traceback, bounded time and memory.

How many examples each property gets is the hypothesis profile's (tests/conftest.py): a few in
the quick tier, more in the full run, SPARKCTL_FUZZ_EXAMPLES=1000 to dig deeper."""

from __future__ import annotations

import functools
import json
import resource
import tempfile
import time
from pathlib import Path

import yaml
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from clirun import REPO, run_cli_in_process

CPU_PER_RUN = 200  # times a plain check's CPU (~20 ms): the old loader spent 7 s on a 342-byte alias bomb
PEAK_GROWTH = 256 << 20  # the old loader grew by 1.1 GB on a 342-byte alias bomb

FUZZ = settings(deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])


def cli(*args: str) -> tuple[int, str, str]:
    """``sparkctl ARGS`` through the CLI's entry point in this process: exit code, stdout, stderr."""
    result = run_cli_in_process(*args, timeout=60)
    return result.code, result.stdout, result.stderr


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@functools.lru_cache(maxsize=None)
def plain_check_cpu() -> float:
    """CPU seconds of checking the example inventory (the best of three: the first pays for
    imports). Each copy differs by a comment, so each is parsed afresh."""
    example = (REPO / "inventory.example.yaml").read_text()
    runs = []
    for attempt in range(3):
        path = _write(f"{example}\n# copy {attempt}\n")
        started = time.process_time()
        assert cli("-i", path, "inventory", "check")[0] == 0
        runs.append(time.process_time() - started)
    return min(runs)


def bounded(*args: str) -> tuple[int, str, str]:
    """One run, which may raise the process's peak memory by at most PEAK_GROWTH and use at most
    CPU_PER_RUN times a plain check's CPU time (CPU, not the wall clock: load does not stretch it)."""
    budget = CPU_PER_RUN * plain_check_cpu()
    peak_before, started = _peak_rss(), time.process_time()
    code, out, err = cli(*args)
    cpu, growth = time.process_time() - started, _peak_rss() - peak_before
    assert cpu < budget, (args, cpu, budget)
    assert growth < PEAK_GROWTH, (args, growth)
    assert "Traceback" not in err and "Traceback" not in out
    return code, out, err


def assert_clean(code: int, err: str, allowed=(0, 2)) -> None:
    assert code in allowed, (code, err[-2000:])
    if code == 2:  # one line per problem: `inventory check` names every field that is wrong, each on its line
        lines = err.strip().splitlines()
        assert lines and all(line.startswith("error: ") for line in lines), err[-2000:]


# --- generated YAML ---------------------------------------------------------------------------------

scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=True),
                    st.text(max_size=20), st.sampled_from(["head", "worker", "10.0.0.1", "/mnt/nvme", "a:b", "~", ""]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=4)),
                      max_leaves=25)
FIELDS = ["name", "address", "role", "ssh", "nvme_path", "fabric_interfaces", "hcas", "fabric_addresses", "port",
          "user", "identity_file", "paths", "known_hosts", "defaults", "cluster", "hosts", "state_dir"]
# Fragments of YAML syntax, including the hostile ones: anchors, aliases, tags, flow brackets, documents.
TOKENS = ["hosts:", "\n", "  ", "- ", "name: a", "address: 10.0.0.1", "role: head", "&a ", "*a", "&b ", "*b", "[",
          "]", "{", "}", ", ", ": ", "? ", "---\n", "...\n", "!!binary ", "!!python/object:os.system ", "!!set ",
          "!!timestamp ", "!!int ", "'", '"', "|\n", ">\n", "#", "%YAML 1.1\n", "\t", "\x00", "\ufeff", "9" * 50,
          "0x1F", "1e9999", ".nan", "<<: *a\n", "2001-01-01", "null", "~", "é", "\\", "@", "`"]


@st.composite
def inventories(draw):
    """Either a near-valid inventory with a field replaced by a generated value, or token soup."""
    if draw(st.booleans()):
        hosts = [{"name": "a", "address": "10.0.0.1", "role": "head"}, {"name": "b", "address": "10.0.0.2"}]
        doc = {"hosts": hosts}
        target = draw(st.sampled_from([doc, hosts[0], hosts[1]]))
        target[draw(st.sampled_from(FIELDS))] = draw(values)
        return yaml.safe_dump(doc, allow_unicode=draw(st.booleans()))
    return "".join(draw(st.lists(st.sampled_from(TOKENS), max_size=60)))


def _write(text: str) -> str:
    folder = Path(tempfile.mkdtemp(prefix="fuzz-"))
    path = folder / "candidate.yaml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    return str(path)


@FUZZ
@given(inventories())
@example("name: a")  # two problems (an unknown field, the missing hosts): two error lines, the located one first
def test_inventory_loading_never_crashes(text):
    code, out, err = bounded("-i", _write(text), "inventory", "check")
    assert_clean(code, err)


@FUZZ
@given(inventories())
def test_inventory_json_is_always_one_document(text):
    code, out, err = bounded("-i", _write(text), "inventory", "check", "--json")
    assert_clean(code, err)
    document = json.loads(out)
    if code == 2:
        assert document["ok"] is False and document["exit_code"] == 2


PROFILE_FIELDS = ["tensor_parallel", "engine", "engine_args", "env", "container", "serving", "memory", "image",
                  "engram", "max_model_len", "gpu_memory_utilization", "slo", "distributed", "extends", "name"]


@st.composite
def profiles(draw):
    if draw(st.booleans()):
        return yaml.safe_dump({"extends": "tp4", draw(st.sampled_from(PROFILE_FIELDS)): draw(values)})
    return "extends: tp4\n" + "".join(draw(st.lists(st.sampled_from(TOKENS), max_size=60)))


def assert_plan_clean(code: int, out: str, err: str) -> None:
    if code == 1:  # a valid profile whose plan does not fit: the one JSON document says so
        assert json.loads(out)["fits"] is False
        return
    assert_clean(code, err)


@FUZZ
@given(profiles())
def test_profile_file_loading_never_crashes(text):
    code, out, err = bounded("plan", "--profile", _write(text), "--json")
    assert_plan_clean(code, out, err)


option_text = st.text(st.characters(blacklist_categories=("Cs",)), max_size=40)
set_keys = st.one_of(st.sampled_from(PROFILE_FIELDS + ["engine_args.api-key", "container.ulimits.nofile",
                                                       "serving.port", "env.HF_TOKEN", "a..b", ".", ""]),
                     option_text)
set_values = st.one_of(option_text, values.map(lambda v: yaml.safe_dump(v, default_flow_style=True).strip()),
                       st.lists(st.sampled_from(TOKENS), max_size=30).map("".join))


@FUZZ
@given(st.lists(st.tuples(st.sampled_from(["--set", "--env"]), set_keys, set_values), min_size=1, max_size=3))
def test_set_and_env_values_never_crash(options):
    args = [part for option, key, value in options for part in (option, f"{key}={value}")]
    code, out, err = bounded("plan", "--profile", "tp4", "--json", *args)
    assert_plan_clean(code, out, err)


@FUZZ
@given(option_text, option_text)
def test_odd_inventory_paths_and_profile_names(path, profile):
    code, out, err = bounded("-i", path or ".", "inventory", "check")
    assert_clean(code, err)
    code, out, err = bounded("plan", "--profile", profile or ".", "--json")
    assert_plan_clean(code, out, err)
