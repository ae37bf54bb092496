"""status asks a host about the running container's image once when its tag still names that image:
the tag's inspect document carries both the ID the tag names now and the layers (the real remote
scripts run here under sh, against a `docker` on PATH that answers as docker 20.10 does)."""

from __future__ import annotations

import json

import pytest

from sparkctl.ops.status import host_state
from test_fact_failures import _docker

RUNNING = "sha256:" + "a" * 64
MOVED = "sha256:" + "b" * 64
LAYERS = ["sha256:" + "1" * 64, "sha256:" + "2" * 64]
OLD_LAYERS = ["sha256:" + "3" * 64]
CONTAINER = {"Id": "c" * 64, "Name": "/sparkctl-sandbox", "Image": RUNNING,
             "State": {"Status": "running"}, "Config": {"Image": "img:1", "Labels": {"sparkctl.profile": "sandbox"}}}


def _host(tmp_path, tag_doc: dict | None):
    """A host whose one container runs RUNNING, its tag img:1 naming ``tag_doc`` (None: the tag is gone)."""
    (tmp_path / "container.json").write_text(json.dumps([CONTAINER]))
    (tmp_path / "tag.json").write_text(json.dumps(tag_doc) if tag_doc else "")
    (tmp_path / "layers.json").write_text(json.dumps(OLD_LAYERS))
    body = (f'echo "$*" >> "{tmp_path}/calls.log"\n'
            f'case "$1" in ps) echo "{"c" * 64} running sparkctl-sandbox +- \\"sandbox\\""; exit 0;;\n'
            f'  inspect) exec cat "{tmp_path}/container.json";; esac\n'
            f'case "$4 $5" in "{{{{json .}}}} img:1") [ -s "{tmp_path}/tag.json" ] && exec cat "{tmp_path}/tag.json"\n'
            '  echo "Error: No such image: img:1" >&2; exit 1;;\n'
            f'  "{{{{json .RootFS.Layers}}}} {RUNNING}") exec cat "{tmp_path}/layers.json";; esac\nexit 1\n')
    return _docker(tmp_path, body)


def _image_calls(tmp_path) -> list[str]:
    return [line for line in (tmp_path / "calls.log").read_text().splitlines() if line.startswith("image inspect")]


def test_a_tag_that_still_names_the_running_image_answers_both_in_one_inspect(tmp_path):
    conn = _host(tmp_path, {"Id": RUNNING, "RootFS": {"Type": "layers", "Layers": LAYERS}})
    _, _, tag_image_id, layers = host_state(conn, "sandbox", str(tmp_path / "state"))
    assert (tag_image_id, layers) == (RUNNING, tuple(LAYERS))
    assert len(_image_calls(tmp_path)) == 1


@pytest.mark.parametrize("tag_doc", [{"Id": MOVED, "RootFS": {"Type": "layers", "Layers": LAYERS}}, None],
                         ids=["moved", "gone"])
def test_a_moved_or_gone_tag_has_the_running_images_own_layers_asked(tmp_path, tag_doc):
    conn = _host(tmp_path, tag_doc)
    _, _, tag_image_id, layers = host_state(conn, "sandbox", str(tmp_path / "state"))
    assert tag_image_id == (MOVED if tag_doc else None)
    assert layers == tuple(OLD_LAYERS)  # the content the container runs, not the tag's new one
    assert len(_image_calls(tmp_path)) == 2
