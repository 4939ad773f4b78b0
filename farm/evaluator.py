"""The judge: verify and time a candidate kernel on one device, in isolation.

Stages, each of which can end the evaluation with its verdict:

    static   parse, ModelNew present, a Triton kernel, no banned constructs  -> compile_error | cheat
    compile  load the source in the candidate runner, instantiate, first run  -> compile_error | runtime_error
    verify   outputs on the .pt inputs against the .pt outputs;               -> mismatch | cheat
             inputs unchanged; a Triton kernel launched on the timed stream
             from the calling thread; a second run identical; the same check
             on secret fresh seeds against Reference run on the target
    time     warm-up, flushed, event-timed repetitions until the RSE target    -> cheat (unseen work)
    pass     with speedups against Model and Reference timed the same way

A timeout or a dead runner at any stage gives `timeout` or `crash`; the runner is replaced and
the evaluator carries on. The candidate's runner never holds expected outputs: the trusted
reference runner (a second child) computes them, and this process compares.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from farm import compare, corpus, static_checks, timing
from farm.backends import DeviceSpec
from farm.errors import FarmError
from farm.opcheck import draw_inputs
from farm.sandbox import Limits, Sandbox, SandboxDied
from farm.tensors import identical

log = logging.getLogger(__name__)

VERDICTS = ("compile_error", "runtime_error", "timeout", "crash", "mismatch", "cheat", "pass")
SUSPICIOUS_SPEEDUP = 20.0  # against Reference; reported, never trusted silently
# timed calls this much faster than first calls on never-seen inputs were served from a cache
# (the CPU interpreter's timings are noisier: a wider margin there)
CACHE_SPEED_RATIO = {"cpu": 0.2}
DEFAULT_CACHE_SPEED_RATIO = 0.5
PROBES = 3  # input sets never shown to a candidate before its first timed call on them
# ...and only where a cache would save this much per call: first calls on new buffers of
# microsecond kernels run measurably slower (page and TLB warm-up), which is not a cache
CACHE_MIN_GAIN_MS = 0.1


@dataclass
class EvalSettings:
    fresh_seeds: int = 2
    timing: dict = field(default_factory=dict)  # options for farm.timing.measure
    limits: Limits = field(default_factory=Limits)
    # cuda: a call whose host time is this many times its event time (and 2 ms more) did
    # work the events did not see
    unseen_work_ratio: float = 4.0

    @classmethod
    def for_device(cls, spec: DeviceSpec) -> "EvalSettings":
        if spec.backend.interpret:
            # the interpreter is slow and its timings only rank roughly: a few repetitions
            return cls(timing={"warmup_ms": 0.0, "budget_ms": 300.0, "min_reps": 3, "max_reps": 20,
                               "rse_target": 0.05})
        return cls()


@dataclass
class EvalResult:
    verdict: str
    reason: str = ""
    log: str = ""
    outputs: list[dict] = field(default_factory=list)
    seeds_checked: int = 0
    launches: int = 0
    kernels: list[str] = field(default_factory=list)
    timing: dict | None = None
    baseline: dict = field(default_factory=dict)
    speedup_vs_model: float | None = None
    speedup_vs_reference: float | None = None
    suspicious: bool = False
    stage_s: dict = field(default_factory=dict)
    device: dict = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return self.verdict == "pass"

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class _Stop(Exception):
    def __init__(self, verdict: str, reason: str, log: str = ""):
        super().__init__(reason)
        self.verdict, self.reason, self.log = verdict, reason, log


class Evaluator:
    """Evaluates candidates for one task on one device. Holds both runners, the .pt, the
    secret fresh-seed cases and the baselines, so each candidate costs only its own runs."""

    def __init__(self, task_ref: corpus.TaskRef, ref_data: dict, spec: DeviceSpec,
                 settings: EvalSettings | None = None):
        self.ref = task_ref
        self.data = ref_data
        self.spec = spec
        self.settings = settings or EvalSettings.for_device(spec)
        self.shapes = ref_data.get("shapes", "bench")
        self.task = corpus.load_task(task_ref, self.shapes)
        self.init_inputs = list(ref_data["init_inputs"])
        self.inputs = list(ref_data["inputs"])
        self.expected = list(ref_data["outputs"])
        self.candidates = Sandbox(spec, self.settings.limits)
        self.candidates.output_nbytes = _nbytes(self.expected)
        self.references = Sandbox(spec, self.settings.limits)
        self._cases: list[tuple[list, list]] | None = None
        self._baseline: dict | None = None

    # ------------------------------------------------------------ trusted side

    def _reference_run(self, which: str, key: str, inputs: list) -> dict:
        reply = self.references.call("load_task", self.settings.limits.compile_s, path=str(self.ref.path.resolve()),
                                     source=self.ref.source, shapes=self.shapes, which=which,
                                     init_inputs=self.init_inputs)
        if not reply.get("ok"):
            raise FarmError(f"{self.ref.path}: {which} cannot be built on {self.spec.label}: {reply.get('error')}")
        return self.references.with_inputs("run", self.settings.limits.compile_s, key, inputs, poison=False)

    def fresh_cases(self) -> list[tuple[list, list]]:
        """Inputs from secret seeds and Reference's outputs for them, computed on the target."""
        return self._all_cases()[:-PROBES]

    def probe_cases(self) -> list[tuple[list, list]]:
        """More secret cases, for the timing probes: no candidate sees them before then."""
        return self._all_cases()[-PROBES:]

    def _all_cases(self) -> list[tuple[list, list]]:
        if self._cases is None:
            cases = []
            for _ in range(self.settings.fresh_seeds + PROBES):
                seed = secrets.randbelow(2**31 - 1) + 1
                inputs = draw_inputs(self.task, seed)
                reply = self._reference_run("Reference", f"seed{len(cases)}", inputs)
                if not reply.get("ok"):
                    raise FarmError(f"{self.ref.path}: Reference fails on {self.spec.label} for a fresh seed: "
                                    f"{reply.get('error')}")
                cases.append((inputs, reply["outputs"]))
            self._cases = cases
        return self._cases

    def baseline(self) -> dict:
        """Model (where it runs on the target) and Reference, timed like candidates."""
        if self._baseline is None:
            base: dict[str, Any] = {}
            for which, key in (("Model", "model"), ("Reference", "reference")):
                try:
                    run = self._reference_run(which, "pt", self.inputs)
                    if not run.get("ok"):
                        base[f"{key}_error"] = run.get("error", "")[-300:]
                        continue
                    reply = self.references.call("time", self.settings.limits.time_s, keys=["pt"],
                                                 options=self.settings.timing)
                    if reply.get("ok"):
                        base[f"{key}_ms"] = reply["stats"]["median_ms"]
                        base[f"{key}_timing"] = reply["stats"]
                except (SandboxDied, FarmError) as exc:
                    base[f"{key}_error"] = str(exc)[-300:]
            self._baseline = base
        return self._baseline

    # ------------------------------------------------------------ candidate side

    def evaluate(self, source: str, name: str = "candidate") -> EvalResult:
        result = EvalResult(verdict="pass")
        self._started = started = time.monotonic()
        try:
            self._static(source)
            for stage, run in (("compile", lambda: self._compile(source, name)),
                               ("verify", lambda: self._verify(first, result)), ("time", lambda: self._time(result))):
                t0 = time.monotonic()
                value = run()
                if stage == "compile":
                    first = value
                result.stage_s[stage] = time.monotonic() - t0
                self._check_deadline(stage)
        except _Stop as stop:
            result.verdict, result.reason, result.log = stop.verdict, stop.reason, stop.log
        except SandboxDied as died:
            result.verdict, result.reason = died.kind, str(died).splitlines()[0]
            result.log = str(died)
        if result.verdict in ("cheat", "runtime_error", "timeout"):
            # a cheat may have left threads or patches behind, an error a broken device context
            self.candidates.kill()
        result.stage_s["total"] = time.monotonic() - started
        result.device = getattr(self.candidates, "device_info", {})
        if result.passed:
            self._speedups(result)
        return result

    def _put(self, key: str, inputs: list) -> None:
        """Send an input set to the candidate runner unless it already keeps it."""
        if key not in getattr(self.candidates, "cached_inputs", set()) or not self.candidates.alive:
            reply = self.candidates.call("put_inputs", self.settings.limits.run_s, key=key, inputs=inputs,
                                         output_nbytes=self.candidates.output_nbytes)
            if not reply.get("ok"):
                raise _Stop(reply.get("kind", "runtime_error"), reply.get("error", "could not load inputs"))
            self.candidates.cached_inputs.add(key)

    def _check_deadline(self, stage: str) -> None:
        if time.monotonic() - self._started > self.settings.limits.total_s:
            raise _Stop("timeout", f"over the {self.settings.limits.total_s:.0f} s limit per candidate after {stage}")

    def _static(self, source: str) -> None:
        verdict, reason = static_checks.static_verdict(source)
        if verdict:
            raise _Stop(verdict, reason)

    def _call(self, cmd: str, timeout: float, key: str | None = None, inputs: list | None = None, **args) -> dict:
        if key is None:
            reply = self.candidates.call(cmd, timeout, **args)
        else:
            reply = self.candidates.with_inputs(cmd, timeout, key, inputs, **args)
        if not reply.get("ok"):
            kind = reply.get("kind", "runtime_error")
            error = reply.get("error", "")
            raise _Stop(kind, error.strip().splitlines()[-1] if error.strip() else kind, error)
        return reply

    def _compile(self, source: str, name: str) -> dict:
        limits = self.settings.limits
        self._call("load_source", limits.compile_s, source=source, init_inputs=self.init_inputs, name=name)
        return self._call("run", limits.compile_s, "pt", self.inputs, inplace_args=self.task.inplace_args)

    def _check_run(self, reply: dict, what: str) -> None:
        if reply["launches"] == 0:
            raise _Stop("cheat", f"no Triton kernel was launched during {what}: a PyTorch-only forward is not a kernel")
        if reply["side_stream"]:
            raise _Stop("cheat", f"a kernel was launched on a side stream during {what}: the timer would not see it")
        if reply["foreign_thread"] or reply["threads_alive"] > 0:
            raise _Stop("cheat", f"work was left to a background thread during {what}")
        if reply["mutated_inputs"]:
            raise _Stop("cheat", f"forward modified input(s) {reply['mutated_inputs']} during {what} "
                                 "(the task declares no in-place arguments)")

    def _compare(self, got: list, expected: list, what: str, result: EvalResult | None = None) -> None:
        checks = compare.compare_outputs(got, expected, self.task.tolerance)
        if result is not None:
            result.outputs = [c.as_dict() for c in checks]
        if not compare.all_ok(checks):
            failures = "; ".join(f"output {c.index}: {c.reason}" for c in checks if not c.ok)
            raise _Stop("mismatch", f"{what}: {failures}")

    def _verify(self, first: dict, result: EvalResult) -> None:
        limits = self.settings.limits
        self._check_run(first, "the first run")
        result.launches, result.kernels = first["launches"], first["kernels"]
        self._compare(first["outputs"], self.expected, "against the reference data (.pt)", result)
        second = self._call("run", limits.run_s, "pt", self.inputs, inplace_args=self.task.inplace_args)
        self._check_run(second, "the second run")
        if not identical(second["outputs"], first["outputs"]):
            raise _Stop("mismatch", "a second run on the same inputs gave different outputs")
        for i, (inputs, expected) in enumerate(self.fresh_cases()):
            reply = self._call("run", limits.run_s, f"seed{i}", inputs, inplace_args=self.task.inplace_args)
            self._check_run(reply, f"fresh seed {i + 1}")
            try:
                self._compare(reply["outputs"], expected, f"fresh seed {i + 1} against Reference on the target")
            except _Stop as stop:
                if identical(reply["outputs"], first["outputs"]):
                    raise _Stop("cheat", "returned the same outputs for different inputs: "
                                         "outputs are cached or hard-coded") from None
                raise stop
            result.seeds_checked += 1
            self._check_deadline(f"fresh seed {i + 1}")
        if self.fresh_cases():
            self._ghost(reply["outputs"], len(self.fresh_cases()) - 1)

    def _ghost(self, real: list, index: int) -> None:
        """Replay with every Triton launch turned into a no-op: if the outputs do not change,
        the kernels did not compute them (a decoy kernel next to a PyTorch forward)."""
        ghost = self._call("run", self.settings.limits.run_s, f"seed{index}", self.fresh_cases()[index][0],
                           inplace_args=self.task.inplace_args, ghost=True)
        if ghost.get("outputs") is not None and identical(ghost["outputs"], real):
            raise _Stop("cheat", "the outputs are the same with every Triton launch skipped: "
                                 "the kernels do not compute them")

    def _time(self, result: EvalResult) -> None:
        """Time on the secret fresh-seed inputs in rotation, then check that the timed calls
        launched kernels and computed the verified answers: no cache, replay or lazy shortcut
        survives being timed."""
        cases = self.fresh_cases()
        keys = [f"seed{i}" for i in range(len(cases))]
        probes = self.probe_cases()
        probe_keys = [f"seed{len(cases) + i}" for i in range(len(probes))]
        for key, (inputs, _expected) in zip(probe_keys, probes):
            self._put(key, inputs)
        try:
            reply = self._call("time", self.settings.limits.time_s, keys=keys, options=self.settings.timing,
                               probe_keys=probe_keys, inplace_args=self.task.inplace_args)
        finally:
            for key in probe_keys:
                self.candidates.__dict__.get("cached_inputs", set()).discard(key)
        stats = reply["stats"]
        if reply["side_stream"] or reply["foreign_thread"]:
            raise _Stop("cheat", "kernels ran outside the timed stream while being timed")
        if reply["launches"] < reply["min_calls"]:
            raise _Stop("cheat", f"{reply['min_calls']} timed calls launched only {reply['launches']} Triton kernels")
        for key, (_inputs, expected) in zip(keys + probe_keys, cases + probes):
            got = reply["outputs"].get(key)
            if got is None or not compare.all_ok(compare.compare_outputs(got, expected, self.task.tolerance)):
                raise _Stop("cheat", f"the timed calls on input set {key} did not compute the verified outputs")
        if not stats["median_ms"] > 0:
            raise _Stop("cheat", "the timer reports no time at all")
        probe = stats.get("probe_ms")
        ratio = CACHE_SPEED_RATIO.get(self.spec.backend.name, DEFAULT_CACHE_SPEED_RATIO)
        if probe and stats["median_ms"] < ratio * probe and probe - stats["median_ms"] > CACHE_MIN_GAIN_MS:
            raise _Stop("cheat", f"timed calls took {stats['median_ms']:.4f} ms but a call on unseen inputs "
                                 f"{probe:.4f} ms: repeated inputs are served from a cache")
        if self.spec.backend.name == "cuda":
            host, dev = stats["host_median_ms"], stats["median_ms"]
            if host > self.settings.unseen_work_ratio * dev and host > dev + 2.0:
                raise _Stop("cheat", f"device events saw {dev:.3f} ms but each call took {host:.3f} ms: "
                                     "work ran where the timer could not see it")
        result.timing = stats

    def _speedups(self, result: EvalResult) -> None:
        base = self.baseline()
        result.baseline = {k: v for k, v in base.items() if not k.endswith("_timing")}
        ms = result.timing["median_ms"]
        if ms <= 0:
            return
        if base.get("model_ms"):
            result.speedup_vs_model = base["model_ms"] / ms
        if base.get("reference_ms"):
            result.speedup_vs_reference = base["reference_ms"] / ms
            result.suspicious = result.speedup_vs_reference > SUSPICIOUS_SPEEDUP

    def close(self) -> None:
        self.candidates.close()
        self.references.close()

    def __enter__(self) -> "Evaluator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate(candidate: str, ref_data: dict, task: corpus.TaskRef, spec: DeviceSpec,
             settings: EvalSettings | None = None) -> EvalResult:
    """One candidate, start to finish (search keeps an Evaluator open instead)."""
    with Evaluator(task, ref_data, spec, settings) as ev:
        return ev.evaluate(candidate)


def describe_timing(stats: dict | None) -> str:
    if not stats:
        return "-"
    return (f"median {stats['median_ms']:.4f} ms, min {stats['min_ms']:.4f}, "
            f"rse {stats['rse'] * 100:.2f}%, {stats['reps']} reps ({stats['stop_reason']})")


__all__ = ["EvalResult", "EvalSettings", "Evaluator", "VERDICTS", "evaluate", "describe_timing", "timing"]


def _nbytes(values: list) -> list[int]:
    import torch

    return [v.numel() * v.element_size() for v in values if isinstance(v, torch.Tensor)]
