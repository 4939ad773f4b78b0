"""Writes to the store are checked before they replace anything, and a damaged object or
manifest is reported by every command that meets it, with the command that repairs it."""

import json
import shutil

import pytest

from farm.config import load_settings
from farm.corpus.tasks import find_tasks
from farm.reference import manifest
from farm.reference.generate import generate_references, load_pt
from farm.storage import open_store
from farm.targets import resolve_device
from tests.conftest import GOOD_TASK, write_task


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One op's reference data, made once: a store, a folder in the existing tools' layout."""
    root = tmp_path_factory.mktemp("integrity")
    write_task(root / "tasks" / "mini", "scale2", GOOD_TASK)
    settings, _ = load_settings(overrides={"corpus.tasks_dir": str(root / "tasks")})
    store = open_store(f"file://{root / 'store'}")
    [result] = generate_references(find_tasks(settings, ["mini"]), store, resolve_device("cpu"), 0, "small", 120)
    assert result["success"], result
    return root


@pytest.fixture
def store_dir(made, tmp_path, monkeypatch):
    """A fresh copy of the made store, and the config that knows the mini source."""
    shutil.copytree(made / "store", tmp_path / "s")
    cfg = tmp_path / "farm.yaml"
    cfg.write_text(f"corpus:\n  tasks_dir: {made / 'tasks'}\nstore: file://{tmp_path / 's'}\n")
    monkeypatch.setenv("FARM_CONFIG", str(cfg))
    monkeypatch.delenv("FARM_STORE")
    return tmp_path / "s"


def folder_with(store_dir, tmp_path, pt_bytes: bytes):
    """A cache folder <dir>/mini/scale2.pt (+ manifest.json) as the existing tools make it."""
    folder = tmp_path / "cache"
    (folder / "mini").mkdir(parents=True)
    (folder / "mini" / "scale2.pt").write_bytes(pt_bytes)
    return folder


def test_push_refuses_a_truncated_object_and_keeps_the_good_one(cli, store_dir, tmp_path):
    good = (store_dir / "refs" / "mini" / "scale2.pt").read_bytes()
    before = manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"]
    folder = folder_with(store_dir, tmp_path, good[: len(good) // 2])
    result = cli("cache", "push", "--from", folder, "--json")
    assert result.exit_code == 1 and "Traceback" not in result.output
    [row] = json.loads(result.stdout)
    assert row["status"] == "refused" and "scale2.pt" in row["error"]
    assert (store_dir / "refs" / "mini" / "scale2.pt").read_bytes() == good
    assert manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"] == before
    assert cli("cache", "verify").exit_code == 0


def test_push_of_a_good_object_keeps_its_metadata(cli, store_dir, tmp_path):
    good = (store_dir / "refs" / "mini" / "scale2.pt").read_bytes()
    target = tmp_path / "other"
    result = cli("cache", "push", "--from", folder_with(store_dir, tmp_path, good), "--store", f"file://{target}")
    assert result.exit_code == 0, result.output
    entry = manifest.entries(open_store(f"file://{target}"))["mini/scale2"]
    original = manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"]
    for key in ("sha256", "seed", "shapes", "task_sha256", "device"):
        assert entry[key] == original[key], key


def test_push_from_a_folder_with_a_malformed_manifest(cli, store_dir, tmp_path):
    folder = folder_with(store_dir, tmp_path, (store_dir / "refs" / "mini" / "scale2.pt").read_bytes())
    (folder / "manifest.json").write_text("{not json")
    result = cli("cache", "push", "--from", folder)
    assert result.exit_code == 3 and "Traceback" not in result.output
    flat = " ".join(result.stderr.split())
    assert "manifest.json is corrupt: not valid JSON" in flat and f"farm cache repair --dir {folder}" in flat
    assert cli("cache", "repair", "--dir", folder).exit_code == 0
    assert cli("cache", "push", "--from", folder).exit_code == 0


@pytest.mark.parametrize("command", [
    ["cache", "ls"], ["cache", "verify"], ["reference", "--source", "mini", "--device", "cpu", "--force"],
    ["search", "--source", "mini", "--target", "cpu", "--max-tasks", "1"],
    ["run", "--source", "mini", "--target", "cpu", "--max-tasks", "1", "--force"],
])
def test_a_corrupt_manifest_is_reported_with_its_repair(cli, store_dir, command):
    (store_dir / "refs" / "manifest.json").write_text('{"entries": ')
    result = cli(*command)
    assert result.exit_code == 3 and "Traceback" not in result.output, result.output
    flat = " ".join(result.stderr.split())
    assert "refs/manifest.json is corrupt" in flat and f"farm cache repair --store file://{store_dir}" in flat


def test_cache_repair_rebuilds_the_manifest_from_the_objects(cli, store_dir):
    original = manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"]
    (store_dir / "refs" / "manifest.json").write_text("garbage")
    result = cli("cache", "repair", "--json")
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in json.loads(result.stdout)] == ["ok"]
    entry = manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"]
    for key in ("sha256", "size_bytes", "seed", "shapes", "task_sha256"):
        assert entry[key] == original[key], key
    assert cli("cache", "ls").exit_code == 0 and cli("cache", "verify").exit_code == 0


def test_cache_repair_marks_an_unloadable_object_failed(cli, store_dir):
    pt = store_dir / "refs" / "mini" / "scale2.pt"
    pt.write_bytes(pt.read_bytes()[:100])  # the bytes no longer match their record
    result = cli("cache", "repair", "--json")
    assert result.exit_code == 1
    [row] = json.loads(result.stdout)
    assert row["status"] == "corrupt" and "farm reference --source mini --ops scale2 --force" in row["error"]
    assert not manifest.entries(open_store(f"file://{store_dir}"))["mini/scale2"]["success"]


def test_a_corrupt_stored_pt_is_made_again_not_skipped(cli, store_dir):
    pt = store_dir / "refs" / "mini" / "scale2.pt"
    pt.write_bytes(pt.read_bytes()[:-10] + b"0123456789")
    search = cli("search", "--source", "mini", "--op", "scale2", "--target", "cpu", "--max-tasks", "1")
    assert search.exit_code == 3 and "is corrupt" in search.stderr
    assert "farm reference --source mini --ops scale2 --force" in " ".join(search.stderr.split())
    result = cli("reference", "--source", "mini", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["results"]
    assert not row.get("skipped") and row["success"]
    assert load_pt(pt)["op_name"] == "scale2" and cli("cache", "verify").exit_code == 0


def test_a_manifest_of_the_wrong_shape_names_its_repair_which_works(cli, store_dir):
    (store_dir / "refs" / "manifest.json").write_text('{"entries": ["mini/scale2"]}')  # JSON, but not entries
    result = cli("cache", "ls")
    flat = " ".join(result.stderr.split())
    assert result.exit_code == 3 and f"farm cache repair --store file://{store_dir}" in flat, result.output
    assert cli("cache", "repair").exit_code == 0
    assert cli("cache", "ls").exit_code == 0
