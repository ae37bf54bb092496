"""A fact whose command fails is an error naming the cause, never a "no": the real remote scripts run
here under sh, against a `docker` on PATH that answers as docker does when its engine is down or the
image is absent (the sandbox tier checks the same against real engines: tests/test_faults_sandbox.py)."""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

from sparkctl.commands import facts
from sparkctl.commands.lock import LOCK_HELD, lock_argv
from sparkctl.ops.steps import ask
from sparkctl.remote.result import CommandResult

ENGINE_DOWN = "Cannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?"


class LocalConnection:
    """Runs an argv here, as a host would, with ``bin`` first on PATH."""

    def __init__(self, bin_dir: str):
        self.env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}

    def run(self, argv, timeout=None, stdin=None):
        started = time.monotonic()
        proc = subprocess.run(argv, capture_output=True, text=True, env=self.env, timeout=timeout, input=stdin)
        return CommandResult(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)


def _fake(tmp_path, command: str, body: str, name: str) -> LocalConnection:
    """A connection whose PATH finds ``command`` as a shell script of ``body`` first (in ``tmp_path/name``)."""
    bin_dir = tmp_path / name
    bin_dir.mkdir()
    script = bin_dir / command
    script.write_text("#!/bin/sh\n" + body)
    script.chmod(0o755)
    return LocalConnection(str(bin_dir))


def _docker(tmp_path, body: str, name: str = "bin") -> LocalConnection:
    return _fake(tmp_path, "docker", body, name)


@pytest.fixture
def engine_down(tmp_path):
    return _docker(tmp_path, f'echo "{ENGINE_DOWN}" >&2\nexit 1\n', "down")


@pytest.fixture
def no_such_image(tmp_path):
    return _docker(tmp_path, 'case "$1 $2" in "image inspect") echo "Error: No such image: $6" >&2; exit 1;; esac\n'
                             'case "$1" in ps) exit 0;; esac\nexit 1\n', "absent")


def test_container_list_with_the_engine_down_is_an_error_not_an_empty_list(engine_down):
    with pytest.raises(RuntimeError, match="cannot list containers: Cannot connect to the Docker daemon"):
        ask(engine_down, facts.CONTAINERS, "sandbox", "sparkctl-sandbox")


def test_container_list_fails_even_when_only_a_later_docker_call_fails(tmp_path):
    # The listing answers (one container of the profile), the inspect after it fails.
    conn = _docker(tmp_path, 'case "$1" in ps) echo "1a2b running sparkctl-sandbox +- \\"sandbox\\""; exit 0;; esac\n'
                             f'echo "{ENGINE_DOWN}" >&2\nexit 1\n')
    with pytest.raises(RuntimeError, match="Cannot connect"):
        ask(conn, facts.CONTAINERS, "sandbox", "sparkctl-sandbox")


# `docker ps -a --no-trunc --format serve.CONTAINER_LINE_FORMAT` as docker 20.10.24 printed it on a
# sandbox host: containers of two profiles, unlabelled ones, one labelled with an empty value (and
# another label whose value holds ",sparkctl.profile="), paused, exited and created ones; the last two
# lines were added by hand (a spaced profile, a name the regex "c.x.named" matches but the name is not).
RECORDED_LISTING = """\
b22557a4d72bbf88a722afad8c91e59d25aa28c0f75f188039cc3cc4944a74ea exited c-exited +- "other"
db822d282dae371f11409ebd940f219149ea8585d90438eb5149a8307a313497 paused c-paused +- "other"
206b3686e7af62723c07463e0f36e503e7b2549fffb9e1c200ba71b260caf3a7 created c.x.named - ""
d98c60dcf2f5734cd35804dcb23b7870589f21a21d9bfb7cbf799f65bbd03c8a created c-named,other/alias - ""
dbf963cab59accbd803dfaf46928d31b8becdff7eaecefc0830a16b2922c33bc running c-emptyrun ++- ""
7ff279c1726102f3d4b413a743414929026f9246e06014f969374a4d7c11a6a6 created c-empty +- ""
b2b6e8ca16a1e9bcb6ebc8941009b32145c92bcc28682273714648622e99e7d0 running c-other +- "other"
c868d83e334323ce44e4dc0f678042dc443f5c478458b66213e184037177ed86 created c-mine +- "sandbox"
0c0ffee000000000000000000000000000000000000000000000000000000000 exited c-spaced +- "sandbox x"
a11ce00000000000000000000000000000000000000000000000000000000000 created cAxBnamed - ""
"""


