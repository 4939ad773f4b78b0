"""Timing: what can be checked without an accelerator (Ascend included)."""

import statistics

import pytest

from farm.errors import FarmError
from farm.evaluate import timing
from farm.targets import available, resolve_device


def test_measure_on_cpu_reports_statistics_and_stops_on_rse():
    import time

    timer = timing.DeviceTimer(resolve_device("cpu"))
    stats = timing.measure(lambda: time.sleep(0.002), timer, warmup_ms=5, budget_ms=2000, min_reps=5, rse_target=0.05)
    assert 1.5 < stats.median_ms < 20 and stats.min_ms <= stats.median_ms
    assert stats.reps >= 5 and stats.stop_reason in ("rse_target", "time_budget")
    assert stats.method == "host_clock" and stats.host_median_ms >= stats.min_ms * 0.5


def test_measure_stops_on_budget_for_noisy_calls():
    import itertools
    import time

    delays = itertools.cycle([0.0, 0.004])
    timer = timing.DeviceTimer(resolve_device("cpu"))
    stats = timing.measure(lambda: time.sleep(next(delays)), timer, warmup_ms=0, budget_ms=50, min_reps=4,
                           rse_target=1e-6)
    assert stats.stop_reason == "time_budget" and stats.std_ms > 0


def test_npu_profiler_csv_is_read_in_microseconds():
    from farm.ascend.target import parse_op_statistic

    csv_text = (
        "Device_id,OP Type,Core Type,Count,Total Time(us),Min Time(us),Avg Time(us),Max Time(us),Ratio(%)\n"
        "0,farm_flush_kernel,AI_VECTOR_CORE,50,4000.0,80,80,80,40\n"
        "0,_row_sum_kernel,AI_VECTOR_CORE,50,1000.0,20,20,20,10\n"
        "0,_helper_kernel,AI_VECTOR_CORE,100,500.0,5,5,5,5\n"
        "0,warmup_only,AI_VECTOR_CORE,1,9999.0,9999,9999,9999,45\n"
    )
    # (1000 + 500) us over 50 calls = 30 us = 0.03 ms; the flush and the one-off op are left out
    assert parse_op_statistic(csv_text, active=50) == pytest.approx(0.03)


@pytest.mark.parametrize("mode", ["write", "clean"])
def test_flush_writes_its_buffer_as_do_bench_or_reads_it_to_leave_the_cache_clean(mode):
    """The calls the GPU timer makes, on CPU tensors."""
    import dataclasses

    from farm.targets import DeviceSpec

    backend = dataclasses.replace(available()["cuda"], torch_device="cpu", flush_bytes=4096)
    timer = timing.DeviceTimer(DeviceSpec(backend, None), flush=mode)
    timer.flush_buf.fill_(1)
    timer.flush()
    if mode == "clean":
        assert int(timer._flush_sum) == 4096 and int(timer.flush_buf.sum()) == 4096  # read, not written
    else:
        assert int(timer.flush_buf.abs().sum()) == 0
    with pytest.raises(FarmError, match="--flush"):
        timing.DeviceTimer(DeviceSpec(backend, None), flush="fast")


def test_a_timed_forward_drops_its_previous_output_before_running_again():
    """Two outputs alternating in memory put an L2-sized op out of L2 (sglang fused_softcap
    on the H100: 17% against do_bench_cudagraph)."""
    import weakref

    import torch

    from farm.evaluate.child_rounds import forward_call

    seen: list = []

    def model(x):
        seen.append(previous[0]() if previous else None)
        out = x + 1
        previous[:] = [weakref.ref(out)]
        return out

    previous: list = []
    last: dict = {}
    call = forward_call(model, [torch.zeros(4)], last, "seed0")
    for _ in range(3):
        call()
    assert seen[1:] == [None, None]  # the last output was gone when the next call ran
    assert torch.equal(last["seed0"], torch.ones(4))  # and the latest is kept for the checks


class _CudaLikeTimer(timing.DeviceTimer):
    """The lead's arithmetic on the host: a timer with a spin kernel (as cuda's) whose spins are written down."""

    def __init__(self, flush_ms: float):
        super().__init__(resolve_device("cpu"))
        self._spin, self._flush_ms, self.spins = (lambda cycles: None), flush_ms, []
        self._event_cls = lambda enable_timing: timing._HostClock()

    def spin(self, ms: float) -> None:
        self.spins.append(ms)


