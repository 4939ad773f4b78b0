"""The judge: verify and time a candidate kernel on one device, in isolation.

Stages, each of which can end the evaluation with its verdict:

    static   parse, ModelNew present, a Triton kernel, no banned constructs  -> compile_error | cheat
             targets with a frontend check (ascend), where it is configured:
             every launch compiled by triton-ascend up to Linalg             -> compile_error
    compile  load the source in the candidate runner, instantiate, first run  -> compile_error | runtime_error
    verify   outputs on the .pt inputs against the .pt outputs;               -> mismatch | cheat
             inputs unchanged; a Triton kernel launched on the timed stream
             from the calling thread; a second run identical; the same check
             on secret fresh seeds against Reference run on the target
    probes   secret input sets never shown to the candidate reach its runner
             (a verification: the timing's exclusive hold starts after them)
    time     warm-up, flushed, event-timed repetitions until the RSE target    -> cheat (unseen work)
             (the per-call figure, probes and host checks); then the comparison:
             candidate and baselines timed in alternating rounds, in the op's timing
             mode (CUDA graph for short ops), outputs of the timed calls checked again
    pass     with speedups against Model and Reference measured in that comparison
             (farm.evaluate.speedup), and the fraction of the device's physical limit

A timeout or a dead runner at any stage gives `timeout` or `crash`; the runner is replaced and
the evaluator carries on. The candidate's runner never holds expected outputs: the trusted
reference runner (a second child) computes them, and this process compares.
"""

from __future__ import annotations

import logging
import secrets
import time
from dataclasses import dataclass, field
from typing import Any

from farm.config import current_settings, mask_secrets, secret_values
from farm.corpus import modes
from farm.corpus import tasks as corpus
from farm.corpus.inputs import draw_inputs
from farm.errors import FarmError
from farm.evaluate import boundary as os_boundary
from farm.evaluate import lease as device_lease
from farm.evaluate import profiles, static_checks, timed_checks, timing, verified
from farm.evaluate.comparison import Comparison
from farm.evaluate.result import EvalResult
from farm.evaluate.result import Stop as _Stop
from farm.evaluate.result import nbytes as _nbytes
from farm.evaluate.sandbox import Limits, Sandbox, SandboxDied, close_all
from farm.evaluate.timing import GRAPH_THRESHOLD_MS
from farm.runtime import compare
from farm.runtime.isolation import trim
from farm.runtime.tensors import identical
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

VERDICTS = ("compile_error", "runtime_error", "timeout", "crash", "mismatch", "cheat", "pass")
PROBES = 3  # input sets never shown to a candidate before its first timed call on them
# What a verdict keeps of a candidate's words (its exception text, its log), after known
# secrets are masked: stored in reports and databases and put into repair prompts.
REASON_CHARS = 2000
LOG_CHARS = 4000
# what each stage does with the device (farm.evaluate.lease): timings hold it alone
STAGE_PHASE = {"compile": device_lease.VERIFICATION, "verify": device_lease.VERIFICATION,
               "verify_backward": device_lease.VERIFICATION, "probes": device_lease.VERIFICATION,
               "time": device_lease.TIMING,
               "compare": device_lease.TIMING, "time_backward": device_lease.TIMING}


@dataclass
class EvalSettings:
    fresh_seeds: int = 2
    timing: dict = field(default_factory=dict)  # options for farm.evaluate.timing.measure
    limits: Limits = field(default_factory=Limits)
    # cuda: a call whose host time is this many times its event time (and 2 ms more) did
    # work the events did not see
    unseen_work_ratio: float = 4.0
    sandbox: str | None = None  # auto or off; None: evaluator.sandbox
    # python of the triton-ascend virtualenv (farm.ascend.frontend); None: its default lookup
    frontend_python: str | None = None
    profile: str = "farm"  # farm.evaluate.profiles: tolerances, trials, timing rules
    mode: str = "auto"  # timing mode of the comparison: auto, events or graph (farm.evaluate.timing)
    graph_threshold_ms: float = GRAPH_THRESHOLD_MS
    rounds: int = 4  # comparison rounds per baseline, per candidate
    round_reps: int = 20  # per-call figures (events) or graph replays in one round
    confirm_rounds: int = 12  # the re-timing before promotion
    # issue 17, a candidate's device time: the per-call pass beside a comparison gives checks and
    # a labelled figure, not the ratio (its budget, in ms; None: the profile's); a candidate whose
    # ratios after half the rounds all stay under this share of the op's best stops there (None: never)
    per_call_budget_ms: float | None = 100.0
    out_of_running: float | None = 0.9

    @classmethod
    def for_device(cls, spec: DeviceSpec, profile: str = "farm") -> "EvalSettings":
        rules = profiles.get(profile)
        if spec.target.interpret:
            # the interpreter is slow and its timings only rank roughly: a few repetitions,
            # whatever the profile says about timing
            return cls(timing={"warmup_ms": 0.0, "budget_ms": 300.0, "min_reps": 3, "max_reps": 20,
                               "rse_target": 0.05}, fresh_seeds=rules.fresh_seeds, profile=profile,
                       rounds=1, round_reps=2, confirm_rounds=3)
        return cls(timing=dict(rules.timing), fresh_seeds=rules.fresh_seeds, profile=profile)