@pytest.fixture
def recorded_host(tmp_path):
    """A docker that lists RECORDED_LISTING and inspects the IDs it is given (each call counted in calls.log)."""
    (tmp_path / "listing.txt").write_text(RECORDED_LISTING)
    return _docker(tmp_path, f'echo "$1" >> "{tmp_path}/calls.log"\n'
                             f'case "$1" in ps) exec cat "{tmp_path}/listing.txt";; esac\n'
                             'printf "["; sep=""; shift\n'
                             'for id in "$@"; do printf \'%s{"Id": "%s", "Name": "/n-%s"}\' "$sep" "$id" "$id"; sep=","; done\n'
                             'echo "]"\n'), tmp_path / "calls.log"


@pytest.mark.parametrize("profile, name, picked", [
    # this profile's (any state), then every running (or paused) labelled one, whatever its profile
    ("sandbox", "", {"c868d8", "db822d", "dbf963", "b2b6e8"}),
    # and the one of the plan's name (not its link alias, not a name the regex "c.x.named" would match)
    ("sandbox", "c-named", {"c868d8", "db822d", "dbf963", "b2b6e8", "d98c60"}),
    ("other", "c.x.named", {"b22557", "db822d", "206b36", "dbf963", "b2b6e8"}),  # c-mine: created, not running
    ("nope", "c-x-named", {"db822d", "dbf963", "b2b6e8"}),
    ("nope", "alias", {"db822d", "dbf963", "b2b6e8"}),
])
def test_one_listing_picks_the_profiles_the_named_and_the_running_labelled_containers(recorded_host, profile, name, picked):
    conn, calls = recorded_host
    containers = ask(conn, facts.CONTAINERS, profile, name)
    assert {c.id[:6] for c in containers} == picked
    assert [c.id for c in containers] == sorted(c.id for c in containers)  # ID order, as before
    assert calls.read_text().split() == ["ps", "inspect"]  # one listing, one inspect


def test_nothing_picked_is_an_empty_answer_without_an_inspect(tmp_path):
    (tmp_path / "listing.txt").write_text(RECORDED_LISTING.splitlines()[2] + "\n")  # one unlabelled, created
    conn = _docker(tmp_path, f'echo "$1" >> "{tmp_path}/calls.log"\n'
                             f'case "$1" in ps) exec cat "{tmp_path}/listing.txt";; esac\nexit 1\n')
    assert ask(conn, facts.CONTAINERS, "sandbox", "sparkctl-sandbox") == []
    assert (tmp_path / "calls.log").read_text().split() == ["ps"]


def test_no_containers_is_an_empty_answer(no_such_image):
    assert ask(no_such_image, facts.CONTAINERS, "sandbox", "") == []


# `docker inspect --type container -- NAME` as docker 20.10.24 answers on a sandbox host: "[]" on stdout
# and exit 1 both when no container has the name and when the engine is down; stderr tells them apart.
NO_SUCH_CONTAINER_DOCKER = 'echo "[]"; echo "Error: No such container: $5" >&2; exit 1\n'
ENGINE_DOWN_INSPECT_DOCKER = f'echo "[]"; echo "{ENGINE_DOWN}" >&2; exit 1\n'


def test_one_container_by_name_tells_a_gone_container_from_a_down_engine(tmp_path):
    gone = _docker(tmp_path, NO_SUCH_CONTAINER_DOCKER, "gone")
    assert ask(gone, facts.CONTAINER, "sparkctl-sandbox") is None
    with pytest.raises(RuntimeError, match="cannot inspect the container: Cannot connect to the Docker daemon"):
        ask(_docker(tmp_path, ENGINE_DOWN_INSPECT_DOCKER, "down"), facts.CONTAINER, "sparkctl-sandbox")
    with pytest.raises(RuntimeError, match="cannot inspect the container: docker inspect printed no JSON"):
        ask(_docker(tmp_path, 'echo "garbled"\n', "garbled"), facts.CONTAINER, "sparkctl-sandbox")


def test_one_container_by_name_is_one_docker_and_reads_what_the_listing_reads(tmp_path):
    doc = {"Id": "c" * 64, "Name": "/sparkctl-sandbox", "RestartCount": 2,
           "State": {"Status": "running", "ExitCode": 0, "StartedAt": "2026-12-02T08:00:00Z"},
           "Config": {"Image": "img:1", "Labels": {"sparkctl.profile": "sandbox", "sparkctl.rank": "1"}}}
    (tmp_path / "doc.json").write_text(json.dumps([doc]))
    conn = _docker(tmp_path, f'echo "$*" >> "{tmp_path}/calls.log"\nexec cat "{tmp_path}/doc.json"\n')
    seen = ask(conn, facts.CONTAINER, "sparkctl-sandbox")
    assert (seen.id, seen.name, seen.rank, seen.restart_count, seen.running) == ("c" * 64, "sparkctl-sandbox", 1, 2, True)
    assert (tmp_path / "calls.log").read_text().splitlines() == ["inspect --type container -- sparkctl-sandbox"]


