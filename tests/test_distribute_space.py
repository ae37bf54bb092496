"""distribute refuses a host whose Docker data folder cannot hold the image before streaming to it
(a full disk used to fail after the whole stream), and its facts script fails when docker does."""

from __future__ import annotations

import json

import pytest

from sparkctl.ops import distribute as D
from test_fact_failures import LocalConnection, _docker

SOURCE = D.SourceImage("img:1", "sha256:" + "a" * 64, ("sha256:" + "1" * 64, "sha256:" + "2" * 64), (), 2_000_000_000)


# docker 20.10 with its daemon down: `docker info` exits 0, the reason in ServerErrors (which the
# script's template prints as "E ..."); every other docker command fails with it on stderr.
# Only info's answer names the socket: a script that read past the "E" line would fail on the next
# docker with the shorter line, which the asserts tell apart.
ENGINE_DOWN_20_10 = ('case "$1" in info) echo "E Cannot connect to the Docker daemon at unix:///var/run/docker.sock."; exit 0;; esac\n'
                     'echo "Cannot connect to the Docker daemon" >&2\nexit 1\n')
DOWN_REASON = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock."
# docker 25 and later: `docker info` itself fails, the reason on stderr
ENGINE_DOWN_25 = 'echo "Cannot connect to the Docker daemon at unix:///var/run/docker.sock." >&2\nexit 1\n'


def _one_info(tmp_path, info: str) -> str:
    """A docker whose every answer is one `docker info` (INFO_FORMAT: "R <root dir>" then the JSON), an
    empty image list, anything else refused; each call's verb counted in calls.log."""
    return (f'echo "$1" >> "{tmp_path}/calls.log"\n'
            'case "$1 $2" in\n'
            f'  "info --format") printf "R %s\\n%s\\n" "{tmp_path}" \'{info}\';;\n'
            '  "image ls") ;;\n  *) exit 1;;\nesac\n')


def _facts(free_bytes):
    return D.ImageStore("spark-3", "overlay2", False, "28.0", [], free_bytes=free_bytes)


def test_a_host_without_room_for_the_image_is_refused_before_the_stream():
    plan = D.plan_host(SOURCE, _facts(500_000_000))
    assert plan.action == "send" and plan.mode == "full"
    problem = D.space_problem(plan, _facts(500_000_000), SOURCE)
    assert problem and "0.50 GB free" in problem and "2.20 GB" in problem, problem
    assert D.space_problem(plan, _facts(3_000_000_000), SOURCE) is None
    assert D.space_problem(plan, _facts(None), SOURCE) is None  # unknown: not refused on a guess


def test_the_facts_script_reports_the_free_space_and_fails_with_docker(tmp_path):
    info = json.dumps({"Driver": "overlay2", "ServerVersion": "28.0", "DockerRootDir": str(tmp_path)})
    conn = _docker(tmp_path, _one_info(tmp_path, info), "ok")
    result = conn.run(D.image_store_argv())
    assert result.exit_code == 0, result
    facts = D.parse_facts("h", result.stdout)
    assert facts.driver == "overlay2" and facts.free_bytes and facts.free_bytes > 0 and facts.images == []
    assert (tmp_path / "calls.log").read_text().split() == ["info", "image"]  # one docker info, one image listing
    down = _docker(tmp_path, ENGINE_DOWN_20_10, "down")
    failed = down.run(D.image_store_argv())
    assert failed.exit_code != 0 and DOWN_REASON in failed.stderr and failed.stdout == "", failed  # not "no images"
    newer = _docker(tmp_path, ENGINE_DOWN_25, "down25").run(D.image_store_argv())
    assert newer.exit_code != 0 and "Cannot connect to the Docker daemon" in newer.stderr and newer.stdout == "", newer


def test_the_image_store_is_read_through_the_fact_runner_and_named_for_its_host(tmp_path):
    from sparkctl.ops.ask import FactFailed

    info = json.dumps({"Driver": "overlay2", "ServerVersion": "28.0", "DockerRootDir": str(tmp_path)})
    conn = _docker(tmp_path, _one_info(tmp_path, info), "ok")
    conn.name = "spark-2"
    store = D.gather_facts(conn)
    assert store.name == "spark-2" and store.driver == "overlay2" and store.images == []
    down = _docker(tmp_path, ENGINE_DOWN_20_10, "down")
    down.name = "spark-3"
    with pytest.raises(FactFailed) as failed:
        D.gather_facts(down)
    assert str(failed.value).startswith("spark-3: ") and DOWN_REASON in str(failed.value)
