"""The stand-in's pure parts: timing model, scheduler arithmetic, output plans, request validation, rootfs tar."""

from __future__ import annotations

import os
import subprocess
import tarfile
import threading
from pathlib import Path

import pytest

from sparkctl.standin import rootfs
from sparkctl.standin.simulate import (ApiError, Scheduler, Timing, chat_prompt_tokens, count_tokens, output_pieces,
                                       parse_request, plan_output)


def test_timing_shape_matches_the_source_reports():
    t = Timing()
    # The TP4 vLLM report §6.1: ITL 32.39 -> 45.12 -> 73.86 -> 110.28 ms at C=1,2,4,8 (x1.39, x2.28, x3.40)
    ratios = [t.expected_itl_ms(c) / t.expected_itl_ms(1) for c in (2, 4, 8)]
    assert ratios == pytest.approx([1.35, 2.05, 3.45])
    # TTFT 272 -> 396 -> 577 -> 806 ms (x1.46, x2.13, x2.97)
    ttft = [t.expected_ttft_ms(1000, c) / t.expected_ttft_ms(1000, 1) for c in (2, 4, 8)]
    assert ttft == pytest.approx([1.3, 1.9, 3.1])
    assert t.prefill_ms(1000) == pytest.approx(25 + 20)


def test_timing_from_env():
    t = Timing.from_env({"SPARKCTL_STANDIN_ITL_MS": "32.5", "SPARKCTL_STANDIN_ANSWER_TOKENS": "128", "OTHER": "x"})
    assert t.itl_ms == 32.5 and t.answer_tokens == 128 and t.ttft_base_ms == 25.0


def test_scheduler_slows_work_by_active_requests():
    slept: list[float] = []
    sched = Scheduler(Timing(itl_ms=10, itl_concurrency=0.35, ttft_base_ms=12, ttft_per_token_ms=0,
                             ttft_concurrency=0.5), max_running=8, sleep=slept.append)
    sched.running = 1
    sched.decode_step()
    sched.running = 4
    sched.decode_step()
    assert slept == pytest.approx([0.010, 0.0205])
    slept.clear()
    sched.running = 3
    sched.prefill(0)  # 12 ms of work in 5 ms slices, each at 2x
    assert slept == pytest.approx([0.010, 0.010, 0.004])


def test_scheduler_admits_at_most_max_running():
    sched = Scheduler(Timing(), max_running=2)
    sched.admit()
    sched.admit()
    admitted = threading.Event()

    def third():
        sched.admit()
        admitted.set()

    thread = threading.Thread(target=third)
    thread.start()
    assert not admitted.wait(0.2) and sched.waiting == 1
    sched.release()
    assert admitted.wait(2) and sched.running == 2 and sched.waiting == 0
    thread.join()


def test_tokens():
    assert count_tokens("Count from 1 to 10.") == 6
    assert count_tokens("") == 0
    assert chat_prompt_tokens([{"role": "user", "content": "a b"}, {"role": "assistant", "content": None}]) == 2 + 5 + 3
    parts = [{"type": "text", "text": "look at this"}, {"type": "image_url", "image_url": {"url": "data:"}}]
    assert chat_prompt_tokens([{"role": "user", "content": parts}]) == 2 + 3 + 3 + 256


@pytest.mark.parametrize("kw, expected", [
    (dict(max_tokens=None, thinking=False, ignore_eos=False), (0, 48, "stop")),
    (dict(max_tokens=10, thinking=False, ignore_eos=False), (0, 10, "length")),
    (dict(max_tokens=100, thinking=False, ignore_eos=True), (0, 100, "length")),
    (dict(max_tokens=None, thinking=True, ignore_eos=False), (16, 48, "stop")),
    (dict(max_tokens=10, thinking=True, ignore_eos=False), (10, 0, "length")),
])
def test_plan_output(kw, expected):
    plan = plan_output(prompt_tokens=100, max_model_len=4096, timing=Timing(), **kw)
    assert (plan.reasoning, plan.content, plan.finish_reason) == expected


def test_plan_output_stops_at_the_context_end():
    plan = plan_output(prompt_tokens=4090, max_tokens=None, max_model_len=4096, thinking=False, ignore_eos=False,
                       timing=Timing())
    assert (plan.total, plan.finish_reason) == (6, "length")