class Evaluator(Comparison):
    """Evaluates candidates for one task on one device. Holds both runners, the .pt, the
    secret fresh-seed cases and the baselines, so each candidate costs only its own runs."""

    def __init__(self, task_ref: corpus.TaskRef, ref_data: dict, spec: DeviceSpec,
                 settings: EvalSettings | None = None):
        self.ref = task_ref
        self.data = ref_data
        self.spec = spec
        self.settings = settings or EvalSettings.for_device(spec)
        self.profile = profiles.get(self.settings.profile)
        self.shapes = ref_data.get("shapes", "bench")
        self.task = modes.as_recorded(modes.load_resolved(task_ref, self.shapes, ref_data.get("reference_class"),
                                                          ref_data.get("mode")), ref_data)
        self.seed_sets = ref_data.get("_seed_sets")
        # reference-data mode with a .pt that records no secret seed sets (made by the existing
        # tools' generator): nothing on the target knows the answer on other inputs, so a pass
        # rests on the .pt alone, and every verdict says so (farm.evaluate.verified)
        self.pt_only = self.task.reference_cls is None and self.task.mode == "reference-data" and not self.seed_sets
        # the profile's tolerances, and over them the task's own TOLERANCE
        self.tolerance = {**self.profile.tolerance, **self.task.tolerance}
        self.init_inputs = list(ref_data["init_inputs"])
        self.inputs = list(ref_data["inputs"])
        self.expected = list(ref_data["outputs"])
        self.boundary = os_boundary.current(self.settings.sandbox)  # raises where one is required and unavailable
        self.secrets = secret_values(current_settings())
        self.candidates = Sandbox(spec, self.settings.limits, self.boundary)
        self.candidates.output_nbytes = _nbytes(self.expected)
        # the task file runs here: it may import from its folder, and nothing else it needs
        self.references = Sandbox(spec, self.settings.limits, self.boundary, read_only=(task_ref.path.resolve().parent,))
        self._cases: list[tuple[list, list]] | None = None
        self._baseline: dict | None = None
        self.backward = None
        if self.task.backward:
            from farm.evaluate.backward import BackwardCheck

            self.backward = BackwardCheck(self)
        self._op_timing: dict | None = None
        self._slots: tuple[int, dict[str, str]] | None = None  # (runner start, {slot: "" or error})
        self._floor: dict | None = None
        self._kill_after = False
        self._null_run = False  # the candidate runner holds the task's own Model (confirm's null check)
        self.lease = device_lease.for_device(spec.label, host_wide=not spec.target.interpret)

    # ------------------------------------------------------------ trusted side

    def _load_trusted(self, which: str) -> dict:
        return self.references.call("load_task", self.settings.limits.compile_s, path=str(self.ref.path.resolve()),
                                    source=self.ref.source, shapes=self.shapes, which=which,
                                    init_inputs=self.init_inputs, policy=self.ref.policy,
                                    reference=self.task.reference_cls.__name__ if self.task.reference_cls else None)

    def _reference_run(self, which: str, key: str, inputs: list) -> dict:
        reply = self._load_trusted(which)
        if not reply.get("ok"):
            raise FarmError(f"{self.ref.path}: {which} cannot be built on {self.spec.label}: "
                            f"{self._clean(str(reply.get('error')), REASON_CHARS)}")
        return self.references.with_inputs("run", self.settings.limits.compile_s, key, inputs, poison=False)

    def reference_backward(self, key: str, inputs: list, indices: list[int], upstream: list) -> dict:
        """Reference's gradients on an input set, in the trusted runner."""
        loaded = self._load_trusted("Reference")
        reply = self.references.with_inputs("run_backward", self.settings.limits.compile_s, key, inputs,
                                            indices=indices, grad_outputs=upstream) if loaded.get("ok") else loaded
        if not reply.get("ok"):
            raise FarmError(f"{self.ref.path}: Reference's backward fails on {self.spec.label}: {reply.get('error')}")
        return reply

    @property
    def uses_seed_sets(self) -> bool:
        """Reference-data mode: the stored secret seed sets stand in for Reference on fresh seeds."""
        return self.task.reference_cls is None and bool(self.seed_sets)

    def _probe_count(self) -> int:
        return len(self.seed_sets) // 2 if self.uses_seed_sets else 0 if self.pt_only else PROBES

    def fresh_cases(self) -> list[tuple[list, list]]:
        """Inputs from secret seeds and the truth for them: Reference's outputs computed on the
        target, or in reference-data mode the Model's outputs recorded on the reference platform."""
        cases = self._all_cases()
        return cases[:len(cases) - self._probe_count()]

    def probe_cases(self) -> list[tuple[list, list]]:
        """More secret cases, for the timing probes: no candidate sees them before then."""
        cases = self._all_cases()
        return cases[len(cases) - self._probe_count():]

    def verification(self) -> dict:
        if self.pt_only:
            return verified.pt_only(self.data.get("device_name"))
        if self.uses_seed_sets:
            return {"by": "seed_sets", "sets": len(self.seed_sets),
                    "truth": f"original Model recorded on {self.data.get('device_name') or 'the reference platform'}"}
        return {"by": "reference", "sets": len(self._all_cases()),
                "truth": f"{self.task.truth_cls.__name__} on the target, fresh secret seeds"}

    def _all_cases(self) -> list[tuple[list, list]]:
        if self.pt_only:
            return []
        if self._cases is None and self.uses_seed_sets:
            self._cases = [(list(i), list(o)) for i, o in self.seed_sets]
        if self._cases is None:
            cases = []
            for i in range(self.settings.fresh_seeds + PROBES):
                seed = secrets.randbelow(2**31 - 1) + 1
                if self.profile.derived_seeds and i < self.settings.fresh_seeds:
                    seed = profiles.trial_seed(int(self.data.get("seed", 0) or 0), i)
                inputs = draw_inputs(self.task, seed)
                with self._device(device_lease.VERIFICATION):  # Reference on the device: never beside a timing
                    reply = self._reference_run("Reference", f"seed{len(cases)}", inputs)
                if not reply.get("ok"):
                    raise FarmError(f"{self.ref.path}: Reference fails on {self.spec.label} for a fresh seed: "
                                    f"{self._clean(str(reply.get('error')), REASON_CHARS)}")
                cases.append((inputs, reply["outputs"]))
            self._cases = cases
        return self._cases

    def fixed_costs(self) -> dict:
        """What this evaluator paid once per op: the secret fresh-seed cases (inputs and the
        truth on the target) and the baselines. The search stores them with its checkpoint so
        that later chunks and other workers adopt them instead of paying again."""
        return {"cases": None if self.uses_seed_sets else self._all_cases(), "baseline": self.baseline()}

    def adopt(self, fixed: dict) -> None:
        """Take the fixed costs another evaluator of this op paid (`fixed_costs`)."""
        if fixed.get("cases") is not None and not self.uses_seed_sets:
            self._cases = [(list(i), list(o)) for i, o in fixed["cases"]]
        if fixed.get("baseline") is not None:
            self._baseline = dict(fixed["baseline"])

    def baseline(self) -> dict:
        """Model (where it runs on the target) and Reference, timed like candidates."""
        if self._baseline is None:
            base: dict[str, Any] = {}
            for which, key in (("Model", "model"), ("Reference", "reference")):
                if which == "Reference" and self.task.reference_cls is None and self.task.mode != "model":
                    base["reference_error"] = "no Reference: the task is in reference-data mode"
                    continue
                try:
                    self._time_baseline(which, key, base)
                except (SandboxDied, FarmError) as exc:
                    base[f"{key}_error"] = str(exc)[-300:]
            self._baseline = base
        return self._baseline

    def _time_baseline(self, which: str, key: str, base: dict) -> None:
        """Loaded and run once as a verification, then timed alone: only the timing calls hold
        the device from other ops."""
        self.references.ensure_started()
        with self._device(device_lease.VERIFICATION):
            run = self._reference_run(which, "pt", self.inputs)
        if not run.get("ok"):
            base[f"{key}_error"] = run.get("error", "")[-300:]
            return
        with self._device(device_lease.TIMING):
            reply = self.references.call("time", self.settings.limits.time_s, keys=["pt"], options=self.settings.timing)
            if reply.get("ok"):
                base[f"{key}_ms"] = reply["stats"]["median_ms"]
                base[f"{key}_timing"] = reply["stats"]
            if self.backward is not None:
                reply = self.references.call("time", self.settings.limits.time_s, keys=["pt"],
                                             options=self.backward.timing_options(self.data["grad_outputs"]))
                if reply.get("ok"):
                    base[f"{key}_fwd_bwd_ms"] = reply["stats"]["median_ms"]

    # ------------------------------------------------------------ candidate side

    def evaluate(self, source: str, name: str = "candidate", bar: float | None = None) -> EvalResult:
        """The candidate's verdict and figures. `bar`: the op's best ratio against the Model so
        far (farm.search), against which a candidate out of the running stops its rounds early."""
        result = EvalResult(verdict="pass")
        self._started = started = time.monotonic()
        first: dict | None = None
        try:
            self._static(source)
            self._frontend(source, result)
            self._start_runners()
            for stage, run in self._stages(source, name, result, bar):
                t0 = time.monotonic()
                with self._device(STAGE_PHASE[stage], pin=stage == "compare"):
                    value = run(first if stage == "verify" else None)
                if stage == "compile":
                    first = value
                result.stage_s[stage] = time.monotonic() - t0
                self._check_deadline(stage)
        except _Stop as stop:
            result.verdict, result.reason, result.log = stop.verdict, stop.reason, stop.log
        except SandboxDied as died:
            result.verdict, result.reason = died.kind, str(died).splitlines()[0]
            result.log = str(died)
        if result.verdict in ("cheat", "runtime_error", "timeout") or self._kill_after:
            # a cheat may have left threads or patches behind, an error or a failed graph
            # capture a broken device context
            self.candidates.kill()
            self._kill_after = False
        result.stage_s["total"] = time.monotonic() - started
        result.device = getattr(self.candidates, "device_info", {})
        result.sandbox = self.boundary.kind
        result.reason = self._clean(result.reason, REASON_CHARS)
        result.log = self._clean(result.log, LOG_CHARS)
        if result.passed and self.backward is not None:
            self.backward.speedups(result)
        if result.passed:
            result.verified = {**self.verification(), "checked": result.seeds_checked}
        return result

    def _start_runners(self) -> None:
        """Both runners up before any stage takes the lease: a start held the device from
        other ops' timings for seconds (issue 17)."""
        self.candidates.ensure_started()
        self.references.ensure_started()

    def _stages(self, source: str, name: str, result: EvalResult, bar: float | None = None) -> list:
        stages = [("compile", lambda _: self._compile(source, name)), ("verify", lambda first: self._verify(first, result))]
        if self.backward is not None:
            stages.append(("verify_backward", lambda _: self.backward.verify(result, _Stop)))
        stages.append(("probes", lambda _: self._put_probes()))
        stages.append(("time", lambda _: self._time(result)))
        stages.append(("compare", lambda _: self._compare_all(result, bar=bar)))
        if self.backward is not None:
            stages.append(("time_backward", lambda _: self.backward.time(result, _Stop)))
        return stages

    def _clean(self, text: str, limit: int) -> str:
        """Known secrets masked (before the cut, so that no half of one survives), then cut."""
        return trim(mask_secrets(text or "", self.secrets), limit)

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

    def _frontend_wrap(self):
        """The frontend check runs the candidate's code too: inside the runners' boundary."""
        if not self.candidates.boundary.on:
            return None
        from farm.evaluate import boundary

        return lambda argv, scratch, env, read_only: boundary.wrap(argv, scratch=scratch, env=env,
                                                                   read_only=read_only)

    def _frontend(self, source: str, result: EvalResult) -> None:
        """Compile every launch with the target's own Triton (triton-ascend, up to Linalg) before
        any device time; a failure is the candidate's compile_error."""
        if self.spec.target.frontend != "ascend":
            return
        from farm.ascend import frontend

        t0 = time.monotonic()
        python = frontend.configured_python(self.settings.frontend_python)
        if python is None:
            frontend.say_not_configured_once()
            result.frontend = {"ran": False, "note": frontend.not_configured_notice()}
            return
        try:
            report = frontend.check_source(python, source, "ModelNew", self.init_inputs, self.inputs,
                                           wrap=self._frontend_wrap())
        except FarmError as exc:  # the compiler died on this candidate's kernels
            raise _Stop("compile_error", f"triton-ascend frontend check: {exc}") from None
        result.frontend = {"ran": True, **report.as_dict()}
        result.stage_s["frontend"] = time.monotonic() - t0
        if not report.ok:
            bad = report.first_failure()
            raise _Stop("compile_error", report.summary(), log=bad.message or "")

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
            raise _Stop("cheat", f"not a Triton kernel: no Triton kernel was launched during {what}")
        if reply["side_stream"]:
            raise _Stop("cheat", f"a kernel was launched on a side stream during {what}: the timer would not see it")
        if reply["foreign_thread"] or reply["threads_alive"] > 0:
            raise _Stop("cheat", f"work was left to a background thread during {what}")
        if reply["mutated_inputs"]:
            raise _Stop("cheat", f"forward modified input(s) {reply['mutated_inputs']} during {what} "
                                 "(the task declares no in-place arguments)")

    def _compare(self, got: list, expected: list, what: str, result: EvalResult | None = None) -> None:
        checks = compare.compare_outputs(got, expected, self.tolerance)
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
                self._compare(reply["outputs"], expected, f"fresh seed {i + 1} against Reference on the target"
                              if not self.uses_seed_sets else f"secret seed set {i + 1} recorded from the original Model")
            except _Stop as stop:
                if identical(reply["outputs"], first["outputs"]):
                    raise _Stop("cheat", "returned the same outputs for different inputs: "
                                         "outputs are cached or hard-coded") from None
                raise stop
            result.seeds_checked += 1
            self._check_deadline(f"fresh seed {i + 1}")
        if self.fresh_cases():
            last = len(self.fresh_cases()) - 1
            self._ghost(reply["outputs"], f"seed{last}", self.fresh_cases()[last][0])
        else:  # the .pt alone (no unseen inputs): the decoy check still runs on it
            self._ghost(first["outputs"], "pt", self.inputs)

    def _ghost(self, real: list, key: str, inputs: list) -> None:
        """Replay with every Triton launch turned into a no-op: if the outputs do not change,
        the kernels did not compute them (a decoy kernel next to a PyTorch forward)."""
        ghost = self._call("run", self.settings.limits.run_s, key, inputs,
                           inplace_args=self.task.inplace_args, ghost=True)
        if ghost.get("outputs") is not None and identical(ghost["outputs"], real):
            raise _Stop("cheat", "the outputs are the same with every Triton launch skipped: "
                                 "the kernels do not compute them")

    def _probe_keys(self) -> list[str]:
        first = len(self.fresh_cases())
        return [f"seed{first + i}" for i in range(len(self.probe_cases()))]

    def _put_probes(self) -> None:
        """The probe sets reach the runner just before the timing and outside its exclusive
        hold (a large set takes a second to send), with no candidate call in between: a
        candidate never runs while they are there before it is timed on them. A failed send
        takes the runner down, so no next candidate finds them either."""
        try:
            for key, (inputs, _expected) in zip(self._probe_keys(), self.probe_cases()):
                self._put(key, inputs)
        except BaseException:
            self.candidates.kill()
            raise

    def _time(self, result: EvalResult) -> None:
        """Time on the secret fresh-seed inputs in rotation, then check that the timed calls
        launched kernels and computed the verified answers: no cache, replay or lazy shortcut
        survives being timed."""
        keys, cases = self._time_cases()
        probes = self.probe_cases()
        probe_keys = self._probe_keys()
        self._put_probes()  # a no-op after the probes stage: they are kept until this call
        try:
            reply = self._call("time", self.settings.limits.time_s, keys=keys, options=self._per_call_options(),
                               probe_keys=probe_keys, inplace_args=self.task.inplace_args)
        finally:
            for key in probe_keys:
                self.candidates.__dict__.get("cached_inputs", set()).discard(key)
        expected = {key: outputs for key, (_inputs, outputs) in zip(keys + probe_keys, cases + probes)}

        def host_again() -> float:  # the same pass without the probes, which this candidate has now seen
            return self._call("time", self.settings.limits.time_s, keys=keys, options=self._per_call_options(),
                              inplace_args=self.task.inplace_args)["stats"]["host_median_ms"]

        result.timing = timed_checks.check(reply, expected, self.tolerance, self.spec.target,
                                           self.settings.unseen_work_ratio, recheck=host_again)

    def close(self) -> None:
        close_all((self.candidates, self.references))

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
    mode = f" ({stats['mode']})" if stats.get("mode") else ""
    return (f"median {stats['median_ms']:.4f} ms{mode}, min {stats['min_ms']:.4f}, "
            f"rse {stats['rse'] * 100:.2f}%, {stats['reps']} reps ({stats['stop_reason']})")


__all__ = ["EvalResult", "EvalSettings", "Evaluator", "VERDICTS", "evaluate", "describe_timing", "timing"]
