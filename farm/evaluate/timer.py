"""The timer: the evaluator's own clock over the rounds it asks runners to time.

A candidate's runner reports per-call times from inside the candidate's process, where the
candidate can reach everything (the clocks, the harness's frames and replies). Those figures
are claims. The evaluator times each round command itself, from sending it to the last byte of
the reply, on a clock no runner can touch. A round costs the calls the runner claims plus the
harness's own work around them (flushes, synchronisations, the reply); that work is measured
on the trusted runner, whose rounds in the same comparison run the same harness on the same
device. A candidate whose claimed time covers less than CLAIM_FLOOR of what the evaluator's
clock saw, once up to OVERHEAD_FACTOR times the trusted harness's overhead is taken off, in
every round, has claimed time it did not take: `cheat`, once a second measurement says the
same (a busy host stalls some rounds; a lie is in all of them).

What this bounds: where a round's calls take more than a few times the harness's own work
(a graph round, a CPU round, any kernel of tens of microseconds and more), a rewritten clock,
reply or sample list can shade a candidate's figure by at most 1 / CLAIM_FLOOR (2x); every
gross claim (a forged 15x or 1850x, tests/evaluate/test_trust_line.py) fails. Below that, the round says too little. On
CUDA, per-call rounds may hold lead spins the runner adds while its host is slower than the
device (farm.evaluate.timing); up to MAX_LEAD_MS per call of them is allowed, so there the
bound is looser for kernels under about a millisecond. The re-timing before
promotion (farm.evaluate.rounds.retime) runs again in fresh runners, and its rounds are
held to the same clock.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

from farm.evaluate.timing import MAX_LEAD_MS

CLAIM_FLOOR = 0.5
# the harness's work around the calls differs between two runners by scheduling, not by much:
# a round may spend this many times the trusted harness's, and SLACK_MS more
OVERHEAD_FACTOR = 3.0
SLACK_MS = 2.0


def claimed_ms(samples: list[float], calls: int) -> float:
    """The device time a round's samples claim for its `calls`: the median per call (the figure
    a verdict rests on) times the calls. Not the samples' sum: a graph round's samples are per
    call, one per replay of many calls, and a sum would leave a slow kernel's replays unclaimed
    (a tune candidate 7x slower than the Model read as `cheat` on the H100); nor their mean, which
    one inflated sample raises while the median, and the figure, stay forged."""
    return statistics.median(samples) * calls


@dataclass
class Timed:
    who: str
    wall_ms: float  # the evaluator's clock, send to reply
    claimed_ms: float  # the device time the runner's figure implies for the round's calls
    calls: int  # timed calls (or graph replays x captured calls)
    mode: str
    exempt: bool  # its wall time holds work outside the harness's rounds (a capture, returned outputs)


class RoundClock:
    """The evaluator's clock over one comparison's rounds."""

    def __init__(self, lead_allowed: bool):
        self.lead_allowed = lead_allowed  # CUDA per-call rounds: lead spins lie between the events
        self.rounds: list[Timed] = []

    def time(self, who: str, mode: str, calls: int, call, exempt: bool = False):
        """Run `call()` (one round command) on the evaluator's clock; the reply gets `wall_ms`.
        `calls`: the calls the round ran on the device (in a graph round, replays x captured calls).
        `exempt`: a round whose wall time also holds what no other round does (a graph's capture,
        which the evaluator knows happens in a runner's first graph round, or outputs sent back):
        timed and reported, not compared."""
        t0 = time.perf_counter()
        reply = call()
        wall = (time.perf_counter() - t0) * 1e3
        samples = reply.get("samples") if reply.ok else None
        if samples:
            try:
                reply.wall_ms = wall
            except AttributeError:  # a scripted reply (tests)
                pass
            self.rounds.append(Timed(who, wall, claimed_ms(samples, calls), calls, mode, exempt))
        return reply

    def overhead_ms(self, mode: str, trusted: set[str]) -> float | None:
        """What the trusted harness spent outside its timed calls in a round of `mode` (the
        median: one round stalled by a busy host says nothing about the harness). Never below
        zero: a claim a little over the wall time (a median above the mean) is no negative
        work, and a negative overhead would count against the candidate."""
        seen = sorted(max(0.0, r.wall_ms - r.claimed_ms) for r in self.rounds
                      if r.who in trusted and r.mode == mode and not r.exempt)
        return seen[(len(seen) - 1) // 2] if seen else None

    def check(self, who: str, trusted: set[str]) -> str:
        """Why `who`'s claims disagree with the evaluator's clock, or "". Only where every round
        of `who` does: a busy host stalls some rounds, a runner that lies lies in all of them."""
        worst = None
        for r in self.rounds:
            overhead = self.overhead_ms(r.mode, trusted)
            if r.who != who or r.exempt or overhead is None:
                continue
            lead = MAX_LEAD_MS * r.calls if self.lead_allowed and r.mode == "events" else 0.0
            unexplained = r.wall_ms - OVERHEAD_FACTOR * overhead - lead - SLACK_MS
            if not (unexplained > 0 and r.claimed_ms < CLAIM_FLOOR * unexplained):
                return ""
            worst = r
        if worst is None:
            return ""
        return (f"the runner claimed {worst.claimed_ms:.3f} ms of timed calls in a round the evaluator's clock saw "
                f"take {worst.wall_ms:.3f} ms, more than the harness's own work explains, and so in every round: "
                "its timings were not measured on the calls it ran")

    def summary(self, who: str) -> dict:
        mine = [r for r in self.rounds if r.who == who]
        return {"rounds": len(mine), "wall_ms": round(sum(r.wall_ms for r in mine), 3),
                "claimed_ms": round(sum(r.claimed_ms for r in mine), 3)}
