"""Inputs drawn on the reference device, and the compact form of large reference data.

KernelBench's level 1 draws up to 16 GiB of inputs per op: on the host that is tens of seconds of
single-threaded random numbers and a serialisation per op while the device waits. So inputs are
drawn where AKG's generator draws them, with the reference device as torch's default device,
and recorded (`input_recipe`): the seed, where they were drawn (device type and name, torch
version) and a digest of every input. Where a task builds its inputs on the host anyway (numpy,
`torch.tensor(list)`, an explicit `device="cpu"`), or its draw does not repeat on the device,
they are drawn on the host as before.

A `.pt` ships its inputs and outputs in full (AKG's `save_inputs: True` form) unless all of:
  - inputs and outputs together exceed `reference.ship_max_mb`;
  - the task's truth runs on the target (mode `reference` or `model`: not reference-data mode,
    whose recorded outputs are the only truth there is);
  - it is not a training op (its gradients are recorded in full).
Then it is compact: AKG's `save_inputs: False` form (no `inputs`; `outputs` empty, so AKG's
verifier runs the original itself, as it does for a file without reference outputs), with the
recipe and, per output, its digest and an evenly spaced sample of elements (`output_samples`).
A target on the same device and torch redraws the inputs from the seed (`redraw`): equal digests
prove they are the recorded ones, and the target's truth is checked against the samples within
tolerance (`check_samples`). Elsewhere (another device draws other numbers) the target draws
its own inputs from the seed and its own truth judges candidates, as for fresh inputs.

The digest is exact, not cryptographic: the .pt that holds it is sha256-checked; the digest
only has to tell a redraw that differs. It is computed on the device that holds the tensor, the
same on every device: 32-bit words split into 16-bit halves, summed plain and weighted by
position within rows of 2^20 words, in int64 with no overflow, then sha256 over the sums.
"""

from __future__ import annotations

import hashlib
from typing import Any

from farm.errors import FarmError, TaskError

SAMPLE = 4096  # output elements kept per tensor in the compact form
ROW = 1 << 20  # words weighted by position within a row (2^16 * 2^20 * 2^20 < 2^63)
BLOCK_ROWS = 16  # rows digested at once: 16 Mi words, 128 MiB per int64 temporary
SPAN = 1024  # positions summed by one matrix product (row_sums)
GEMM_DEVICES = ("cpu", "cuda")  # float64 matrix products exact and fast: row_sums; elsewhere _row_sums_int
DEVICE_HEADROOM = 0.9  # of the device's free memory a draw and its forward may take
DEVICE_WAIT_S = 300.0  # how long a job that fits an idle device waits for the other jobs' memory


class Unreproducible(FarmError):
    """This device and torch draw other numbers for the recipe than the reference device did."""


def _words(t):
    import torch

    flat = t.detach().contiguous().reshape(-1)
    raw = flat.view(torch.uint8) if flat.dtype != torch.bool else flat.to(torch.uint8)
    return raw.view(torch.int32) if raw.numel() % 4 == 0 else raw


def digest(value: Any) -> str:
    """A tensor's digest (dtype, shape and every bit), computed where it lives; a plain value's
    is that of its repr."""
    import torch

    if not isinstance(value, torch.Tensor):
        return "v:" + hashlib.sha256(repr(value).encode()).hexdigest()[:32]
    head = hashlib.sha256(f"{value.dtype}:{tuple(value.shape)}".encode())
    words = _words(value)
    if words.numel():
        sums = row_sums(words) if device_type(str(words.device)) in GEMM_DEVICES else _row_sums_int(words)
        head.update(sums.cpu().numpy().tobytes())
    return "t:" + head.hexdigest()[:32]


def _row_sums_int(words):
    """Per row of ROW words: the sums of the low and high 16-bit halves, plain and weighted by
    position (1..ROW), in int64: ten passes over an int64 copy of each block."""
    import torch

    idx = torch.arange(1, ROW + 1, dtype=torch.int64, device=words.device)
    parts = []
    for start in range(0, words.numel(), ROW * BLOCK_ROWS):
        block = words[start:start + ROW * BLOCK_ROWS].to(torch.int64)
        if block.numel() % ROW:
            block = torch.nn.functional.pad(block, (0, ROW - block.numel() % ROW))
        block = block.view(-1, ROW)
        lo, hi = block & 0xFFFF, (block >> 16) & 0xFFFF
        parts.append(torch.stack([lo.sum(1), hi.sum(1), (lo * idx).sum(1), (hi * idx).sum(1)], 1))
    return torch.cat(parts)


