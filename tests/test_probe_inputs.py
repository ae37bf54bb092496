"""Hostile options an outside tester tried on the verbs, each one a defect once: the answer must be one
line naming the option, exit 2, nothing written and nothing asked of a host or an endpoint.

- ``--endpoint`` that is not an http(s) base URL (smoke ran nine checks that each failed on it, bench
  said "unexpected InvalidURL", both exit 1);
- ``serve --replica N`` on a profile without replicas (ignored: the whole deployment was replaced);
- ``render --out`` where the files cannot go (exit 1 after some hosts' files were already written).
"""

from __future__ import annotations

import json

import pytest

from clirun import run_cli

INVENTORY = "inventory.example.yaml"

BAD_ENDPOINTS = [
    ("notaurl", "expected a base URL"),
    ("ftp://x", "expected a base URL"),
    ("http://[::1", "Invalid IPv6 URL"),
    ("http://h:99999", "out of range"),
    ("http://h:abc", "Port could not be cast"),
    ("http:///v1", "expected a base URL"),
    ("http://h\n:8000", "control characters"),
]

CLIENT_VERBS = [
    ("smoke", "--model", "m", "--request-timeout", "1"),
    ("bench", "--model", "m", "--concurrency", "1", "--request-timeout", "1"),
    ("top", "--once"),
]


def _one_line_usage_error(result, *fragments) -> str:
    assert result.code == 2, result
    assert "Traceback" not in result.stderr, result
    lines = [text for text in result.stderr.splitlines() if text.strip()]
    assert len(lines) == 1, result
    for fragment in fragments:
        assert fragment in lines[0], result
    return lines[0]


@pytest.mark.parametrize("endpoint,why", BAD_ENDPOINTS, ids=[e for e, _ in BAD_ENDPOINTS])
@pytest.mark.parametrize("verb", CLIENT_VERBS, ids=[v[0] for v in CLIENT_VERBS])
def test_an_endpoint_that_is_not_a_base_url_is_a_usage_error(verb, endpoint, why):
    result = run_cli(verb[0], "--endpoint", endpoint, *verb[1:], timeout=60)
    line = _one_line_usage_error(result, "--endpoint", why)
    assert line.startswith("error: --endpoint: ")
    assert not result.stdout.strip(), result


def test_an_endpoint_error_is_one_json_document_with_json():
    result = run_cli("smoke", "--endpoint", "ftp://x", "--model", "m", "--json", timeout=60)
    assert result.code == 2, result
    doc = result.json()
    assert doc["ok"] is False and doc["exit_code"] == 2 and doc["field"] == "--endpoint"


def test_a_good_endpoint_passes_the_check():
    """The check refuses only what is not a base URL: a real one reaches the request (refused port: exit 1)."""
    result = run_cli("smoke", "--endpoint", "http://127.0.0.1:9/v1/", "--model", "m", "--request-timeout", "1",
                     "--quick", timeout=120)
    assert result.code == 1, result
    assert "--endpoint" not in result.stderr, result


# ---------------------------------------------------------------------------------------------- serve --replica


@pytest.mark.parametrize("replica", ["2", "1", "-1"])
def test_serve_replica_on_a_profile_without_replicas_is_refused(replica):
    result = run_cli("-i", INVENTORY, "serve", "--profile", "tp4", "--replica", replica, "--dry-run")
    _one_line_usage_error(result, "--replica", "tp4", "no replicas")


def test_serve_replica_still_picks_a_replica_of_a_replicated_profile():
    result = run_cli("-i", INVENTORY, "serve", "--profile", "tp4", "--set", "replicas=2", "--replica", "2", "--dry-run")
    assert result.code == 0, result
    result = run_cli("-i", INVENTORY, "serve", "--profile", "tp4", "--set", "replicas=2", "--replica", "3", "--dry-run")
    _one_line_usage_error(result, "--replica", "no replica 3")


# ---------------------------------------------------------------------------------------------- render --out


def _tree(root) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _render(out, *extra):
    return run_cli("-i", INVENTORY, "render", "--profile", "tp4", "--out", str(out), *extra)


@pytest.mark.parametrize("blocker,fragment", [
    ("spark-157", "is a file where the render needs a folder"),   # a later host's folder is a file
    ("spark-153/engine.env/", "is a folder where the render writes a file"),
    ("recipe.yaml/", "is a folder where the render writes a file"),  # the last file written
])
def test_render_out_that_cannot_take_every_file_writes_none(tmp_path, blocker, fragment):
    out = tmp_path / "out"
    out.mkdir()
    place = out / blocker.rstrip("/")
    place.parent.mkdir(parents=True, exist_ok=True)
    place.mkdir() if blocker.endswith("/") else place.write_text("mine\n")
    before = _tree(out)
    _one_line_usage_error(_render(out), "--out", fragment)
    assert _tree(out) == before  # no host's files written, no folder made


