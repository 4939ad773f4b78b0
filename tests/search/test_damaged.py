"""Every damaged run record has a way out, named in its error: a ledger, a checkpoint, the run
index. Each is damaged (truncated JSON, garbage bytes, the wrong type), the error must name
`--force` and `farm cache repair`, and each way out must work."""

import json
import shutil

import pytest

from farm.config import load_settings
from farm.corpus.tasks import find_tasks
from farm.errors import IntegrityError
from farm.generators import load_generator
from farm.reference.generate import generate_references
from farm.search import catalog, ledger
from farm.search.batch import search_batch
from farm.search.context import SearchConfig, SearchContext
from farm.search.repair import repair_runs
from farm.storage import open_store
from tests.conftest import GOOD_TASK, write_task
from tests.search.test_resume import CPU

DAMAGE = {"truncated": b'{"run": "r", "ops": {"mini/scale2": {"status": "do',
          "garbage": b"\x00\xffnot json at all",
          "wrong type": b'{"ops": ["mini/scale2"]}'}


@pytest.fixture(scope="module")
def finished(tmp_path_factory):
    """Run r over mini/scale2 with a budget of 1, finished once for the module (each test copies it)."""
    root = tmp_path_factory.mktemp("damaged")
    write_task(root / "tasks" / "mini", "scale2", GOOD_TASK)
    (root / "farm.yaml").write_text(f"corpus:\n  tasks_dir: {root / 'tasks'}\n")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FARM_CONFIG", str(root / "farm.yaml"))
        refs = find_tasks(load_settings()[0], ["mini"])
        store = open_store(f"file://{root / 'store'}").inner
        assert all(r["success"] for r in generate_references(refs, store, CPU, 0, "small", 120))
        assert _batch(store, refs)["stop_reason"] == "budget"
    return root / "store", refs


@pytest.fixture
def mini(finished, tmp_path):
    """A copy of the finished run, for one test to damage."""
    shutil.copytree(finished[0], tmp_path / "store")
    return open_store(f"file://{tmp_path / 'store'}"), finished[1]


def _batch(store, refs, max_tasks=1, force=False):
    config = SearchConfig(max_tasks=max_tasks, max_concurrent=1)
    [row] = search_batch(refs, SearchContext(store, "r", "cpu", [CPU], [load_generator("tune")], config), force=force)
    return row


def _damage(store, key, how):
    if how == "garbage":  # written past the store (its recorded sha256 no longer matches)
        store.path_of(key).write_bytes(DAMAGE[how])
    else:
        store.put_bytes(key, DAMAGE[how])


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_ledger_names_force_and_repair_and_both_work(mini, how):
    store, refs = mini
    store = store.inner
    _damage(store, ledger.key("r"), how)
    with pytest.raises(IntegrityError, match=r"ledger.json is corrupt.*--force.*farm cache repair --store"):
        _batch(store, refs)
    [row] = repair_runs(store)
    assert row["status"] == "repaired" and "ledger.json" in row["name"]
    assert ledger.read(store, "r")["mini/scale2"]["status"] == "done"  # rebuilt from the finished checkpoint
    assert _batch(store, refs)["status"] == "skipped"
    if how == "truncated":  # the other way out, --force (a whole search: once)
        _damage(store, ledger.key("r"), how)
        assert _batch(store, refs, force=True)["status"] != "failed"
        assert ledger.read(store, "r")["mini/scale2"]["status"] == "done"


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_checkpoint_names_force_and_repair_and_both_work(mini, how):
    store, refs = mini
    store = store.inner
    state = "runs/r/mini/scale2/state.json"
    _damage(store, state, how)
    failed = _batch(store, refs, max_tasks=2)  # a raised budget goes on from the checkpoint: it is damaged
    assert failed["status"] == "failed"
    assert "--force searches mini/scale2 again" in failed["error"] and "farm cache repair" in failed["error"]
    rows = repair_runs(store)
    assert [r["name"] for r in rows] == ["runs/r/mini/scale2/state.json"] and not store.exists(state)
    if how != "garbage":
        assert _batch(store, refs, max_tasks=2)["status"] != "failed"  # not held back by the recorded error
    else:  # the other way out, --force
        _damage(store, state, how)
        assert _batch(store, refs, max_tasks=2, force=True)["status"] != "failed"


def test_a_damaged_run_index_is_rebuilt(mini):  # a record the issue does not name
    store, refs = mini
    store = store.inner
    store.put_bytes(catalog.INDEX_KEY, b'{"runs": {"r": 3}}')
    with pytest.raises(IntegrityError, match="index.json is corrupt.*farm cache repair"):
        catalog.latest(store)
    [row] = repair_runs(store)
    assert row["name"] == catalog.INDEX_KEY and catalog.latest(store) == "r"
    assert json.loads(store.get_bytes(catalog.INDEX_KEY))["runs"]["r"]["kind"] == "local"


def test_cache_repair_fixes_a_truncated_ledger_from_the_cli(cli, mini, tmp_path):
    url = f"file://{tmp_path / 'store'}"
    (tmp_path / "store" / "runs" / "r" / "ledger.json").write_bytes(DAMAGE["truncated"])
    before = cli("status", "r", "--store", url)
    assert before.exit_code != 0 and "farm cache repair" in " ".join(before.stderr.split())
    fixed = cli("cache", "repair", "--store", url, "--json")
    assert fixed.exit_code == 0, fixed.output
    assert any(r["status"] == "repaired" for r in json.loads(fixed.stdout))
    assert cli("status", "r", "--store", url).exit_code == 0
