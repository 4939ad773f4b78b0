"""One manifest writer for tests/reference/test_reference.py's concurrent writers, in a module of
its own: a spawned child imports only this (the farm's store and manifest, no torch), so the
eight writers start in a fraction of a second each and meet at the manifest, instead of each
importing the test module and torch for seconds first."""

from farm.reference import manifest
from farm.storage import open_store


def record_one(root: str, i: int) -> None:
    store = open_store(f"file://{root}")
    entry = {"source": f"src{i % 2}", "op_name": f"op{i}", "success": True, "key": f"refs/src{i % 2}/op{i}.pt"}
    manifest.record(store, [entry])
