"""The built-in targets: cuda (farm.targets.cuda), cpu (here) and ascend (farm.ascend.target).

Ascend lives with the rest of Ascend in farm.ascend, a stage above this one: it is registered
here by name and loaded on first use, as an entry point would be (farm.targets.available).
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import resources

from farm.targets.base import Target
from farm.targets.cuda import CUDA


@dataclass(frozen=True)
class CpuTarget(Target):
    """Triton's interpreter on the host: real semantics, host-clock timings that only order candidates."""

    def prompt_text(self) -> str:
        return resources.files("farm.targets").joinpath("prompt_cpu.txt").read_text(encoding="utf-8")


# Hide GPUs from CPU children so nothing initialises a device by accident. Big blocks are merely
# slow in the interpreter; inductor's Triton output runs there too (farm.generators.inductor.capture).
CPU = CpuTarget("cpu", "cpu", None, 0, interpret=True, max_block=4096, inductor_modes=("default",),
                child_env={"TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""})

BUILTIN: dict[str, Target] = {t.name: t for t in (CUDA, CPU)}
# built-in targets that live in a higher stage, as "module:attribute", imported on first use
LAZY = ("farm.ascend.target:ASCEND",)
ORDER = ("cuda", "ascend", "cpu")  # how they are listed (and probed for --device auto)
