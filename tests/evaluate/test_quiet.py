"""A quiet host while a device is timed (farm.evaluate.quiet): compile-ahead's runners are
stopped, compilers and all, for exactly as long as a timing of any process of the host holds
their device, and their time limits do not count the stop. Real runners (inside the sandbox's
boundary where bubblewrap works), real lock files."""

import multiprocessing as mp
import shutil
import time
from pathlib import Path

import pytest

from farm.evaluate import lease as device_lease
from farm.evaluate import quiet, sandbox
from farm.evaluate.proctree import tree as _tree
from farm.evaluate.runner import Limits, Runner
from farm.targets import resolve_device

SLOW_LOAD = '''
import time
time.sleep(1.5)

import torch

class ModelNew(torch.nn.Module):
    def forward(self, x):
        return x
'''


@pytest.fixture
def runner(tmp_path, monkeypatch):
    monkeypatch.setenv(device_lease.LOCK_DIR_ENV, str(tmp_path))
    sb = Runner(resolve_device("cpu"), Limits(start_s=60), sandbox.current())
    sb.start()
    try:
        yield sb
    finally:
        sb.close()
        shutil.rmtree(sb.workdir or tmp_path / "none", ignore_errors=True)


def _states(sb: Runner) -> set[str]:
    """The scheduler state of every process of the runner's tree (T: stopped)."""
    out = set()
    for pid in _tree(sb.proc.pid):
        stat = Path(f"/proc/{pid}/stat").read_text()
        out.add(stat[stat.rindex(")") + 2])
    return out


def _wait_states(sb: Runner, stopped: bool, within_s: float = 5.0) -> set[str]:
    deadline = time.monotonic() + within_s
    while True:
        states = _states(sb)
        if (states == {"T"} if stopped else "T" not in states) or time.monotonic() > deadline:
            return states


def test_a_timing_of_this_process_stops_the_registered_runners_until_it_lets_go(runner):
    label = "quiet-test:0"
    host = quiet.for_device(label)
    host.add(runner)
    try:
        lease = device_lease.for_device(label)
        with lease.hold(device_lease.VERIFICATION):
            assert "T" not in _states(runner)  # verifications share the host
        with lease.hold(device_lease.TIMING):
            # every process of the tree: bwrap and, in its own session, the interpreter
            assert _wait_states(runner, stopped=True) == {"T"}
        assert "T" not in _wait_states(runner, stopped=False)
        assert host.pauses >= 1
        assert runner.call("load_source", 60, source=SLOW_LOAD.replace("1.5", "0"), init_inputs=[])["ok"]
    finally:
        host.remove(runner)


def _time_elsewhere(lock_dir: str, label: str, hold_s: float, out) -> None:
    import os

    os.environ[device_lease.LOCK_DIR_ENV] = lock_dir
    with device_lease.DeviceLease(label).hold(device_lease.TIMING):
        out.put("holding")
        time.sleep(hold_s)
    out.put("released")


def test_a_timing_in_another_process_of_the_host_stops_them_too(runner, tmp_path):
    label = "quiet-test:1"
    host = quiet.for_device(label)
    host.add(runner)
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    other = ctx.Process(target=_time_elsewhere, args=(str(tmp_path), label, 2.0, out))
    other.start()
    try:
        assert out.get(timeout=60) == "holding"
        assert _wait_states(runner, stopped=True) == {"T"}
        assert out.get(timeout=30) == "released"
        assert "T" not in _wait_states(runner, stopped=False)
    finally:
        other.join(30)
        host.remove(runner)


def test_a_stopped_runner_is_not_timed_out_for_the_seconds_it_was_stopped(runner):
    """A 1.5 s load under a 3 s limit, stopped for 4 s in the middle: it answers, where a
    limit counting the stop would have killed it."""
    import threading

    def stop_for_a_while():
        time.sleep(0.5)
        runner.pause()
        time.sleep(4.0)
        runner.resume()

    pauser = threading.Thread(target=stop_for_a_while)
    pauser.start()
    started = time.monotonic()
    reply = runner.call("load_source", 3.0, source=SLOW_LOAD, init_inputs=[])
    pauser.join()
    assert reply.get("ok"), reply
    assert time.monotonic() - started >= 4.0
    assert runner.paused_s() >= 4.0


def test_a_runner_that_hangs_still_times_out_once_it_runs_again(runner):
    runner.pause()
    time.sleep(1.0)
    runner.resume()
    started = time.monotonic()
    with pytest.raises(Exception) as died:
        runner.call("load_source", 1.0, source=SLOW_LOAD.replace("1.5", "30"), init_inputs=[])
    assert getattr(died.value, "kind", "") == "timeout"
    assert time.monotonic() - started < 10


