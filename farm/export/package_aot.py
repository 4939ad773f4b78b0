"""Build and run the AOT-compiled C of an op (copied into an exported package as `_aot.py`).

build(folder): generate.sh where no C sources exist yet, then build.sh -> lib<op>.so.
replay(folder, case): load the library with ctypes and make the recorded launches (aot.json
"calls") on the stored inputs through the linked dispatchers; returns the op's outputs.
Imports nothing of Kernel Farm.
"""

from __future__ import annotations

import ctypes
import json
import struct
import subprocess
from pathlib import Path

import torch

C_TYPES = {
    "CUdeviceptr": ctypes.c_uint64, "int8_t": ctypes.c_int8, "int16_t": ctypes.c_int16, "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64, "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32,
    "uint64_t": ctypes.c_uint64, "float": ctypes.c_float, "double": ctypes.c_double,
}
TORCH_DTYPES = {name: getattr(torch, name) for name in (
    "float32", "float16", "bfloat16", "float64", "int8", "int16", "int32", "int64", "uint8", "bool")}


def plan(folder: Path) -> dict:
    return json.loads((Path(folder) / "aot.json").read_text())


def library(folder: Path) -> Path:
    return Path(folder) / f"lib{plan(folder)['op_c']}.so"


def build(folder: Path) -> Path:
    folder = Path(folder)
    doc = plan(folder)
    if not doc.get("generated") or not any((folder / "src").glob("*.c")):
        _sh(folder / "generate.sh")
    _sh(folder / "build.sh")
    return library(folder)


def _sh(script: Path) -> None:
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{script} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")


def _scalar(c_type: str, triton_type: str, value):
    if triton_type == "fp32" and c_type == "double":
        # Triton >= 3.4: declared double, read as 4 bytes by the kernel (see <op>.h, kfarm_f32_arg)
        return struct.unpack("<d", struct.pack("<f", float(value)) + b"\0\0\0\0")[0]
    return value


def replay(folder: Path, case: dict) -> list:
    """The recorded launches on `case` (inputs already on the GPU); returns the outputs on the CPU."""
    folder = Path(folder)
    doc = plan(folder)
    if not doc.get("testable"):
        raise RuntimeError(f"{folder}: no stored-output test for this op: {doc.get('not_testable')}")
    try:  # the library calls the driver API; make libcuda's symbols visible to it whether or not it links it
        ctypes.CDLL("libcuda.so.1", mode=ctypes.RTLD_GLOBAL)
    except OSError:
        pass
    lib = ctypes.CDLL(str(library(folder)))
    inputs = case["inputs"]
    device = next(t.device for t in inputs if isinstance(t, torch.Tensor))
    tensors = {f"input:{i}": t for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)}
    outputs = []
    for j, spec in enumerate(doc["outputs"]):
        alias = next((a["input"] for c in doc["calls"] for a in c["args"]
                      if a.get("tensor") == f"output:{j}" and a.get("input")), None)
        if alias:
            out = tensors[alias]
        else:
            out = torch.empty_strided(spec["shape"], spec["stride"], dtype=TORCH_DTYPES[spec["dtype"]], device=device)
            out.zero_()
        tensors[f"output:{j}"] = out
        outputs.append(out)
    stream = torch.cuda.current_stream(device).cuda_stream
    variants = {(k["kernel"], v["signature"]): v for k in doc["kernels"] for v in k["variants"]}
    for call in doc["calls"]:
        v = variants[(call["kernel"], call["signature"])]
        fn = getattr(lib, v["entry"])
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_void_p] + [C_TYPES[c["type"]] for c in v["c_args"]]
        values = []
        for arg, c in zip(call["args"], v["c_args"]):
            if "tensor" in arg:
                values.append(tensors[arg["tensor"]].data_ptr() + arg["offset"])
            else:
                values.append(_scalar(c["type"], arg["type"], arg["value"]))
        rc = fn(ctypes.c_void_p(stream), *values)
        if rc != 0:
            raise RuntimeError(f"{v['entry']} returned CUresult {rc}")
    torch.cuda.synchronize(device)
    return [o.cpu() for o in outputs]
