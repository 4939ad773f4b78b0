"""Inside a runner (farm.evaluate.runner_child): the task's own Model and Reference, built
once per runner and kept.

The trusted runner used to rebuild the task's class for every run it was asked for: each
fresh input set's Reference run, each baseline, each kept slot. A rebuild unloads what was there
first (a full garbage collection and an emptied allocator cache: 0.14 s on the H100 host,
bench/runner_overheads.py), so an op's fixed costs held the device for seconds of
rebuilding. A built class is the same module every time (same file, same
`manual_seed(0)` initialisation), so it is kept by what built it and handed out again, as
the current model or as a slot."""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch


class TrustedMixin:
    """Mixed into runner_child.ChildRunner: uses its `_instantiate`, `unload`, `models`, `graphs`."""

    # the ChildRunner's, set by its __init__
    model: torch.nn.Module | None
    models: dict[str, torch.nn.Module]
    graphs: dict[tuple, Any]
    built: dict[tuple, torch.nn.Module]

    if TYPE_CHECKING:
        def _instantiate(self, cls: type, init_inputs: list) -> dict: ...
        def unload(self) -> dict: ...

    def load_task(self, path: str, source: str, shapes: str, which: str, init_inputs: list,
                  policy=None, slot: str | None = None,
                  reference: str | None = None) -> dict:
        """Load the task's Model or Reference as the current model, or, with `slot`, keep it
        under that name beside the others (the baselines that candidates are compared with).
        What was built before with the same arguments is that very module again."""
        key = (path, hashlib.sha256((source or "").encode()).hexdigest(), shapes, which, repr(policy), reference,
               repr(init_inputs))
        built = self.built.get(key)
        if built is None:
            reply = self._build(path, source, shapes, which, init_inputs, policy, slot, reference)
            if not reply["ok"]:
                return reply
            built = self.built[key] = reply.pop("model")
        if slot is None:
            self.model = built
        elif self.models.get(slot) is not built:
            self.models[slot] = built
            self.graphs = {k: v for k, v in self.graphs.items() if k[0] != slot}  # captured on another module
        return {"ok": True}

    def _build(self, path: str, source: str, shapes: str, which: str, init_inputs: list, policy, slot: str | None,
               reference: str | None) -> dict:
        from farm.corpus import tasks as taskfiles

        if slot is None:
            self.unload()
        task = taskfiles.load_task(taskfiles.ref_from_file(path, source, policy=policy), shapes, reference=reference)
        cls = task.model_cls if which == "Model" else task.truth_cls
        current = self.model
        reply = self._instantiate(cls, init_inputs)
        if reply["ok"]:
            reply["model"] = self.model
        self.model = current
        return reply
