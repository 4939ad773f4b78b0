"""Every damaged run record has a way out, named in its error: a ledger, a checkpoint, the run
index. Each is damaged (truncated JSON, garbage bytes, the wrong type), the error must name
`--force` and `farm cache repair`, and each way out must work."""

import json

import pytest

from farm.errors import IntegrityError
from farm.generators import load_generator
from farm.search import catalog, ledger
from farm.search.batch import search_batch
from farm.search.controller import SearchConfig
from farm.search.repair import repair_runs
from tests.search.test_resume import CPU, mini  # noqa: F401 - the fixture

DAMAGE = {"truncated": b'{"run": "r", "ops": {"mini/scale2": {"status": "do',
          "garbage": b"\x00\xffnot json at all",
          "wrong type": b'{"ops": ["mini/scale2"]}'}


def _batch(store, refs, max_tasks=1, force=False):
    [row] = search_batch(refs, store, "r", "cpu", [CPU], [load_generator("tune")],
                         SearchConfig(max_tasks=max_tasks, max_concurrent=1), force=force)
    return row


def _damage(store, key, how):
    if how == "garbage":  # written past the store (its recorded sha256 no longer matches)
        store.path_of(key).write_bytes(DAMAGE[how])
    else:
        store.put_bytes(key, DAMAGE[how])


@pytest.mark.parametrize("how", list(DAMAGE))
def test_a_damaged_ledger_names_force_and_repair_and_both_work(mini, how):  # noqa: F811
    store, refs = mini
    store = getattr(store, "inner", store)
    assert _batch(store, refs)["status"] != "failed"
    _damage(store, ledger.key("r"), how)
    with pytest.raises(IntegrityError, match=r"ledger.json is corrupt.*--force.*farm cache repair --store"):
        _batch(store, refs)
    [row] = repair_runs(store)
    assert row["status"] == "repaired" and "ledger.json" in row["name"]
    assert ledger.read(store, "r")["mini/scale2"]["status"] == "done"  # rebuilt from the finished checkpoint
    assert _batch(store, refs)["status"] == "skipped"
    _damage(store, ledger.key("r"), how)
    assert _batch(store, refs, force=True)["status"] != "failed"  # the other way out: --force
    assert ledger.read(store, "r")["mini/scale2"]["status"] == "done"


@pytest.mark.parametrize("how", ["truncated", "wrong type"])
def test_a_damaged_checkpoint_names_force_and_repair_and_both_work(mini, how):  # noqa: F811
    store, refs = mini
    store = getattr(store, "inner", store)
    state = "runs/r/mini/scale2/state.json"
    assert _batch(store, refs)["stop_reason"] == "budget"
    _damage(store, state, how)
    failed = _batch(store, refs, max_tasks=2)  # a raised budget goes on from the checkpoint: it is damaged
    assert failed["status"] == "failed"
    assert "--force searches mini/scale2 again" in failed["error"] and "farm cache repair" in failed["error"]
    rows = repair_runs(store)
    assert [r["name"] for r in rows] == ["runs/r/mini/scale2/state.json"] and not store.exists(state)
    assert _batch(store, refs, max_tasks=2)["status"] != "failed"  # not held back by the recorded error
    _damage(store, state, how)
    assert _batch(store, refs, max_tasks=3, force=True)["status"] != "failed"


def test_a_damaged_run_index_is_rebuilt(mini):  # noqa: F811 - a record the issue does not name
    store, refs = mini
    store = getattr(store, "inner", store)
    _batch(store, refs)
    store.put_bytes(catalog.INDEX_KEY, b'{"runs": {"r": 3}}')
    with pytest.raises(IntegrityError, match="index.json is corrupt.*farm cache repair"):
        catalog.latest(store)
    [row] = repair_runs(store)
    assert row["name"] == catalog.INDEX_KEY and catalog.latest(store) == "r"
    assert json.loads(store.get_bytes(catalog.INDEX_KEY))["runs"]["r"]["kind"] == "local"


def test_cache_repair_fixes_a_truncated_ledger_from_the_cli(cli, mini, tmp_path):  # noqa: F811
    store, refs = mini
    _batch(store, refs)
    url = f"file://{tmp_path / 'store'}"
    (tmp_path / "store" / "runs" / "r" / "ledger.json").write_bytes(DAMAGE["truncated"])
    before = cli("status", "r", "--store", url)
    assert before.exit_code != 0 and "farm cache repair" in " ".join(before.stderr.split())
    fixed = cli("cache", "repair", "--store", url, "--json")
    assert fixed.exit_code == 0, fixed.output
    assert any(r["status"] == "repaired" for r in json.loads(fixed.stdout))
    assert cli("status", "r", "--store", url).exit_code == 0
