"""Device memory reserved by the concurrent reference jobs of one host (farm.runtime.devmem):
a job that fits the idle device waits for the others instead of failing; one that never fits
fails at once; a killed job's reservation ends with it."""

import multiprocessing as mp
import os
import time

import pytest

from farm.runtime import devmem

GIB = 2**30


def _idle(total=10 * GIB):
    return lambda: (total, total)  # this test's jobs allocate nothing: the device always reads idle


def _hold(device: str, need: int, ready, release) -> None:
    devmem.reserve(device, need, _idle(), 1.0, 5.0)
    ready.set()
    release.wait(30)


@pytest.fixture
def device(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", str(tmp_path))
    import tempfile

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return f"cuda:0-test{os.getpid()}"


def test_a_job_that_fits_the_idle_device_waits_for_another_jobs_reservation(device):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(device, 6 * GIB, ready, release))
    holder.start()
    try:
        assert ready.wait(30)
        with pytest.raises(devmem.DoesNotFit) as exc:
            devmem.reserve(device, 6 * GIB, _idle(), 1.0, 0.6)  # 6 + 6 > 10: waits, then gives up
        assert not exc.value.never and "1 other job" in str(exc.value)
        release.set()
        started = time.monotonic()
        devmem.reserve(device, 6 * GIB, _idle(), 1.0, 30.0)  # goes on once the holder has ended
        assert time.monotonic() - started < 15
    finally:
        release.set()
        holder.join(10)


def test_a_killed_jobs_reservation_ends_with_it(device):
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(device, 9 * GIB, ready, release))
    holder.start()
    assert ready.wait(30)
    holder.kill()
    holder.join(10)
    devmem.reserve(device, 9 * GIB, _idle(), 1.0, 0.0)


def test_a_need_over_the_whole_device_fails_at_once_and_says_so(device):
    started = time.monotonic()
    with pytest.raises(devmem.DoesNotFit) as exc:
        devmem.reserve(device, 11 * GIB, _idle(), 0.9, 60.0)
    assert exc.value.never and "10.00 GiB" in str(exc.value)
    assert time.monotonic() - started < 5


def test_memory_other_processes_hold_is_not_waited_for(device):
    with pytest.raises(devmem.DoesNotFit) as exc:  # no job of ours holds it: waiting would not help
        devmem.reserve(device, 6 * GIB, lambda: (4 * GIB, 10 * GIB), 1.0, 60.0)
    assert not exc.value.never and "other processes" in str(exc.value)


def test_a_waiting_job_hands_back_its_cached_memory_before_each_look(device):
    """A job's allocator keeps freed blocks: while it waits they read as used, and a host of
    jobs each waiting with a full cache waited on each other (four reference jobs on an H100)."""
    ctx = mp.get_context("fork")
    ready, release = ctx.Event(), ctx.Event()
    holder = ctx.Process(target=_hold, args=(device, 4 * GIB, ready, release))
    holder.start()
    cache = {"held": 5 * GIB}
    try:
        assert ready.wait(30)
        free_total = lambda: (10 * GIB - 4 * GIB - cache["held"], 10 * GIB)  # noqa: E731
        with pytest.raises(devmem.DoesNotFit):  # without a release the cache never shrinks
            devmem.reserve(device, 5 * GIB, free_total, 1.0, 0.6)
        devmem.reserve(device, 5 * GIB, free_total, 1.0, 0.6, release=lambda: cache.update(held=0))
    finally:
        release.set()
        holder.join(10)
