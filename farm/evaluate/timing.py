"""Timing: how long a callable takes on a device. Knows nothing of correctness.

One recipe for every target, after Triton's do_bench, so that figures compare with published
ones: warm-up calls, a cache flush before every repetition (`write` as do_bench, or `clean`, a
read that leaves no dirty lines for the timed call to write back), a fresh pair of device events
around each call in batches behind the flush (the host's launch latency stays outside), until a
target relative standard error, a time budget or a count; the median ranks, the spread goes with
it. Three host-clock calls show work the events did not see (a side stream, a thread).

That is the `events` mode. For microsecond kernels a per-call figure times the host's launch
path (`host_bound` says when), so the `graph` mode replays the calls in a device graph (CUDA's),
as serving does. On an interpreting target (cpu) the events are host clocks around the
interpreter: they only order candidates. What a device can do is asked of its target
(farm.targets.base: `spins`, `graphs`, `event_class`, `spin`, `capture_graph`, `profile_ms`).
The figures behind each choice: docs/evaluator.md ("Timing").
"""

from __future__ import annotations

import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from farm.errors import FarmError
from farm.targets import DeviceSpec, Target

# Bound once, when the runner starts and before any candidate runs: a candidate that replaces
# time.perf_counter afterwards does not change the clock the harness reads.
_perf_counter = time.perf_counter

DEFAULT_WARMUP_MS = 25.0
DEFAULT_BUDGET_MS = 400.0
DEFAULT_MIN_REPS = 10
DEFAULT_MAX_REPS = 1000
DEFAULT_RSE_TARGET = 0.005  # stop at 0.5% relative standard error of the mean
DEFAULT_BATCH = 10  # repetitions enqueued between two synchronisations
LEAD_MARGIN = 1.5  # DeviceTimer._lead_ms: the host's time per call, with this margin
MAX_LEAD_MS = 2.0  # a host slower than this per call is host-bound, and flagged as such
GRAPH_LEAD_MS = 0.2  # graph_samples: covers the first replay's launch
SYNC_SHARE = 0.9  # DeviceTimer._waits_on_device: a call whose host time covers this share of the lead and flush


@dataclass
class TimingStats:
    median_ms: float
    min_ms: float
    mean_ms: float
    std_ms: float
    rse: float  # relative standard error of the mean
    reps: int
    host_median_ms: float  # wall clock around one call + full device sync, from an idle device
    method: str
    stop_reason: str
    samples_ms: list[float] = field(default_factory=list, repr=False)
    # share of batches in which the device waited for the host (events saw host time too)
    host_bound: float = 0.0

    def as_dict(self, samples: bool = False) -> dict:
        d = asdict(self)
        if not samples:
            d.pop("samples_ms")
        return d


class _HostClock:
    """Event-like clock for devices without events (cpu)."""

    def __init__(self):
        self.t = 0.0

    def record(self):
        self.t = _perf_counter()

    def elapsed_time(self, other: "_HostClock") -> float:
        return (other.t - self.t) * 1e3


FLUSH_MODES = ("write", "clean")


def check_flush(mode: str) -> str:
    if mode not in FLUSH_MODES:
        raise FarmError(f"unknown cache flush '{mode}' (--flush): use write (as do_bench) or clean")
    return mode


