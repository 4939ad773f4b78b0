"""The search's pipeline around its devices (docs/search.md "Pipeline"): a sliding window of
candidates in flight, the per-op fixed costs kept with the checkpoint, and the device's
time per phase in the metrics.

With compile-ahead on (farm.evaluate.ahead), a chunk keeps `slots` candidates in flight at
all times: while the device verifies and times one, the others are being proposed and
compiled on the host. The old path waits for a whole batch before starting the next, which
left the device idle while the last of a batch was compiled; it stays as it was when
compile-ahead is off.
"""

from __future__ import annotations

import io
import logging
import time
from collections.abc import Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Callable

from farm.evaluate import ahead
from farm.evaluate import lease as device_lease
from farm.observe import metrics
from farm.storage import Store

log = logging.getLogger(__name__)

FIXED_VERSION = 1


def run_window(executor: ThreadPoolExecutor, job: Callable[[], bool], quota: int, slots: int) -> int:
    """Run `job` until `quota` of them ran, `slots` at a time, starting one as soon as one ends.
    A job that finds nothing to do (False) pauses new starts until the ones in flight end: their
    results may give new parents. Returns how many ran."""
    done, paused = 0, False
    inflight: set[Future[bool]] = set()
    while True:
        while not paused and len(inflight) < slots and done + len(inflight) < quota:
            inflight.add(executor.submit(job))
        if not inflight:
            return done
        finished, inflight = wait(inflight, return_when=FIRST_COMPLETED)
        ran = sum(f.result() for f in finished)
        done += ran
        paused = ran < len(finished)


def compile_ahead(search, evaluator) -> ahead.CompileAhead | None:
    """The compile-ahead pool of an OpSearch, where its configuration asks for one."""
    size = ahead.pool_size(search.evaluation.compile_runners(search.ctx.settings), search.devices[0])
    if size <= 0:
        return None
    return evaluator.compile_ahead(search.devices, size, search.target)


def take_evaluator(pool, runner=None) -> tuple:
    """An evaluator from the search's pool and what its evaluate() is given: with a `runner` that
    compile-ahead started and loaded the candidate in, the evaluator of that runner's device,
    which goes on with it."""
    while True:
        evaluator = pool.get()
        if runner is None:
            return evaluator, {}
        if evaluator.spec.label == runner.spec.label:
            return evaluator, {"runner": runner}
        pool.put(evaluator)  # another device's: its own candidates take it
        time.sleep(0.005)


# ---------------------------------------------------------------- fixed costs per op


def fixed_costs(search, evaluators: list, reuse: bool = True) -> dict:
    """Secret seed cases and baselines of an OpSearch, paid once per op and kept beside its
    checkpoint: a later chunk, a resumed search or another worker adopts them. Returns the
    baseline."""
    identity = {"task_sha256": search.ref.sha256(), "ref_sha256": search.data.get("_sha256") or "",
                "target": search.target, "settings": repr(evaluators[0].settings)}
    fixed = load_fixed(search.store, search.prefix, identity) if reuse else None
    if fixed is None:
        fixed = evaluators[0].fixed_costs()
        save_fixed(search.store, search.prefix, identity, fixed)
        search.fixed_paid = True
    for ev in evaluators:
        ev.adopt(fixed)
    return fixed["baseline"]


def fixed_key(prefix: str) -> str:
    return f"{prefix}/fixed.pt"


def load_fixed(store: Store, prefix: str, identity: dict) -> dict | None:
    """The op's fixed costs as a previous chunk or worker stored them; None where there are
    none or they were made for other data (task, reference data, target, profile)."""
    import torch

    key = fixed_key(prefix)
    if not store.exists(key):
        return None
    try:
        doc = torch.load(io.BytesIO(store.get_bytes(key)), map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 - a stale or damaged file is paid again, not fatal
        log.warning("%s: cannot be read (%s): the fixed costs are paid again", key, exc)
        return None
    if doc.get("version") != FIXED_VERSION or doc.get("identity") != identity:
        return None
    return doc


def save_fixed(store: Store, prefix: str, identity: dict, fixed: dict) -> None:
    import torch

    buf = io.BytesIO()
    torch.save({"version": FIXED_VERSION, "identity": identity, **fixed}, buf)
    store.put_bytes(fixed_key(prefix), buf.getvalue())


# ---------------------------------------------------------------- device time per phase


class DeviceClock:
    """The device's time per phase (farm.evaluate.lease) over one chunk, into the metrics."""

    def __init__(self, target: str, specs: Sequence):
        self.target = target
        self.leases = {spec.label: device_lease.for_device(spec.label, host_wide=not spec.target.interpret)
                       for spec in specs}
        self.start: dict[str, dict[str, float]] = {}

    def begin(self) -> None:
        self.start = {label: lease.seconds() for label, lease in self.leases.items()}

    def end(self, wall_s: float) -> dict[str, dict[str, float]]:
        out = {}
        for label, lease in self.leases.items():
            share = device_lease.shares(self.start.get(label, {}), lease.seconds(), wall_s)
            device = metrics.device_label() or label
            for phase, value in share.items():
                metrics.DEVICE_TIME_SHARE.labels(self.target, device, phase).set(value)
            out[label] = share
        return out
