"""Record the Triton launches of a kernel module on a stored seed set: which kernel, the value
and type of each argument, constexprs, grid, warps and stages. The AOT export turns one launch
into a Triton AOT signature (`*fp32:16, i32, 128, ...`).

Runs in a child process (`python -m farm.export.launches SPEC.json OUT.json`): the kernel is
untrusted code and, on CUDA, a fault must not take the export down. The child records every
JITFunction.run (InterpretedFunction.run under TRITON_INTERPRET=1, which is how CPU CI checks
signature extraction) and maps each tensor argument to an input or output of the forward by
its address.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import sys
from pathlib import Path
from typing import Any

# torch dtype name -> Triton's type name in AOT signatures
TRITON_DTYPE = {
    "float32": "fp32", "float16": "fp16", "bfloat16": "bf16", "float64": "fp64",
    "float8_e4m3fn": "fp8e4nv", "float8_e5m2": "fp8e5",
    "int8": "i8", "int16": "i16", "int32": "i32", "int64": "i64",
    "uint8": "u8", "uint16": "u16", "uint32": "u32", "uint64": "u64", "bool": "i1",
}


def int_type(value: int) -> str:
    """The type Triton's JIT gives a Python int argument."""
    if -(2**31) <= value < 2**31:
        return "i32"
    if -(2**63) <= value < 2**63:
        return "i64"
    return "u64"


class Recorder:
    """Wraps the launch entry points; `launches` holds one dict per launch, in order."""

    def __init__(self) -> None:
        self.launches: list[dict] = []
        self._originals: list[tuple[Any, Any]] = []  # (Triton's launcher class, its run)

    def install(self) -> None:
        from triton.runtime.jit import JITFunction

        classes = [JITFunction]
        try:
            from triton.runtime.interpreter import InterpretedFunction

            classes.append(InterpretedFunction)
        except ImportError:
            pass
        recorder = self
        for cls in classes:
            original = cls.run
            self._originals.append((cls, original))

            def run(fn, *args, _original=original, **kwargs):
                if kwargs.get("warmup"):
                    return _original(fn, *args, **kwargs)
                entry = recorder.describe(fn, args, kwargs)
                result = _original(fn, *args, **kwargs)
                meta = getattr(result, "metadata", None)
                for key in ("num_warps", "num_stages"):
                    if meta is not None and getattr(meta, key, None) is not None:
                        entry[key] = int(getattr(meta, key))
                recorder.launches.append(entry)
                return result

            cls.run = run

    def uninstall(self) -> None:
        for cls, original in self._originals:
            cls.run = original

    def describe(self, fn, args: tuple, kwargs: dict) -> dict:
        py = getattr(fn, "fn", fn)
        sig = inspect.signature(py)
        call_kwargs = {k: v for k, v in kwargs.items() if k in sig.parameters}
        bound = sig.bind(*args, **call_kwargs)
        bound.apply_defaults()
        constexpr = _constexpr_flags(fn, sig)
        no_spec = set(getattr(fn, "do_not_specialize", ()) or ())
        arguments = []
        for i, (name, value) in enumerate(bound.arguments.items()):
            arguments.append(describe_arg(name, value, constexpr[i], i in no_spec or name in no_spec))
        grid = kwargs["grid"]
        if callable(grid):
            grid = grid(dict(bound.arguments))
        grid = [int(g) for g in (list(grid) + [1, 1, 1])[:3]]
        return {"kernel": py.__name__, "file": inspect.getsourcefile(py), "args": arguments, "grid": grid,
                "num_warps": int(kwargs.get("num_warps") or 4), "num_stages": int(kwargs.get("num_stages") or 3)}


def _constexpr_flags(fn, sig: inspect.Signature) -> list[bool]:
    params = getattr(fn, "params", None)
    if params and all(hasattr(p, "is_constexpr") for p in params):
        return [bool(p.is_constexpr) for p in params]
    import triton.language as tl

    return [p.annotation is tl.constexpr or "constexpr" in str(p.annotation) for p in sig.parameters.values()]