def test_reasoning_without_a_parser_stays_in_content():
    plan = plan_output(prompt_tokens=1, max_tokens=None, max_model_len=100, thinking=True, ignore_eos=False,
                       timing=Timing(reasoning_tokens=3, answer_tokens=2))
    with_parser = output_pieces(plan, seed=0, reasoning_parser=True)
    without = output_pieces(plan, seed=0, reasoning_parser=False)
    assert [k for k, _ in with_parser] == ["reasoning_content"] * 3 + ["content"] * 2
    assert [k for k, _ in without] == ["content"] * 5
    assert without[0][1].startswith("<think>") and without[2][1].endswith("</think>")


def request(kind="chat", **body):
    base = {"messages": [{"role": "user", "content": "hello"}]} if kind == "chat" else {"prompt": "hello"}
    return parse_request(kind, {**base, **body}, served_model_name="m", max_model_len=100, default_chat_kwargs={"thinking": False})


def test_parse_request():
    r = request(max_tokens=5, stream=True, stream_options={"include_usage": True}, chat_template_kwargs={"thinking": True})
    assert (r.prompt_tokens, r.max_tokens, r.stream, r.include_usage, r.thinking) == (6, 5, True, True, True)
    assert request(max_completion_tokens=7).max_tokens == 7
    assert request(stream_options={"include_usage": True}).include_usage is False  # only with stream
    assert request("completion", prompt=[1, 2, 3]).prompt_tokens == 3


@pytest.mark.parametrize("body, status, fragment", [
    (dict(model="other"), 404, "does not exist"),
    (dict(max_tokens=0), 400, "positive integer"),
    (dict(max_tokens=True), 400, "positive integer"),
    (dict(max_tokens=95), 400, "(95 > 100 - 6)"),
    (dict(messages=[{"role": "user", "content": "w " * 120}]), 400, "maximum context length is 100 tokens"),
    (dict(messages="hi"), 400, "messages"),
    (dict(n=2), 400, "n=1"),
    (dict(chat_template_kwargs="x"), 400, "chat_template_kwargs"),
])
def test_request_errors(body, status, fragment):
    with pytest.raises(ApiError) as raised:
        request(**body)
    assert raised.value.status == status and fragment in raised.value.message
    assert raised.value.body()["error"]["code"] == status


# ---------------------------------------------------------------------------------------------- image


@pytest.fixture(scope="module")
def rootfs_tar(tmp_path_factory):
    path = tmp_path_factory.mktemp("rootfs") / "standin.tar"
    return rootfs.write_rootfs_tar(path)


@pytest.mark.integration
def test_rootfs_tar_contents(rootfs_tar):
    assert rootfs_tar.bytes <= 60 * 1024 * 1024
    with tarfile.open(rootfs_tar.path) as tar:
        members = {m.name: m for m in tar.getmembers()}
    site = rootfs_tar.site_packages.lstrip("/")
    for required in ("usr/local/bin/vllm", f"{site}/sparkctl_standin/cli.py", f"{site}/sparkctl_standin/engine_flags/vllm-0.33.0.json",
                     f"{site}/sparkctl_standin/engine_flags/sglang-0.5.23.json", f"{site}/sglang/launch_server.py",
                     rootfs_tar.python.lstrip("/"), "usr/bin/python3", "tmp", "etc/passwd"):
        assert required in members, required
    assert members["usr/local/bin/vllm"].mode & 0o111
    assert members["tmp"].mode == 0o1777
    for lib in rootfs_tar.libraries:
        assert lib.lstrip("/") in members and members[lib.lstrip("/")].isfile()
    assert any("libc.so" in lib for lib in rootfs_tar.libraries) and any("ld-linux" in lib for lib in rootfs_tar.libraries)
    names = list(members)
    assert not [n for n in names if "/test/" in n or "/idlelib/" in n or "/config-3" in n]
    pycs = [n for n in names if n.endswith(".pyc")]  # only the image's own (sparkctl.bytecode), each beside its source
    assert any(n.startswith(f"{site}/sparkctl_standin/__pycache__/server.") for n in pycs)
    assert all(n.split("/")[-2] == "__pycache__" and
               "/".join(n.split("/")[:-2] + [n.split("/")[-1].split(".")[0] + ".py"]) in members for n in pycs)
    assert not [n for n in names if "sparkctl_standin/shims" in n]


