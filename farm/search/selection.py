"""Which lineage, which parent, which inspirations: the adaptive search of AKG's
evolution controller, kept to the letter where it is good.

- progress = submitted / max_tasks; temperature tau and the UCB constant c anneal 1.5 -> 0.5.
- Lineage by exploration deficit: the share a lineage deserves (softmax of its best speedup at
  temperature tau) over the share of candidates it got. With probability 0.7 the largest
  deficit (times a quality bonus) wins, else a roulette over deficits; uniform while no
  lineage has a speedup.
- Parent by UCB inside the lineage: rank-based quality (n - rank) / (n - 1) plus
  c * sqrt(ln(N + 1) / (n_i + 1)) plus uniform noise of +-0.1; ranked by measured time.
- Inspirations: three records Boltzmann-sampled by speedup from the parent's lineage at
  temperature tau; each one is, with probability 0.2, drawn instead from another lineage's top-2
  elites (a migrant).
"""

from __future__ import annotations

import math
import random

from farm.search.database import Database, Record

EXPLOIT_P = 0.7
MIGRATION_P = 0.2
N_INSPIRATIONS = 3
NOISE = 0.1


def anneal(progress: float, start: float = 1.5, end: float = 0.5) -> float:
    p = min(max(progress, 0.0), 1.0)
    return start + (end - start) * p


def _softmax(values: list[float], tau: float) -> list[float]:
    top = max(values)
    exps = [math.exp((v - top) / max(tau, 1e-6)) for v in values]
    total = sum(exps)
    return [e / total for e in exps]


def choose_lineage(db: Database, progress: float, rng: random.Random) -> int | None:
    """A lineage that has at least one passing candidate to be a parent."""
    alive = [lin for lin in db.lineages() if db.passing(lin)]
    if not alive:
        return None
    best = [db.passing(lin)[0].speedup for lin in alive]
    if max(best) <= 0:
        return rng.choice(alive)
    tau = anneal(progress)
    target = _softmax(best, tau)
    total = max(sum(db.lineage_submitted.get(lin, 0) for lin in alive), 1)
    deficit = [t / max(db.lineage_submitted.get(lin, 0) / total, 1e-3) for t, lin in zip(target, alive)]
    if rng.random() < EXPLOIT_P:
        bonus = [0.5 + 0.5 * b / max(best) for b in best]
        scores = [d * q for d, q in zip(deficit, bonus)]
        return alive[scores.index(max(scores))]
    return rng.choices(alive, weights=deficit, k=1)[0]


def ucb_parent(db: Database, lineage: int, progress: float, rng: random.Random) -> Record:
    ranked = db.passing(lineage)  # fastest first
    n = len(ranked)
    c = anneal(progress)
    total = sum(db.selections.get(r.id, 0) for r in ranked)

    def score(rank: int, rec: Record) -> float:
        quality = (n - rank) / (n - 1) if n > 1 else 1.0
        explore = c * math.sqrt(math.log(total + 1) / (db.selections.get(rec.id, 0) + 1))
        return quality + explore + rng.uniform(-NOISE, NOISE)

    scores = [score(i, r) for i, r in enumerate(ranked)]
    return ranked[scores.index(max(scores))]


def inspirations(db: Database, parent: Record, progress: float, rng: random.Random) -> list[Record]:
    tau = anneal(progress)
    own = [r for r in db.passing(parent.lineage) if r.id != parent.id]
    others = [r for lin in db.lineages() if lin != parent.lineage for r in db.passing(lin)[:2]]
    chosen: list[Record] = []
    for _ in range(N_INSPIRATIONS):
        pool = others if others and rng.random() < MIGRATION_P else own
        pool = [r for r in pool if r not in chosen]
        if not pool:
            continue
        weights = _softmax([r.speedup for r in pool], tau)
        chosen.append(rng.choices(pool, weights=weights, k=1)[0])
    return chosen


def converged(best_by_window: list[float], passes: int, min_passes: int = 5, windows: int = 3,
              min_gain: float = 0.02) -> bool:
    """At least `min_passes` passes and the best time improved less than `min_gain` in each of
    the last `windows` windows (a window is 5 evaluated candidates)."""
    if passes < min_passes or len(best_by_window) < windows + 1:
        return False
    recent = best_by_window[-(windows + 1):]
    gains = [(a - b) / a if a and a != math.inf else 1.0 for a, b in zip(recent, recent[1:])]
    return all(g < min_gain for g in gains)


def rng_state(rng: random.Random) -> list:
    """The random generator's state as JSON-able data (the checkpoint keeps it)."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    rng.setstate((state[0], tuple(state[1]), state[2]))
