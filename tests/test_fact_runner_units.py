"""The one fact runner (sparkctl.ops.ask) on recorded host answers: the retry policy, failures that
name the host, absent things, and answers kept for the run while the host is unchanged."""

from __future__ import annotations

import json

import pytest

from sparkctl.commands import facts as F
from sparkctl.ops.ask import FactFailed, ask
from sparkctl.remote.fake import Answer, FakeTransport
from sparkctl.remote.result import RemoteError

IMAGE_DOC = {"Id": "sha256:" + "a" * 64, "RepoTags": ["vllm-dsv41:latest"], "RepoDigests": [],
             "RootFS": {"Layers": ["sha256:" + "1" * 64]}, "Size": 123}
MEMINFO = "MemTotal:       131072000 kB\nMemAvailable:   120000000 kB\n"
GPUS = "NVIDIA GB10, 580.95.05, 12.1, [N/A]\n"


def test_recorded_answers_parse_to_typed_values():
    host = FakeTransport("spark-1", {
        ("docker", "image", "inspect", "--format", "{{json .}}"): Answer(stdout=json.dumps(IMAGE_DOC)),
        ("cat", "/proc/meminfo"): Answer(stdout=MEMINFO),
        ("nvidia-smi",): Answer(stdout=GPUS),
    })
    assert ask(host, F.IMAGE_DOC, "vllm-dsv41:latest")["RootFS"]["Layers"] == IMAGE_DOC["RootFS"]["Layers"]
    assert ask(host, F.MEMINFO)["MemAvailable"] == 120000000 * 1024
    assert [g.driver for g in ask(host, F.GPUS)] == ["580.95.05"]


def test_an_absent_image_is_none_but_an_engine_that_is_down_is_the_hosts_error():
    absent = FakeTransport("spark-2", {("docker",): Answer(1, stderr="Error: No such image: x:y")})
    assert ask(absent, F.IMAGE_ID, "x:y") is None
    assert ask(absent, F.IMAGE_DOC, "x:y") is None
    down = FakeTransport("spark-2", {("docker",): Answer(1, stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock")})
    with pytest.raises(FactFailed, match=r"^spark-2: cannot inspect the image: Cannot connect to the Docker daemon") as caught:
        ask(down, F.IMAGE_ID, "x:y")
    assert isinstance(caught.value, RuntimeError) and caught.value.exit_code == 1


def test_a_missing_program_and_an_unreadable_answer_are_failures():
    host = FakeTransport("spark-3", {("nvidia-smi",): Answer(127, stderr="sh: nvidia-smi: not found"),
                                     ("docker",): Answer(stdout="{not json")})
    with pytest.raises(FactFailed, match="nvidia-smi: command not found"):
        ask(host, F.GPUS)
    with pytest.raises(FactFailed, match="spark-3: cannot inspect the image: unexpected docker image inspect output"):
        ask(host, F.IMAGE_DOC, "x")


def test_a_dropped_connection_is_asked_once_more_then_raised_with_its_cause():
    drops = iter([RemoteError("spark-1", "closed", "dropped"), None])

    def flaky(argv, stdin):
        err = next(drops)
        if err:
            raise err
        return Answer(stdout=MEMINFO)

    host = FakeTransport("spark-1", {("cat",): flaky})
    assert ask(host, F.MEMINFO)["MemTotal"] == 131072000 * 1024
    assert len(host.ran("cat")) == 2
    dead = FakeTransport("spark-1", unreachable="refused")
    with pytest.raises(RemoteError) as caught:
        ask(dead, F.MEMINFO)
    assert caught.value.cause == "refused"


def test_an_answer_is_kept_while_nothing_else_runs_on_the_host():
    host = FakeTransport("spark-1", {("cat",): Answer(stdout=MEMINFO), ("docker", "load"): Answer()})
    ask(host, F.MEMINFO)
    ask(host, F.MEMINFO)
    assert len(host.ran("cat")) == 1  # one run asks each question once
    host.run(["docker", "load"], stdin=b"x")  # anything else may have changed the host
    ask(host, F.MEMINFO)
    assert len(host.ran("cat")) == 2
    ask(host, F.MEMINFO, fresh=True)
    assert len(host.ran("cat")) == 3


def test_answers_are_kept_per_question_and_arguments():
    host = FakeTransport("spark-1", {("docker",): lambda argv, stdin: Answer(stdout=json.dumps({"Id": "sha256:" + ("b" if argv[-1] == "b" else "a") * 64}))})
    assert ask(host, F.IMAGE_ID, "a").endswith("a" * 64)
    assert ask(host, F.IMAGE_ID, "b").endswith("b" * 64)
    assert ask(host, F.IMAGE_ID, "a").endswith("a" * 64)
    assert len(host.calls) == 2  # other questions change nothing: "a" is still known


def test_only_a_run_that_remembers_keeps_answers():
    """`up` keeps answers (remember_facts); other verbs poll and must see every change."""
    from sparkctl.remote.pool import ConnectionPool
    from sparkctl.remote.target import SSHTarget

    target = SSHTarget(name="spark-1", address="192.0.2.1")
    assert ConnectionPool().get(target).memo is None
    assert ConnectionPool(remember_facts=True).get(target).memo == {}
    polled = FakeTransport("spark-1", {("cat",): Answer(stdout=MEMINFO)}, memo=None)
    ask(polled, F.MEMINFO)
    ask(polled, F.MEMINFO)
    assert len(polled.ran("cat")) == 2


def test_two_facts_of_one_command_are_one_run_and_a_failure_is_never_kept():
    """An image's ID and its whole document come from one `docker image inspect`: a run that keeps
    answers runs it once for both; a failed answer is asked again (it may have been passing)."""
    doc = {**IMAGE_DOC, "Id": "sha256:" + "c" * 64}
    host = FakeTransport("spark-1", {("docker", "image", "inspect"): Answer(stdout=json.dumps(doc))})
    assert ask(host, F.IMAGE_DOC, "x:y")["Id"] == doc["Id"]
    assert ask(host, F.IMAGE_ID, "x:y") == doc["Id"]
    assert len(host.calls) == 1
    answers = [Answer(1, stderr="Cannot connect to the Docker daemon at unix:///var/run/docker.sock"), Answer(stdout=json.dumps(doc))]
    flaky = FakeTransport("spark-2", {("docker",): lambda argv, stdin: answers.pop(0)})
    with pytest.raises(FactFailed, match="Cannot connect"):
        ask(flaky, F.IMAGE_ID, "x:y")
    assert ask(flaky, F.IMAGE_ID, "x:y") == doc["Id"]
    assert len(flaky.calls) == 2
