"""Folders the user names: the farm writes there only what it owns (farm.storage.owned), through
every command that writes one: fetch, export (tests/export), report (tests/report), cache pull,
reference --output-dir."""

import json

import pytest

from farm.errors import FarmError
from farm.export import fetch as fetching
from farm.storage import open_folder, open_store
from farm.storage.owned import MARKER, ForeignFile, Owned, writing


def _write(folder, files):
    with writing(folder, "--out", force=True) as stage:
        for rel, text in files.items():
            (stage / rel).parent.mkdir(parents=True, exist_ok=True)
            (stage / rel).write_text(text)


def test_a_foreign_folder_is_refused_naming_it_and_force(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(FarmError, match=r"out \(--out\) is not empty .*notes.txt.*--force"):
        with writing(tmp_path / "out", "--out"):
            pass
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"
    with writing(tmp_path / "empty", "--out"):  # a new folder, or an empty one, is fine
        pass
    (tmp_path / "file").write_text("x")
    with pytest.raises(FarmError, match=r"file \(--out\) is a file"):
        Owned(tmp_path / "file", "--out")


def test_rewriting_replaces_only_the_farms_files(tmp_path):
    out = tmp_path / "out"
    _write(out, {"index.html": "v1", "plots/a.svg": "a", "plots/b.svg": "b", "edited.txt": "farm"})
    (out / "mine.txt").write_text("mine")
    (out / "plots" / "mine.svg").write_text("mine")
    (out / "edited.txt").write_text("the user edited it")
    _write(out, {"index.html": "v2", "plots/a.svg": "a2"})  # no --force needed: the marker says it is ours
    assert (out / "index.html").read_text() == "v2" and (out / "plots" / "a.svg").read_text() == "a2"
    assert not (out / "plots" / "b.svg").exists()  # the earlier write's own file, not written again: gone
    assert (out / "mine.txt").read_text() == (out / "plots" / "mine.svg").read_text() == "mine"
    assert (out / "edited.txt").read_text() == "the user edited it"  # edited since: theirs now
    assert set(json.loads((out / MARKER).read_text())["files"]) == {"index.html", "plots/a.svg"}


def test_a_users_file_where_the_farm_would_write_is_never_replaced(tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "README.md").write_text("mine")
    with pytest.raises(ForeignFile, match=r"README.md was not written by farm.*\(--out\)"):
        _write(out, {"README.md": "farm's", "index.json": "{}"})
    assert (out / "README.md").read_text() == "mine" and not (out / "index.json").exists()  # nothing moved


def test_a_damaged_marker_names_the_way_out(tmp_path):
    out = tmp_path / "out"
    _write(out, {"a": "1"})
    (out / MARKER).write_text('{"files": ')
    with pytest.raises(FarmError, match="is damaged.*delete .*--force"):
        _write(out, {"a": "2"})


def _kernel_store(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    store.put_bytes("kernels/cpu/demo/scale/best.py", b"class ModelNew: pass\n")
    return store, [{"target": "cpu", "source": "demo", "op": "scale", "time_ms": 1.0}]


def test_fetch_keeps_a_users_readme(tmp_path):
    store, metas = _kernel_store(tmp_path)
    out = tmp_path / "kernels"
    out.mkdir()
    (out / "README.md").write_text("my notes")
    with pytest.raises(FarmError, match=r"kernels \(--out\) is not empty.*--force"):
        fetching.export(store, metas, out)
    with pytest.raises(ForeignFile, match="README.md was not written by farm"):
        fetching.export(store, metas, out, force=True)
    assert (out / "README.md").read_text() == "my notes"
    (out / "README.md").rename(out / "NOTES.md")
    fetching.export(store, metas, out, force=True)
    fetching.export(store, metas, out)  # again: the folder is the farm's now
    assert (out / "cpu" / "demo" / "scale.py").is_file() and (out / "NOTES.md").read_text() == "my notes"


def test_cache_pull_and_reference_folder_write_only_their_files(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    store.put_bytes("refs/demo/op.pt", b"data")
    dest = tmp_path / "cache"
    dest.mkdir()
    (dest / "manifest.json").write_text("another tool's manifest")
    with pytest.raises(FarmError, match=r"cache \(--to\) is not empty.*--force"):
        open_folder(dest, "--to")
    folder = open_folder(dest, "--to", force=True)
    folder.put_bytes("refs/demo/op.pt", b"data")
    with pytest.raises(ForeignFile, match="manifest.json was not written by farm"):
        folder.update_json("refs/manifest.json", lambda d: {**d, "x": 1})
    with pytest.raises(ForeignFile):
        folder.delete("refs/manifest.json")
    assert (dest / "manifest.json").read_text() == "another tool's manifest"
    # a folder the farm filled (farm reference --output-dir) is written again without --force
    (dest / "manifest.json").unlink()
    again = open_folder(dest, "--output-dir")
    again.update_json("refs/manifest.json", lambda d: {**d, "x": 1})
    again.put_bytes("refs/demo/op.pt", b"new")
    assert set(json.loads((dest / MARKER).read_text())["files"]) == {"demo/op.pt", "manifest.json"}
    assert [i.key for i in again.list("refs/")] == ["refs/demo/op.pt", "refs/manifest.json"]  # marker not listed


def test_cache_repair_and_push_of_a_folder_that_is_not_farms(cli, tmp_path):
    """`farm cache repair --dir` rewrote any folder's manifest.json (another tool's, say AKG's
    generator's) and exited 0 on a folder with no reference data, as `cache push --from` did."""
    empty = tmp_path / "notes"
    empty.mkdir()
    (empty / "a.txt").write_text("mine")
    for args in (["cache", "repair", "--dir", empty], ["cache", "push", "--from", empty, "--store", f"file://{tmp_path / 's'}"]):
        res = cli(*args)
        assert res.exit_code == 2 and "no reference data (<source>/<op>.pt) in" in res.stderr, res.output
    assert sorted(p.name for p in empty.iterdir()) == ["a.txt"] and not (tmp_path / "s").exists()
    theirs = tmp_path / "akg_refs"  # made by the existing tools: their manifest, no marker
    (theirs / "demo").mkdir(parents=True)
    (theirs / "demo" / "op.pt").write_bytes(b"data")
    (theirs / "manifest.json").write_text('{"total": 1, "ops": [{"op_name": "op", "success": true}]}')
    res = cli("cache", "repair", "--dir", theirs)
    assert res.exit_code == 2 and "is not a manifest farm wrote" in " ".join(res.stderr.split()), res.output
    assert "--force" in res.stderr and "Traceback" not in res.output
    assert json.loads((theirs / "manifest.json").read_text())["total"] == 1
