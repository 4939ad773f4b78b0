"""Every candidate of one op's search, the lineages they belong to, and what selection needs.

The whole database is plain data (`to_dict` / `from_dict`), so a checkpoint restores it
exactly, random-number state included.
"""

from __future__ import annotations

import ast
import hashlib
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from farm import pyast
from farm.generators.base import Candidate


def normalized_hash(source: str) -> str:
    """Identity of a candidate up to formatting and comments: the hash of its syntax tree,
    written back as code (ast.unparse is stable across Python versions; ast.dump is not)."""
    try:
        text = ast.unparse(pyast.parse(source))
    except SyntaxError:
        text = "\n".join(line.rstrip() for line in source.strip().splitlines())
    return hashlib.sha256(text.encode()).hexdigest()


@dataclass
class Record:
    id: str
    source: str
    generator: str
    note: str
    lineage: int
    generation: int
    parent: str | None
    source_hash: str
    verdict: str = "pending"
    reason: str = ""
    time_ms: float | None = None
    speedup_vs_model: float | None = None
    speedup_vs_reference: float | None = None
    timing: dict | None = None
    eval_s: float | None = None
    chunk: int = 0
    device: str = ""
    sandbox: str = ""  # the runner's operating-system boundary when it was judged: bwrap or none
    backward: dict | None = None  # training ops: how the backward was verified, fwd+bwd time and speedups
    inspirations: list[str] = field(default_factory=list)  # ids shown to the generator beside the parent
    comparison: dict | None = None  # how its speedups were measured (farm.evaluate.speedup)
    limit: dict | None = None  # the physical limit and the fraction of it reached
    stage_s: dict | None = None  # seconds in each evaluator stage: where a device-minute went

    @property
    def passed(self) -> bool:
        return self.verdict == "pass" and self.time_ms is not None

    @property
    def speedup(self) -> float:
        """The figure lineages compete on: against Model where it runs, else Reference."""
        return self.speedup_vs_model or self.speedup_vs_reference or 0.0

    def as_candidate(self) -> Candidate:
        """What a generator sees of this record."""
        return Candidate(id=self.id, source=self.source, generator=self.generator, verdict=self.verdict,
                         time_ms=self.time_ms, speedup=self.speedup, error=self.reason, lineage=self.lineage,
                         generation=self.generation, note=self.note)

    @classmethod
    def from_dict(cls, d: dict) -> "Record":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})  # old checkpoints load


@dataclass
class Database:
    records: dict[str, Record] = field(default_factory=dict)
    hashes: dict[str, str] = field(default_factory=dict)  # normalized hash -> record id
    selections: dict[str, int] = field(default_factory=dict)  # parent id -> times chosen
    lineage_submitted: dict[int, int] = field(default_factory=dict)
    next_id: int = 0

    def new_id(self) -> str:
        self.next_id += 1
        return f"c{self.next_id:04d}"

    def is_duplicate(self, source: str) -> bool:
        return normalized_hash(source) in self.hashes

    def add(self, record: Record) -> Record:
        self.records[record.id] = record
        self.hashes[record.source_hash] = record.id
        self.lineage_submitted[record.lineage] = self.lineage_submitted.get(record.lineage, 0) + 1
        return record

    # ------------------------------------------------------------ queries

    @property
    def submitted(self) -> int:
        return len(self.records)

    def passing(self, lineage: int | None = None) -> list[Record]:
        found = [r for r in self.records.values() if r.passed and (lineage is None or r.lineage == lineage)]
        # times of different modes never compete: a candidate that had to be timed per call in
        # an op timed in CUDA graphs ranks after every one timed in the op's mode
        return sorted(found, key=lambda r: (_off_mode(r), r.time_ms, r.id))

    def lineages(self) -> list[int]:
        return sorted({r.lineage for r in self.records.values()})

    def best(self) -> Record | None:
        passing = self.passing()
        return passing[0] if passing else None

    def best_ratio(self) -> float | None:
        """The highest ratio against the Model among passing candidates (the search's best so far)."""
        # the benchmark case's ratio, which a candidate's first rounds are held to (a serving mix's
        # geomean, farm.evaluate.mix_timing, is not measured in them)
        ratios = [((r.comparison or {}).get("model") or {}).get("ratio") or r.speedup_vs_model for r in self.passing()]
        known: list[float] = [r for r in ratios if r]
        return max(known) if known else None

    def failures(self, seed_reasons: dict[str, str] | None = None) -> str:
        """Why no candidate passed, per generator: its verdicts counted with the first reason of
        the most common one ("inductor: 2 of 2 failed: mismatch 2 (...)"), and each generator
        that gave no seed with its reason."""
        parts = []
        for gen in sorted({r.generator for r in self.records.values()}):
            mine = [r for r in self.records.values() if r.generator == gen and r.verdict != "pending"]
            failed = [r for r in mine if not r.passed]
            if not failed:
                continue
            counts: dict[str, int] = {}
            for r in failed:
                counts[r.verdict] = counts.get(r.verdict, 0) + 1
            top = max(counts, key=lambda v: counts[v])
            reason = next(r.reason for r in failed if r.verdict == top).strip().splitlines()
            tally = ", ".join(f"{v} {n}" for v, n in sorted(counts.items(), key=lambda kv: -kv[1]))
            parts.append(f"{gen}: {len(failed)} of {len(mine)} failed: {tally}"
                         + (f" ({reason[-1][:200]})" if reason else ""))
        parts += [f"{name}: no seed: {why}" for name, why in (seed_reasons or {}).items()]
        return "no passing kernel: " + "; ".join(parts)

    def children(self, parent_id: str) -> list[Record]:
        return [r for r in self.records.values() if r.parent == parent_id]

    # ------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {"records": [asdict(r) for r in self.records.values()], "selections": self.selections,
                "lineage_submitted": {str(k): v for k, v in self.lineage_submitted.items()}, "next_id": self.next_id}

    @classmethod
    def from_dict(cls, d: dict) -> "Database":
        db = cls(selections=dict(d.get("selections", {})), next_id=d.get("next_id", 0),
                 lineage_submitted={int(k): v for k, v in d.get("lineage_submitted", {}).items()})
        for raw in d.get("records", []):
            rec = Record.from_dict(raw)
            db.records[rec.id] = rec
            db.hashes[rec.source_hash] = rec.id
        return db


def _off_mode(rec: Record) -> bool:
    timing = rec.timing or {}
    return bool(timing.get("op_mode")) and timing.get("mode") != timing.get("op_mode")