class _Clock:
    """The host clock the timer reads, moved only by what a test's calls say they took: the
    lead's arithmetic without the scheduler's wake-ups (on CI's loaded 2 cores, 1 ms sleeps
    overslept by a millisecond and turned a launch into a wait on the device)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock(monkeypatch):
    host = _Clock()
    monkeypatch.setattr(timing, "_perf_counter", host)
    return host


def test_a_busy_host_gets_a_lead_queued_before_each_timed_call(clock):
    timer = _CudaLikeTimer(flush_ms=0.05)
    timer.batch(lambda: clock.sleep(0.001), 3)  # the host took 1 ms per call
    assert timer.spins == [0.0] * 3  # nothing known yet: no lead
    timer.batch(lambda: clock.sleep(0.001), 3)
    lead = timer.spins[-1]
    assert 1.0 < lead <= timing.MAX_LEAD_MS and timer.spins[3:] == [lead] * 3
    quiet = _CudaLikeTimer(flush_ms=50.0)  # a flush longer than the host's launch covers it alone
    for _ in range(2):
        quiet.batch(lambda: None, 3)
    assert quiet.spins == [0.0] * 6


class _Syncing:
    """A forward that waits on the device (an `.item()`): it returns once the flush and spin
    queued before it have run, after its own half millisecond."""

    def __init__(self, timer: _CudaLikeTimer, clock: _Clock):
        self.timer, self.clock = timer, clock
        spin = timer.spin

        def queued_spin(ms: float) -> None:
            spin(ms)
            self.queued_ms = ms + timer._flush_ms

        timer.spin = queued_spin
        self.queued_ms = 0.0

    def __call__(self):
        self.clock.sleep(self.queued_ms / 1e3 + 0.0005)
        self.queued_ms = 0.0


def test_a_call_that_waits_on_the_device_gets_no_lead_that_feeds_on_itself(clock):
    """Its host time is the device's: a lead made of it was waited for in the next batch, which
    made the next lead longer, up to MAX_LEAD_MS before every call."""
    timer = _CudaLikeTimer(flush_ms=0.05)
    call = _Syncing(timer, clock)
    for _ in range(6):
        timer.batch(call, 4)
    batches = [timer.spins[i:i + 4] for i in range(0, len(timer.spins), 4)]
    assert all(b[2:] == [0.0] * 2 for b in batches), batches  # the second call tells, the rest get none
    # about 1.5 x (the flush and half a millisecond); fed on itself it would reach the 2 ms cap
    # from the second lead on
    leads = [b[0] for b in batches if b[0] > 0]
    assert statistics.median(leads) < 0.75 * timing.MAX_LEAD_MS, batches
    assert sum(1 for b in batches if b[0] > 0) >= 2  # and it is asked again, not given up for good


def test_a_host_bound_kernel_keeps_its_lead_when_a_batch_starts_slowly(clock):
    """A batch's first call is the host's slowest (it comes back from a synchronisation and a
    reply): taken for a wait on the device, it cost a 5 us kernel its lead on the H100."""
    timer = _CudaLikeTimer(flush_ms=0.05)
    calls = []

    def launch():
        calls.append(1)
        clock.sleep(0.0025 if len(calls) % 4 == 1 else 0.001)

    for _ in range(4):
        timer.batch(launch, 4)
    for b in range(1, 4):
        spins = timer.spins[4 * b:4 * b + 4]
        assert spins[0] > 1.0 and spins == [spins[0]] * 4, timer.spins


def test_the_first_graph_replay_is_queued_behind_a_spin():
    spins: list = []

    class Clock:
        def record(self):
            pass

        def elapsed_time(self, other):
            return 0.2

    class Timer:
        def event(self):
            return Clock()

        def synchronize(self):
            pass

        def spin(self, ms):
            spins.append(ms)

    class Graph:
        def replay(self):
            pass

    assert timing.graph_samples(Graph(), 40, 5, Timer()) == [0.005] * 5
    assert spins == [timing.GRAPH_LEAD_MS]
