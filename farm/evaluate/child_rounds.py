"""Inside the candidate runner (farm.evaluate.runner_child): one round of an interleaved
comparison (farm.evaluate.speedup) in either timing mode, the device graphs it captures, and the
device floor; plus how a failure is classified. Runs next to untrusted candidate code: the
harness names it relies on are watched by runner_child._WATCHED."""

from __future__ import annotations

import traceback
from typing import TYPE_CHECKING, Any, Protocol

import torch

from farm.evaluate import timing
from farm.runtime import pointers
from farm.runtime.children import trim
from farm.runtime.tensors import clone_values, to_cpu
from farm.runtime.tolerance import as_output_list

if TYPE_CHECKING:
    from farm.targets import DeviceSpec


class LaunchLog(Protocol):
    """runner_child.LaunchLog (which imports this module), as a round uses it."""

    compile_only: bool
    capture_stream: Any
    tuned: list

    def reset(self) -> None: ...

    def summary(self) -> dict: ...


class RoundsMixin:
    """Mixed into runner_child.ChildRunner: uses its model(s), input sets, timer and launch log."""

    # the ChildRunner's, set by its __init__
    spec: DeviceSpec
    model: torch.nn.Module | None
    models: dict[str, torch.nn.Module]
    inputs: dict[str, list]
    graphs: dict[tuple, Any]
    timer: timing.DeviceTimer
    launches: LaunchLog

    if TYPE_CHECKING:
        def _forward(self, dev_inputs: list) -> Any: ...

    def warm(self, key: str) -> dict:
        """Compile-ahead (farm.evaluate.ahead): forward on an input set with every Triton launch
        compiled but not run, so that this runner's own Triton cache holds the kernels before it
        goes on to the device with the same candidate. No kernel runs, so what the
        forward computes is garbage and its errors are not the candidate's: they are reported,
        never judged (the device's runner judges the real run)."""
        if self.model is None:
            return {"ok": False, "kind": "runtime_error", "error": "no model loaded"}
        type(self.launches).compile_only = True
        try:
            self._forward(clone_values(self.inputs[key]))
            error = ""
        except BaseException as exc:  # noqa: BLE001 - garbage in, anything out
            error = trim(f"{type(exc).__name__}: {exc}", 500)
        finally:
            type(self.launches).compile_only = False
            for tuner in self.launches.tuned:  # this runner goes on to the device: no choice made on garbage stays
                getattr(tuner, "cache", {}).clear()
            self.launches.tuned.clear()
        return {"ok": True, "error": error}

    def time_round(self, slot: str | None, keys: list[str], mode: str, reps: int, calls: int = 0,
                   inplace_args: tuple = (), flush: str = "write", outputs: bool = False,
                   swap_key: str | None = None) -> dict:
        """One round of an interleaved comparison (farm.evaluate.speedup): `reps` per-call times
        of the current model (slot None) or a kept baseline, on the input sets in rotation.
        events: flushed calls, as `time`. graph: `reps` replays of a CUDA graph of `calls` calls
        (captured on first use and kept), each giving replay time / calls. With `outputs` and
        `swap_key`, a graph is also replayed once on that input set written into its buffers."""
        model = self.model if slot is None else self.models.get(slot)
        if model is None:
            return {"ok": False, "kind": "runtime_error", "error": f"no model loaded in slot {slot!r}"}
        self.timer.flush_mode = timing.check_flush(flush)
        self.launches.reset()
        captured = False
        try:
            if mode == "graph":
                cache_key = (slot, tuple(keys), calls)
                captured = cache_key not in self.graphs
                if captured:
                    self.graphs[cache_key] = self._capture(model, keys, calls)
                graph, last, _bufs = self.graphs[cache_key]
                samples = timing.graph_samples(graph, calls, reps, self.timer)
            else:
                bufs = {k: clone_values(self.inputs[k]) for k in keys}
                last = {}
                order = [keys[i % len(keys)] for i in range(reps)]

                def prepare(i: int) -> None:
                    for j in inplace_args:
                        if j < len(bufs[order[i]]) and isinstance(bufs[order[i]][j], torch.Tensor):
                            bufs[order[i]][j].copy_(self.inputs[order[i]][j])

                current = iter(order)
                calls_by_key = {k: forward_call(model, bufs[k], last, k) for k in keys}

                def call():
                    calls_by_key[next(current)]()

                samples = self.timer.batch(call, reps, prepare)
        except timing.CaptureError as exc:
            self.timer.synchronize()  # a broken context shows here, and kills the runner
            return {"ok": True, "capture_error": exc.kind, "detail": exc.detail, **self.launches.summary()}
        except BaseException as exc:  # noqa: BLE001
            return {"ok": False, "kind": _kind(exc), "error": trim(traceback.format_exc())}
        reply = {"ok": True, "samples": samples, "captured": captured, **self.launches.summary()}
        if outputs:
            reply["outputs"] = {k: to_cpu(as_output_list(out)) for k, out in last.items()}
            if mode == "graph" and swap_key is not None:
                reply["swap_check"] = self._swap_replay(self.graphs[cache_key], keys[0], swap_key, reply["outputs"])
        return reply

    def _swap_replay(self, entry: tuple, key: str, swap_key: str, outputs: dict) -> str:
        """Write another secret input set into the graph's input buffers and replay once, as
        serving feeds a graph new data in the same buffers: outputs cached while the graph was
        captured (the forward's Python never runs on replay) cannot answer it. The timed set
        is written back afterwards."""
        graph, last, bufs = entry
        timed, other = bufs[key], self.inputs[swap_key]
        if not _same_layout(timed, other):
            return "skipped: the input sets differ in shape, dtype or plain values"
        # an input holding addresses keeps pointing into the graph's own buffers
        fixed = pointers.holders(timed)
        for i, (dst, src) in enumerate(zip(timed, other)):
            if isinstance(dst, torch.Tensor) and i not in fixed:
                dst.copy_(src)
        graph.replay()
        self.timer.synchronize()
        outputs[swap_key] = to_cpu(as_output_list(last[key]))
        for i, (dst, src) in enumerate(zip(timed, self.inputs[key])):
            if isinstance(dst, torch.Tensor) and i not in fixed:
                dst.copy_(src)
        return "replayed"

    def _capture(self, model, keys: list[str], calls: int):
        """A graph of `calls` forwards over the input sets in rotation, on buffers of its own."""
        bufs = {k: clone_values(self.inputs[k]) for k in keys}
        last: dict[str, Any] = {}
        order = [forward_call(model, bufs[keys[i % len(keys)]], last, keys[i % len(keys)]) for i in range(calls)]

        def allow(stream):
            self.launches.capture_stream = stream

        graph = timing.capture_graph(order, self.timer, on_stream=allow)
        # the graph reads and writes these addresses on every replay: they live as long as it does
        return graph, last, bufs

    def device_limits(self) -> dict:
        """Copy bandwidth and the empty kernel in each timing mode (trusted runner only). None on an
        interpreting target: its timings are the interpreter's (farm.evaluate.limits)."""
        if self.spec.target.interpret:
            return {"ok": True, "limits": None}
        from farm.evaluate.floor import device_floor

        try:
            modes = ("events", "graph") if self.spec.target.graphs else ("events",)
            return {"ok": True, "limits": device_floor(self.timer, modes)}
        except BaseException:  # noqa: BLE001
            return {"ok": False, "kind": "runtime_error", "error": trim(traceback.format_exc())}


