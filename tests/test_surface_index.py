"""The surfaces folder's index: latest_for_tag answers as from the files, reading each file once; a
surface already read from an image ID is reused by the next build of it."""

from __future__ import annotations

import json

from sparkctl.images import surface, surface_index


def _doc(engine: str = "vllm") -> dict:
    return {"engine": engine, "version": "0.33.0", "flags": {"--port": {}}}


def _store(folder, n: int, tags: list[str], read_at: float, engine: str = "vllm"):
    path = surface.store("sha256:" + (f"{n:02x}" * 32), tags, _doc(engine), folder)
    record = json.loads(path.read_text())
    record["read_at"] = read_at
    path.write_text(json.dumps(record))
    return path


def _counting_reads(monkeypatch) -> list:
    read = []
    real = surface_index._read_entry
    monkeypatch.setattr(surface_index, "_read_entry", lambda path: read.append(path.name) or real(path))
    return read


def test_the_latest_tagged_surface_is_found_and_each_file_read_once(tmp_path, monkeypatch):
    _store(tmp_path, 1, ["app:latest"], 100.0)
    newest = _store(tmp_path, 2, ["app:latest", "app:v2"], 300.0)
    _store(tmp_path, 3, ["other:latest"], 900.0)
    _store(tmp_path, 4, ["app:latest"], 950.0, engine="sglang")  # another engine's surface
    read = _counting_reads(monkeypatch)
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("02" * 32)
    assert len(read) == 3  # the vllm files, each once
    read.clear()
    assert surface.latest_for_tag("app:v2", "vllm", tmp_path)["image_id"].endswith("02" * 32)
    assert surface.latest_for_tag("app:latest", "sglang", tmp_path)["image_id"].endswith("04" * 32)
    assert read == [f"{'04' * 32}-sglang.json"]  # the index knew the vllm files: only the sglang one is read
    assert surface.latest_for_tag("absent:tag", "vllm", tmp_path) is None
    assert newest.exists()


def test_a_changed_removed_or_unreadable_file_is_read_again(tmp_path, monkeypatch):
    older = _store(tmp_path, 1, ["app:latest"], 100.0)
    newer = _store(tmp_path, 2, ["app:latest"], 300.0)
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("02" * 32)
    read = _counting_reads(monkeypatch)
    record = json.loads(older.read_text())
    record["read_at"] = 500.0  # read again from its image since: the latest now
    older.write_text(json.dumps(record, indent=2))
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("01" * 32)
    assert read == [older.name]
    older.unlink()
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("02" * 32)
    assert older.name not in json.loads((tmp_path / surface_index.INDEX_NAME).read_text())["files"]
    newer.write_text("{not json")
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path) is None


def test_a_broken_index_is_rebuilt_from_the_files(tmp_path):
    _store(tmp_path, 1, ["app:latest"], 100.0)
    for broken in ("{not json", "[]", json.dumps({"version": 1, "files": {"x-vllm.json": 3}})):
        (tmp_path / surface_index.INDEX_NAME).write_text(broken)
        assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("01" * 32)
        index = json.loads((tmp_path / surface_index.INDEX_NAME).read_text())
        assert list(index["files"]) == [f"{'01' * 32}-vllm.json"]
    assert oct((tmp_path / surface_index.INDEX_NAME).stat().st_mode & 0o777) == "0o644"


def test_a_file_that_could_not_be_read_is_not_remembered_as_untagged(tmp_path, monkeypatch):
    """A read that fails (too many open files, a permission being fixed) is asked again next time,
    not kept in the index as "no tags" until the file changes."""
    path = _store(tmp_path, 1, ["app:latest"], 100.0)
    real = path.read_text
    failing = {"on": True}

    def read_text(self, *args, **kwargs):
        if self == path and failing["on"]:
            raise OSError(24, "Too many open files")
        return real(*args, **kwargs)

    monkeypatch.setattr(type(path), "read_text", read_text)
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path) is None
    failing["on"] = False
    assert surface.latest_for_tag("app:latest", "vllm", tmp_path)["image_id"].endswith("01" * 32)


class _Engine:
    """A build engine whose python3 prints the probe's document (and counts the containers run)."""

    def __init__(self):
        self.runs = 0

    def run_python(self, image, code, argv):
        self.runs += 1
        return json.dumps(_doc(argv[0]))


def test_a_surface_read_by_this_probe_is_reused_for_the_same_image_and_stored_with_the_new_tags(tmp_path):
    engine, image_id = _Engine(), "sha256:" + "ab" * 32
    surface.capture(engine, "app:1", image_id, ["app:1"], "vllm", folder=tmp_path)
    assert engine.runs == 1 and surface.reuse("sha256:" + "cd" * 32, ["app:1"], "vllm", tmp_path) is None
    assert surface.reuse(image_id, ["app:1"], "sglang", tmp_path) is None  # never read for that engine
    again = surface.reuse(image_id, ["app:2"], "vllm", tmp_path)
    assert again == {**_doc(), "image_id": image_id, "tags": ["app:2"]}
    assert surface.latest_for_tag("app:2", "vllm", tmp_path)["tags"] == ["app:2"]  # stored again, as a read is
    # one stored by another probe (or by a sparkctl from before the digest) is read again
    path = next(tmp_path.glob("*-vllm.json"))
    record = json.loads(path.read_text())
    path.write_text(json.dumps({**record, "probe_digest": "0" * 16}))
    assert surface.reuse(image_id, ["app:2"], "vllm", tmp_path) is None
    del record["probe_digest"]
    path.write_text(json.dumps(record))
    assert surface.reuse(image_id, ["app:2"], "vllm", tmp_path) is None