class DeviceTimer:
    """Events, synchronisation and cache flushing for one pinned device."""

    def __init__(self, spec: DeviceSpec, flush: str = "write"):
        import torch

        self.spec = spec
        self._torch = torch
        # the target's synchronisation, event class and spin kernel, bound now for the same reason
        # as _perf_counter; an interpreting target (cpu) has real semantics but no device clock:
        # it times on the host
        self._synchronize = spec.target.synchronize
        self._event_cls = spec.target.event_class()
        self._spin = spec.target.spin if spec.target.spins and self._event_cls is not None else None
        self.flush_mode = check_flush(flush)
        self.batches = self.host_bound_batches = 0  # see host_bound()
        self.flush_buf = self._flush_sum = None
        # the lead (see _lead_ms): the host's seconds per call of the last batch, the flush's
        # device time and the spin kernel's clock, each learned once on this device
        self._host_call_ms: float | None = None
        self._flush_ms: float | None = None
        self._cycles_per_ms: float | None = None
        if spec.target.flush_bytes:
            # int8, so that the sweep touches every byte; zeroed once so the sum is defined
            self.flush_buf = torch.zeros(spec.target.flush_bytes, dtype=torch.int8, device=spec.torch_device)
            self._flush_sum = torch.zeros((), dtype=torch.int32, device=spec.torch_device)

    @property
    def method(self) -> str:
        return self.spec.target.event_method if self._event_cls is not None else "host_clock"

    def event(self):
        if self._event_cls is not None:
            return self._event_cls(enable_timing=True)
        return _HostClock()

    def synchronize(self) -> None:
        self._synchronize()

    def flush(self) -> None:
        """Evict the cache before a timed call (step 2): write the buffer, or read it."""
        if self.flush_buf is None:
            return
        if self.flush_mode == "clean":
            self._torch.sum(self.flush_buf, dim=0, dtype=self._torch.int32, out=self._flush_sum)
        else:
            self.flush_buf.zero_()

    def batch(self, fn: Callable[[], object], n: int, prepare: Callable[[int], None] | None = None,
              first: int = 0) -> list[float]:
        """Device ms of n flushed calls, enqueued back to back and synchronised once.

        As in triton's do_bench, nothing waits between the flush and the start event: the host
        runs ahead of the device, so the host's launch latency stays outside every measured
        interval, and the events see only the call.
        """
        pairs = []
        lead = self._lead_ms()
        spun_between = 0.0  # the spins inside the batch's span (all but the first call's)
        waited = False
        probe = first + (1 if n > 1 else 0)  # the second call: a batch's first is slower on the host
        host0 = _perf_counter()
        for i in range(first, first + n):
            if prepare is not None:
                prepare(i)  # e.g. load the next input set: outside the events
            self.flush()
            self.spin(lead)
            spun_between += lead if i > first else 0.0
            start, end = self.event(), self.event()
            start.record()
            if lead and i == probe:
                waited = self._waits_on_device(fn, lead)
                lead = 0.0 if waited else lead
            else:
                fn()
            end.record()
            pairs.append((start, end))
        host_s = _perf_counter() - host0
        self.synchronize()
        # the host time of calls that wait on the device is not launch time: a lead made of it
        # would feed on itself (the next lead waited for, the host slower by as much)
        self._host_call_ms = None if waited else host_s * 1e3 / max(1, n)
        if self._event_cls is not None and pairs:
            self.batches += 1
            span = pairs[0][0].elapsed_time(pairs[-1][1]) - spun_between  # the spins are not the calls'
            self.host_bound_batches += host_bound(host_s, span)
        return [s.elapsed_time(e) for s, e in pairs]

    def _waits_on_device(self, fn: Callable[[], object], lead: float) -> bool:
        """Run one call and say whether it waited for the device (a forward that synchronises:
        `.item()`, `.tolist()`, a host loop): its host time then covers the flush and the spin
        queued before it, where a call that only launches takes what the host took per call
        before, which the lead exceeds by LEAD_MARGIN. Such a call gets no lead (it catches up
        with the device by itself, as in do_bench): on the H100, AKG compute_position's Model,
        led by 2 ms spins, read 85 us and do_bench 45 us. Asked of a batch's second call: the
        first, slower on the host, took a host-bound kernel's lead away (AKG _compute_pid's
        best read 53 us for a 5 us kernel)."""
        t0 = _perf_counter()
        fn()
        return (_perf_counter() - t0) * 1e3 >= SYNC_SHARE * (lead + (self._flush_ms or 0.0))

    def _lead_ms(self) -> float:
        """Device time to queue ahead of each timed call so that the device is still busy when
        the host has launched it. The flush alone covered the host's launch (as in do_bench)
        until the host got busy: on the H100 with six ops' compile-ahead runners on 16 cores,
        a 4.4 us kernel's calls measured 57 us, the host's launch latency, not the kernel
        (AKG sglang/_compute_pid, 2026-11-24). The lead is what the host took per call in the
        last batch, with a margin, less what the flush already covers; none on a quiet host."""
        if self._spin is None or self._host_call_ms is None:
            return 0.0
        if self._flush_ms is None:
            self._flush_ms = self._device_ms(self.flush) if self.flush_buf is not None else 0.0
        return min(MAX_LEAD_MS, max(0.0, LEAD_MARGIN * self._host_call_ms - self._flush_ms))

    def spin(self, ms: float) -> None:
        """Keep the device busy for about `ms` (the target's spin kernel, CUDA's; a no-op where it
        has none): the launches queued behind it are in place before it ends."""
        spin = self._spin
        if ms <= 0 or spin is None:
            return
        if self._cycles_per_ms is None:
            cycles = 1_000_000
            self._device_ms(lambda: spin(cycles))  # the first launch pays for loading
            self._cycles_per_ms = cycles / max(1e-3, self._device_ms(lambda: spin(cycles)))
        spin(int(ms * self._cycles_per_ms))

    def _device_ms(self, fn: Callable[[], object]) -> float:
        self.synchronize()
        start, end = self.event(), self.event()
        start.record()
        fn()
        end.record()
        self.synchronize()
        return start.elapsed_time(end)

    def host_check(self, fn: Callable[[], object]) -> tuple[float, float]:
        """(device ms, host ms) of one call from an idle device: the host time covers the call
        and a full synchronisation, so work the events did not see shows up here."""
        self.synchronize()
        start, end = self.event(), self.event()
        host0 = _perf_counter()
        start.record()
        fn()
        end.record()
        self.synchronize()
        return start.elapsed_time(end), (_perf_counter() - host0) * 1e3


