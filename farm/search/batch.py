"""Search many ops with a resume ledger (farm search without --op, farm run). Each op is an
ordinary `search_op` call; one after another, or `ops_per_device` at a time sharing the
devices (docs/search.md "Pipeline"): an op alone leaves its device idle while its runners
start, its references run and its candidates compile, and the device lease
(farm.evaluate.lease) keeps every timing alone on the device whatever else runs.
"""

from __future__ import annotations

import functools
import logging
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from farm.corpus import tasks as taskfiles
from farm.corpus.tasks import natural_sorted
from farm.errors import FarmError, IntegrityError
from farm.reference import cases as ref_cases
from farm.reference import manifest, secret_inputs
from farm.reference.generate import load_pt
from farm.search import catalog, ledger, provenance
from farm.search.context import SearchContext
from farm.search.controller import OpOutcome, search_op
from farm.storage import Store, locks

log = logging.getLogger(__name__)


def load_reference(store: Store, source: str, op: str) -> dict[str, Any]:
    """The op's .pt from the store, checked (sha256, weights_only), with its sha256 attached."""
    key = manifest.ref_key(source, op)
    if store.head(key) is None:
        raise FarmError(f"no reference data {key} in {store.url}: run `farm reference --source {source} --ops {op}`")
    fix = f"regenerate it with `farm reference --source {source} --ops {op} --force`"
    with tempfile.TemporaryDirectory(prefix="farm-ref-") as tmp:
        try:
            info = store.get_file(key, Path(tmp) / "ref.pt")
        except IntegrityError as exc:
            raise IntegrityError(f"{exc}; {fix}") from None
        try:
            data = load_pt(Path(tmp) / "ref.pt")
        except FarmError as exc:
            raise FarmError(f"{store.url}/{key}: {str(exc).split(': ', 1)[-1]}; {fix}") from None
    data["_sha256"] = info.sha256
    return ref_cases.attach(store, secret_inputs.attach(store, data))


def cached_ops(store: Store, sources: list[str] | None) -> list[tuple[str, str]]:
    entries = manifest.entries(store)
    return natural_sorted(((e["source"], e["op_name"]) for e in entries.values()
                           if e.get("success") and (not sources or e["source"] in sources)), key="/".join)


def _one_writer(fn: Callable) -> Callable:
    """The run is locked while a batch writes it: a second `farm run`/`farm search` on the same
    run waits briefly, then fails naming the holder (farm.storage.locks)."""
    @functools.wraps(fn)
    def locked(refs, ctx: SearchContext, *args, **kwargs):
        with locks.held(ctx.store, locks.run_lock_key(ctx.run), f"run {ctx.run}"):
            return fn(refs, ctx, *args, **kwargs)

    return locked


@_one_writer
def search_batch(
    refs: list[taskfiles.TaskRef],
    ctx: SearchContext,
    retry_errors: bool = False,
    force: bool = False,
    on_op: Callable[[str, dict], None] | None = None,
    ops_per_device: int = 1,
    budgets: dict[str, int] | None = None,
    load: Callable[[taskfiles.TaskRef], dict[str, Any]] | None = None,
    current_sha: Callable[[taskfiles.TaskRef], str | None] | None = None,
) -> list[dict[str, Any]]:
    """Every op of `refs` under `ctx` (farm.search.context): skipped per the ledger, or searched
    and recorded. Returns one row per op, in the order of `refs`. `on_op(phase, row)` hears of
    each op's start and end. `budgets` ("source/op" -> candidates) overrides config.max_tasks per op
    (farm.search.budget spends a batch's candidates where the headroom is). `load(ref)` gives an
    op's reference data (default: the store's; a copied folder's for `farm search --ref-dir`);
    `current_sha(ref)` its sha256 (default: the store's manifest's). An op finished on another
    task file or reference data than it has now is searched again, its row saying why
    ("retired"), never skipped as done."""
    budgets = budgets or {}
    store, run = ctx.store, ctx.run
    config_of = {ref.key: replace(ctx.config, max_tasks=budgets[ref.key]) if ref.key in budgets else ctx.config
                 for ref in refs}
    on_op = on_op or (lambda phase, row: None)
    load = load or (lambda ref: load_reference(store, ref.source, ref.op))
    catalog.record(store, run, "local", [r.source for r in refs], ctx.target, planned=len(refs))
    done = ledger.read(store, run, force)
    stale = _stale(refs, done, store, run, current_sha) if not force else {}
    rows: dict[str, dict] = {}
    todo = []
    for ref in refs:
        name = ref.key
        if name in stale:  # finished on another task file or reference data: searched again, from scratch
            todo.append(ref)
        elif ledger.should_skip(done.get(name), retry_errors, force, config_of[name].max_tasks):
            row = {"source": ref.source, "op": ref.op, "status": "skipped",
                   "previous": done[name]["status"], **done[name].get("result", {})}
            row["status"] = "skipped"
            rows[name] = row
            on_op("skipped", row)
        else:
            todo.append(ref)
    lock = threading.Lock()  # the ledger's and the callbacks' order
    cancel = ctx.cancel or threading.Event()  # set by an interrupt: the running ops stop at their next candidate

    def one(ref: taskfiles.TaskRef) -> None:
        with lock:
            on_op("start", {"source": ref.source, "op": ref.op})
        began = {"started_at": manifest.now(), "clock": time.monotonic()}
        try:
            row = _search_one(ref, load, replace(ctx, config=config_of[ref.key], cancel=cancel),
                              force or ref.key in stale)
        except KeyboardInterrupt:  # its checkpoint stays; the ledger says interrupted, and the next run resumes it
            with lock:
                ledger.record(store, run, ref.key, "interrupted", _timed(
                    {"source": ref.source, "op": ref.op, "status": "interrupted", "stop_reason": "interrupted",
                     "error": "interrupted (Ctrl-C or SIGTERM): run the same command again to resume"}, began))
            raise
        _timed(row, began)
        if ref.key in stale:
            row["retired"] = stale[ref.key]
        with lock:  # as soon as the op ends: a batch cut off later leaves this op's result and reason
            ledger.record(store, run, ref.key, "error" if row["status"] == "failed" else "done", row)
            rows[ref.key] = row
            on_op("done", row)

    parallel = max(1, ops_per_device) * len(ctx.devices)
    if parallel == 1 or len(todo) <= 1:
        for ref in todo:
            one(ref)
    else:
        _run_parallel(one, todo, parallel, cancel)
    return [rows[ref.key] for ref in refs]