@pytest.mark.parametrize("fact", [facts.IMAGE_ID, facts.IMAGE_LAYERS])
def test_image_questions_tell_an_absent_image_from_a_down_engine(fact, engine_down, no_such_image):
    assert ask(no_such_image, fact, "sparkctl-sandbox:latest") is None
    with pytest.raises(RuntimeError, match="Cannot connect to the Docker daemon"):
        ask(engine_down, fact, "sparkctl-sandbox:latest")


def test_a_deployment_record_that_cannot_be_read_is_an_error(tmp_path, engine_down):
    state = tmp_path / "state"
    assert ask(engine_down, facts.DEPLOYMENT_RECORD, "sandbox", str(state)) is None  # none yet: a "no"
    (state / "sandbox" / "deployment.json").mkdir(parents=True)  # there, but unreadable
    with pytest.raises(RuntimeError, match="cannot read the deployment record: .*[Ii]s a directory"):
        ask(engine_down, facts.DEPLOYMENT_RECORD, "sandbox", str(state))
    (state / "sandbox" / "deployment.json").rmdir()
    (state / "sandbox" / "deployment.json").write_text('{"profile": "sandbox", "rank": 0}')
    assert ask(engine_down, facts.DEPLOYMENT_RECORD, "sandbox", str(state)) == {"profile": "sandbox", "rank": 0}


def test_a_lock_that_cannot_be_read_is_an_error_not_a_free_lock(tmp_path, engine_down):
    path = tmp_path / "deploy.lock"
    assert ask(engine_down, facts.LOCK, str(path)) is None
    (path / "info.json").mkdir(parents=True)
    with pytest.raises(RuntimeError, match="cannot read the deploy lock"):
        ask(engine_down, facts.LOCK, str(path))


def test_taking_the_lock_where_nothing_can_be_written_fails_instead_of_reading_as_held(tmp_path, engine_down):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):  # root writes anyway: a path under a regular file cannot be made by anyone
            parent.chmod(0o700)
            (parent / "file").write_text("")
            path = parent / "file" / "deploy.lock"
        else:
            path = parent / "deploy.lock"
        result = engine_down.run(lock_argv({"who": "me"}, str(path)))
        assert result.exit_code not in (0, LOCK_HELD), result
        assert result.stderr.strip(), result
    finally:
        parent.chmod(0o700)


def test_a_native_pidfile_that_cannot_be_read_is_an_error_not_stopped(tmp_path):
    from sparkctl.commands.native import NativePaths, state_argv

    conn = LocalConnection(str(tmp_path))
    paths = NativePaths(str(tmp_path / "run"))
    assert conn.run(state_argv(paths, "p")).stdout.strip() == "stopped"  # no pidfile: stopped, truly
    (tmp_path / "run").mkdir()
    os.mkdir(paths.pidfile)  # there, but unreadable as a file
    result = conn.run(state_argv(paths, "p"))
    assert result.exit_code != 0 and "stopped" not in result.stdout, result


# The host's python3 as it fails when its installation is broken (seen with a half-upgraded
# interpreter: the encodings module missing), on stderr with exit 1.
BROKEN_PYTHON = ("echo 'Fatal Python error: init_fs_encoding: failed to get the Python codec of the filesystem "
                 "encoding' >&2\necho \"ModuleNotFoundError: No module named 'encodings'\" >&2\nexit 1\n")


def test_a_checkpoint_read_by_a_failing_python3_is_its_error_never_an_absent_checkpoint(tmp_path):
    with pytest.raises(RuntimeError, match="cannot read the checkpoint: ModuleNotFoundError: No module named 'encodings'"):
        ask(_fake(tmp_path, "python3", BROKEN_PYTHON, "py-bin"), facts.CHECKPOINT, str(tmp_path))


def test_the_host_scripts_run_isolated_from_the_login_folder_and_the_python_environment(tmp_path):
    """``python3 -I -S -c``: a json.py in the folder the login starts in (an SSH session's is the home
    folder) and PYTHONPATH/PYTHONSTARTUP do not reach the checkpoint and room scripts."""
    from sparkctl.commands import native, probes

    home = tmp_path / "home"
    home.mkdir()
    (home / "json.py").write_text("raise SystemExit('the json.py of the home folder was imported')\n")
    (home / "struct.py").write_text("raise SystemExit('the struct.py of the home folder was imported')\n")
    env = {**os.environ, "PYTHONPATH": str(home), "PYTHONSTARTUP": str(home / "json.py")}
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    answers = []
    for argv, parse in ((probes.checkpoint_argv(str(model)), probes.parse_checkpoint),
                        (native.room_argv([1]), native.parse_room)):
        proc = subprocess.run(argv, cwd=home, env=env, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        answers.append(parse(proc.stdout))
    checkpoint, room = answers
    assert checkpoint.dir_exists and checkpoint.config and room.mem_available > 0