def test_render_out_naming_a_file_is_a_usage_error(tmp_path):
    target = tmp_path / "result.json"
    target.write_text("{}")
    _one_line_usage_error(_render(target), "--out", "result.json")
    assert target.read_text() == "{}"


@pytest.mark.parametrize("sets", [(), ("--set", "replicas=2")], ids=["one", "replicated"])
def test_render_out_empty_is_refused_not_the_current_folder(tmp_path, sets):
    _one_line_usage_error(run_cli("-i", str(REPO_INVENTORY()), "render", "--profile", "tp4", *sets, "--out", "",
                                  cwd=tmp_path), "--out")
    assert not list(tmp_path.iterdir())  # a replicated render wrote ./replica-1 and ./replica-2


def test_render_out_of_a_replicated_profile_writes_no_replica_when_one_cannot_go(tmp_path):
    out = tmp_path / "out"
    (out / "replica-2").mkdir(parents=True)
    (out / "replica-2" / "spark-162").write_text("mine\n")
    before = _tree(out)
    _one_line_usage_error(_render(out, "--set", "replicas=2"), "--out", "replica-2")
    assert _tree(out) == before  # replica-1 was not written either


def test_render_out_into_new_nested_folders_still_writes(tmp_path):
    out = tmp_path / "a" / "b"
    result = _render(out, "--set", "replicas=2")
    assert result.code == 0, result
    assert (out / "replica-1" / "spark-153" / "engine.env").is_file()
    assert (out / "replica-2" / "spark-161" / "launch.sh").is_file()


def REPO_INVENTORY():
    from clirun import REPO

    return REPO / INVENTORY


# ---------------------------------------------------------------------------------------------- huge numbers


@pytest.mark.parametrize("setting", [
    "memory.weights_total_gb=1e308",    # the memory plan said "unexpected ValueError: cannot convert float NaN to integer"
    "memory.engram_total_gb=1e300",
    f"max_model_len={10 ** 99}",        # was rendered into --max-model-len as is
    f"max_num_seqs={10 ** 20}",
])
def test_a_number_beyond_any_real_setting_is_refused_naming_it(setting):
    field = setting.partition("=")[0]
    for verb in ("plan", "render"):
        result = run_cli("-i", INVENTORY, verb, "--profile", "tp4", "--set", setting)
        line = _one_line_usage_error(result, field, "--set")
        assert "unexpected" not in line and len(line) < 400


def test_a_single_box_number_beyond_any_real_setting_is_refused():
    result = run_cli("-i", INVENTORY, "plan", "--profile", "single-box", "--set", "single_box.min_free_gib=1e300")
    _one_line_usage_error(result, "single_box.min_free_gib")


def test_big_but_real_numbers_still_plan():
    """The bound is far above every real value: a 1M-token context on TP8 plans (fits or not: exit 0 or 1)."""
    result = run_cli("-i", INVENTORY, "plan", "--profile", "tp8-1m", "--set", "max_model_len=1048576",
                     "--set", "memory.weights_total_gb=1e15")
    assert result.code in (0, 1), result
    assert "unexpected" not in result.stderr


# ---------------------------------------------------------------------------------------------- --set of what it cannot change


@pytest.mark.parametrize("host", ["0.0.0.0;reboot", "0.0.0.0 --evil", "\" 0.0.0.0\"", "a b"])
def test_serving_host_that_is_no_address_is_refused(host):
    """It went into every rank's --host as is: the engine failed to bind only after a long serve."""
    result = run_cli("-i", INVENTORY, "render", "--profile", "tp4", "--set", f"serving.host={host}")
    _one_line_usage_error(result, "serving.host", "neither an IP address nor a valid hostname")


@pytest.mark.parametrize("host", ["0.0.0.0", "127.0.0.1", "'::'", "spark-153.lan"])
def test_serving_host_addresses_and_names_still_render(host):
    result = run_cli("-i", INVENTORY, "render", "--profile", "tp4", "--set", f"serving.host={host}", "--json")
    assert result.code == 0, result
    argv = result.json()["hosts"][0]["engine_argv"]
    assert argv[argv.index("--host") + 1] == host.strip("'")


@pytest.mark.parametrize("assignment", ["extends=sandbox", "name=other", " name=other"])
def test_set_of_name_or_extends_is_refused_not_ignored(assignment):
    """Both are read before --set is applied: the render used to go on as the unchanged profile, exit 0."""
    result = run_cli("-i", INVENTORY, "render", "--profile", "tp4", "--set", assignment)
    _one_line_usage_error(result, f"--set {assignment.strip().partition('=')[0]}", "--profile")


