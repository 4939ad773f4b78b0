"""What a candidate's timed calls must show before their figure counts.

The timing stage times forward on secret input sets; its reply is then held to this: every
timed call launched Triton kernels on the timed stream from the calling thread, computed the
verified answers, took measurable time, did not serve repeated inputs from a cache (probes on
never-seen inputs, called inside the same batch) and, where the target's events time only the
device (`Target.host_check`: CUDA), did no work the device events could not see. Each failure
is a `cheat` verdict, but for a wrong answer on a probe: a `mismatch`, as in verification.
"""

from __future__ import annotations

from typing import Callable

from farm.evaluate.protocol import Reply
from farm.evaluate.result import Stop
from farm.runtime.tolerance import all_ok, compare_outputs

# timed calls this much faster than calls on never-seen inputs were served from a cache (the
# CPU interpreter's timings are noisier: a wider margin there)
INTERPRETER_CACHE_SPEED_RATIO = 0.2
DEFAULT_CACHE_SPEED_RATIO = 0.5
# ...and only where a cache would save this much per call: first calls on new buffers of
# microsecond kernels run measurably slower (page and TLB warm-up), which is not a cache
CACHE_MIN_GAIN_MS = 0.1


def check(reply: Reply | dict, cases: dict, tolerance, target, unseen_work_ratio: float,
          recheck: Callable[[], float] | None = None, unverified: frozenset[str] = frozenset()) -> dict:
    """The reply's stats, once every check passed; `cases` maps input-set key to expected outputs.
    `recheck()`: the host's time per call measured again, asked before host time alone makes a
    candidate a cheat. `unverified`: keys of `cases` first shown to the candidate in this
    timing (the probes)."""
    stats = reply["stats"]
    if reply["side_stream"] or reply["foreign_thread"]:
        raise Stop("cheat", "kernels ran outside the timed stream while being timed")
    if reply["launches"] < reply["min_calls"]:
        raise Stop("cheat", f"{reply['min_calls']} timed calls launched only {reply['launches']} Triton kernels")
    check_outputs(reply["outputs"], cases, tolerance, unverified)
    if not stats["median_ms"] > 0:
        raise Stop("cheat", "the timer reports no time at all")
    # host-bound per-call figures time the host's launch path, not the call: a probe on new
    # inputs then says nothing about a cache (the outputs of every timed call and, in a graph,
    # the launches captured per call still do)
    if stats.get("host_bound", 0.0) >= 0.5:
        stats["probe_check"] = "skipped: per-call timing host-bound"
    elif stats.get("probe_ms") and served_from_cache(stats, cache_ratio(target)):
        raise Stop("cheat", f"timed calls took {stats['median_ms']:.4f} ms but a call on unseen inputs "
                            f"{stats['probe_ms']:.4f} ms: repeated inputs are served from a cache")
    if target.host_check:
        host, dev = stats["host_median_ms"], stats["median_ms"]
        if unseen_work(host, dev, unseen_work_ratio) and recheck is not None:
            # the host clock also counts a stall of the host (a busy neighbour, a runner starting
            # beside a search): hidden work shows again, a stall seldom does (a search sharing
            # its H100 host with others once judged one of 29 honest candidates a cheat this way)
            stats["host_check"] = f"measured again after {host:.3f} ms per call"
            host = stats["host_median_ms"] = recheck()
        if unseen_work(host, dev, unseen_work_ratio):
            raise Stop("cheat", f"device events saw {dev:.3f} ms but each call took {host:.3f} ms: "
                                "work ran where the timer could not see it")
    return stats


def check_outputs(outputs: dict, cases: dict, tolerance, unverified: frozenset[str]) -> None:
    """Each set's timed outputs against its truth. Wrong outputs on a set the candidate passed
    verification on are a `cheat` (it computes something else when timed); on a probe, which
    no verification saw, they are a `mismatch` like any other wrong answer: a kernel whose
    rounding sits at the tolerance's edge (a demo/row_sum tile on the H100) meets it on one
    more set, not a timer it fooled."""
    for key, expected in cases.items():
        got = outputs.get(key)
        if got is not None and key in unverified:
            if not all_ok(compare_outputs(got, expected, tolerance)):
                raise Stop("mismatch", "a secret input set first seen when timed: the outputs are outside the "
                                       "tolerance")
        elif got is None or not all_ok(compare_outputs(got, expected, tolerance)):
            raise Stop("cheat", f"the timed calls on input set {key} did not compute the verified outputs")


def unseen_work(host_ms: float, device_ms: float, ratio: float) -> bool:
    """A call whose host time is `ratio` times its device time, and 2 ms more: work ran where
    the device's events could not see it."""
    return host_ms > ratio * device_ms and host_ms > device_ms + 2.0


def cache_ratio(target) -> float:
    # the interpreter (cpu, or a stand-in such as ascend:cpu) times noisily: its wider margin
    return INTERPRETER_CACHE_SPEED_RATIO if target.interpret else DEFAULT_CACHE_SPEED_RATIO


def served_from_cache(stats: dict, ratio: float) -> bool:
    """Unseen inputs slower than seen ones both beside the probes in their own batch and in the
    timing itself: a cache slows every unseen call, a busy host only the calls it preempts."""
    probe = stats["probe_ms"]
    seen = max(stats["median_ms"], stats.get("probe_beside_ms", 0.0))
    return seen < ratio * probe and probe - seen > CACHE_MIN_GAIN_MS
