"""The generator interface.

A generator turns what the search knows (the task, the target's rules, a parent candidate,
inspirations from other lineages, recent errors) into proposals: full candidate sources
defining `class ModelNew`. Generators never evaluate; the evaluator judges every proposal.
"""

from __future__ import annotations

import random
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Proposal:
    source: str  # a complete module defining class ModelNew(nn.Module)
    generator: str  # name of the generator that made it
    note: str = ""  # what changed, in a few words ("BLOCK 128->256")


@dataclass
class Candidate:
    """What generators may read of an evaluated candidate."""

    id: str
    source: str
    generator: str
    verdict: str
    time_ms: float | None = None
    speedup: float | None = None
    error: str = ""
    lineage: int = 0
    generation: int = 0
    note: str = ""


@dataclass
class Context:
    task_code: str  # the task file's text (Model, Reference, get_inputs, ...)
    op: str
    source: str  # corpus source name (sglang, vllm_triton, ...)
    target: str  # cuda, ascend, cpu
    device: dict[str, Any] = field(default_factory=dict)  # sm_count / num_vectorcore / cores
    rng: random.Random = field(default_factory=random.Random)
    recent_errors: list[str] = field(default_factory=list)
    shape_policy: Any = None  # farm.corpus.shapes.ShapePolicy of the task (how its small shapes are made)

    @property
    def task_doc(self) -> str:
        match = re.match(r'\s*(?:"""|\'\'\')(.*?)(?:"""|\'\'\')', self.task_code, re.S)
        return match.group(1).strip() if match else ""

    @property
    def task_source(self) -> str:
        """task_code's earlier name: generators written against it keep working."""
        return self.task_code


class Generator(ABC):
    name: str = "generator"
    # seeding tier: tier n seeds an op only when every generator of lower tiers gave no seed
    # (--generators "tune,port>inductor>llm"); every generator of the tier that seeded proposes
    tier: int = 0

    def initial_candidates(self, ctx: Context) -> list[Proposal]:
        """The op's first candidates (generation 0); each starts a lineage. Default: none."""
        return []

    def no_initial_reason(self, ctx: Context) -> str:
        """Why initial_candidates(ctx) gave nothing, in a few words, for the run's table and report.json."""
        return "it makes no initial candidates"

    # The earlier names of the two above, for plug-ins written against them: called, they answer
    # as the new ones do; overridden (also in a subclass of a built-in generator), the search asks
    # through them (initial_candidates_of, no_initial_reason_of).
    def seeds(self, ctx: Context) -> list[Proposal]:
        return self.initial_candidates(ctx)

    def no_seed_reason(self, ctx: Context) -> str:
        return self.no_initial_reason(ctx)

    @abstractmethod
    def propose(self, parent: Candidate, inspirations: list[Candidate], ctx: Context, n: int = 1) -> list[Proposal]:
        """Up to n new candidates derived from parent (and inspirations)."""


def _overrides(gen: Generator, name: str) -> bool:
    return getattr(type(gen), name) is not getattr(Generator, name)


def initial_candidates_of(gen: Generator, ctx: Context) -> list[Proposal]:
    """What the search asks a generator for first: seeds() where it still overrides that name."""
    return gen.seeds(ctx) if _overrides(gen, "seeds") else gen.initial_candidates(ctx)


def no_initial_reason_of(gen: Generator, ctx: Context) -> str:
    return gen.no_seed_reason(ctx) if _overrides(gen, "no_seed_reason") else gen.no_initial_reason(ctx)


_MODEL_NAME = re.compile(r"\bModel\b")


def model_as_candidate(task_code: str) -> str:
    """The task's own Model as a candidate: the class renamed ModelNew, the rest unchanged."""
    return _MODEL_NAME.sub("ModelNew", task_code)
