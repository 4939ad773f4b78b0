"""The search loop for one op: seeds, then parents chosen by farm.search.selection, children
proposed by the generators, judged by an Evaluator per device, in bounded chunks with a
checkpoint after each, until the budget is spent or the search has converged.

`search_op` is the library function that `farm search`, `farm run` and the Celery search task
all call. A search killed at any point resumes from its last checkpoint: at most one chunk of
work is lost, and nothing is evaluated twice (identical candidates, up to formatting, are
never evaluated twice at all).
"""

from __future__ import annotations

import logging
import random
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from queue import Queue
from typing import TYPE_CHECKING

from farm.corpus import tasks as taskfiles
from farm.errors import FarmError
from farm.evaluate import limits, timing
from farm.evaluate import speedup as speedups
from farm.evaluate.result import EvalResult
from farm.evaluate.runner import close_all
from farm.generators import Context, Proposal
from farm.observe import metrics
from farm.reference.fitted import fitted
from farm.reference.manifest import now
from farm.search import catalog, pipeline, provenance, repair, results, selection
from farm.search.context import SearchConfig as SearchConfig  # where callers have always imported it from
from farm.search.context import SearchContext, SearchEvaluator
from farm.search.database import Database, Record, normalized_hash
from farm.search.results import OpOutcome, kernel_prefix
from farm.search.seeding import Seeding
from farm.storage import locks
from farm.storage.base import dump_json

if TYPE_CHECKING:
    from farm.evaluate.ahead import CompileAhead

log = logging.getLogger(__name__)

STATE_VERSION = 1
PROPOSAL_ATTEMPTS = 12  # tries to find a non-duplicate child before giving up on a slot
# per candidate, in the checkpoint: the figure, its timing mode and why, and the per-call figure
TIMING_KEPT = ("median_ms", "min_ms", "rse", "reps", "stop_reason", "method", "mode", "mode_reason", "op_mode", "flush",
               "graph_calls", "per_call_ms", "cases")  # cases: the serving mix's rows (farm.evaluate.mix_timing)


