"""Promotion is a compare-and-swap (farm.search.results.promote): searches promoting the same op
at once, on a file store and on a real S3 server, always leave the fastest kernel, with best.py
and best.json naming the same one."""

import random
import threading

import pytest

from farm.search import results
from farm.search.database import Record
from farm.storage import open_store
from tests.s3_server import atomic_s3, s3_server  # noqa: F401

WRITERS, ROUNDS = 6, 4


def _promote(store, i: int, time_ms: float, barrier: threading.Barrier, won: list) -> None:
    rec = Record(id=f"c{i}", source=f"class ModelNew:  # writer {i}\n    pass\n", generator="tune", note="",
                 lineage=0, generation=0, parent=None, source_hash=f"h{i}", verdict="pass", time_ms=time_ms,
                 timing={"mode": "graph"})
    summary = {"source": "mini", "op": "scale2", "target": "cuda", "run": f"r{i}", "device_name": "H100",
               "verified": {"by": "reference", "sets": 4}}
    barrier.wait()
    won[i] = results.promote(store, "cuda", summary, rec)


def _race(make_store, seed: int) -> None:
    rng = random.Random(seed)
    times = [round(rng.uniform(1.0, 2.0), 4) for _ in range(WRITERS)]
    barrier, won = threading.Barrier(WRITERS), [None] * WRITERS
    threads = [threading.Thread(target=_promote, args=(make_store(), i, t, barrier, won)) for i, t in enumerate(times)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    store = make_store()
    prefix = results.kernel_prefix("cuda", "mini", "scale2")
    best = store.read_json(f"{prefix}/best.json")
    fastest = times.index(min(times))
    assert best["time_ms"] == min(times) and best["candidate"] == f"c{fastest}", (times, best["candidate"])
    assert f"# writer {fastest}\n" in store.get_bytes(f"{prefix}/best.py").decode()  # best.py agrees
    assert won[fastest] is True
    assert best["version"] == sum(1 for w in won if w)  # one version per promotion that landed


@pytest.mark.parametrize("seed", range(ROUNDS))
def test_concurrent_promotions_on_a_file_store_keep_the_fastest(tmp_path, seed):
    _race(lambda: open_store(f"file://{tmp_path / 'store'}"), seed)


def test_concurrent_promotions_on_s3_keep_the_fastest(atomic_s3):  # noqa: F811
    for seed in range(ROUNDS):
        _race(lambda prefix=f"race{seed}": atomic_s3.store(prefix), seed)


def test_a_record_from_an_older_farm_keeps_its_best_py(tmp_path):
    """best.json written before the record held the kernel: best.py stays the source."""
    store = open_store(f"file://{tmp_path / 'store'}")
    prefix = results.kernel_prefix("cuda", "mini", "scale2")
    store.put_bytes(f"{prefix}/best.py", b"old kernel\n")
    store.put_bytes(f"{prefix}/best.json", b'{"time_ms": 1.0, "device_name": "H100", "timing_mode": "graph"}')
    assert results.kernel_source(store, prefix) == b"old kernel\n"
    assert "kernel_source" not in results.best_record(store, f"{prefix}/best.json")


def _meta(time_ms: float, device: str, mode: str = "graph") -> dict:
    return {"source": "mini", "op": "scale2", "time_ms": time_ms, "device_name": device, "timing_mode": mode,
            "verified": {"by": "reference", "sets": 4}, "unseen_inputs": True}


def test_a_best_that_names_no_device_never_wins_by_default(caplog):
    """Issue 37 finding 1: a result whose device name was lost (a chunk whose runner never
    started) took the place of a faster best of a named device without its time compared. An
    unnamed device of the same target is compared as the same device; where the times cannot be
    compared it is refused, and the log says why."""
    stored = {**_meta(42.39, "NVIDIA H100"), "version": 3}
    assert not results.replaces(stored, _meta(51.35, ""))  # slower: refused
    assert results.replaces(stored, _meta(30.0, ""))  # faster: compared, and wins
    assert not results.replaces(_meta(42.39, ""), _meta(51.35, "NVIDIA H100"))  # either way round
    assert not results.replaces(_meta(42.39, ""), _meta(51.35, ""))
    with caplog.at_level("WARNING", logger="farm.search.results"):
        assert not results.replaces(stored, _meta(10.0, "", mode="events"))  # another mode: no comparison
    assert "names no device" in caplog.text and "never wins by default" in caplog.text
    # the rules that stay: the same named device compares times, another named device replaces
    assert not results.replaces(stored, _meta(51.35, "NVIDIA H100"))
    assert results.replaces(stored, _meta(51.35, "NVIDIA A100"))


def test_promotion_keeps_a_faster_named_best_over_an_unnamed_slower_one(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    summary = {"source": "mini", "op": "scale2", "target": "cuda", "verified": {"by": "reference", "sets": 4}}
    for i, (time_ms, device) in enumerate(((42.39, "NVIDIA H100"), (51.35, ""))):
        rec = Record(id=f"c{i}", source=f"class ModelNew:  # writer {i}\n    pass\n", generator="tune", note="",
                     lineage=0, generation=0, parent=None, source_hash=f"h{i}", verdict="pass", time_ms=time_ms,
                     timing={"mode": "graph"})
        results.promote(store, "cuda", {**summary, "run": f"r{i}", "device_name": device}, rec)
    prefix = results.kernel_prefix("cuda", "mini", "scale2")
    best = store.read_json(f"{prefix}/best.json")
    assert (best["time_ms"], best["device_name"], best["version"]) == (42.39, "NVIDIA H100", 1)
    assert "# writer 0\n" in store.get_bytes(f"{prefix}/best.py").decode()