def rse_of(samples: list[float]) -> float:
    if len(samples) < 2:
        return math.inf
    mean = statistics.fmean(samples)
    return statistics.stdev(samples) / math.sqrt(len(samples)) / mean if mean > 0 else math.inf


def measure(
    fn: Callable[[], object],
    timer: DeviceTimer,
    *,
    warmup_ms: float = DEFAULT_WARMUP_MS,
    budget_ms: float = DEFAULT_BUDGET_MS,
    min_reps: int = DEFAULT_MIN_REPS,
    max_reps: int = DEFAULT_MAX_REPS,
    rse_target: float = DEFAULT_RSE_TARGET,
    batch: int = DEFAULT_BATCH,
    prepare: Callable[[int], None] | None = None,
) -> TimingStats:
    """`prepare(i)` runs before repetition i, outside the timed interval."""
    fn()
    timer.synchronize()
    warm_end = _perf_counter() + warmup_ms / 1e3
    while _perf_counter() < warm_end:
        timer.batch(fn, 1)
    checks = [timer.host_check(fn) for _ in range(3)]
    timer.batches = timer.host_bound_batches = 0
    samples: list[float] = []
    deadline = _perf_counter() + budget_ms / 1e3
    stop = "max_reps"
    while len(samples) < max_reps:
        n = min(max(batch, min_reps - len(samples)), max_reps - len(samples))
        samples.extend(timer.batch(fn, n, prepare, first=len(samples)))
        if len(samples) >= min_reps:
            if rse_of(samples) <= rse_target:
                stop = "rse_target"
                break
            if _perf_counter() > deadline:
                stop = "time_budget"
                break
    return TimingStats(
        median_ms=statistics.median(samples),
        min_ms=min(samples),
        mean_ms=statistics.fmean(samples),
        std_ms=statistics.stdev(samples) if len(samples) > 1 else 0.0,
        rse=rse_of(samples),
        reps=len(samples),
        host_median_ms=statistics.median(h for _, h in checks),
        method=timer.method,
        stop_reason=stop,
        samples_ms=samples,
        host_bound=timer.host_bound_batches / timer.batches if timer.batches else 0.0,
    )


# ---------------------------------------------------------------- timing modes
#
# "events": one flushed, event-timed call per repetition (the recipe above). For kernels of a
# few microseconds it measures the launch path as much as the kernel: the host must enqueue
# flush, events and the forward's Python faster than the device runs the 256 MB flush (about
# 90 us on an H100), or the start event fires on an idle device and the interval then holds
# the forward's host time too. `host_bound` in the result says when that happened.
# "graph": the calls captured once in a device graph (CUDA's) and replayed, as LLM serving runs these
# kernels (and as triton.testing.do_bench_cudagraph times them): no host work inside the
# timed interval and no flush; input sets rotate inside the graph. Per-call time = replay
# time / calls in the graph. A forward that synchronises with the host cannot be captured:
# it is then timed per call and labelled so ("events", reason "not capturable: host_sync").

TIMING_MODES = ("auto", "events", "graph")
GRAPH_THRESHOLD_MS = 0.020  # auto: ops whose original runs under 20 us per call are timed in a graph
GRAPH_REPLAY_MS = 0.5  # aim for replays this long: long enough for the events, short enough per round
MAX_GRAPH_CALLS = 256


# "interpreter": what a figure timed on an interpreting target (cpu) is recorded and shown as.
# It is timed per call ("events" inside the evaluator), but on the host clock around Triton's
# interpreter, so no surface calls it "events" (issue 35 item 7).
INTERPRETER = "interpreter"


def recorded_mode(mode: str, target: Target) -> str:
    """The timing mode a figure of `target` timed in `mode` is recorded with (result timing, comparison)."""
    return INTERPRETER if target.interpret else mode


def mode_of(timing: dict | None, default: str = "") -> str:
    """A stored timing's timing mode as every surface shows it: "interpreter" also for a record written
    before it was recorded so (mode "events", method "host_clock")."""
    timing = timing or {}
    if timing.get("method") == "host_clock":
        return INTERPRETER
    return timing.get("mode") or default