# ---------------------------------------------------------------------------------------------- bench compare


def _result_file(tmp_path, name, change=None, raw=None):
    """A small bench result as `bench --out` writes it; ``change(doc)`` spoils it."""
    level = {"kind": "concurrency", "label": "C=1", "concurrency": 1, "rate": None, "prompt_tokens_asked": 256,
             "ttft_ms": {"mean": 12.0, "p50": 11.0, "p90": 14.0, "n": 4}, "itl_ms": {"mean": 3.3, "p50": 3.2, "n": 4},
             "tps": {"mean": 290.0, "n": 4}, "latency_s": {"mean": 0.44, "n": 4}, "rps": {"mean": 2.3, "n": 4},
             "prompt_tokens": {"mean": 256, "n": 4}, "output_tokens_per_s": 291.6}
    doc = {"ok": True, "levels": [level, dict(level, label="C=2", concurrency=2)]}
    if change:
        change(doc)
    path = tmp_path / f"{name}.json"
    path.write_text(raw if raw is not None else json.dumps(doc))
    return str(path)


SPOILED = {
    "concurrency_text": (lambda d: d["levels"][0].update(concurrency="a"), "levels[0].concurrency is not a number"),
    "level_number": (lambda d: d["levels"].append(5), "levels[2] is not an object"),
    "concurrency_missing": (lambda d: d["levels"][1].pop("concurrency"), "levels[1].concurrency is missing"),
    "stat_text": (lambda d: d["levels"][1].update(ttft_ms="fast"), "levels[1].ttft_ms is neither a number nor statistics"),
    "stat_mean_text": (lambda d: d["levels"][0]["tps"].update(mean="x"), "levels[0].tps.mean is not a number"),
    "label_escape": (lambda d: d["levels"][0].update(label="\x1b[31mred\nsecond line"),
                     "levels[0].label is not one line of printable text"),
    "mean_overflow": (lambda d: d["levels"][0]["ttft_ms"].update(mean=10**400), "levels[0].ttft_ms.mean is not a number"),
    "reference_escape": (lambda d: d.update(reference={"source": "\x1b[31mred\nsecond line"}),
                         "reference is not an object of one-line printable texts"),
}


def test_bench_compare_names_a_number_past_pythons_digit_limit(tmp_path):
    good = _result_file(tmp_path, "good")
    digits = '{"levels": [{"kind": "concurrency", "concurrency": ' + "9" * 4301 + "}]}"  # json.loads: ValueError
    bad = _result_file(tmp_path, "bad", raw=digits)
    _one_line_usage_error(run_cli("bench", "compare", good, bad), "bad.json", "not a bench result")


@pytest.mark.parametrize("case", sorted(SPOILED))
def test_bench_compare_names_what_a_spoiled_result_holds(tmp_path, case):
    """Each was "unexpected TypeError/AttributeError", exit 1 (or, for the label, a terminal escape and a
    second line printed into the table)."""
    change, fragment = SPOILED[case]
    good, bad = _result_file(tmp_path, "good"), _result_file(tmp_path, "bad", change)
    for order in ((good, bad), (bad, good)):
        result = run_cli("bench", "compare", *order, "--chart", str(tmp_path / "c.png"))
        line = _one_line_usage_error(result, "bad.json", fragment)
        assert "unexpected" not in line and "\x1b" not in result.stdout + result.stderr
        assert not (tmp_path / "c.png").exists()


def test_bench_compare_names_a_too_deeply_nested_result(tmp_path):
    bad = _result_file(tmp_path, "deep", raw="[" * 100_000 + "]" * 100_000)
    _one_line_usage_error(run_cli("bench", "compare", _result_file(tmp_path, "good"), bad), "deep.json", "nested")


def test_bench_compare_still_reads_good_results_and_missing_stats(tmp_path):
    good = _result_file(tmp_path, "good")
    sparse = _result_file(tmp_path, "sparse", lambda d: d["levels"][0].update(ttft_ms=None, label=None))
    result = run_cli("bench", "compare", good, sparse, "--json")
    assert result.code == 0, result
    assert [row["level"] for row in result.json()["levels"]][:2] == ["C=1", "C=2"]
    result = run_cli("bench", "compare", "ref:vllm-tp4-report", good)
    assert result.code == 0, result
    bare = _result_file(tmp_path, "bare", lambda d: d["levels"][0].update(ttft_ms=12.5, tps=280))  # a table's cells
    result = run_cli("bench", "compare", good, bare, "--chart", str(tmp_path / "c.png"))
    assert result.code == 0, result
    assert (tmp_path / "c.png").read_bytes().startswith(b"\x89PNG")


# ---------------------------------------------------------------------------------------------- init --out


