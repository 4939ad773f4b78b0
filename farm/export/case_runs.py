"""Run an exported kernel at the cases of its shape space, in a child process:

    python -m farm.export.case_runs SPEC.json

SPEC names the kernel file, an inputs file (torch.save of {"init_inputs", "cases": [{"inputs",
"grad_indices", "upstream"}]}) and an output file. The child builds ModelNew under seed 0 (as
the package builds it), runs its forward on each case (and, for a training op, the backward
with the given upstream gradient) and saves what came out, tensors only. The parent loads it
weights_only and judges it (farm.export.envelope): the kernel is untrusted code, and nothing
it could do in here decides a verdict.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path


def run(spec: dict) -> None:
    import torch

    from farm.runtime.grads import forward_backward
    from farm.runtime.tensors import clone_values, to_cpu, to_device
    from farm.runtime.tolerance import as_output_list

    data = torch.load(spec["inputs_file"], weights_only=True)
    module_spec = importlib.util.spec_from_file_location("_kfarm_case_kernel", spec["kernel_file"])
    assert module_spec is not None and module_spec.loader is not None  # a .py path always has both
    module = importlib.util.module_from_spec(module_spec)
    sys.modules["_kfarm_case_kernel"] = module
    module_spec.loader.exec_module(module)
    device = spec["device"]
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = module.ModelNew(*data["init_inputs"]).to(device).eval()
    results = []
    for case in data["cases"]:
        inputs = to_device(clone_values(case["inputs"]), device)
        try:
            if case.get("grad_indices") is not None:
                raw, _, grad_inputs, grad_params = forward_backward(model, inputs, list(case["grad_indices"]),
                                                                    case["upstream"], 0, device)
                results.append({"outputs": as_output_list(to_cpu(raw)), "grad_inputs": grad_inputs,
                                "grad_params": grad_params})
            else:
                with torch.no_grad():
                    results.append({"outputs": as_output_list(to_cpu(model(*inputs)))})
        except Exception as exc:  # noqa: BLE001 - the kernel's failure at this case is the verdict
            results.append({"error": f"{type(exc).__name__}: {exc}".splitlines()[0][:300]})
    torch.save({"results": results}, spec["output_file"])



def main(argv: list[str]) -> int:
    run(json.loads(Path(argv[0]).read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
