"""-v: every remote command is said, per host, before it runs; secret values never appear."""

from __future__ import annotations

import shlex

from sparkctl.remote import echo


def test_echo_is_off_until_turned_on_and_masks_secrets():
    lines: list[str] = []
    echo.command("spark-1", ["docker", "ps"])  # off: nothing happens, nothing fails
    echo.echo_to(lines.append)
    try:
        echo.command("spark-1", ["docker", "run", "img", "vllm", "serve", "--api-key", "sk-s3cr3t", "--port", "8000"])
        echo.command("spark-2", ["sh", "-c", "cat > \"$1\"", "write", "/var/lib/sparkctl/x/engine.env"], stdin=True)
        echo.command("spark-3", ["vllm", "--api-key=sk-s3cr3t"])
    finally:
        echo.echo_to(None)
    assert lines[0].startswith("[spark-1] $ docker ")
    assert all("sk-s3cr3t" not in line for line in lines)
    assert lines[1].startswith("[spark-2] $ sh ") and lines[1].endswith("(with input on stdin)")
    echo.command("spark-1", ["docker", "ps"])
    assert len(lines) == 3  # off again


def test_echo_quotes_what_it_shows():
    lines: list[str] = []
    echo.echo_to(lines.append)
    try:
        echo.command("h", ["ls", "a b"])
    finally:
        echo.echo_to(None)
    shown = lines[0].split(" $ ", 1)[1]
    assert shlex.split(shown)[0] == "ls"
