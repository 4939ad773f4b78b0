"""Seeding an op's search (mixed into farm.search.controller.OpSearch): every generator of the
first tier that gives seeds, the later tiers only where none did, and in words why an op got no
seed or no passing kernel, per generator."""

from __future__ import annotations

import logging
import random
from typing import TYPE_CHECKING

from farm.errors import FarmError
from farm.generators import Generator
from farm.generators.base import initial_candidates_of, no_initial_reason_of
from farm.search.database import Database, normalized_hash

if TYPE_CHECKING:
    from farm.corpus.tasks import TaskRef
    from farm.generators import Context
    from farm.search.context import SearchConfig

log = logging.getLogger("farm.search.controller")


class Seeding:
    """Needs from its host: generators, pending_seeds, seed_reasons, seed_tier, db, config, ref
    and _context(rng)."""

    # the OpSearch's, set by its __init__
    ref: TaskRef
    config: SearchConfig
    generators: dict[str, Generator]
    db: Database
    pending_seeds: list[dict]
    seed_reasons: dict[str, str]
    seed_tier: int | None

    if TYPE_CHECKING:
        def _context(self, rng: random.Random) -> Context: ...

    def _make_seeds(self) -> None:
        """Seeds of every generator; fallback generators only where the others gave none.
        Where nothing seeds the op, seed_reasons says why, per generator."""
        for tier in sorted({g.tier for g in self.generators.values()}):
            self._seed_with([g for g in self.generators.values() if g.tier == tier])
            if self.pending_seeds:
                self.seed_tier = tier
                break
        self._drop_unused_fallbacks()

    def _drop_unused_fallbacks(self) -> None:
        """Generators of higher tiers than the one that seeded take no part in the search."""
        if self.seed_tier is not None:
            self.generators = {n: g for n, g in self.generators.items() if g.tier <= self.seed_tier}

    def no_seed_text(self) -> str:
        if not self.seed_reasons:
            return ""
        return "no generator seeds this op: " + "; ".join(f"{n}: {r}" for n, r in self.seed_reasons.items())

    def why_no_kernel(self) -> str:
        """A zero_pass's reason: each generator that gave no seed and why, how the others' failed."""
        if self.db.records:
            return self.db.failures(self.seed_reasons)
        if self.pending_seeds:  # seeded, then stopped (a time budget) before any was evaluated
            by = ", ".join(sorted({s["generator"] for s in self.pending_seeds}))
            return f"stopped before any of its {len(self.pending_seeds)} seed(s) ({by}) was evaluated"
        return self.no_seed_text()

    def _seed_with(self, generators: list[Generator]) -> None:
        ctx = self._context(random.Random(self.config.seed))
        seen = set()
        for gen in generators:
            try:
                proposals = initial_candidates_of(gen, ctx)
            except FarmError as exc:
                log.warning("generator %s gave no seeds for %s: %s", gen.name, self.ref.key, exc)
                self.seed_reasons[gen.name] = str(exc)
                continue
            if not proposals:
                try:
                    self.seed_reasons[gen.name] = no_initial_reason_of(gen, ctx)
                except Exception as exc:  # noqa: BLE001 - a reason is best effort
                    self.seed_reasons[gen.name] = f"no seed ({type(exc).__name__})"
            for p in proposals:
                h = normalized_hash(p.source)
                if h not in seen:
                    seen.add(h)
                    self.pending_seeds.append({"source": p.source, "generator": p.generator, "note": p.note})