def forward_call(model, inputs: list, last: dict, key: str):
    """One timed forward on a kept input set, its output kept in `last[key]` for the checks.
    The previous output of that set is dropped before the call, not after: otherwise two
    outputs alternate in memory, and an op whose inputs and output fit in L2 with one output
    but not with two (sglang fused_softcap: 8 MB in, 16 MB out on the H100's 50 MB) was timed
    from DRAM here and from L2 in a plain do_bench_cudagraph, 17% apart. A serving graph, like
    do_bench_cudagraph, writes one output buffer per call site."""
    def call():
        last.pop(key, None)
        with torch.no_grad():
            last[key] = model(*inputs)
    return call


def _same_layout(a: list, b: list) -> bool:
    """Same tensors (shape, dtype, strides) and equal plain values: one set can be written into
    the other's buffers and the captured graph still applies."""
    if len(a) != len(b):
        return False
    for x, y in zip(a, b):
        if isinstance(x, torch.Tensor) != isinstance(y, torch.Tensor):
            return False
        if isinstance(x, torch.Tensor):
            if x.shape != y.shape or x.dtype != y.dtype or x.stride() != y.stride():
                return False
        elif x != y:
            return False
    return True


_COMPILE_CAUSES = (NameError, AttributeError, TypeError, ValueError, SyntaxError)


def _kind(exc: BaseException) -> str:
    """compile_error for what a Triton compiler rejects; the CPU interpreter reports those as
    an InterpreterError caused by the frontend's NameError/TypeError/ValueError/..."""
    try:
        from triton.compiler.errors import CompilationError

        if isinstance(exc, CompilationError):
            return "compile_error"
    except ImportError:
        pass
    if type(exc).__name__ == "InterpreterError" and isinstance(exc.__cause__, _COMPILE_CAUSES):
        return "compile_error"
    return "runtime_error"
