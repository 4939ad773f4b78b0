"""Inside the candidate runner (started by farm.evaluate.runner.Runner): load, run, time.

Everything here runs next to untrusted candidate code. What the harness needs is bound to
local names before any candidate is executed, so that a candidate rebinding module
attributes does not change what the harness calls.
"""

from __future__ import annotations

import gc
import importlib.util
import itertools
import os
import pickle
import signal
import sys
import threading
import traceback
import types
from pathlib import Path
from typing import Any

import torch

from farm import targets
from farm.evaluate import build_client, protocol, timing, wire
from farm.evaluate.child_rounds import RoundsMixin, _kind
from farm.evaluate.child_trusted import TrustedMixin
from farm.runtime import grads, pointers
from farm.runtime.children import trim
from farm.runtime.tensors import clone_values, to_cpu, to_device
from farm.runtime.tolerance import as_output_list

_counter = itertools.count()
_torch_load = torch.load
_equal = torch.equal


class LaunchLog:
    """Triton launches observed at run time: how many, which kernels, from where."""

    def __init__(self, spec: targets.DeviceSpec):
        self.spec = spec
        self.main_thread = threading.get_ident()
        self.reset()

    ghost = False  # while True, launches are recorded but not executed (ghost replay)
    capture_stream = None  # the harness's graph capture stream: launches there are on the timed path
    compile_only = False  # while True, launches are compiled and not run (compile-ahead: RoundsMixin.warm)

    def reset(self) -> None:
        self.tuned: list = []  # autotuners that chose a config while compiling ahead
        self.count = 0
        self.names: set[str] = set()
        self.side_stream = False
        self.foreign_thread = False

    def record(self, kernel: Any) -> None:
        self.count += 1
        fn = getattr(kernel, "fn", kernel)
        self.names.add(getattr(fn, "__name__", type(kernel).__name__))
        if threading.get_ident() != self.main_thread:
            self.foreign_thread = True
        if self.spec.target.on_side_stream(self.capture_stream):
            self.side_stream = True

    def summary(self) -> dict:
        return {"launches": self.count, "kernels": sorted(self.names), "side_stream": self.side_stream,
                "foreign_thread": self.foreign_thread}


def install_launch_hook(log: LaunchLog) -> None:
    """Wrap every Triton entry point that launches a kernel (compiled and interpreted)."""
    from triton.runtime.jit import JITFunction

    classes = [JITFunction]
    try:
        from triton.runtime.interpreter import InterpretedFunction

        classes.append(InterpretedFunction)
    except ImportError:
        pass
    for cls in classes:
        original = cls.run

        def run(self, *args, _original=original, **kwargs):
            if log.compile_only:  # Triton's own warm-up path: compile (and cache on disk), launch nothing
                kwargs["warmup"] = True
            if not kwargs.get("warmup", False):
                log.record(self)
                if log.ghost:
                    return None
            return _original(self, *args, **kwargs)

        cls.run = run
    _compile_only_autotune(log)


def _compile_only_autotune(log: LaunchLog) -> None:
    """While compiling ahead, an autotuner compiles each config and times none: its benchmark
    would run a cache flush per repetition on the device, beside another runner's timing."""
    try:
        from triton.runtime.autotuner import Autotuner
    except ImportError:
        return
    original = Autotuner._bench

    def _bench(self, *args, config, _original=original, **meta):
        if not log.compile_only:
            return _original(self, *args, config=config, **meta)
        log.tuned.append(self)  # its choice, made on no timing at all, is forgotten after the warm run
        try:
            self.fn.run(*args, **dict(meta, **config.all_kwargs()))  # the launch hook makes it a warm-up
        except Exception:  # noqa: BLE001 - a config that does not compile is the device runner's to meet
            return [float("inf")] * 3
        return [0.0] * 3

    Autotuner._bench = _bench


def device_info(spec: targets.DeviceSpec) -> dict:
    """The pinned device as results record it: names, and the target's properties (SM count,
    cores, memory) that generators and prompts read."""
    info: dict[str, Any] = {"target": spec.target.name, "label": spec.label, "name": targets.device_name(spec),
                            "device_timing": spec.target.device_timing}
    info.update(spec.target.properties())
    return info