def test_compile_ahead_runners_are_stopped_while_their_device_is_timed(tmp_path, monkeypatch):
    from farm.evaluate.ahead import CompileAhead

    monkeypatch.setenv(device_lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(quiet, "STARTS_BESIDE_TIMING_CPUS", 1 << 20)  # a small host, whatever this one is
    cpu = resolve_device("cpu")
    pool = CompileAhead([cpu], 1, [], [], Limits(start_s=60), sandbox.current(), "cpu")
    try:
        waiting = pool.pools[0]
        with waiting._cv:
            waiting._spawn()  # a runner started ahead, waiting for its candidate
            while not waiting.ready:
                waiting._cv.wait()
        box = waiting.ready[0]
        with device_lease.for_device(cpu.label, host_wide=False).hold(device_lease.TIMING):
            assert _wait_states(box, stopped=True) == {"T"}
        assert "T" not in _wait_states(box, stopped=False)
    finally:
        pool.close()
    assert box not in quiet.for_device(cpu.label, host_wide=False).members


@pytest.mark.parametrize("spare", [True, False], ids=["cores-to-spare", "small-host"])
def test_a_runner_starts_beside_a_timing_only_on_a_host_with_cores_to_spare(tmp_path, monkeypatch, spare):
    from farm.evaluate.pool import RunnerPool

    monkeypatch.setenv(device_lease.LOCK_DIR_ENV, str(tmp_path))
    monkeypatch.setattr(quiet, "STARTS_BESIDE_TIMING_CPUS", 1 if spare else 1 << 20)
    cpu = resolve_device("cpu")
    host = quiet.for_device(cpu.label, host_wide=False)
    pool = RunnerPool(cpu, Limits(start_s=60), sandbox.current(), size=1)
    try:
        with device_lease.for_device(cpu.label, host_wide=False).hold(device_lease.TIMING):
            with pool._cv:
                pool._spawn()
                deadline = time.monotonic() + 60
                while not pool.ready and not (not spare and pool._inflight) and time.monotonic() < deadline:
                    pool._cv.wait(0.05)
                # a fork from an idle server can start and be ready between two looks
                boxes = list(pool._inflight) + [r for r in pool.ready if isinstance(r, Runner)]
            if spare:  # started, with the device held for timing all along
                assert pool.ready and isinstance(pool.ready[0], Runner)
                assert pool.ready[0] not in host.members
            else:  # its start is one of the quiet's members, stopped with the compilers
                assert boxes and all(box in host.members for box in boxes)
        with pool._cv:
            while not pool.ready:
                pool._cv.wait(0.05)
        assert isinstance(pool.ready[0], Runner)
    finally:
        pool.close()


def _affinities(sb: Runner) -> set[frozenset[int]]:
    """The cores every thread of the runner's tree may run on, one set per distinct answer."""
    import os

    out = set()
    for pid in _tree(sb.proc.pid):
        for task in Path(f"/proc/{pid}/task").iterdir():
            out.add(frozenset(os.sched_getaffinity(int(task.name))))
    return out


@pytest.mark.skipif(len(__import__("os").sched_getaffinity(0)) < 2, reason="one core: nothing to pin to")
def test_a_pinned_runner_runs_every_thread_on_the_timing_core_until_let_go(runner):
    """Two processes placed freely by the scheduler timed one host-synchronising Model 0.79 to
    1.27 times apart on the H100, pinned to one core within 3% (bench/cross_process.py)."""
    import os

    everywhere = frozenset(os.sched_getaffinity(0))
    core = max(everywhere)
    assert len(list(Path(f"/proc/{_tree(runner.proc.pid)[-1]}/task").iterdir())) > 1  # torch's threads too
    runner.pin({core})
    assert _affinities(runner) == {frozenset({core})}
    runner.pin(None)
    assert _affinities(runner) == {everywhere}
    runner.pin({core})
    runner.kill()
    runner.start()  # a runner started while pinned is pinned as well
    assert _affinities(runner) == {frozenset({core})}


def test_the_timing_core_is_one_of_ours_a_different_one_per_device_or_as_configured(monkeypatch):
    import os

    cores = sorted(os.sched_getaffinity(0))
    monkeypatch.delenv(quiet.TIMING_CPU_ENV, raising=False)
    if len(cores) > 1:
        assert quiet.timing_cpu(0) == cores[-1] and quiet.timing_cpu(1) == cores[-2]
    monkeypatch.setenv(quiet.TIMING_CPU_ENV, "off")
    assert quiet.timing_cpu(0) is None
    monkeypatch.setenv(quiet.TIMING_CPU_ENV, str(cores[0]))
    assert quiet.timing_cpu(3) == cores[0]
    monkeypatch.setenv(quiet.TIMING_CPU_ENV, "9999")  # not a core of ours: not pinned, said in the log
    assert quiet.timing_cpu(0) is None