def check_mode(mode: str) -> str:
    if mode not in TIMING_MODES:
        raise FarmError(f"unknown timing mode '{mode}' (--timing-mode): use auto, events or graph")
    return mode


def choose_mode(requested: str, target: Target, graph_ms: float | None = None, capture_error: str = "",
                threshold_ms: float = GRAPH_THRESHOLD_MS, per_call_host_bound: float = 0.0) -> tuple[str, str]:
    """The op's timing mode and why, from the original's per-call time in a graph (None when
    it was not tried), why it could not be captured (empty when it could), and the share of
    its per-call batches that were host-bound (then per-call figures measure the host)."""
    check_mode(requested)
    if requested == "events":
        return "events", "requested"
    if not target.graphs:
        why = "host clock on the cpu target" if target.interpret else "no CUDA graphs on this target"
        return "events", f"{target.name}: {why}; timed per call"
    if capture_error:
        return "events", f"not capturable ({capture_error}): timed per call"
    if requested == "graph":
        return "graph", "requested"
    if graph_ms is None:
        return "events", "no graph measurement of the original"
    if graph_ms < threshold_ms:
        return "graph", f"original {graph_ms * 1e3:.1f} us per call in a graph, under {threshold_ms * 1e3:.0f} us"
    if per_call_host_bound >= 0.5:
        return "graph", (f"original {graph_ms * 1e3:.1f} us per call in a graph, but its per-call timing was "
                         f"host-bound ({per_call_host_bound:.0%} of batches)")
    return "events", f"original {graph_ms * 1e3:.1f} us per call, at or over {threshold_ms * 1e3:.0f} us"


def graph_calls_for(per_call_ms: float, sets: int, replay_ms: float = GRAPH_REPLAY_MS,
                    cap: int = MAX_GRAPH_CALLS) -> int:
    """Calls per graph: a whole number of rotations over the input sets, about `replay_ms` long."""
    sets = max(1, sets)
    want = int(replay_ms / per_call_ms) if per_call_ms > 0 else cap
    want = max(sets, min(cap, want))
    return max(sets, want - want % sets)


class CaptureError(Exception):
    """The forward could not be captured in a device graph; `kind` says why (host_sync, ...)."""

    def __init__(self, kind: str, detail: str):
        super().__init__(f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def classify_capture_error(exc: BaseException) -> str:
    text = f"{type(exc).__name__}: {exc}".lower()
    if any(s in text for s in ("capturing", "synchroniz", "capture_status", "not permitted", "implicit")):
        return "host_sync"
    return "capture_failed"


def capture_graph(calls: list[Callable[[], object]], timer: "DeviceTimer", on_stream=None):
    """A device graph of the given calls, in order (the target's `capture_graph`). `on_stream(stream)`
    is told the capture stream (the launch hook accepts launches on it). Raises CaptureError."""
    try:
        return timer.spec.target.capture_graph(calls, on_stream)
    except BaseException as exc:  # noqa: BLE001 - whatever broke the capture, it is the verdict on capture
        raise CaptureError(classify_capture_error(exc), str(exc).strip().splitlines()[0][:300] if str(exc).strip()
                           else type(exc).__name__) from None
    finally:
        if on_stream is not None:
            on_stream(None)


def graph_samples(graph, calls: int, n: int, timer: "DeviceTimer") -> list[float]:
    """Per-call ms of n replays, enqueued back to back, one synchronisation. A spin first, so
    that the first replay too is queued before the device reaches its start event; later
    replays queue behind the running ones."""
    pairs = []
    spin = getattr(timer, "spin", None)
    if spin is not None:
        spin(GRAPH_LEAD_MS)
    for _ in range(n):
        start, end = timer.event(), timer.event()
        start.record()
        graph.replay()
        end.record()
        pairs.append((start, end))
    timer.synchronize()
    return [s.elapsed_time(e) / calls for s, e in pairs]


def stats_of(samples: list[float], method: str, stop_reason: str, host_median_ms: float = 0.0) -> TimingStats:
    return TimingStats(median_ms=statistics.median(samples), min_ms=min(samples), mean_ms=statistics.fmean(samples),
                       std_ms=statistics.stdev(samples) if len(samples) > 1 else 0.0, rse=rse_of(samples),
                       reps=len(samples), host_median_ms=host_median_ms, method=method, stop_reason=stop_reason,
                       samples_ms=samples)


def host_bound(host_s: float, device_ms: float) -> bool:
    """A batch whose enqueueing took the host as long as the device took to run it: the device
    waited for the host, so the events also saw host time."""
    return device_ms > 0 and host_s * 1e3 >= 0.9 * device_ms
