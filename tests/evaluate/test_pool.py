"""The warm pool of candidate runners (farm.evaluate.pool)."""

import logging

import pytest

from farm.evaluate.pool import RunnerPool
from farm.evaluate.runner import Limits
from farm.evaluate.sandbox import Boundary
from farm.targets import resolve_device

LIMITS = Limits(start_s=60, compile_s=20, run_s=10, time_s=20, host_memory_mb=4096, log_mb=64, scratch_mb=64,
                tmp_mb=32, tasks=64)


def test_a_runner_that_failed_to_start_ahead_is_replaced_not_handed_out(caplog):
    """A start that failed in a starter thread (on an H100 a prestarted runner died of a broken
    pipe, and the independent re-timing that took it refused every promotion) is the host's
    trouble: the taker gets a runner started there and then, and the failure is logged."""
    configured = []

    def configure(box):
        configured.append(box)
        if len(configured) == 2:  # the first runner started ahead
            raise BrokenPipeError(32, "Broken pipe")

    pool = RunnerPool(resolve_device("cpu"), LIMITS, Boundary("none", "not under test"), size=1, configure=configure)
    try:
        first = pool.take()
        first.close()
        with caplog.at_level(logging.WARNING, logger="farm.evaluate.pool"):
            second = pool.take()
        try:
            assert second.alive and second is not first
            reply = second.call("load_source", 60, source="FOUND = 1\n", init_inputs=[])
            assert reply.kind == "compile_error" and "ModelNew" in reply.error  # a live runner's answer
        finally:
            second.close()
    finally:
        pool.close()
    assert any("failed to start ahead" in r.getMessage() for r in caplog.records)
    assert len(configured) >= 3


def test_a_runner_primed_for_other_cases_is_sent_the_current_inputs_again():
    """The re-timing before a promotion draws cases of its own under the same seed keys as the
    search's: a runner the pool primed with the search's must not be trusted to hold them (every
    re-timing on an H100 compared outputs for the search's inputs with the truth for its own)."""
    import types

    from farm.evaluate.trusted import TrustedSide

    search_cases, retime_cases = [([1], [2])], [([3], [4])]
    primed = types.SimpleNamespace(cached_inputs={"pt", "seed0", "seed1"}, primed_for=search_cases)
    side = types.SimpleNamespace(pool=types.SimpleNamespace(take=lambda **_: primed), _cases=retime_cases)
    assert TrustedSide._take_runner(side).cached_inputs == {"pt"}
    again = types.SimpleNamespace(cached_inputs={"pt", "seed0"}, primed_for=retime_cases)
    side.pool.take = lambda **_: again
    assert TrustedSide._take_runner(side).cached_inputs == {"pt", "seed0"}  # primed for these very cases


def test_the_first_runner_starts_a_server_where_none_waits_only_on_an_interpreted_target(monkeypatch):
    """On the host's cores (the interpreter) a server and a fork cost less than a new interpreter,
    and the pool's next runners use that server; on a compiled target a server's start queued
    behind the other pools' (an H100 batch), so there the first runner forks only where a server
    waits idle."""
    from dataclasses import replace as copy_with

    from farm.evaluate import forkserver
    from farm.evaluate import pool as pool_module
    from farm.targets import DeviceSpec

    asked = []

    class Asked(Exception):
        pass

    def lend(spec, limits, boundary, start=True, **kwargs):
        asked.append(start)
        raise Asked  # what the pool asked for is the subject; no runner needs to start

    monkeypatch.setattr(forkserver, "lend", lend)
    cpu = resolve_device("cpu")
    compiled = DeviceSpec(copy_with(cpu.target, interpret=False), cpu.index)
    for spec in (cpu, compiled):
        pool = pool_module.RunnerPool(spec, LIMITS, Boundary("bwrap", "under test"), size=1)
        try:
            with pytest.raises(Asked):
                pool.take()
        finally:
            pool.close()
    assert asked == [True, False]