def row_sums(words):
    """The same sums as `_row_sums_int`, bit for bit, in one conversion and one matrix product:
    the 16-bit halves as float64, each span of SPAN positions times [1, 0, b, 0; 0, 1, 0, b]
    (b its offset in the span), then the spans of a row summed with their weights in int64.
    Every product and partial sum is an integer under 2^46, so float64 holds it exactly in
    any order of summation. A third of the memory traffic (the digest was three quarters of a
    large op's reference time on the host, and the bulk of its device time)."""
    import torch

    dev = words.device
    halves = 2 if words.dtype == torch.int32 else 1  # a word's two halves; a byte (uint8) has one
    b = torch.arange(SPAN, dtype=torch.float64, device=dev)
    one, zero = torch.ones_like(b), torch.zeros_like(b)
    cols = [torch.stack([one, zero, b, zero], 1), torch.stack([zero, one, zero, b], 1)][:halves]
    weights = torch.stack(cols, 1).reshape(SPAN * halves, 4)  # row 2b + h: half h of position b
    span_base = torch.arange(ROW // SPAN, dtype=torch.int64, device=dev) * SPAN + 1  # i = base + b
    parts = []
    for start in range(0, words.numel(), ROW * BLOCK_ROWS):
        block = words[start:start + ROW * BLOCK_ROWS]
        n = block.numel()
        values = (block.view(torch.uint16) if halves == 2 else block).to(torch.float64)
        if n % ROW:
            values = torch.nn.functional.pad(values, (0, (ROW - n % ROW) * halves))
        spans = (values.view(-1, SPAN * halves) @ weights).to(torch.int64).view(-1, ROW // SPAN, 4)
        plain = spans[..., :2].sum(1)
        weighted = (spans[..., :2] * span_base[:, None]).sum(1) + spans[..., 2:].sum(1)
        parts.append(torch.cat([plain, weighted], 1))
    return torch.cat(parts)


def digests(values: list) -> list[str]:
    return [digest(v) for v in values]


# ---------------------------------------------------------------- drawing


def device_type(torch_device: str) -> str:
    return torch_device.split(":")[0]


def on_device(torch_device: str) -> bool:
    return device_type(torch_device) != "cpu"


def draw(task, seed: int, spec) -> tuple[list, dict]:
    """The task's inputs for `seed`, on the reference device where the task allows it, and the
    recipe that redraws them. Raises TaskError where the draw is not deterministic, and where
    what the task needs does not fit the device (before allocating it)."""
    from farm.corpus.inputs import draw_inputs

    dev = spec.torch_device
    if on_device(dev):
        guard_device(task, spec)
        drawn = _device_draw(task, seed, dev)
        if drawn is not None:
            return drawn[0], recipe("device", seed, spec, drawn[1])
    inputs = draw_inputs(task, seed)  # the host draw, checked for determinism there
    return inputs, recipe("host", seed, spec, digests(inputs))


def _device_draw(task, seed: int, dev: str) -> tuple[list, list[str]] | None:
    """Drawn twice under the device as default device, one draw at a time (never two copies on
    the device); None where the task does not draw there (a tensor left on the host, a call
    that fails there) or the two draws differ: it is then drawn on the host as before."""
    import torch

    from farm.corpus.inputs import draw_seeded

    with torch.device(dev):
        try:
            first = draw_seeded(task, seed)
        except TaskError:
            return None
    if any(isinstance(v, torch.Tensor) and v.device.type != device_type(dev) for v in first):
        return None
    sums = digests(first)
    del first
    with torch.device(dev):
        again = draw_seeded(task, seed)
    return (again, sums) if digests(again) == sums else None


def recipe(where: str, seed: int, spec, sums: list[str]) -> dict:
    import torch

    from farm import targets

    return {"draw": where, "seed": seed, "device_type": device_type(spec.torch_device) if where == "device" else "cpu",
            "device_name": targets.device_name(spec) if where == "device" else "host",
            "torch_version": str(torch.__version__), "digests": sums}


def redraw(task, data: dict, spec) -> list:
    """The recorded inputs again, from the recipe, on this device; Unreproducible where this
    device or torch draws other numbers (the digests say so)."""
    rec = data.get("input_recipe")
    if not isinstance(rec, dict) or "digests" not in rec:
        raise FarmError(f"the reference data of {data.get('source')}/{data.get('op_name')} records no input recipe")
    if rec["draw"] == "device":
        if device_type(spec.torch_device) != rec["device_type"]:
            raise Unreproducible(f"inputs were drawn on {rec['device_type']} ({rec['device_name']}); "
                                 f"{spec.label} cannot draw the same numbers")
        drawn = _device_draw(task, int(rec["seed"]), spec.torch_device)
        inputs = drawn[0] if drawn is not None else None
    else:
        from farm.corpus.inputs import draw_inputs

        inputs = draw_inputs(task, int(rec["seed"]))
    if inputs is None or digests(inputs) != list(rec["digests"]):
        raise Unreproducible(f"{spec.label} (torch {_torch_version()}) draws other inputs for seed {rec['seed']} than "
                             f"{rec['device_name']} (torch {rec['torch_version']}) did")
    return inputs


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


# ---------------------------------------------------------------- memory


def guard_device(task, spec) -> None:
    """Inputs, parameters and outputs (measured on the meta device) against the device's
    memory, before anything is allocated there, reserved beside the other reference jobs of
    this host (farm.runtime.devmem: a job that fits an idle device waits for the others); a
    clear error naming the task and the size where it does not fit."""
    from farm.corpus.shapes import measure
    from farm.runtime import devmem

    if device_memory(spec) is None:
        return
    try:
        fp = measure(task.module, task.model_cls, task.input_kwargs)
    except Exception:  # noqa: BLE001 - a file the meta device cannot build is checked for real
        return
    try:
        devmem.reserve(spec.label, fp.total_bytes, lambda: device_memory(spec), DEVICE_HEADROOM, DEVICE_WAIT_S,
                       release=spec.target.release_memory)
    except devmem.DoesNotFit as exc:
        raise TaskError(task.ref.path, f"needs {fp.describe()} at {task.shapes} shapes (measured on the meta device), "
                                       f"{exc} on {spec.label}",
                        "use --shapes small, or a device with more memory" if exc.never
                        else "run it with fewer --jobs, or when the device is free") from None


def device_free_bytes(spec) -> int | None:
    memory = device_memory(spec)
    return memory[0] if memory else None


def job_share(spec, jobs: int) -> int | None:
    """Bytes of the device one of `jobs` jobs may take (DEVICE_HEADROOM of its total, shared
    evenly); None off a device."""
    memory = device_memory(spec)
    return int(memory[1] * DEVICE_HEADROOM / max(1, jobs)) if memory else None


def device_memory(spec) -> tuple[int, int] | None:
    """(free, total) bytes of the spec's device; None where torch cannot say (the CPU)."""
    import torch

    kind = device_type(spec.torch_device)
    module = getattr(torch, kind, None) if kind != "cpu" else None
    if module is None or not hasattr(module, "mem_get_info"):
        return None
    try:
        free, total = module.mem_get_info(torch.device(spec.torch_device))
        return int(free), int(total)
    except (RuntimeError, AssertionError):
        return None


# ---------------------------------------------------------------- the compact form


def value_bytes(values: list) -> int:
    from farm.runtime.tensors import tensor_bytes

    return sum(tensor_bytes(v) for v in values)


def compact_reason(task, in_bytes: int, out_bytes: int, ship_max_mb: float) -> str | None:
    """Why this op's data is stored compact (None: shipped in full), by the rule of the module
    docstring."""
    total = in_bytes + out_bytes
    if ship_max_mb < 0 or total <= ship_max_mb * 2**20:
        return None
    if task.mode == "reference-data" or task.backward:
        return None  # the recorded data is the truth: shipped, however large
    return (f"inputs and outputs {total / 2**20:.2f} MiB, over reference.ship_max_mb ({ship_max_mb:g} MiB): "
            "inputs as seed + digest, outputs as digest + samples; the target's truth runs there")


def sample(t) -> dict:
    """A tensor's digest and SAMPLE evenly spaced elements (all of a small one), on the host."""
    flat = t.detach().reshape(-1)
    return {"shape": list(t.shape), "dtype": str(t.dtype), "digest": digest(t),
            "values": flat[sample_index(flat.numel(), flat.device)].cpu()}


def sample_index(n: int, device):
    """Which elements a sample holds: all of a small tensor, else SAMPLE evenly spaced ones,
    first and last included (recomputed by the reader, never stored)."""
    import torch

    if n <= SAMPLE:
        return torch.arange(n, device=device)
    return torch.arange(SAMPLE, device=device, dtype=torch.int64) * (n - 1) // (SAMPLE - 1)


def samples(outputs: list) -> list:
    import torch

    return [sample(o) if isinstance(o, torch.Tensor) else {"value": o} for o in outputs]


def check_samples(outputs: list, recorded: list, tolerance: dict) -> list[str]:
    """Where this device's truth differs from the reference platform's at the recorded samples
    (the profile's tolerances); [] where it agrees."""
    import torch

    from farm.runtime.tolerance import compare_outputs

    if len(outputs) != len(recorded):
        return [f"{len(outputs)} outputs, the reference data records {len(recorded)}"]
    problems = []
    for i, (out, rec) in enumerate(zip(outputs, recorded)):
        if "value" in rec:
            if out != rec["value"]:
                problems.append(f"output {i}: {out!r} != recorded {rec['value']!r}")
            continue
        if not isinstance(out, torch.Tensor) or list(out.shape) != rec["shape"] or str(out.dtype) != rec["dtype"]:
            problems.append(f"output {i}: not a {rec['dtype']} tensor of shape {rec['shape']}")
            continue
        flat = out.detach().reshape(-1)
        got = flat[sample_index(flat.numel(), flat.device)].cpu()
        check = compare_outputs([got], [rec["values"]], tolerance)[0]
        if not check.ok:
            problems.append(f"output {i}: {check.reason}")
    return problems
