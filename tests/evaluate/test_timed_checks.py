"""The cache probe under a busy host: only a slowdown of unseen inputs against seen ones measured
in the same batch and in the timing is a cache."""

import pytest

from farm.evaluate import timed_checks
from farm.evaluate.result import Stop
from farm.targets import available, resolve_device

CPU = resolve_device("cpu").target


def _reply(median_ms: float, probe_ms: float, beside_ms: float) -> dict:
    stats = {"median_ms": median_ms, "probe_ms": probe_ms, "probe_beside_ms": beside_ms, "host_bound": 0.0,
             "host_median_ms": median_ms}
    return {"stats": stats, "side_stream": False, "foreign_thread": False, "launches": 10, "min_calls": 10,
            "outputs": {}}


def test_unseen_inputs_slower_than_seen_ones_in_their_own_batch_are_a_cache():
    with pytest.raises(Stop) as stop:
        timed_checks.check(_reply(0.75, 9.58, 0.7), {}, None, CPU, 4.0)
    assert stop.value.verdict == "cheat" and "served from a cache" in stop.value.reason


def test_a_batch_slowed_as_a_whole_by_a_busy_host_is_no_cache():
    # the CI failure this guards against: probes at 9.6 ms, the timing later at 0.75 ms, but the
    # calls on a seen set beside the probes were as slow: the host was busy, not the candidate
    stats = timed_checks.check(_reply(0.75, 9.58, 9.1), {}, None, CPU, 4.0)
    assert stats["probe_ms"] == 9.58


def test_a_gain_below_the_floor_is_no_cache():
    assert not timed_checks.served_from_cache({"median_ms": 0.01, "probe_ms": 0.08, "probe_beside_ms": 0.01}, 0.5)


CUDA = available()["cuda"]  # the host check is CUDA's (Target.host_check)


@pytest.mark.parametrize("again, cheat", [(0.06, False), (5.2, True), (None, True)])
def test_host_time_alone_makes_a_cheat_only_when_measured_again(again, cheat):
    """A call the device saw for 0.05 ms took the host 5 ms: hidden work, or a stalled host. The
    host's time is measured again first (issue 17): a stall passes the second time, hidden work
    does not; without a way to measure again the first figure decides."""
    reply = _reply(0.05, 0.0, 0.0)
    reply["stats"]["host_median_ms"] = 5.0
    asked = []

    def recheck():
        asked.append(1)
        return again

    args = (reply, {}, None, CUDA, 4.0)
    if cheat:
        with pytest.raises(Stop) as stop:
            timed_checks.check(*args, recheck=recheck if again is not None else None)
        assert stop.value.verdict == "cheat" and "where the timer could not see it" in stop.value.reason
    else:
        stats = timed_checks.check(*args, recheck=recheck)
        assert stats["host_median_ms"] == 0.06 and "measured again after 5.000 ms" in stats["host_check"]
    assert len(asked) == (0 if again is None else 1)
    quiet = _reply(0.05, 0.0, 0.0)
    timed_checks.check(quiet, {}, None, CUDA, 4.0, recheck=recheck)  # no suspicion, nothing asked again
    assert len(asked) == (0 if again is None else 1)


def test_a_wrong_answer_on_a_probe_is_a_mismatch_and_on_a_verified_set_a_cheat():
    import torch

    truth = [torch.ones(64)]
    wrong = [torch.ones(64) + 1e-2]  # outside float32's tolerance
    cases = {"seed0": truth, "seed3": truth}
    reply = _reply(0.75, 0.8, 0.75)
    reply["outputs"] = {"seed0": truth, "seed3": wrong}
    with pytest.raises(Stop) as stop:  # seed3 was first shown to the candidate in this timing
        timed_checks.check(reply, cases, None, CPU, 4.0, unverified=frozenset({"seed3"}))
    assert stop.value.verdict == "mismatch" and "first seen when timed" in stop.value.reason
    reply["outputs"] = {"seed0": wrong, "seed3": truth}  # it passed verification on seed0
    with pytest.raises(Stop) as stop:
        timed_checks.check(reply, cases, None, CPU, 4.0, unverified=frozenset({"seed3"}))
    assert stop.value.verdict == "cheat" and "seed0" in stop.value.reason
    reply["outputs"] = {"seed0": truth}  # a probe with no outputs at all returned nothing it was asked for
    with pytest.raises(Stop) as stop:
        timed_checks.check(reply, cases, None, CPU, 4.0, unverified=frozenset({"seed3"}))
    assert stop.value.verdict == "cheat"
    reply["outputs"] = {"seed0": truth, "seed3": truth}
    assert timed_checks.check(reply, cases, None, CPU, 4.0, unverified=frozenset({"seed3"}))["median_ms"] == 0.75
