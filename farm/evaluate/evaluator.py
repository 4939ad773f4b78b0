"""The judge: verify and time a candidate kernel on one device, in isolation.

Stages, each of which can end the evaluation with its verdict:

    static   parse, ModelNew present, a Triton kernel, no banned constructs  -> compile_error | cheat
             targets with a frontend check (ascend), where it is configured:
             every launch compiled by triton-ascend up to Linalg             -> compile_error
    compile  load the code in the candidate runner, instantiate, first run    -> compile_error | runtime_error
    verify   outputs on the .pt inputs against the .pt outputs;               -> mismatch | cheat
             inputs unchanged; a Triton kernel launched on the timed stream
             from the calling thread; a second run identical; the same check
             on secret fresh inputs against Reference run on the target; then
             each recorded case of the op's shape space (farm.evaluate.space_cases)
    probes   secret input sets never shown to the candidate reach its runner
             (a verification: the timing's exclusive hold starts after them)
    time     warm-up, flushed, event-timed repetitions until the RSE target    -> cheat (unseen work)
             (the per-call figure, probes and host checks); then the comparison:
             candidate and baselines timed in alternating rounds, in the op's timing
             mode (CUDA graph for short ops), outputs of the timed calls checked again;
             then each further case of the serving mix (farm.evaluate.mix_timing)
    pass     with speedups against Model and Reference measured in that comparison
             (farm.evaluate.speedup), and the fraction of the device's physical limit

The parts, along the trust line (docs/evaluator.md, "Trust"):

    candidate runner  a fresh process per candidate, from a warm pool (farm.evaluate.pool,
                      farm.evaluate.runner): runs the candidate, returns plain outputs; its
                      claims (launches, threads, timings) are evidence, never the decision
    trusted runner    the task's Model and Reference (`trusted`): the truth on the fresh
                      inputs and the baselines; never runs candidate code
    verifier          this process: outputs against each case's truth (farm.evaluate.verifier)
    timer             this process's clock over every round (farm.evaluate.timer)
    protocol          typed, size- and time-bounded messages (farm.evaluate.protocol, .wire)

A timeout or a dead runner at any stage gives `timeout` or `crash`. Whatever the verdict, the
candidate's runner ends with the candidate: the next one gets a runner no candidate ran in.
"""

from __future__ import annotations

import logging
import time

from farm.config import Settings, environment_settings
from farm.corpus import modes
from farm.corpus import tasks as taskfiles
from farm.errors import FarmError
from farm.evaluate import lease as device_lease
from farm.evaluate import pids, profiles, sandbox, space_cases, static_checks, timed_checks, timing
from farm.evaluate.ahead import CompileAhead
from farm.evaluate.eval_settings import EvalSettings
from farm.evaluate.pool import RunnerPool
from farm.evaluate.protocol import Reply
from farm.evaluate.result import LOG_CHARS, REASON_CHARS, EvalResult
from farm.evaluate.result import Stop as _Stop
from farm.evaluate.rounds import Comparison
from farm.evaluate.runner import Runner, RunnerDied, close_all
from farm.evaluate.trusted import PROBES, TrustedSide  # noqa: F401 - PROBES: part of this module's face
from farm.evaluate.verifier import Verifier
from farm.masking import mask_secrets, secret_values
from farm.reference.fitted import fitted
from farm.runtime import tolerance
from farm.runtime.children import trim
from farm.runtime.tensors import identical
from farm.targets import DeviceSpec

log = logging.getLogger(__name__)

VERDICTS = ("compile_error", "runtime_error", "timeout", "crash", "mismatch", "cheat", "pass")
# what each stage does with the device (farm.evaluate.lease): timings hold it alone
STAGE_PHASE = {"compile": device_lease.VERIFICATION, "verify": device_lease.VERIFICATION,
               "verify_backward": device_lease.VERIFICATION, "probes": device_lease.VERIFICATION,
               "time": device_lease.TIMING,
               "compare": device_lease.TIMING, "time_backward": device_lease.TIMING}


