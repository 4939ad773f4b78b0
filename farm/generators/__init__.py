"""Candidate generators: plug-ins with one interface (farm.generators.base.Generator).

Built in: tune (knobs of any Triton source), port (CUDA Triton -> triton-ascend rewrite
passes), inductor (Triton from torch.compile of Reference), llm (any OpenAI-compatible
endpoint). Others register under the entry-point group `farm.generators`.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points

from farm.config_checks import did_you_mean
from farm.errors import FarmError
from farm.generators.base import Candidate, Context, Generator, Proposal

BUILTIN = {
    "tune": "farm.generators.tune:TuneGenerator",
    "port": "farm.generators.port:PortGenerator",
    "inductor": "farm.generators.inductor.generator:InductorGenerator",
    "llm": "farm.generators.llm.generator:LLMGenerator",
}
OFFLINE_DEFAULT = ("tune", "port", "inductor")
# --generators default: tune and port rework a Triton Model, inductor compiles the op's PyTorch
# truth (Reference, AKG's comparison class, or a PyTorch Model), all seeding side by side so
# that compile's kernels compete with the original's and tune refines both; with an LLM
# endpoint configured the CLI adds ">llm" for ops nothing seeds
DEFAULT_CHAIN = ",".join(OFFLINE_DEFAULT)
# on an interpreted target (cpu) inductor seeds only the ops tune and port cannot: its
# interpreter timings rank nothing, and each capture costs a CPU minute
INTERPRETED_CHAIN = "tune,port>inductor"

__all__ = ["Candidate", "Context", "Generator", "Proposal", "load_generator", "available"]


def available() -> dict[str, str]:
    found = dict(BUILTIN)
    for ep in entry_points(group="farm.generators"):
        found.setdefault(ep.name, ep.value)
    return found


def load_generator(name: str, **options) -> Generator:
    spec = available().get(name)
    if spec is None:
        raise FarmError(f"unknown generator '{name}' (--generators{did_you_mean(name, available())}); available: "
                        f"{', '.join(sorted(available()))}")
    module_name, _, attr = spec.partition(":")
    try:
        cls = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise FarmError(f"generator '{name}' cannot be loaded from {spec}: {exc}") from exc
    return cls(**options)