@pytest.mark.integration
def test_rootfs_tar_is_the_same_bytes_when_made_again(rootfs_tar, tmp_path):
    """An unchanged base keeps its hash (and the tests make the tar once a process: rootfs_once.py)."""
    again = rootfs.write_rootfs_tar(tmp_path / "again.tar")
    assert again.bytes == rootfs_tar.bytes
    assert (tmp_path / "again.tar").read_bytes() == open(rootfs_tar.path, "rb").read()


@pytest.mark.integration
@pytest.mark.skipif(os.geteuid() != 0, reason="chroot needs root")
def test_rootfs_runs_the_engine_in_a_chroot(rootfs_tar, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    with tarfile.open(rootfs_tar.path) as tar:
        tar.extractall(root)
    env = {"PATH": rootfs.IMAGE_PATH}
    version = subprocess.run(["chroot", str(root), "vllm", "--version"], capture_output=True, text=True, env=env, timeout=30)
    assert version.returncode == 0 and version.stdout.strip() == "0.33.0"
    refused = subprocess.run(["chroot", str(root), "python3", "-m", "sglang.launch_server", "--model-path", "/model",
                              "--bogus"], capture_output=True, text=True, env=env, timeout=30)
    assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr
    nomodel = subprocess.run(["chroot", str(root), "vllm", "serve", "/model"], capture_output=True, text=True, env=env, timeout=30)
    assert nomodel.returncode == 1 and "config.json not found" in nomodel.stdout


def test_docker_import_argv():
    argv = rootfs.docker_import_argv("sparkctl-standin:test")
    assert argv[:2] == ["docker", "import"] and argv[-2:] == ["-", "sparkctl-standin:test"]
    assert f"ENV PATH={rootfs.IMAGE_PATH}" in argv


def _python39():
    import glob
    import shutil

    candidates = sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.9*/bin/python3.9"))) + [shutil.which("python3.9")]
    for candidate in candidates:
        if candidate and subprocess.run([candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"],
                                        capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.integration
@pytest.mark.skipif(_python39() is None, reason="no python3.9 on this machine")
def test_the_engine_runs_on_python_3_9(tmp_path):
    """The image's python may be older than sparkctl's own: the stand-in promises 3.9."""
    from sparkctl.engram.checkpoint_maker import make_checkpoint
    from test_standin_support import REPO, Proc, free_port, wait_http

    python = _python39()
    refused = subprocess.run([python, "-m", "sparkctl.standin", "vllm", "serve", "/m", "--bogus"], cwd=REPO,
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "unrecognized arguments: --bogus" in refused.stderr
    make_checkpoint(str(tmp_path / "model"), vocab_size=64)
    port = free_port()
    proc = Proc([python, "-m", "sparkctl.standin", "vllm", "serve", str(tmp_path / "model"), "--host", "127.0.0.1",
                 "--port", str(port)], tmp_path / "py39.log")
    try:
        import httpx

        wait_http(f"http://127.0.0.1:{port}/health", proc=proc)
        body = {"max_tokens": 3, "stream": True, "messages": [{"role": "user", "content": "hi"}]}
        with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/chat/completions", json=body, timeout=30) as response:
            text = "".join(response.iter_text())
        assert text.rstrip().endswith("data: [DONE]") and text.count("data: {") == 4
    finally:
        proc.stop()


def test_the_tar_made_once_leaves_no_temporary_link_when_given_again(tmp_path, monkeypatch):
    """The second plan of a process gets the same bytes at the same path; nothing else is left there."""
    import rootfs_once

    def fake_maker(path, python=None, busybox=None):
        Path(path).write_bytes(b"rootfs")
        return rootfs.RootfsReport(path=str(path), bytes=6, files=1, python="python3", python_version="3.11", site_packages="")

    monkeypatch.setattr(rootfs, "write_rootfs_tar", fake_maker)
    monkeypatch.setattr(rootfs_once, "_made", {})
    try:
        for _ in range(3):
            made = rootfs_once.write_rootfs_tar(tmp_path / "standin.tar")
            assert Path(made.path).read_bytes() == b"rootfs"
        assert sorted(p.name for p in tmp_path.iterdir()) == ["standin.tar"]
    finally:
        rootfs_once.forget()