class Evaluator(TrustedSide, Comparison):
    """Evaluates candidates for one task on one device. Holds both runners, the .pt, the
    secret fresh-input cases and the baselines, so each candidate costs only its own runs.
    `config`: the command's settings (the sandbox policy, the cases, the secrets to mask);
    None: the environment's and the config file's (farm.config.environment_settings)."""

    def __init__(self, task_ref: taskfiles.TaskRef, ref_data: dict, spec: DeviceSpec,
                 settings: EvalSettings | None = None, config: Settings | None = None):
        self.settings = settings or EvalSettings.for_device(spec)
        self.config = config if config is not None else environment_settings()
        # a compact .pt (a KernelBench-sized op) is verified at the largest shapes that ship in full
        task_ref, ref_data = fitted(task_ref, ref_data, spec, self.settings.limits.compile_s * 4)
        self.ref = task_ref
        self.data = ref_data
        self.spec = spec
        self.profile = profiles.get(self.settings.profile)
        self.shapes = ref_data.get("shapes", "bench")
        self.task = modes.as_recorded(modes.load_resolved(task_ref, self.shapes, ref_data.get("reference_class"),
                                                          ref_data.get("mode")), ref_data)
        self.secret_inputs = ref_data.get("_secret_inputs")
        # reference-data mode with a .pt that records no secret input sets (made by the existing
        # tools' generator): nothing on the target knows the answer on other inputs, so a pass
        # rests on the .pt alone, and every verdict says so (farm.evaluate.verified)
        self.pt_only = self.task.reference_cls is None and self.task.mode == "reference-data" and not self.secret_inputs
        # the profile's tolerances, over them the task's own TOLERANCE, no finer than the inputs
        self.tolerance = tolerance.through_inputs({**self.profile.tolerance, **self.task.tolerance},
                                                ref_data.get("input_dtypes"), self.task.tolerance)
        self.init_inputs = list(ref_data["init_inputs"])
        self.inputs = list(ref_data["inputs"])
        self.expected = list(ref_data["outputs"])
        recorded, self.cases_note = space_cases.recorded(ref_data)
        self.mix = space_cases.timed(recorded, self._setting("timed_cases"), task_ref.source, spec.target.interpret)
        self.space_cases = space_cases.verified(recorded, self._setting("cases"), self.mix)
        # raises where one is required and unavailable
        self.boundary = sandbox.current(self._setting("sandbox"), self.config.evaluator.require_sandbox)
        self.secrets = secret_values(self.config)
        self.verifier = Verifier(self.tolerance)
        # a fresh runner per candidate, started ahead; the current candidate's is `candidates`
        self.pool = RunnerPool(spec, self.settings.limits, self.boundary, self.settings.warm_runners,
                               configure=self._configure, prime=self._prime)
        self.candidates: Runner | None = None
        self.trusted = self._new_trusted()
        self._cases: list[tuple[list, list]] | None = None
        self._seeds: list[int | None] = []
        self._baseline: dict | None = None
        self.backward = None
        if self.task.backward:
            from farm.evaluate.backward import BackwardCheck

            self.backward = BackwardCheck(self)
        self._op_timing: dict | None = None
        self._slots: tuple[tuple[int, int], dict[str, str]] | None = None  # ((runner id, its starts), {slot: ...})
        self._floor: dict | None = None
        self._null_run = False  # the candidate runner holds the task's own Model (the re-timing's null check)
        self.lease = device_lease.for_device(spec.label, host_wide=not spec.target.interpret)

    def _setting(self, name: str):
        value = getattr(self.settings, name)
        return getattr(self.config.evaluator, name) if value is None else value

    # ------------------------------------------------------------ candidate side

    def evaluate(self, candidate_code: str, name: str = "candidate", best_so_far: float | None = None,
                 runner: Runner | None = None) -> EvalResult:
        """The candidate's verdict and figures. `best_so_far`: the op's best ratio against the
        Model so far (farm.search), against which a candidate out of the running stops its rounds
        early.
        `runner`: a fresh runner that compile-ahead already loaded this candidate in
        (farm.evaluate.ahead); else one from the pool. Either way it ends with this candidate."""
        result = EvalResult(verdict="pass")
        self._started = started = time.monotonic()
        first: dict | None = None
        self.candidates, runner = runner, None
        try:
            self._static(candidate_code)
            self._frontend(candidate_code, result)
            self._start_runners()
            for stage, run in self._stages(candidate_code, name, result, best_so_far):
                t0 = time.monotonic()
                with self._device(STAGE_PHASE[stage], pin=stage == "compare"):
                    value = run(first if stage == "verify" else None)
                if stage == "compile":
                    first = value
                result.stage_s[stage] = time.monotonic() - t0
                self._check_deadline(stage)
        except _Stop as stop:
            result.verdict, result.reason, result.log = stop.verdict, stop.reason, stop.log
        except RunnerDied as died:
            result.verdict, result.reason = died.kind, str(died).splitlines()[0]
            result.log = str(died)
        finally:
            result.device = getattr(self.candidates, "device_info", None) or getattr(self.trusted, "device_info", {})
            self._retire()
        result.stage_s["total"] = time.monotonic() - started
        result.sandbox = self.boundary.kind
        result.runner_limits = self.limits_in_force()
        result.reason = self._clean(result.reason, REASON_CHARS)
        result.log = self._clean(result.log, LOG_CHARS)
        if result.passed and self.backward is not None:
            self.backward.speedups(result)
        if result.passed:
            result.verified = {**self.verification(), "checked": result.seeds_checked,
                               **self.cases_verified(result.cases_checked)}
        return result

    def _retire(self) -> None:
        """The candidate's runner goes with its candidate: nothing it did (patches, processes,
        files, compiled entries, input sets) reaches the next one."""
        box, self.candidates = self.candidates, None
        if box is not None:
            box.close()

    def limits_in_force(self) -> dict:
        """What bounded the runner besides time and memory (docs/evaluator.md, Sandbox)."""
        limits = self.settings.limits
        if not self.boundary.on:
            return {"pids": "none (no sandbox)"}
        return {"pids": pids.mechanism(), "tasks": limits.tasks, "scratch_mb": limits.scratch_mb,
                "tmp_mb": limits.tmp_mb}

    def _start_runners(self) -> None:
        """Both runners up before any stage takes the lease: a start held the device from
        other ops' timings for seconds."""
        if self.candidates is None:
            self.candidates = self._take_runner()
        self.candidates.ensure_started()
        self.trusted.ensure_started()

    def _stages(self, candidate_code: str, name: str, result: EvalResult, best_so_far: float | None = None) -> list:
        stages = [("compile", lambda _: self._compile(candidate_code, name)),
                  ("verify", lambda first: self._verify(first, result))]
        backward = self.backward
        if backward is not None:
            stages.append(("verify_backward", lambda _: backward.verify(result, _Stop)))
        stages.append(("probes", lambda _: self._put_probes()))
        stages.append(("time", lambda _: self._time(result)))
        stages.append(("compare", lambda _: self._compare_all(result, best_so_far=best_so_far)))
        if backward is not None:
            stages.append(("time_backward", lambda _: backward.time(result, _Stop)))
        return stages

    def _clean(self, text: str, limit: int) -> str:
        """Known secrets masked (before the cut, so that no half of one survives), then cut."""
        return trim(mask_secrets(text or "", self.secrets), limit)

    @property
    def _candidate(self) -> Runner:
        """The current candidate's runner, which its stages use: there from the start of evaluate()."""
        if self.candidates is None:
            raise RuntimeError("no candidate runner outside evaluate()")
        return self.candidates

    def _put(self, key: str, inputs: list) -> None:
        """Send an input set to the candidate runner unless it already keeps it."""
        box = self._candidate
        if key not in box.cached_inputs or not box.alive:
            reply = box.call("put_inputs", self.settings.limits.run_s, key=key, inputs=inputs,
                             output_nbytes=box.output_nbytes)
            if not reply.ok:
                raise _Stop(reply.get("kind", "runtime_error"), reply.get("error", "could not load inputs"))
            box.cached_inputs.add(key)

    def _check_deadline(self, stage: str) -> None:
        if time.monotonic() - self._started > self.settings.limits.total_s:
            raise _Stop("timeout", f"over the {self.settings.limits.total_s:.0f} s limit per candidate after {stage}")

    def _static(self, candidate_code: str) -> None:
        verdict, reason = static_checks.static_verdict(candidate_code)
        if verdict:
            raise _Stop(verdict, reason)

    def _frontend_wrap(self):
        """The frontend check runs the candidate's code too: inside the runners' boundary."""
        if not self.boundary.on:
            return None
        from farm.evaluate import sandbox

        return lambda argv, scratch, env, read_only: sandbox.wrap(argv, scratch=scratch, env=env,
                                                                   read_only=read_only)

    def _frontend(self, candidate_code: str, result: EvalResult) -> None:
        """Compile every launch with the target's own Triton frontend (`Target.frontend_check`:
        triton-ascend, up to Linalg) before any device time; a failure is the candidate's compile_error."""
        frontend = self.spec.target.frontend_check()
        if frontend is None:
            return
        t0 = time.monotonic()
        python = frontend.configured_python(self.settings.frontend_python)
        if python is None:
            frontend.say_not_configured_once()
            result.frontend = {"ran": False, "note": frontend.not_configured_notice()}
            return
        try:
            report = frontend.check_source(python, candidate_code, "ModelNew", self.init_inputs, self.inputs,
                                           wrap=self._frontend_wrap())
        except FarmError as exc:  # the compiler died on this candidate's kernels
            raise _Stop("compile_error", f"{frontend.CHECK_NAME}: {exc}") from None
        result.frontend = {"ran": True, **report.as_dict()}
        result.stage_s["frontend"] = time.monotonic() - t0
        if not report.ok:
            bad = report.first_failure()
            raise _Stop("compile_error", report.summary(), log=(bad.message if bad else "") or "")

    def _call(self, cmd: str, timeout: float, key: str | None = None, inputs: list | None = None, **args) -> Reply:
        if key is None:
            reply = self._candidate.call(cmd, timeout, **args)
        else:
            reply = self._candidate.with_inputs(cmd, timeout, key, inputs, **args)
        if not reply.ok:
            kind = reply.get("kind", "runtime_error")
            error = reply.get("error", "")
            raise _Stop(kind, error.strip().splitlines()[-1] if error.strip() else kind, error)
        return reply

    def _compile(self, candidate_code: str, name: str) -> Reply:
        limits = self.settings.limits
        self._call("load_source", limits.compile_s, source=candidate_code, init_inputs=self.init_inputs, name=name)
        return self._call("run", limits.compile_s, "pt", self.inputs, inplace_args=self.task.inplace_args)

    def _check_run(self, reply: Reply, what: str) -> None:
        """The runner's own account of a run. Evidence only: a candidate could hide each of
        these, and none of them can make a wrong or slower kernel pass (outputs are compared
        in this process, times held to its clock)."""
        if reply["launches"] == 0:
            raise _Stop("cheat", f"not a Triton kernel: no Triton kernel was launched during {what}")
        if reply["side_stream"]:
            raise _Stop("cheat", f"a kernel was launched on a side stream during {what}: the timer would not see it")
        if reply["foreign_thread"] or reply["threads_alive"] > 0:
            raise _Stop("cheat", f"work was left to a background thread during {what}")
        if reply["mutated_inputs"]:
            raise _Stop("cheat", f"forward modified input(s) {reply['mutated_inputs']} during {what} "
                                 "(the task declares no in-place arguments)")

    def _verify(self, first: Reply, result: EvalResult) -> None:
        """Every case, compared in this process: the .pt, a second run on it (bitwise), each
        secret fresh case; then the ghost replay on the last."""
        limits = self.settings.limits
        pt, *fresh = self.cases()
        self._check_run(first, "the first run")
        result.launches, result.kernels = first["launches"], first["kernels"]
        result.outputs = [c.as_dict() for c in self.verifier.checks(first["outputs"], pt)]
        self.verifier.check(first["outputs"], pt)
        second = self._call("run", limits.run_s, "pt", self.inputs, inplace_args=self.task.inplace_args)
        self._check_run(second, "the second run")
        if not identical(second["outputs"], first["outputs"]):
            raise _Stop("mismatch", "a second run on the same inputs gave different outputs")
        # the decoy check's replay of the last fresh case runs before the candidate ever computed it:
        # a freed buffer the allocator hands back then cannot hold that case's answer by chance
        ghost = self._ghost_run(fresh[-1].key, fresh[-1].inputs) if fresh else None
        for i, case in enumerate(fresh):
            reply = self._call("run", limits.run_s, case.key, case.inputs, inplace_args=self.task.inplace_args)
            self._check_run(reply, f"fresh input set {i + 1}")
            self.verifier.check_seed(reply["outputs"], case, first["outputs"])
            result.seeds_checked += 1
            self._check_deadline(f"fresh input set {i + 1}")
        self._verify_space(first, result)
        if fresh:
            self._ghost(reply["outputs"], ghost)
        else:  # the .pt alone (no unseen inputs): the decoy check still runs on it
            self._ghost(first["outputs"], self._ghost_run("pt", self.inputs))

    def _verify_space(self, first: Reply, result: EvalResult) -> None:
        """The cases of the op's shape space (farm.evaluate.space_cases), once the cheap checks
        passed: a kernel that assumes one shape (a hard-coded size, a grid without the tail)
        fails here, at the case it gets wrong."""
        for case in self.space_cases:
            self._candidate.cached_inputs.discard(space_cases.RUNNER_KEY)  # this case replaces the last one
            try:
                reply = self._call("run", self.settings.limits.run_s, space_cases.RUNNER_KEY, case.inputs,
                                   inplace_args=self.task.inplace_args)
            except _Stop as stop:  # a kernel compiled for one shape raises at another: say where
                raise _Stop(stop.verdict, f"{case.describe()}: {stop.reason}", stop.log) from None
            self._check_run(reply, f"the {case.label}")
            self.verifier.check_seed(reply["outputs"], case, first["outputs"])
            result.cases_checked += 1
            self._check_deadline(case.label)
        self._candidate.cached_inputs.discard(space_cases.RUNNER_KEY)

    def _ghost_run(self, key: str, inputs: list) -> Reply:
        """A replay with every Triton launch turned into a no-op."""
        return self._call("run", self.settings.limits.run_s, key, inputs,
                          inplace_args=self.task.inplace_args, ghost=True)

    def _ghost(self, real: list, ghost: Reply | None) -> None:
        """If the outputs do not change with every launch skipped, the kernels did not compute
        them (a decoy kernel next to a PyTorch forward)."""
        if ghost is not None and ghost.get("outputs") is not None and identical(ghost["outputs"], real):
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
        for key, (inputs, _expected) in zip(self._probe_keys(), self.probe_cases()):
            self._put(key, inputs)

    def _time(self, result: EvalResult) -> None:
        """Time on the secret fresh inputs in rotation, then check that the timed calls
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
                self._candidate.cached_inputs.discard(key)
        expected = {key: outputs for key, (_inputs, outputs) in zip(keys + probe_keys, cases + probes)}

        def host_again() -> float:  # the same pass without the probes, which this candidate has now seen
            return self._call("time", self.settings.limits.time_s, keys=keys, options=self._per_call_options(),
                              inplace_args=self.task.inplace_args)["stats"]["host_median_ms"]

        result.timing = timed_checks.check(reply, expected, self.tolerance, self.spec.target,
                                           self.settings.unseen_work_ratio, recheck=host_again,
                                           unverified=frozenset(probe_keys))

    # ------------------------------------------------------------ what a search asks besides verdicts

    def device_info(self) -> dict:
        """The device as the trusted runner described it when it started (name, properties).
        Started here if it has not yet: a later chunk reuses the stored fixed costs, so nothing
        else has started it when the search reads the device, and an empty name made promotion
        take the result for another device's and replace the best without comparing times."""
        self.trusted.ensure_started()
        return self.trusted.device_info

    def compile_ahead(self, specs: list[DeviceSpec], size: int, target: str) -> CompileAhead:
        """`size` compile-ahead runners (farm.evaluate.ahead) over `specs`, set up as this
        evaluator's own are, so that a candidate compiled in one goes on to be judged in it."""
        return CompileAhead(specs, size, self.init_inputs, self.inputs, self.settings.limits, self.boundary, target,
                            configure=self._configure, prime=self._prime, secrets=self.secrets)

    def close(self) -> None:
        close_all([self.pool] + [b for b in (self.candidates, self.trusted) if b is not None])
        self.candidates = None

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def evaluate(candidate: str, ref_data: dict, task: taskfiles.TaskRef, spec: DeviceSpec,
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


__all__ = ["VERDICTS", "EvalResult", "EvalSettings", "Evaluator", "describe_timing", "evaluate", "timing"]