def describe_arg(name: str, value: Any, constexpr: bool, no_specialize: bool = False) -> dict:
    import torch

    if constexpr:
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"name": name, "kind": "constexpr", "value": value}
        return {"name": name, "kind": "constexpr", "value": repr(value), "unsupported": True}
    if isinstance(value, torch.Tensor):
        dtype = str(value.dtype).removeprefix("torch.")
        return {"name": name, "kind": "tensor", "dtype": dtype, "type": "*" + TRITON_DTYPE.get(dtype, dtype),
                "ptr": int(value.data_ptr()), "shape": list(value.shape), "stride": list(value.stride()),
                "aligned16": value.data_ptr() % 16 == 0, "no_specialize": no_specialize}
    if isinstance(value, bool):
        return {"name": name, "kind": "scalar", "type": "i1", "value": value, "no_specialize": True}
    if isinstance(value, int):
        return {"name": name, "kind": "scalar", "type": int_type(value), "value": value, "no_specialize": no_specialize}
    if isinstance(value, float):
        return {"name": name, "kind": "scalar", "type": "fp32", "value": value, "no_specialize": True}
    return {"name": name, "kind": "unsupported", "type": type(value).__name__, "value": repr(value)[:80]}


def locate(ptr: int, tensors: list[tuple[str, Any]]) -> dict | None:
    """Which input/output tensor's storage holds address `ptr`, and at what byte offset."""
    for label, t in tensors:
        start = t.data_ptr()
        size = t.untyped_storage().nbytes() - t.storage_offset() * t.element_size()
        if start <= ptr < start + max(size, 1):
            return {"of": label, "offset": ptr - start}
    return None


def _tensors_of(prefix: str, values: list) -> list[tuple[str, Any]]:
    import torch

    return [(f"{prefix}:{i}", v) for i, v in enumerate(values) if isinstance(v, torch.Tensor)]


def record(kernel_file: str, pt_file: str, device: str) -> dict:
    """Run ModelNew of `kernel_file` on the seed set `pt_file` on `device`; every launch, mapped."""
    import torch

    data = torch.load(pt_file, weights_only=True)
    spec = importlib.util.spec_from_file_location("_kfarm_kernel", kernel_file)
    assert spec is not None and spec.loader is not None  # a .py path always has both
    module = importlib.util.module_from_spec(spec)
    sys.modules["_kfarm_kernel"] = module
    recorder = Recorder()
    recorder.install()
    try:
        spec.loader.exec_module(module)
        torch.manual_seed(0)
        model = module.ModelNew(*data.get("init_inputs", [])).to(device).eval()
        inputs = [v.to(device) if isinstance(v, torch.Tensor) else v for v in data["inputs"]]
        with torch.no_grad():
            result = model(*inputs)
        getattr(torch, torch.device(device).type).synchronize()  # torch.cuda's, or torch.cpu's no-op
    finally:
        recorder.uninstall()
    outputs = list(result) if isinstance(result, (list, tuple)) else [result]
    # Outputs first: an in-place op returns its input, and the test must read the result there.
    known = _tensors_of("output", outputs) + _tensors_of("input", inputs)
    for launch in recorder.launches:
        for arg in launch["args"]:
            if arg["kind"] == "tensor":
                arg["at"] = locate(arg["ptr"], known)
                where_in = locate(arg["ptr"], _tensors_of("input", inputs))
                arg["input_at"] = where_in
    return {"launches": recorder.launches, "kernel_file": kernel_file, "device": device,
            "outputs": [{"dtype": str(o.dtype).removeprefix("torch."), "shape": list(o.shape), "stride": list(o.stride())}
                        if isinstance(o, torch.Tensor) else {"value": repr(o)} for o in outputs]}


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text())
    out = record(spec["kernel_file"], spec["pt_file"], spec["device"])
    Path(argv[1]).write_text(json.dumps(out, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
