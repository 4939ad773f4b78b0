"""Compile-ahead: candidates checked and compiled on the host's cores while the device verifies
and times earlier ones, so the device does not wait on Triton's JIT (LLVM, ptxas: tenths of a
second to seconds per kernel). The pipeline as a whole: docs/search.md ("Pipeline").

For each candidate, in a fresh runner from the warm pool (farm.evaluate.pool): the static
checks, loading the code, and one forward with every Triton launch turned into Triton's own
warm-up (`JITFunction.run(warmup=True)`: compile into that runner's cache, launch nothing); the
runner then goes to the evaluator, which judges the candidate in it. Failures up to the load are
the verdicts the evaluator would give at that stage, under the same limits; of the warm forward
only a hang is (`timeout`): it computed on garbage, so its errors are not the candidate's. Warm
launches, not Triton's compile API, because only running the candidate's Python shows which
launches, constexprs and autotune configs it makes. No compiler cache is shared between runners
(a candidate could plant entries another would load); the interpreter compiles nothing, so the
automatic pool there is empty; runners are stopped while their device is timed (farm.evaluate.quiet).
"""

from __future__ import annotations

import itertools
import os
import threading
import time
from collections.abc import Callable

from farm.evaluate import quiet, static_checks
from farm.evaluate.pool import RunnerPool
from farm.evaluate.result import EvalResult
from farm.evaluate.runner import Limits, Runner, RunnerDied, close_all
from farm.evaluate.sandbox import Boundary
from farm.masking import mask_secrets, secret_values
from farm.observe import metrics
from farm.runtime.children import trim
from farm.targets import DeviceSpec

AUTO_MAX = 4  # compile-ahead runners per search at most, by default


def pool_size(requested: int, spec: DeviceSpec) -> int:
    """Runners to keep: `requested` (evaluator.compile_workers or --compile-workers; -1: automatic)."""
    if requested >= 0:
        return requested
    if spec.target.interpret:
        return 0  # interpreted kernels are not compiled: nothing to do ahead
    return max(0, min(AUTO_MAX, (os.cpu_count() or 1) - 1))


class CompileAhead:
    """Checks and compiles candidates before their device turn, each in a fresh runner that then
    goes to the device. `prepare` blocks while `size` candidates are compiling: callers are the
    search's bounded set of candidates in flight, so neither the queue nor memory grows with
    the budget."""

    def __init__(self, specs: list[DeviceSpec], size: int, init_inputs: list, inputs: list,
                 limits: Limits, boundary: Boundary, target: str,
                 configure: Callable[[Runner], None] | None = None,
                 prime: Callable[[Runner], None] | None = None, secrets: list[str] | None = None):
        self.limits = limits
        self.init_inputs, self.inputs = init_inputs, inputs
        # masked in what a verdict says: the evaluator's (its settings' and the environment's), else the environment's
        self.secrets = secret_values() if secrets is None else secrets
        self.boundary = boundary
        self.configure = configure

        def setup(box: Runner) -> None:
            if configure is not None:
                configure(box)
            box.extra_env = {"TRITON_CACHE_AUTOTUNING": "0"}  # no autotune choice made on garbage timings

        per_device = max(1, size // len(specs))
        self.pools = [RunnerPool(spec, limits, boundary, per_device, configure=setup, prime=prime) for spec in specs]
        self._next_pool = itertools.cycle(self.pools)
        self.slots = threading.Semaphore(size)
        self.depth = metrics.COMPILE_QUEUE.labels(target, metrics.device_label() or specs[0].label, "compile")
        self.lock = threading.Lock()
        self.waiting = 0
        self.prepared = 0  # candidates handed on to the device
        self.judged = 0  # candidates given their verdict here

    def prepare(self, candidate_code: str, name: str) -> EvalResult | Runner:
        """The verdict where the candidate fails before it needs the device; else the fresh
        runner it is loaded and compiled in, for the evaluator of that runner's device."""
        started = time.monotonic()
        verdict, reason = static_checks.static_verdict(candidate_code)
        if verdict:
            return self._judged(EvalResult(verdict=verdict, reason=reason), started)
        self._wait(+1)
        self.slots.acquire()
        self._wait(-1)
        try:
            with self.lock:
                pool = next(self._next_pool)
            box = pool.take()
            calm = quiet.for_device(box.spec.label, host_wide=not box.spec.target.interpret)
            calm.add(box)  # its compilers stop while the device is timed
            try:
                result = self._warm(box, candidate_code, name)
            finally:
                calm.remove(box)
        except RunnerDied as died:  # no runner could be started: the evaluator's own start says so again
            return self._judged(EvalResult(verdict=died.kind, reason=str(died).splitlines()[0], log=str(died)),
                                started)
        finally:
            self.slots.release()
        if isinstance(result, EvalResult):
            box.close()
            return self._judged(result, started)
        with self.lock:
            self.prepared += 1
        return result

    def _warm(self, box: Runner, candidate_code: str, name: str) -> EvalResult | Runner:
        try:
            reply = box.call("load_source", self.limits.compile_s, source=candidate_code, init_inputs=self.init_inputs,
                             name=name)
            if not reply.ok:
                error = reply.get("error", "")
                kind = reply.get("kind", "runtime_error")
                return EvalResult(verdict=kind, reason=error.strip().splitlines()[-1] if error.strip() else kind,
                                  log=error)
        except RunnerDied as died:  # while loading: the device's runner would meet exactly this
            return EvalResult(verdict=died.kind, reason=str(died).splitlines()[0], log=str(died))
        try:
            reply = box.with_inputs("warm", self.limits.compile_s, "pt", self.inputs)
        except RunnerDied as died:
            if died.kind == "timeout":  # a compiler (or forward) that never returns: not on the device's time
                return EvalResult(verdict="timeout", reason=str(died).splitlines()[0], log=str(died))
            return self._fresh(box)  # a crash may come from the garbage (a size read from an unwritten output)
        if not reply.ok or reply.get("error"):
            return self._fresh(box)  # garbage may have broken the runner's device context
        return box

    def _fresh(self, box: Runner) -> Runner:
        """A runner for a candidate whose warm run went wrong on garbage: a new one (its kernels
        are compiled on the device then), with the same setup."""
        box.close()
        fresh = Runner(box.spec, box.limits, box.boundary)
        if self.configure is not None:
            self.configure(fresh)
        return fresh

    def _judged(self, result: EvalResult, started: float) -> EvalResult:
        result.reason = trim(mask_secrets(result.reason or "", self.secrets), 2000)
        result.log = trim(mask_secrets(result.log or "", self.secrets), 4000)
        result.stage_s["ahead"] = result.stage_s["total"] = time.monotonic() - started
        result.sandbox = self.boundary.kind
        with self.lock:
            self.judged += 1
        return result

    def _wait(self, delta: int) -> None:
        with self.lock:
            self.waiting += delta
        self.depth.inc(delta)

    def close(self) -> None:
        close_all(self.pools)