def _stale(refs: list[taskfiles.TaskRef], done: dict[str, dict], store: Store, run: str,
           current_sha: Callable[[taskfiles.TaskRef], str | None] | None) -> dict[str, str]:
    """name -> why, for each op this run finished on another task file or reference data than
    it has now (farm.search.provenance): not skipped as done; the run says its result is retired."""
    listed = provenance.reference_shas(store) if current_sha is None else None
    out = {}
    for ref in refs:
        result = (done.get(ref.key) or {}).get("result") or {}
        if not result:
            continue
        sha = current_sha(ref) if current_sha else listed(ref.source, ref.op) if listed else None
        now = provenance.current(ref, sha)
        was = provenance.recorded(result)
        if provenance.changes(was, now):
            out[ref.key] = provenance.describe(was, now)
    return out


def _timed(row: dict[str, Any], began: dict[str, Any]) -> dict[str, Any]:
    row.update(started_at=began["started_at"], finished_at=manifest.now(),
               elapsed_s=round(time.monotonic() - began["clock"], 3))
    return row


def _run_parallel(one: Callable[[taskfiles.TaskRef], None], todo: list[taskfiles.TaskRef], parallel: int,
                  cancel: threading.Event) -> None:
    """The ops `parallel` at a time. Ctrl-C or SIGTERM reach the main thread only: on either (or
    an op's unexpected error) the ops not started are dropped and the running ones are told to
    stop at their next candidate, so the process ends in seconds, not after every op's budget."""
    pool = ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="farm-op")
    try:
        for future in [pool.submit(one, ref) for ref in todo]:
            future.result()
    except BaseException:
        cancel.set()
        pool.shutdown(wait=True, cancel_futures=True)
        raise
    pool.shutdown()


def _search_one(ref: taskfiles.TaskRef, load: Callable[[taskfiles.TaskRef], dict[str, Any]], ctx: SearchContext,
                force: bool) -> dict[str, Any]:
    try:
        data = load(ref)
        outcome = search_op(ref, data, ctx, force=force)
    except FarmError as exc:
        outcome = OpOutcome(ref.source, ref.op, "failed", "error", error=str(exc),
                            transient=getattr(exc, "transient", False))
    except KeyboardInterrupt:
        log.warning("interrupted during %s: its checkpoint stays, the ledger marks it interrupted", ref.key)
        raise
    return outcome.as_dict()


def summarize(rows: list[dict], profile: str = "farm") -> dict[str, Any]:
    """Counts by status; under the kernelbench profile also its fast_p (p = 0, 1, 2): the
    fraction of the ops that passed and beat the Model by more than p (farm.evaluate.profiles)."""
    from farm.evaluate import profiles

    count = lambda s: sum(1 for r in rows if r["status"] == s)  # noqa: E731
    out: dict[str, Any] = {"total": len(rows), "succeeded": count("succeeded"), "zero_pass": count("zero_pass"),
                           "failed": count("failed"), "skipped": count("skipped"),
                           # passes that rest on the .pt alone (farm.evaluate.verified)
                           "no_unseen_inputs": sum(1 for r in rows if r.get("unseen_inputs") is False
                                                   and r["status"] in ("succeeded", "skipped")),
                           # finished before on another task file or reference data: searched again
                           "retired": sum(1 for r in rows if r.get("retired"))}
    for p in profiles.get(profile).fast_p:
        out[f"fast_{p:g}"] = round(profiles.fast_p(rows, p), 4)
    return out