@pytest.mark.parametrize("kind", ["fifo", "folder", "under_a_file"])
def test_init_out_that_is_no_place_for_a_file_is_refused_even_with_force(tmp_path, kind):
    """--force replaced what --out named by a rename: as root, `--out /dev/full --force` put a regular file
    where the device was; a folder under a file or a missing one was an 'unexpected' error, exit 1."""
    import os

    target = {"fifo": tmp_path / "fifo", "folder": tmp_path / "folder", "under_a_file": tmp_path / "file" / "inv.yaml"}[kind]
    if kind == "fifo":
        os.mkfifo(target)
    elif kind == "folder":
        target.mkdir()
    elif kind == "under_a_file":
        target.parent.write_text("mine\n")
    before = _tree(tmp_path)
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = run_cli("init", "--example", "--out", str(target), "--force", env=env, timeout=60)
    _one_line_usage_error(result, "--out")
    assert _tree(tmp_path) == before  # nothing replaced, no per-user default written
    assert kind != "fifo" or target.is_fifo()


def test_init_out_in_a_folder_that_cannot_be_made_is_refused(tmp_path):
    env = {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    result = run_cli("init", "--example", "--out", "/proc/no-such/inv.yaml", env=env, timeout=60)
    _one_line_usage_error(result, "--out", "/proc/no-such/inv.yaml")
    assert not (tmp_path / "config").exists()


# ---------------------------------------------------------------------------------------------- up --model-source


@pytest.mark.parametrize("source,fragment", [
    ("/no/such/checkpoint", "no such folder on this machine"),
    ("hf:no-owner", "expects hf:OWNER/NAME"),
    ("hf:a/../b", "expects hf:OWNER/NAME"),
])
def test_up_refuses_a_model_source_it_cannot_use_before_asking_a_host(source, fragment):
    """Found at the checkpoint step before, after setup and doctor had asked every host: exit 1."""
    result = run_cli("-i", INVENTORY, "up", "--profile", "tp4", "--model-source", source, "--dry-run", "--json",
                     timeout=60)
    assert result.code == 2, result
    doc = result.json()
    assert doc["field"] == "--model-source" and fragment in doc["error"], doc


@pytest.mark.parametrize("endpoint", ["http://admin:s3cret-pw@127.0.0.1:9", "http://admin:s3cret-pw@h:99999",
                                      "http://admin:s3cret-pw@[::1", "http://admin:s3cret-pw@/v1"])
@pytest.mark.parametrize("verb", CLIENT_VERBS, ids=[v[0] for v in CLIENT_VERBS])
def test_an_endpoint_with_credentials_is_refused_without_echoing_them(verb, endpoint):
    result = run_cli(verb[0], "--endpoint", endpoint, *verb[1:])
    line = _one_line_usage_error(result, "--endpoint", "credentials")
    assert "s3cret-pw" not in line and "s3cret-pw" not in result.stdout


class _KeyedEndpoint:
    """An endpoint that answers /health and wants ``Bearer right-key`` on /v1/models, as a keyed engine."""

    def __enter__(self):
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802 -- the stdlib's name
                keyed = self.headers.get("Authorization") == "Bearer right-key"
                code, body = ((200, b"") if self.path == "/health"
                              else (200, b'{"object":"list","data":[{"id":"m"}]}') if keyed
                              else (401, b'{"error":"Unauthorized"}'))
                self.send_response(code)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __exit__(self, *exc):
        self.server.shutdown()
        self.server.server_close()


def test_bench_takes_the_key_from_api_key_env_and_a_refused_key_is_not_called_a_stopped_engine(monkeypatch):
    monkeypatch.delenv("BENCH_KEY_UNSET", raising=False)
    unset = run_cli("bench", "--endpoint", "http://127.0.0.1:9", "--api-key-env", "BENCH_KEY_UNSET", "--concurrency", "1")
    _one_line_usage_error(unset, "--api-key-env", "BENCH_KEY_UNSET")
    with _KeyedEndpoint() as endpoint:
        missing = run_cli("bench", "--endpoint", endpoint, "--model", "m", "--concurrency", "1", "--warmup", "0")
        monkeypatch.setenv("BENCH_KEY", "wrong-key")
        refused = run_cli("bench", "--endpoint", endpoint, "--model", "m", "--concurrency", "1", "--warmup", "0",
                          "--api-key-env", "BENCH_KEY")
    assert missing.code == 1 and "--api-key-env" in missing.stderr and "sparkctl serve" not in missing.stderr, missing
    assert refused.code == 1 and "the API key was refused" in refused.stderr, refused
    assert "sparkctl serve" not in refused.stderr and "wrong-key" not in refused.stderr + refused.stdout