class ChildRunner(RoundsMixin, TrustedMixin):
    def __init__(self, spec: targets.DeviceSpec):
        self.spec = spec
        self.device = spec.torch_device
        self.launches: LaunchLog = LaunchLog(spec)
        self.model = None
        self.module: types.ModuleType | None = None
        self.baseline_threads = threading.active_count()
        self.timer = timing.DeviceTimer(spec)
        self.inputs: dict[str, list] = {}  # input sets by key, on the device
        self.fingerprints: dict[str, list] = {}
        self.output_nbytes: list[int] = []
        self.integrity: dict[str, Any] = {}
        self.models: dict[str, torch.nn.Module] = {}  # trusted runner: baselines kept side by side
        self.graphs: dict[tuple, Any] = {}  # (slot, keys, calls) -> (graph, its outputs, its input buffers)
        self.built: dict[tuple, torch.nn.Module] = {}  # the task's classes built here (child_trusted)

    def snapshot(self) -> None:
        """What the harness relies on, as it is before any candidate runs: its own functions
        and the target's hooks it calls while timing."""
        cls = type(self.spec.target)
        hooks = [f"{cls.__module__}.{cls.__qualname__}.{hook}" for hook in _TARGET_HOOKS]
        self.integrity = {name: _lookup(name) for name in (*_WATCHED, *hooks)}

    # ------------------------------------------------------------ loading

    def load_source(self, source: str, init_inputs: list, name: str = "candidate") -> dict:
        """Execute the candidate from a file of its own: Triton reads kernel source from files."""
        self.unload()
        self.built.clear()  # the task's own modules are never kept next to candidate code
        n = next(_counter)
        mod_name = f"farm_candidate_{n}"
        path = Path.cwd() / f"candidate_{n}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(mod_name, path)
        assert spec is not None and spec.loader is not None  # a .py path always has both
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException:  # noqa: BLE001 - the candidate's failure is its verdict
            return {"ok": False, "kind": "compile_error", "error": trim(traceback.format_exc())}
        finally:
            sys.modules.pop(mod_name, None)
        cls = module.__dict__.get("ModelNew")
        if not isinstance(cls, type) or not issubclass(cls, torch.nn.Module):
            return {"ok": False, "kind": "compile_error", "error": "the candidate defines no class ModelNew(nn.Module)"}
        self.module = module
        return self._instantiate(cls, init_inputs)

    def _instantiate(self, cls: type, init_inputs: list) -> dict:
        try:
            torch.manual_seed(0)
            self.model = cls(*init_inputs).to(self.device).eval()
        except BaseException:  # noqa: BLE001
            return {"ok": False, "kind": "runtime_error", "error": trim(traceback.format_exc())}
        return {"ok": True}

    def unload(self) -> dict:
        self.model = None
        self.module = None
        self.graphs = {k: v for k, v in self.graphs.items() if k[0] is not None}
        gc.collect()
        self.spec.target.release_memory()
        return {"ok": True}

    # ------------------------------------------------------------ running

    def _poison(self) -> None:
        """Hand the allocator blocks filled with 0xFF (NaN for floats) of exactly the sizes the
        outputs will take, and one large block: an output that is never written cannot hold a
        stale answer from an earlier run."""
        junk = [torch.full((n,), 0xFF, dtype=torch.uint8, device=self.device) for n in self.output_nbytes for _ in (0, 1)]
        junk.append(torch.full((1 << 20,), 0xFF, dtype=torch.uint8, device=self.device))
        del junk

    def put_inputs(self, key: str, inputs: list, output_nbytes: list | None = None) -> dict:
        # a set put again under its key (the shape-space cases share one) voids the graphs captured on the old one
        self.graphs = {k: v for k, v in self.graphs.items() if key not in k[1]}
        self.inputs[key] = to_device(inputs, self.device)
        self.fingerprints[key] = _fingerprint(self.inputs[key])
        if output_nbytes is not None:
            self.output_nbytes = [int(n) for n in output_nbytes]
        return {"ok": True}

    def tampering(self) -> str:
        """Harness objects replaced, or kept input sets changed: the runner cannot be trusted."""
        changed = [name for name, obj in self.integrity.items() if _lookup(name) is not obj]
        if changed:
            return f"the candidate replaced harness code: {', '.join(changed)}"
        for key, fp in self.fingerprints.items():
            if _fingerprint(self.inputs[key]) != fp:
                return f"the candidate changed the runner's kept input set '{key}'"
        return ""

    def _forward(self, dev_inputs: list):
        assert self.model is not None  # its callers answer "no model loaded" first
        with torch.no_grad():
            out = self.model(*dev_inputs)
        self.timer.synchronize()
        return out

    def run(self, key: str, inplace_args: tuple = (), poison: bool = True, ghost: bool = False) -> dict:
        if self.model is None:
            return {"ok": False, "kind": "runtime_error", "error": "no model loaded"}
        dev_inputs = clone_values(self.inputs[key])
        pristine = clone_values(dev_inputs)
        if poison:
            self._poison()
        self.launches.reset()
        LaunchLog.ghost = ghost
        try:
            out = self._forward(dev_inputs)
        except BaseException as exc:  # noqa: BLE001
            if ghost:  # without its kernels a candidate may well fail: then it depends on them
                return {"ok": True, "outputs": None, "ghost_error": type(exc).__name__}
            return {"ok": False, "kind": _kind(exc), "error": trim(traceback.format_exc())}
        finally:
            LaunchLog.ghost = False
        outputs = as_output_list(out)
        odd = _odd_output(outputs)
        if odd:
            return {"ok": False, "kind": "cheat", "error": odd}
        # addresses of inputs held as values differ between the copies: compare them as tokens
        mutated = [i for i, (a, b) in enumerate(zip(pointers.encode(dev_inputs), pointers.encode(pristine)))
                   if isinstance(a, torch.Tensor) and i not in inplace_args and not _same_bits(a, b)]
        return {"ok": True, "outputs": to_cpu(outputs), "mutated_inputs": mutated,
                "threads_alive": threading.active_count() - self.baseline_threads, **self.launches.summary()}

    def run_backward(self, key: str, indices: list[int], grad_outputs: list, ghost: bool = False) -> dict:
        """Forward with gradients, then backward with the given upstream gradient. The launches of
        each direction are counted apart: a backward left to PyTorch autograd launches none. On
        CUDA, autograd runs backward on its own device thread, so the thread check is forward's only."""
        if self.model is None:
            return {"ok": False, "kind": "runtime_error", "error": "no model loaded"}
        dev_inputs = clone_values(self.inputs[key])
        go = to_device(grad_outputs, self.device)
        self.launches.reset()
        try:
            with torch.enable_grad():
                for i in indices:
                    dev_inputs[i] = dev_inputs[i].detach().requires_grad_(True)
                params = grads.trainable(self.model)
                for p in params.values():
                    p.grad = None
                outs = as_output_list(self.model(*dev_inputs))
                forward = self.launches.summary()
                self.launches.reset()
                LaunchLog.ghost = ghost
                pairs = [(o, g) for o, g in zip(outs, go) if g is not None and isinstance(o, torch.Tensor)]
                if any(not o.requires_grad for o, _ in pairs):
                    return {"ok": False, "kind": "runtime_error",
                            "error": "an output has no gradient function: ModelNew's forward is not differentiable"}
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            self.timer.synchronize()
        except BaseException as exc:  # noqa: BLE001
            if ghost:
                return {"ok": True, "grad_inputs": None, "ghost_error": type(exc).__name__}
            return {"ok": False, "kind": _kind(exc), "error": trim(traceback.format_exc())}
        finally:
            LaunchLog.ghost = False
        backward = self.launches.summary()
        return {"ok": True, "launches_forward": forward["launches"], "launches_backward": backward["launches"],
                "kernels_backward": backward["kernels"],
                "grad_inputs": [None if dev_inputs[i].grad is None else dev_inputs[i].grad.detach().cpu()
                                for i in indices],
                "grad_params": {n: (None if p.grad is None else p.grad.detach().cpu()) for n, p in params.items()}}

    def time(self, keys: list[str], options: dict, probe_keys: tuple[str, ...] = (),
             inplace_args: tuple = ()) -> dict:
        """Time forward on the given input sets in rotation, each set with buffers of its own
        (its in-place arguments restored before every repetition, outside the events), and
        return the outputs of the last call on each set, so the parent can check that the
        timed calls computed the answer. Probe sets, never shown to this candidate before, are
        called once each inside a batch, behind regular calls, so the host runs ahead of the
        device for them as for every repetition."""
        sets = {k: self.inputs[k] for k in (*keys, *probe_keys)}
        bufs = {k: clone_values(v) for k, v in sets.items()}
        model = self.model
        current = [keys[0]]
        last: dict[str, Any] = {}

        def select(key: str) -> None:
            current[0] = key
            for j in inplace_args:
                if j < len(bufs[key]) and isinstance(bufs[key][j], torch.Tensor):
                    bufs[key][j].copy_(sets[key][j])

        options = dict(options)
        backward = options.pop("backward", None)

        def call():
            if backward is None:
                with torch.no_grad():
                    last[current[0]] = model(*bufs[current[0]])
                return
            with torch.enable_grad():  # forward + backward: what a training step pays for the op
                args = [a.detach().requires_grad_(True) if i in backward["indices"] else a
                        for i, a in enumerate(bufs[current[0]])]
                outs = as_output_list(model(*args))
                pairs = [(o, g) for o, g in zip(outs, upstream) if g is not None]
                torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
            last[current[0]] = [o.detach() for o in outs]

        upstream = to_device(backward["grad_outputs"], self.device) if backward else None
        method = options.pop("method", "events")
        self.timer.flush_mode = timing.check_flush(options.pop("flush", "write"))
        self.launches.reset()
        probe_ms: list[float] = []
        beside_ms: list[float] = []
        try:
            select(keys[0])
            call()  # warms buffers, allocator and clocks
            self.timer.synchronize()
            if probe_keys:
                order = [keys[0]] * 3 + [k for p in probe_keys for k in (p, keys[0])]
                times = self.timer.batch(call, len(order), prepare=lambda i: select(order[i]))
                probe_ms = [t for t, k in zip(times, order) if k in probe_keys]
                beside_ms = [t for i, (t, k) in enumerate(zip(times, order)) if i > 3 and k not in probe_keys]
            stats = timing.measure(call, self.timer, prepare=lambda i: select(keys[i % len(keys)]), **options).as_dict()
            if method != "events":  # the target's profiler (Target.profile_ms), as `farm eval --timing` named it
                stats.update(event_median_ms=stats["median_ms"], median_ms=self.spec.target.profile_ms(call, self.timer),
                             method=method)
            self.timer.synchronize()
        except BaseException as exc:  # noqa: BLE001
            return {"ok": False, "kind": _kind(exc), "error": trim(traceback.format_exc())}
        finally:
            for k in probe_keys:  # never kept: the next candidate must not find them either
                self.inputs.pop(k, None)
                self.fingerprints.pop(k, None)
        if probe_ms:
            # the fastest probe, beside the calls on a seen set that followed each probe: a cache
            # slows every unseen call, a preempted host (a busy CPU) only some, and both figures
            # of one batch see the same moment's load
            stats.update(probe_ms=min(probe_ms), probe_beside_ms=sorted(beside_ms)[(len(beside_ms) - 1) // 2])
        calls = stats["reps"] + 4 + (2 * len(probe_keys) + 3 if probe_keys else 0)
        outputs = {k: to_cpu(as_output_list(out)) for k, out in last.items()}
        return {"ok": True, "stats": stats, "outputs": outputs, "min_calls": calls, **self.launches.summary()}


def _fingerprint(values: list) -> list:
    """Cheap, order-sensitive summary of an input set (sum and a position-weighted sum)."""
    out: list[tuple[float, float] | str] = []
    for v in values:
        if isinstance(v, torch.Tensor) and v.numel():
            flat = v.detach().reshape(-1).double()
            weights = torch.arange(1, flat.numel() + 1, device=flat.device, dtype=torch.float64)
            out.append((float(flat.nan_to_num().sum()), float((flat.nan_to_num() * weights).sum())))
        else:
            out.append(repr(v))
    return out


_WATCHED = ("time.perf_counter", "time.perf_counter_ns", "time.time", "time.monotonic", "torch.equal",
            "torch.Tensor.clone", "torch.Tensor.copy_", "torch.cuda.synchronize", "torch.cuda.Event",
            "farm.evaluate.timing.measure", "farm.evaluate.timing._perf_counter", "farm.evaluate.timing.DeviceTimer.batch",
            "farm.evaluate.runner_child._reply", "farm.evaluate.runner_child.ChildRunner.run", "farm.evaluate.runner_child.ChildRunner.time",
            "farm.evaluate.runner_child.ChildRunner.time_round", "farm.evaluate.timing.graph_samples",
            "farm.evaluate.timing.capture_graph", "torch.cuda.CUDAGraph.replay",
            "farm.evaluate.timing.DeviceTimer.spin", "triton.runtime.jit.JITFunction.run")


_TARGET_HOOKS = ("on_side_stream", "synchronize", "event_class", "spin", "capture_graph", "profile_ms")


def _lookup(name: str) -> Any:
    parts = name.split(".")
    for cut in range(len(parts), 0, -1):
        module = sys.modules.get(".".join(parts[:cut]))
        if module is not None:
            obj: Any = module
            for attr in parts[cut:]:
                obj = getattr(obj, attr, None)
            return obj
    return None


def _odd_output(outputs: list) -> str:
    """Outputs must be plain tensors or plain values: a tensor subclass can defer or fake its
    work until the harness reads it."""
    for i, v in enumerate(outputs):
        if isinstance(v, torch.Tensor):
            if type(v) is not torch.Tensor:
                return f"output {i} is a {type(v).__name__}, not a plain torch.Tensor"
        elif isinstance(v, (list, tuple)):
            nested = _odd_output(list(v))
            if nested:
                return f"output {i}: {nested}"
        elif v is not None and type(v) not in (int, float, bool, str):
            return f"output {i} is a {type(v).__name__}; outputs must be tensors or plain values"
    return ""


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if a.is_floating_point():
        both_nan = torch.isnan(a) & torch.isnan(b)
        return bool(((a == b) | both_nan).all())
    return _equal(a, b)


def _read_command(payload: bytes, fds: list[int]):
    """A command from the trusted parent: pickled in the frame, or (large ones) a memory file."""
    if fds:
        with os.fdopen(fds[0], "rb") as f:
            return _torch_load(f, map_location="cpu", weights_only=False)
    return pickle.loads(payload)


def _reply(sock, payload: dict) -> None:
    wire.send_frame(sock, wire.encode(payload))


def start_runner(spec: targets.DeviceSpec, memory_fraction: float, build_fd: int | None = None) -> ChildRunner:
    """The device's runtime and Triton driver (the target's), this process's share of device
    memory, and a runner whose launch hook and harness snapshot are in place."""
    targets.import_device_runtime(spec)
    build_client.install(build_fd)  # Triton's C helpers from the trusted builder
    spec.target.limit_memory(memory_fraction)
    runner = ChildRunner(spec)
    install_launch_hook(runner.launches)
    runner.snapshot()
    return runner


def main(fd: int, device_label: str, memory_fraction: float, build_fd: int | None = None) -> None:
    import socket

    sock = socket.socket(fileno=fd)
    # Python ignores SIGXFSZ; the log limit (RLIMIT_FSIZE) must kill the runner instead
    signal.signal(signal.SIGXFSZ, signal.SIG_DFL)
    try:
        spec = targets.resolve_device(device_label)
        runner = start_runner(spec, memory_fraction, build_fd)
        # what is alive now (torch, triton, the harness) lives as long as the runner: out of the
        # collector's sight: a candidate's unload collects only what came after it
        gc.freeze()
        _reply(sock, {"ok": True, "device": device_info(spec)})
    except BaseException:  # noqa: BLE001
        _reply(sock, {"ok": False, "error": trim(traceback.format_exc())})
        return
    while True:
        try:
            cmd = _read_command(*wire.recv_frame_fds(sock))
        except (EOFError, OSError):
            cmd = protocol.Exit()
        if isinstance(cmd, protocol.Exit):
            # no interpreter teardown: with the start-up objects frozen it reported them as
            # nanobind leaks and took longer; nothing of a runner needs it (the log is flushed)
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(0)
        try:
            reply = getattr(runner, cmd.verb)(**cmd.arguments())
        except BaseException:  # noqa: BLE001 - e.g. outputs that cannot be serialised
            reply = {"ok": False, "kind": "runtime_error", "error": trim(traceback.format_exc())}
        tampered = runner.tampering() if not isinstance(cmd, protocol.PutInputs) else ""
        if tampered:  # the verdict is cheat, and this runner is finished
            reply = {"ok": False, "kind": "cheat", "error": tampered, "restart": True}
        try:
            _reply(sock, reply)
        except (TypeError, ValueError, RuntimeError):  # not plain data: said as such, not a dead runner
            _reply(sock, {"ok": False, "kind": "cheat", "error": "the reply holds values that are not plain data"})
        if tampered:
            return
