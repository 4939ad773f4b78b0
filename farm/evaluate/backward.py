"""The backward half of a training op's evaluation (tasks with BACKWARD = True).

A candidate for such a task must be differentiable with Triton kernels in both directions
(typically a torch.autograd.Function whose forward and backward launch them). After the
forward checks pass, its input and parameter gradients, for the stored upstream gradient,
are compared with the reference's: on the .pt, then on the secret fresh inputs against
Reference run on the target with an upstream gradient the candidate has never seen. A
backward that launches no Triton kernel is PyTorch autograd of PyTorch ops, not a kernel for
the backward (verdict cheat), and so is one whose gradients do not change when every Triton
launch in it is skipped. Then forward + backward is timed on the fresh sets.

Gradient tolerance: the forward tolerance of the gradient's dtype (a task's TOLERANCE
included) times GRAD_TOLERANCE_SCALE. Gradients sum over the batch (a weight's gradient adds
one term per row), so a correct kernel that accumulates in another order drifts further than
a forward output does; the scale admits that and not a wrong mask or a missing term.
"""

from __future__ import annotations

import secrets
from typing import Any

from farm.runtime import grads
from farm.runtime.grads import GRAD_TOLERANCE_SCALE, grad_tolerance


def flat_grads(reply: dict[str, Any], names: list[str]) -> list:
    """Input gradients then parameter gradients in `names` order, one list to compare."""
    params = reply.get("grad_params") or {}
    return list(reply.get("grad_inputs") or []) + [params.get(n) for n in names]


def mismatches(got: dict, expected: dict, tolerance: dict) -> str:
    names = sorted(expected.get("grad_params") or {})
    missing = sorted(set(names) - set(got.get("grad_params") or {}))
    if missing:
        return f"no gradient for parameter(s) {', '.join(missing)}"
    labels = [f"input {i}" for i in expected["indices"]] + [f"parameter {n}" for n in names]
    return grads.grad_failures(list(zip(labels, flat_grads(got, names), flat_grads(expected, names))), tolerance)


class BackwardCheck:
    """Verifies and times one candidate's backward for an Evaluator of a BACKWARD task."""

    def __init__(self, ev: Any):  # farm.evaluate.evaluator.Evaluator, which imports this module
        self.ev = ev
        self.tolerance = grad_tolerance(ev.task.tolerance)
        data = ev.data
        self.indices = list(data.get("grad_input_indices") or grads.grad_indices(ev.task.grad_inputs, ev.inputs))
        self.pt_case = {"indices": self.indices, "grad_outputs": data.get("grad_outputs"),
                        "grad_inputs": data.get("grad_inputs"), "grad_params": data.get("grad_params") or {}}
        self._fresh: list[dict] | None = None

    def fresh(self) -> list[dict]:
        """Reference's gradients on the secret input sets, for upstream gradients of their own."""
        if self._fresh is None:
            ev, cases = self.ev, []
            for i, (inputs, expected) in enumerate(ev.fresh_cases()):
                upstream = grads.upstream(expected, secrets.randbelow(2**31 - 1))
                reply = ev.reference_backward(f"seed{i}", inputs, self.indices, upstream)
                cases.append({"indices": self.indices, "grad_outputs": upstream, **reply})
            self._fresh = cases
        return self._fresh

    def verify(self, result: Any, stop) -> None:
        ev = self.ev
        if self.pt_case["grad_outputs"] is None:
            raise stop("runtime_error", "the reference data has no gradients: regenerate it "
                                        "(farm reference --force) with this farm version")
        got = self._run("pt", ev.inputs, self.pt_case, stop)
        self._judge(got, self.pt_case, "against the reference data's gradients (.pt)", stop)
        for i, case in enumerate(self.fresh()):
            got = self._run(f"seed{i}", ev.fresh_cases()[i][0], case, stop)
            self._judge(got, case, f"fresh input set {i + 1}: gradients against Reference on the target", stop)
        if self.fresh():
            last = len(self.fresh()) - 1
            ghost = ev._call("run_backward", ev.settings.limits.run_s, f"seed{last}", ev.fresh_cases()[last][0],
                             indices=self.indices, grad_outputs=self.fresh()[last]["grad_outputs"], ghost=True)
            names = sorted(self.pt_case["grad_params"])
            if ghost.get("grad_inputs") is not None and _same(flat_grads(ghost, names), flat_grads(got, names)):
                raise stop("cheat", "the gradients are the same with every Triton launch in backward skipped: "
                                    "the backward kernels do not compute them")
        result.backward = {"verified": True, "seeds_checked": len(self.fresh()), "kernels": got["kernels_backward"],
                           "tolerance_scale": GRAD_TOLERANCE_SCALE}

    def _run(self, key: str, inputs: list, case: dict, stop) -> dict:
        return self.ev._call("run_backward", self.ev.settings.limits.run_s, key, inputs, indices=self.indices,
                             grad_outputs=case["grad_outputs"])

    def _judge(self, got: dict, case: dict, what: str, stop) -> None:
        if got["launches_backward"] == 0:
            raise stop("cheat", f"backward launched no Triton kernel ({what.split(':')[0]}): PyTorch autograd of "
                                "PyTorch ops is not a kernel for the backward")
        failures = mismatches(got, case, self.tolerance)
        if failures:
            raise stop("mismatch", f"{what}: {failures}")

    def timing_options(self, upstream: list | None = None) -> dict:
        if upstream is None:
            upstream = (self.fresh()[0] if self.fresh() else self.pt_case)["grad_outputs"]
        return {**self.ev.settings.timing, "backward": {"indices": self.indices, "grad_outputs": upstream}}

    def time(self, result: Any, stop) -> None:
        """Forward + backward on the fresh sets, as a training step pays for the op."""
        ev = self.ev
        keys = [f"seed{i}" for i in range(len(ev.fresh_cases()))] or ["pt"]
        reply = ev._call("time", ev.settings.limits.time_s, keys=keys, options=self.timing_options(),
                         inplace_args=ev.task.inplace_args)
        if reply["launches"] < 2 * reply["min_calls"]:
            raise stop("cheat", f"{reply['min_calls']} timed forward+backward calls launched only "
                                f"{reply['launches']} Triton kernels")
        result.timing_backward = reply["stats"]

    def speedups(self, result: Any) -> None:
        """Forward+backward against the baselines' per-call figures. Not yet an interleaved
        comparison like the forward's (farm.evaluate.speedup); labelled as a division in the result."""
        base = self.ev.baseline()
        fwd_bwd = (result.timing_backward or {}).get("median_ms")
        if not fwd_bwd:
            return
        if base.get("model_fwd_bwd_ms"):
            result.speedup_fwd_bwd_vs_model = base["model_fwd_bwd_ms"] / fwd_bwd
        if base.get("reference_fwd_bwd_ms"):
            result.speedup_fwd_bwd_vs_reference = base["reference_fwd_bwd_ms"] / fwd_bwd
        result.timing_backward["speedup_method"] = "per-call events, baseline timed separately (not interleaved)"


def _same(a: list, b: list) -> bool:
    import torch

    return all((x is None and y is None) or (x is not None and y is not None and torch.equal(x, y))
               for x, y in zip(a, b))
