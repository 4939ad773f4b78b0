"""Search many ops one after another with a resume ledger (farm search without --op,
farm run). Each op is an ordinary `search_op` call."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path
from typing import Any, Callable

from farm import corpus, manifest
from farm.backends import DeviceSpec
from farm.errors import FarmError
from farm.generators import Generator
from farm.reference import load_pt
from farm.search import ledger
from farm.search.controller import OpOutcome, SearchConfig, search_op
from farm.storage import Store

log = logging.getLogger(__name__)


def load_reference(store: Store, source: str, op: str) -> dict[str, Any]:
    """The op's .pt from the store, checked (sha256, weights_only), with its sha256 attached."""
    key = manifest.ref_key(source, op)
    if store.head(key) is None:
        raise FarmError(f"no reference data {key} in {store.url}: run `farm reference --source {source} --ops {op}`")
    with tempfile.TemporaryDirectory(prefix="farm-ref-") as tmp:
        info = store.get_file(key, Path(tmp) / "ref.pt")
        data = load_pt(Path(tmp) / "ref.pt")
    data["_sha256"] = info.sha256
    return data


def cached_ops(store: Store, sources: list[str] | None) -> list[tuple[str, str]]:
    entries = manifest.entries(store)
    return sorted((e["source"], e["op_name"]) for e in entries.values()
                  if e.get("success") and (not sources or e["source"] in sources))


def search_batch(
    refs: list[corpus.TaskRef],
    store: Store,
    run: str,
    target: str,
    devices: list[DeviceSpec],
    generators: list[Generator],
    config: SearchConfig,
    retry_errors: bool = False,
    force: bool = False,
    on_op: Callable[[str, dict], None] | None = None,
    on_event: Callable[[str, dict], None] | None = None,
) -> list[dict[str, Any]]:
    """Every op: skipped per the ledger, or searched and recorded. Returns one row per op."""
    on_op = on_op or (lambda phase, row: None)
    done = ledger.read(store, run)
    rows = []
    for ref in refs:
        name = ref.key
        if ledger.should_skip(done.get(name), retry_errors, force):
            row = {"source": ref.source, "op": ref.op, "status": "skipped",
                   "previous": done[name]["status"], **done[name].get("result", {})}
            row["status"] = "skipped"
            rows.append(row)
            on_op("skipped", row)
            continue
        on_op("start", {"source": ref.source, "op": ref.op})
        try:
            data = load_reference(store, ref.source, ref.op)
            outcome = search_op(ref, data, store, run, target, devices, generators, config, force=force,
                                on_event=on_event)
        except FarmError as exc:
            outcome = OpOutcome(ref.source, ref.op, "failed", "error", error=str(exc))
        except KeyboardInterrupt:
            log.warning("interrupted during %s: its checkpoint stays, the ledger does not mark it done", name)
            raise
        row = outcome.as_dict()
        ledger.record(store, run, name, "error" if outcome.status == "failed" else "done", row)
        rows.append(row)
        on_op("done", row)
    return rows


def summarize(rows: list[dict]) -> dict[str, int]:
    count = lambda s: sum(1 for r in rows if r["status"] == s)  # noqa: E731
    return {"total": len(rows), "succeeded": count("succeeded"), "zero_pass": count("zero_pass"),
            "failed": count("failed"), "skipped": count("skipped")}
