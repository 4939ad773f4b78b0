"""Drawing a task's arguments: seeded, checked, and deterministic even where get_inputs()
allocates with torch.empty.

May import: farm.corpus.tasks and lower stages.
"""

from __future__ import annotations

import contextlib

from farm.corpus import tasks as taskfiles
from farm.errors import TaskError
from farm.runtime import pointers
from farm.runtime.tensors import GENERATOR, same_values, seed_all

_DRAWING = GENERATOR  # seeding and drawing take turns with every other use (farm.runtime.tensors)


def draw_init_inputs(task: taskfiles.Task, seed: int) -> list:
    with _DRAWING:
        seed_all(seed)
        init_inputs = task.init_inputs()
    taskfiles.check_init_arity(task, init_inputs)
    return init_inputs


@contextlib.contextmanager
def filled_uninitialised_memory():
    """While get_inputs() runs, torch.empty and friends return memory filled with a known value
    (NaN, or the largest integer) instead of whatever the allocator held: AKG's files pass
    output buffers made with torch.empty, and those must be the same for the same seed. What
    the Model saw is what the .pt stores, so nothing depends on the fill value."""
    import warnings

    import torch

    before = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
              torch.utils.deterministic.fill_uninitialized_memory)
    _deterministic(True, warn_only=True)  # warn_only: no op of get_inputs() is refused
    torch.utils.deterministic.fill_uninitialized_memory = True
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        _deterministic(before[0], warn_only=before[1])
        torch.utils.deterministic.fill_uninitialized_memory = before[2]


def _deterministic(mode: bool, warn_only: bool) -> None:
    """torch.use_deterministic_algorithms without its import of Inductor's config, there only to
    set Inductor's own flag (torch._dynamo and Triton come with it: about 2 CPU-seconds of every
    `farm run` and task child that draws inputs; nothing compiles while they are drawn). Where
    Inductor is loaded already, or torch lacks the setter, the public call."""
    import sys

    import torch

    setter = getattr(torch._C, "_set_deterministic_algorithms", None)
    if setter is None or "torch._inductor.config" in sys.modules:
        torch.use_deterministic_algorithms(mode, warn_only=warn_only)
    else:
        setter(mode, warn_only=warn_only)


def draw_seeded(task: taskfiles.Task, seed: int) -> list:
    with _DRAWING:
        seed_all(seed)
        with filled_uninitialised_memory(), pointers.watching_addresses() as seen:
            inputs = task.inputs()
    # addresses as values become tokens: the same for the same seed, storable (farm.runtime.pointers)
    return pointers.encode(inputs, seen)


def draw_inputs(task: taskfiles.Task, seed: int) -> list:
    """Seeded forward inputs, checked: CPU tensors, and the same values for the same seed."""
    import torch

    inputs = draw_seeded(task, seed)
    for i, v in enumerate(inputs):
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            raise TaskError(task.ref.path, "get_inputs() must return CPU tensors", f"input {i} is on {v.device}")
    again = draw_seeded(task, seed)
    if not same_values(inputs, again):
        # once more before calling the task nondeterministic: a thread of the process (a
        # compiler's worker) that draws from torch's global generator between the seeding and
        # the draw spoils one pair of draws, not every pair
        inputs = draw_seeded(task, seed)
        again = draw_seeded(task, seed)
    if not same_values(inputs, again):
        differ = [i for i, (a, b) in enumerate(zip(inputs, again)) if not same_values(a, b)]
        raise TaskError(task.ref.path, "get_inputs() must be deterministic under torch.manual_seed",
                        f"two calls with the same seed gave different values (inputs {differ}), twice")
    return inputs