class OpSearch(Seeding):
    """One op's search under `ctx` (farm.search.context): where it writes, on which devices,
    with which generators, budget and evaluator options, and who hears of its progress."""

    def __init__(self, task_ref: taskfiles.TaskRef, ref_data: dict, ctx: SearchContext):
        devices = ctx.devices
        self.provenance = provenance.of_search(task_ref, ref_data)  # what its results are bound to
        self.retired = ""  # what changed since this run's checkpoint of the op, which was then not taken up
        # a compact .pt's op: generators and evaluators alike work at the fitted shapes (farm.reference.fitted)
        task_ref, ref_data = fitted(task_ref, ref_data, devices[0])
        self.ref = task_ref
        self.data = ref_data
        self.ctx = ctx
        self.store, self.run_name, self.target, self.devices = ctx.store, ctx.run, ctx.target, list(devices)
        self.generators = {g.name: g for g in ctx.generators}  # the tiers that seeded (farm.search.seeding)
        self.config = ctx.config
        self.evaluation = ctx.evaluation
        self.prefix = results.op_prefix(ctx.run, task_ref.source, task_ref.op)
        self.lock = threading.Lock()
        self.rng = random.Random(ctx.config.seed)
        self.db = Database()
        self.pending_seeds: list[dict] = []
        self.seed_reasons: dict[str, str] = {}  # generator -> why it gave no seed (when none did)
        self.seed_tier: int | None = None  # the generator tier whose seeds started the search
        self.best_by_window: list[float] = []
        self.chunks_done = 0
        self.written: set[str] = set()
        self.device_info: dict = {}
        self.errors: list[str] = []
        self.started = time.monotonic()
        self.started_at = now()  # wall clock, for reports; the first process's time survives a resume
        # the compile-ahead pool (farm.evaluate.ahead) while a step runs, where configured
        self.ahead: CompileAhead | None = None
        self.fixed_paid = False  # this process paid the op's fixed costs (else it adopted stored ones)
        self.verified_by: dict = {}  # the evaluator's verification(), kept in the checkpoint
        self.final: dict | None = None  # the outcome of the finished search
        self.device_queue = metrics.COMPILE_QUEUE.labels(ctx.target, metrics.device_label() or devices[0].label,
                                                         "device")
        self.device_clock = pipeline.DeviceClock(ctx.target, devices)

    # ------------------------------------------------------------ state

    def _state(self, status: str, stop_reason: str = "") -> dict:
        return {"version": STATE_VERSION, "run": self.run_name, "source": self.ref.source, "op": self.ref.op,
                "target": self.target, "config": self.ctx.record(), "status": status, "stop_reason": stop_reason,
                "db": self.db.to_dict(), "rng": selection.rng_state(self.rng), "pending_seeds": self.pending_seeds,
                "seed_reasons": self.seed_reasons, "seed_tier": self.seed_tier,
                "best_by_window": self.best_by_window, "chunks_done": self.chunks_done,
                **self.provenance, "provenance": self.provenance, "started_at": self.started_at,
                "verified": self.verified_by, "outcome": self.final if status == "done" else None}

    def checkpoint(self, status: str = "running", stop_reason: str = "") -> None:
        new = [r for r in self.db.records.values() if r.id not in self.written and r.verdict != "pending"]
        results.write_candidates(self.store, self.prefix, new)
        self.written.update(r.id for r in new)
        self.store.put_bytes(f"{self.prefix}/state.json", dump_json(self._state(status, stop_reason)))

    def restore(self) -> dict | None:
        key = f"{self.prefix}/state.json"
        if not self.store.exists(key):
            return None
        with repair.damaged_checkpoint(self.store, key, self.run_name, self.ref.key):
            state = self.store.read_json(key)
            self.retired = provenance.changed(state, self.provenance, f"run {self.run_name}, {self.ref.key}")
            if self.retired:  # judged against another truth: its candidates and verdict are retired, it starts over
                return None
            return self._restore(state)

    def _restore(self, state: dict) -> dict:
        self.db = Database.from_dict(state["db"])
        # candidates in flight when the previous process died were never finished: drop them
        for rid in [r.id for r in self.db.records.values() if r.verdict == "pending"]:
            rec = self.db.records.pop(rid)
            self.db.hashes.pop(rec.source_hash, None)
            self.db.lineage_submitted[rec.lineage] -= 1
        selection.set_rng_state(self.rng, state["rng"])
        self.pending_seeds = state["pending_seeds"]
        self.seed_reasons = state.get("seed_reasons", {})
        self.seed_tier = state.get("seed_tier")
        self._drop_unused_fallbacks()
        self.best_by_window = state["best_by_window"]
        self.chunks_done = state["chunks_done"]
        self.started_at = state.get("started_at") or self.started_at
        self.written = set(self.db.records)
        self.verified_by = state.get("verified") or {}
        return state

    # ------------------------------------------------------------ proposals

    def _context(self, rng: random.Random) -> Context:
        return Context(task_code=self.ref.path.read_text(), op=self.ref.op, source=self.ref.source,
                       target=self.target, device={**self.device_info, "shapes": self.data.get("shapes", "bench"),
                                                   "mode": self.data.get("mode"),
                                                   "reference_class": self.data.get("reference_class"),
                                                   # the space's recorded cases (inductor compiles per shape)
                                                   "cases": [] if self.data.get("fitted") else
                                                   [d["case"] for d in self.data.get("_case_sets") or []]},
                       rng=rng, recent_errors=self.errors[-3:], shape_policy=self.ref.policy)

    def _reserve(self, proposal: Proposal, parent: Record | None, lineage: int, chunk: int) -> Record | None:
        """Add a proposal to the database unless an identical candidate exists (under the lock)."""
        if self.db.is_duplicate(proposal.source):
            return None
        rec = Record(id=self.db.new_id(), source=proposal.source, generator=proposal.generator, note=proposal.note,
                     lineage=lineage, generation=parent.generation + 1 if parent else 0,
                     parent=parent.id if parent else None, source_hash=normalized_hash(proposal.source), chunk=chunk)
        return self.db.add(rec)

    def _next_seed(self, chunk: int) -> Record | None:
        while self.pending_seeds:
            seed = self.pending_seeds.pop(0)
            lineage = len(self.db.lineages())
            rec = self._reserve(Proposal(seed["source"], seed["generator"], seed["note"]), None, lineage, chunk)
            if rec:
                return rec
        return None

    def _next_child(self, chunk: int) -> Record | None:
        for _ in range(PROPOSAL_ATTEMPTS):
            with self.lock:
                progress = self.db.submitted / max(self.config.max_tasks, 1)
                lineage = selection.choose_lineage(self.db, progress, self.rng)
                if lineage is None:
                    return None
                parent = selection.ucb_parent(self.db, lineage, progress, self.rng)
                insp = selection.inspirations(self.db, parent, progress, self.rng)
                gen = self.generators[self.rng.choice(sorted(self.generators))]
                job_rng = random.Random(self.rng.getrandbits(64))
            try:
                proposals = gen.propose(parent.as_candidate(), [r.as_candidate() for r in insp],
                                        self._context(job_rng), n=1)
            except FarmError as exc:  # an unreachable LLM endpoint costs this proposal, not the search
                log.warning("generator %s failed for %s: %s", gen.name, self.ref.key, exc)
                with self.lock:
                    self.errors.append(f"generator {gen.name}: {exc}")
                continue
            with self.lock:
                for p in proposals:
                    rec = self._reserve(p, parent, parent.lineage, chunk)
                    if rec:
                        rec.inspirations = [r.id for r in insp]
                        self.db.selections[parent.id] = self.db.selections.get(parent.id, 0) + 1
                        return rec
        return None

    def _next(self, chunk: int) -> Record | None:
        with self.lock:
            if self.db.submitted >= self.config.max_tasks:
                return None
            seed = self._next_seed(chunk)
        return seed or self._next_child(chunk)

    # ------------------------------------------------------------ evaluation

    def _evaluate(self, rec: Record, pool: Queue) -> None:
        started = time.monotonic()
        # compile-ahead: checked and compiled off the device; a candidate failing there never takes a device turn
        result = self.ahead.prepare(rec.source, rec.id) if self.ahead else None
        device = self.devices[0].label
        if not isinstance(result, EvalResult):  # ready for the device (in the runner compile-ahead started, if any)
            self.device_queue.inc()
            evaluator, extra = pipeline.take_evaluator(pool, result)
            self.device_queue.dec()
            try:
                result = evaluator.evaluate(rec.source, name=rec.id, best_so_far=self._best_so_far(), **extra)
                device = evaluator.spec.label
            finally:
                pool.put(evaluator)
        with self.lock:
            self._record(rec, result, device, time.monotonic() - started)
        self.ctx.event("candidate", {"id": rec.id, "verdict": rec.verdict, "time_ms": rec.time_ms,
                                     "generator": rec.generator, "submitted": self.db.submitted,
                                     "speedup_vs_model": rec.speedup_vs_model, "stage_s": dict(result.stage_s),
                                     "device": rec.device, "sandbox": rec.sandbox})

    def _best_so_far(self) -> float | None:
        """A candidate that its first rounds put well under this stops comparing there."""
        with self.lock:
            return self.db.best_ratio()

    def _record(self, rec: Record, result, device: str, eval_s: float) -> None:
        """A verdict into the database (under the lock)."""
        rec.verdict, rec.reason, rec.eval_s = result.verdict, result.reason[:2000], eval_s
        rec.device, rec.sandbox, rec.stage_s = device, result.sandbox, dict(result.stage_s)
        if result.passed:
            rec.time_ms = result.timing["median_ms"]
            rec.timing = {k: result.timing[k] for k in TIMING_KEPT if k in result.timing}
            rec.speedup_vs_model, rec.speedup_vs_reference = result.speedup_vs_model, result.speedup_vs_reference
            rec.comparison, rec.limit = result.comparison, result.limit
            if result.backward:
                rec.backward = {**result.backward,
                                "fwd_bwd_ms": (result.timing_backward or {}).get("median_ms"),
                                "speedup_fwd_bwd_vs_model": result.speedup_fwd_bwd_vs_model,
                                "speedup_fwd_bwd_vs_reference": result.speedup_fwd_bwd_vs_reference}
        else:
            self.errors.append(f"{rec.id} ({rec.generator}) {result.verdict}: {result.reason[:500]}")
            if rec.parent and self.db.selections.get(rec.parent, 0) > 0:
                self.db.selections[rec.parent] -= 1  # a failed child does not use up its parent
        self._window_update()

    def _window_update(self) -> None:
        done = sum(1 for r in self.db.records.values() if r.verdict != "pending")
        if done % self.config.window == 0:
            best = self.db.best()
            self.best_by_window.append(best.time_ms if best and best.time_ms is not None else float("inf"))

    def _stop_reason(self) -> str:
        if self.db.submitted >= self.config.max_tasks:
            return "budget"
        # the initial candidates are judged whatever the clock says: they are where the op starts
        # (torch.compile's own kernel among them), and a cold compile making them could spend a short
        # budget alone (40 s on an H100 left ops that compile makes 10x faster with zero_pass)
        if (self.config.time_budget_s and time.monotonic() - self.started > self.config.time_budget_s
                and not self.pending_seeds):
            return "time_budget"
        passes = len(self.db.passing())
        if self.config.early_stop and selection.converged(self.best_by_window, passes):
            return "converged"
        best = self.db.best()
        if self.config.early_stop and best is not None and limits.at_limit(best.time_ms, best.limit):
            return "at_limit"  # within limits.STOP_WITHIN of what the device allows: nothing left to find
        return ""

    def _raise_if_cancelled(self) -> None:
        """Stop as an interrupted `farm search` does: checkpoint kept, not marked done."""
        # set by an interrupted batch: Ctrl-C never reaches this worker thread
        if self.ctx.cancel is not None and self.ctx.cancel.is_set():
            raise KeyboardInterrupt

    def _run_chunk(self, executor: ThreadPoolExecutor, pool: Queue) -> int:
        chunk = self.chunks_done
        quota = min(self.config.chunk_size, self.config.max_tasks - self.db.submitted)
        slots = len(self.devices) * self.config.max_concurrent

        def job() -> bool:
            self._raise_if_cancelled()
            rec = self._next(chunk)
            if rec is None:
                return False
            self._evaluate(rec, pool)
            return True

        if self.ahead is not None:  # the pipeline: a new candidate starts as soon as one ends
            done = pipeline.run_window(executor, job, quota, slots)
            self.chunks_done += 1
            return done
        done = 0
        while done < quota:
            batch = [executor.submit(job) for _ in range(min(slots, quota - done))]
            ran = sum(f.result() for f in batch)
            done += ran
            if ran == 0:
                break
        self.chunks_done += 1
        return done

    # ------------------------------------------------------------ the loop

    def run(self, force: bool = False) -> OpOutcome:
        """The whole search in this process (farm search, farm run)."""
        outcome = self.step(max_chunks=None, force=force)
        assert outcome is not None  # no limit on chunks: it ran to its end
        return outcome

    def step(self, max_chunks: int | None = 1, force: bool = False) -> OpOutcome | None:
        """Resume from the checkpoint, run up to `max_chunks` chunks, checkpoint. Returns the
        outcome when the search has finished, None when it should continue later (the
        distributed search task enqueues its continuation then)."""
        state = None if force else self.restore()
        force = force or bool(self.retired)  # the fixed costs (seed cases, baselines) of the old data too
        if state and state["status"] == "done" and not self._budget_raised(state):
            return OpOutcome.from_dict(state["outcome"]) if state.get("outcome") else self._outcome(state["stop_reason"])
        pool: Queue = Queue()
        evaluators = [self.ctx.evaluator_factory(self.ref, self.data, spec, self.evaluation.settings_for(spec),
                                                 self.ctx.settings) for spec in self.devices]
        try:
            for ev in evaluators:
                pool.put(ev)
            baseline = pipeline.fixed_costs(self, evaluators, reuse=not force)
            self.ahead = pipeline.compile_ahead(self, evaluators[0])
            self.verified_by = evaluators[0].verification()
            self.device_info = evaluators[0].device_info()
            if state is None:
                self._make_seeds()
                self.checkpoint()
            stop = self._loop(pool, max_chunks)
            confirmation = self._retime(evaluators[0]) if stop else None
        finally:  # each closed even when a signal lands while another one closes
            close_all(([self.ahead] if self.ahead is not None else []) + evaluators)
        return self._finish(stop, baseline, confirmation) if stop else None

    def _retime(self, evaluator: SearchEvaluator) -> dict | None:
        """The best, re-timed against the Model in a fresh candidate runner before promotion."""
        best = self.db.best()
        if best is None:
            return None
        confirmation = evaluator.retime(best.source, name=f"{best.id}-retime")
        confirmation["candidate"] = best.id
        confirmation["claimed"] = (best.comparison or {}).get("model")  # the search's figure, beside it
        confirmation["claimed_mix"] = (best.comparison or {}).get("mix")
        confirmation["model_runs"] = evaluator.model_runs()
        self.ctx.event("retime", confirmation)
        return confirmation

    def _budget_raised(self, state: dict) -> bool:
        """A search that stopped on its budget goes on when asked again with a larger one."""
        return state.get("stop_reason") == "budget" and self.db.submitted < self.config.max_tasks

    def _loop(self, pool: Queue, max_chunks: int | None) -> str:
        slots = len(self.devices) * self.config.max_concurrent
        ran_chunks = 0
        with ThreadPoolExecutor(max_workers=slots, thread_name_prefix="farm-search") as executor:
            while True:
                self._raise_if_cancelled()
                stop = self._stop_reason()
                if stop:
                    return stop
                if max_chunks is not None and ran_chunks >= max_chunks:
                    return ""
                self.device_clock.begin()
                chunk_started = time.monotonic()
                ran = self._run_chunk(executor, pool)
                ran_chunks += 1
                self.checkpoint()
                shares = self.device_clock.end(time.monotonic() - chunk_started)
                self.ctx.event("chunk", {"chunk": self.chunks_done, "submitted": self.db.submitted,
                                         "device_share": shares})
                if ran == 0:
                    if not self.db.records and self.seed_reasons:
                        return "no_seed"
                    return "no_passing_parent" if not self.db.passing() else "exhausted"

    def _summary(self, stop: str, baseline: dict) -> dict:
        device_name = self.device_info.get("name", "")
        return {"run": self.run_name, "source": self.ref.source, "op": self.ref.op, "target": self.target,
                "device_name": device_name, "stop_reason": stop, "submitted": self.db.submitted,
                "passed": len(self.db.passing()), "baseline": {k: v for k, v in baseline.items() if k.endswith("_ms")},
                "baseline_timing": results.baseline_spread(baseline, TIMING_KEPT), "started_at": self.started_at,
                "finished_at": now(),
                "verified": {"ref_sha256": self.data.get("_sha256") or "", "ref_device": self.data.get("device_name", ""),
                             # the stored key keeps the earlier word for the fresh inputs
                             "fresh_seeds": self.evaluation.settings_for(self.devices[0]).fresh_inputs,
                             "profile": self.evaluation.profile, **self.verified_by},
                "generators": sorted(self.generators), "config": self.ctx.record(), "provenance": self.provenance,
                "no_seed": self.no_seed_text() if not (self.db.records or self.pending_seeds) else ""}

    def _finish(self, stop: str, baseline: dict, confirmation: dict | None = None) -> OpOutcome:
        summary = self._summary(stop, baseline)
        best = self.db.best()
        summary["status"] = "succeeded" if best else "zero_pass"
        summary["best"] = results.candidate_row(best) if best else None
        allowed, why = False, "no passing kernel"
        if best is not None and confirmation is not None:  # a best is always re-timed (_retime)
            if confirmation.get("error"):
                allowed, why = False, f"the re-timing failed: {confirmation['error']}"
            else:
                allowed, why = speedups.promotion(confirmation, confirmation.get("model_runs", True),
                                                  timed=confirmation.get("timed", True))
        summary["confirmation"] = confirmation
        summary["promotion"] = {"allowed": allowed, "reason": why}
        results.write_report(self.store, self.prefix, summary, self.db)
        promoted = False
        if best and allowed:  # one writer of the op's kernels at a time (farm.storage.locks)
            kernels = kernel_prefix(self.target, self.ref.source, self.ref.op)
            with locks.held(self.store, locks.kernel_lock_key(kernels), f"kernels of {self.ref.key}", wait_s=60):
                promoted = results.promote(self.store, self.target, summary, best)
        outcome = self._outcome(stop, baseline)
        outcome.promoted, outcome.promotion = promoted, why
        if best is not None:  # the op's best speedup as every surface shows it (results.best_speedup)
            results.with_figures(outcome, summary, best)
        self.final = outcome.as_dict()  # a finished search asked again answers the same (promoted, re-timed)
        self.checkpoint(status="done", stop_reason=stop)
        return outcome

    def _outcome(self, stop: str, baseline: dict | None = None) -> OpOutcome:
        best = self.db.best()
        return OpOutcome(self.ref.source, self.ref.op, "succeeded" if best else "zero_pass", stop,
                         submitted=self.db.submitted, passed=len(self.db.passing()), best_id=best.id if best else None,
                         best_time_ms=best.time_ms if best else None,
                         speedup_vs_model=best.speedup_vs_model if best else None,
                         speedup_vs_reference=best.speedup_vs_reference if best else None,
                         baseline={k: v for k, v in (baseline or {}).items() if k.endswith("_ms")},
                         error="" if best else self.why_no_kernel(),
                         timing_mode=timing.mode_of(best.timing) if best else "",
                         fraction_of_limit=(best.limit or {}).get("fraction") if best else None,
                         ref_sha256=self.provenance["ref_sha256"] or "", provenance=self.provenance, retired=self.retired,
                         **results.verified_fields(self.verified_by))


def search_op(task_ref: taskfiles.TaskRef, ref_data: dict, ctx: SearchContext, force: bool = False) -> OpOutcome:
    """Search one op; errors of the task or its reference data become a `failed` outcome.
    `force`: from scratch, ignoring the op's checkpoint and its stored fixed costs."""
    try:
        catalog.record(ctx.store, ctx.run, "local", [task_ref.source], ctx.target)  # farm status and --latest know it
        return OpSearch(task_ref, ref_data, ctx).run(force=force)
    except FarmError as exc:
        return OpOutcome(task_ref.source, task_ref.op, "failed", "error", error=str(exc),
                         transient=getattr(exc, "transient", False))
