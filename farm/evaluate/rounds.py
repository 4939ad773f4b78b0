"""The comparison half of the Evaluator (farm.evaluate.evaluator): the op's timing mode, the
baselines kept in the trusted runner, candidate and baselines timed in alternating rounds
(farm.evaluate.speedup), the physical limit, and the re-timing before promotion (null check,
retime). A mixin: it uses the Evaluator's runners, settings and secret input sets."""

from __future__ import annotations

import statistics
import time
from collections.abc import Iterator
from contextlib import contextmanager

from farm.evaluate import limits, mix_timing, quiet, space_cases, timing
from farm.evaluate import speedup as speedups
from farm.evaluate.lease import TIMING, VERIFICATION
from farm.evaluate.result import EvalResult, NotCapturable, Stop, nbytes
from farm.evaluate.runner import RunnerDied, close_all
from farm.evaluate.state import EvaluatorState
from farm.evaluate.timer import RoundClock
from farm.evaluate.verifier import Case

# device label -> its measured floor (farm.evaluate.floor), shared by the process's evaluators
_FLOORS: dict[str, dict] = {}
SUSPICIOUS_SPEEDUP = 20.0  # against Reference; reported, never trusted silently
# what a result keeps of the per-call pass (probes, host checks) beside the compared figure
PER_CALL_KEYS = ("median_ms", "min_ms", "rse", "reps", "stop_reason", "host_median_ms", "host_bound", "probe_ms",
                 "probe_check", "host_check")


class Comparison(EvaluatorState):
    """Mixed into Evaluator; every method uses its runners (`candidates`, `trusted`)."""

    _pinned = False  # a timing of this evaluator holds the device and has pinned its runners
    _cut = 0
    _mix_case = None  # the case of the serving mix being timed (farm.evaluate.mix_timing)
    _mix_calls = 0  # its graph size
    # set by the Evaluator's __init__
    _op_timing: dict | None  # the op's timing mode, chosen once (op_timing)
    _slots: tuple[tuple[int, int], dict[str, str]] | None  # ((runner id, its starts), {slot: "" or error})
    _floor: dict | None
    _null_run: bool  # the candidate runner holds the task's own Model (the null check)
    _started: float  # when the candidate's evaluation began

    @contextmanager
    def _device(self, phase: str, pin: bool = False) -> Iterator[None]:
        """The lease's hold of the device for `phase`. With `pin` (the interleaved rounds of a
        ratio) both runners, which take turns in them, also run on the device's one timing core
        while it holds (farm.evaluate.quiet.timing_cpu): ratios of figures from two freely placed
        processes carried their placement. Single-runner timings (a candidate's per-call pass and
        its host-side checks, the baselines' per-call figures) keep the host's placement, where
        a busy neighbour cannot hold the runner on one core."""
        outer = pin and phase == TIMING and not self._pinned and not self.spec.target.interpret
        with self.lease.hold(phase):
            cpu = quiet.timing_cpu(self.spec.index or 0) if outer else None  # no index: a host target
            if cpu is None:
                yield
                return
            runners = [r for r in (self.candidates, self.trusted) if r is not None]
            self._pinned = True
            for runner in runners:
                runner.pin({cpu})
            try:
                yield
            finally:
                self._pinned = False
                for runner in runners:
                    runner.pin(None)

    def _per_call_options(self) -> dict:
        """The candidate's per-call pass: its figure is kept beside the compared one, labelled,
        and its checks (probes, host time, launches) need tens of calls, not the 400 ms in which
        a microsecond kernel's figure chases its RSE target. Only under the farm's rules: another
        profile's repetitions are part of its figure (kernelbench: 100)."""
        options = dict(self.settings.timing)
        cap = self.settings.per_call_budget_ms
        if cap is not None and self.settings.profile == "farm":
            options["budget_ms"] = min(cap, options.get("budget_ms", timing.DEFAULT_BUDGET_MS))
        return options

    def _time_cases(self) -> tuple[list[str], list]:
        """The secret input sets timing rotates through; the .pt's own where there are none
        (reference data without secret input sets: farm.evaluate.verified)."""
        if self._mix_case is not None:  # a case of the serving mix (farm.evaluate.mix_timing)
            return [space_cases.RUNNER_KEY], [(self._mix_case.inputs, self._mix_case.expected)]
        cases = self.fresh_cases()
        if not cases:
            return ["pt"], [(self.inputs, self.expected)]
        return [f"seed{i}" for i in range(len(cases))], cases

    def _graph_keys(self) -> list[str]:
        """A graph replays one secret input set in the same buffers, as CUDA-graph serving
        replays its static input buffers (and as do_bench_cudagraph times a call): rotating
        sets at other addresses changed which candidate won by a few percent on the H100."""
        return self._time_cases()[0][:1]

    def _baseline_slots(self) -> dict[str, str]:
        """Model and Reference kept side by side in the trusted runner, on the secret input
        sets the candidates are timed on; {slot: "" if loaded else why not}. Reloaded after
        the runner was replaced."""
        if self._slots is not None and self._slots[0] == (id(self.trusted), self.trusted.starts) \
                and self.trusted.alive:
            return self._slots[1]
        keys, cases = self._time_cases()
        slots: dict[str, str] = {}
        wanted = ["Model"] + (["Reference"] if self.task.reference_cls is not None else [])
        for which in wanted:
            try:
                reply = self.trusted.call("load_task", self.settings.limits.compile_s,
                                             path=str(self.ref.path.resolve()), source=self.ref.source,
                                             shapes=self.shapes, which=which, init_inputs=self.init_inputs, slot=which,
                                             policy=self.ref.policy, reference=self.task.reference_cls.__name__
                                             if self.task.reference_cls else None)
                slots[which] = "" if reply.ok else (reply.get("error") or "cannot be built")[-300:]
            except RunnerDied as exc:
                slots[which] = str(exc)[-300:]
        for key, (inputs, _expected) in zip(keys, cases):
            if key not in self.trusted.cached_inputs:
                reply = self.trusted.call("put_inputs", self.settings.limits.run_s, key=key, inputs=inputs)
                if reply.ok:
                    self.trusted.cached_inputs.add(key)
        self._slots = ((id(self.trusted), self.trusted.starts), slots)
        return slots

    def op_timing(self) -> dict:
        """The op's timing mode, chosen once from the original (Model, else Reference): a CUDA
        graph when it runs under the threshold in one and can be captured, else per call."""
        if self._op_timing is None:
            slots = self._baseline_slots()
            keys = self._graph_keys()
            original = next((w for w in ("Model", "Reference") if slots.get(w) == ""), None)
            graph_ms, capture_error, calls = None, "", 0
            if self.spec.target.graphs and self.settings.mode != "events" and original:
                per_call = self.baseline().get(f"{original.lower()}_ms") or 0.01
                calls = timing.graph_calls_for(per_call, len(keys))
                try:
                    reply = self.trusted.call("time_round", self.settings.limits.time_s, slot=original, keys=keys,
                                                 mode="graph", reps=self.settings.round_reps, calls=calls,
                                                 inplace_args=self.task.inplace_args)
                except RunnerDied:  # the capture took the runner down
                    capture_error = "capture_failed"
                else:
                    if reply.get("capture_error"):
                        capture_error = reply["capture_error"]
                    elif reply.ok:
                        graph_ms = sorted(reply["samples"])[len(reply["samples"]) // 2]
            per_call = self.baseline().get(f"{(original or 'model').lower()}_timing") or {}
            mode, reason = timing.choose_mode(self.settings.mode, self.spec.target, graph_ms, capture_error,
                                              self.settings.graph_threshold_ms, per_call.get("host_bound", 0.0))
            if mode == "graph":
                calls = timing.graph_calls_for(graph_ms or 0.01, len(keys))
            self._op_timing = {"mode": mode, "reason": reason, "graph_calls": calls if mode == "graph" else 0,
                               "original": original, "original_graph_ms": graph_ms, "capture_error": capture_error,
                               "flush": self.settings.timing.get("flush", "write") if mode == "events" else "none"}
        return self._op_timing

    def floor(self) -> dict | None:
        """The device's copy bandwidth and empty-kernel time per mode: measured in a trusted
        runner once per device and process, not once per op (it is the device's, and each
        measurement held the device for about half a second of every op's search)."""
        if self._floor is None:  # {"limits": None} keeps a failed measurement from being retried per candidate
            name = getattr(self.trusted, "device_info", {}).get("name", "")
            floor = _FLOORS.get(self.spec.label) or limits.cached_floor(name, self._measure_floor)
            if floor:
                _FLOORS[self.spec.label] = floor
            self._floor = {"limits": floor}
        return self._floor["limits"]

    def _measure_floor(self) -> dict | None:
        try:
            reply = self.trusted.call("device_limits", self.settings.limits.time_s)
        except RunnerDied:
            return None
        return reply.get("limits") if reply.ok else None

    def _round(self, who: str, keys: list[str], mode: str, calls: int, reps: int, outputs: bool = False,
               captures: bool = False):
        """One round, timed on this process's clock as well (farm.evaluate.timer). A round that
        sends outputs back or captures a graph holds more than the harness's usual work: timed,
        not compared with the others."""
        args = dict(keys=keys, mode=mode, reps=reps, calls=calls, inplace_args=self.task.inplace_args,
                    flush=self.settings.timing.get("flush", "write"), outputs=outputs)
        timed_calls = reps * (calls or 1)
        if who != speedups.CANDIDATE:
            reply = self._clock.time(who, mode, timed_calls, lambda: self.trusted.call(
                "time_round", self.settings.limits.time_s, slot=who, **args), exempt=outputs)
            if reply.ok and reply.get("captured") and self._clock.rounds:
                self._clock.rounds[-1].exempt = True  # the trusted runner's word: it never runs candidate code
            return reply
        all_keys = self._time_cases()[0]
        if mode == "graph" and outputs and not self.task.inplace_args and len(all_keys) > 1:
            args["swap_key"] = all_keys[1]  # a set the graph was never captured on
        reply = self._clock.time(who, mode, timed_calls, lambda: self._call(
            "time_round", self.settings.limits.time_s, slot=None, **args), exempt=outputs or captures)
        if "swap_check" in reply:
            self._swap_check = reply["swap_check"]
        if reply.get("capture_error") or self._null_run:
            return reply
        if reply["side_stream"] or reply["foreign_thread"]:
            raise Stop("cheat", "kernels ran outside the timed stream while being timed")
        if mode == "graph" and reply.get("captured") and reply["launches"] < calls:
            raise Stop("cheat", f"{calls} captured calls launched only {reply['launches']} Triton kernels")
        if mode == "events" and reply["launches"] < reps:
            raise Stop("cheat", f"{reps} timed calls launched only {reply['launches']} Triton kernels")
        return reply

    def _put_time_cases(self) -> None:
        keys, cases = self._time_cases()
        for key, (inputs, _expected) in zip(keys, cases):
            self._put(key, inputs)  # a fresh runner (the re-timing) has none yet

    def _interleave(self, mode: str, baselines: list[str], rounds: int,
                    best_so_far: float | None = None) -> tuple[list, list[float], dict, dict]:
        """Candidate and baselines in alternating rounds, all in timing mode `mode`. Returns the (who, round
        median) sequence, the candidate's samples, the outputs of its last round and the
        baselines that failed (name -> why). With `best_so_far`, a candidate out of the running ends
        after half the rounds (`_out_of_running`)."""
        self._put_time_cases()
        calls = (self._mix_calls or self.op_timing()["graph_calls"]) if mode == "graph" else 0
        keys = self._graph_keys() if mode == "graph" else self._time_cases()[0]
        reps = self.settings.round_reps
        order = speedups.round_order(baselines, rounds)
        timed: list[tuple[str, float]] = []
        samples: list[float] = []
        failed: dict[str, str] = {}
        outputs: dict = {}
        half = 2 * len(baselines) * (rounds // 2)  # the candidate round that ends the first half
        last = len(order) - 1
        first = True  # the candidate's first round: in a graph, its capture
        for i, who in enumerate(order):
            if who in failed:
                continue
            if i == half and i < last and self._out_of_running(timed, best_so_far):
                last = i  # its last round: the outputs checked are this one's
                self._cut = sum(1 for w, _ in timed if w != speedups.CANDIDATE)
            reply = self._round(who, keys, mode, calls, reps, outputs=(i == last),
                                captures=first and who == speedups.CANDIDATE and mode == "graph")
            first = first and who != speedups.CANDIDATE
            if reply.get("capture_error"):
                if who == speedups.CANDIDATE:
                    raise NotCapturable(reply["capture_error"], reply.get("detail", ""))
                failed[who] = f"not capturable ({reply['capture_error']})"
                continue
            if not reply.ok:
                failed[who] = (reply.get("error") or "failed").strip().splitlines()[-1][:300]
                continue
            timed.append((who, statistics.median(reply["samples"])))
            if who == speedups.CANDIDATE:
                samples.extend(reply["samples"])
                outputs = reply["outputs"] if reply.get("outputs") is not None else outputs
            if i == last:
                break
        return timed, samples, outputs, failed

    def _out_of_running(self, timed: list, best_so_far: float | None) -> bool:
        """Half the rounds say the candidate cannot be the op's best: every ratio against the
        Model so far is under `out_of_running` times the best's. Its other rounds would only
        narrow the interval of a figure that is not the search's answer (a comparison is most
        of a candidate's device time). The best, and any candidate near it,
        gets every round, and the promotion re-times the best anyway."""
        share = self.settings.out_of_running
        if not best_so_far or share is None:
            return False
        ratios = speedups.round_ratios(timed, "Model")
        return bool(ratios) and max(ratios) < share * best_so_far

    def _compare_all(self, result: EvalResult, rounds: int | None = None, best_so_far: float | None = None,
                     only: tuple[str, ...] | None = None) -> None:
        """The candidate against the baselines (`only` these, if given) in the op's timing mode
        (a baseline that cannot be captured is compared per call, in a second interleaved
        sequence of its own). `best_so_far`: the op's best ratio against the Model so far."""
        rounds = rounds or self.settings.rounds
        self._clock = RoundClock(lead_allowed=self.spec.target.spins)
        self._swap_check = None
        self._cut = 0  # baseline rounds run before the candidate was found out of the running
        op = self.op_timing()
        slots = self._baseline_slots()
        ready = [w for w, err in slots.items() if not err and (only is None or w in only)]
        mode, reason = op["mode"], op["reason"]
        try:
            timed, samples, outputs, failed = self._interleave(mode, ready, rounds, best_so_far)
        except NotCapturable as nc:
            mode, reason = "events", f"candidate not capturable ({nc.kind}): timed per call"
            timed, samples, outputs, failed = self._interleave(mode, ready, rounds)
        per_mode = {mode: timed}
        graph_failed = [w for w, why in failed.items() if why.startswith("not capturable")]
        if graph_failed and mode == "graph":
            per_mode["events"], _, _, more_failed = self._interleave("events", graph_failed, rounds)
            failed = {w: why for w, why in failed.items() if w not in graph_failed}
            failed.update(more_failed)
        self._check_timed_outputs(outputs, mode)
        self._check_clock(mode, ready, rounds)
        self._record_timing(result, samples, mode, reason, op)
        label = lambda m: timing.recorded_mode(m, self.spec.target)  # noqa: E731
        comparison = {"op_mode": label(op["mode"]), "op_mode_reason": op["reason"], "rounds": rounds,
                      "round_reps": self.settings.round_reps, "graph_calls": op["graph_calls"],
                      "clock": self._clock.summary(speedups.CANDIDATE)}
        if self._cut:
            comparison["stopped"] = (f"out of the running after {self._cut} of {rounds * len(ready)} baseline rounds: "
                                     f"under {self.settings.out_of_running:g} x the op's best "
                                     f"({best_so_far:.3g}x the Model)")
        for name, key in (("Model", "model"), ("Reference", "reference")):
            seq_mode = next((m for m, seq in per_mode.items() if any(w == name for w, _ in seq)), None)
            summary = speedups.summarize(speedups.round_ratios(per_mode[seq_mode], name)) if seq_mode else None
            if summary:
                comparison[key] = {**summary, "mode": label(seq_mode)}
            elif name in slots:
                comparison[f"{key}_error"] = slots[name] or failed.get(name, "no rounds")
        result.comparison = comparison
        result.speedup_vs_model = (comparison.get("model") or {}).get("ratio")
        result.speedup_vs_reference = (comparison.get("reference") or {}).get("ratio")
        result.suspicious = bool(result.speedup_vs_reference and result.speedup_vs_reference > SUSPICIOUS_SPEEDUP)
        result.baseline = {k: v for k, v in self.baseline().items() if not k.endswith("_timing")}
        assert result.timing is not None  # the time stage ran first
        result.limit = self._limit(result.timing["median_ms"], mode)
        if not self._null_run:
            mix_timing.time_mix(self, result, mode, ready, rounds)

    def _check_clock(self, mode: str, ready: list[str], rounds: int) -> None:
        """The candidate's claimed times against this process's clock (farm.evaluate.timer). A
        disagreement is measured again, in rounds of their own, before it makes a `cheat`: a
        host that stalled for a moment shows once, a runner that lies shows every time."""
        trusted = {"Model", "Reference"}
        if self._null_run or not self._clock.check(speedups.CANDIDATE, trusted):
            return
        first = self._clock
        self._clock = RoundClock(lead_allowed=first.lead_allowed)
        self._interleave(mode, ready, rounds)
        disagrees = self._clock.check(speedups.CANDIDATE, trusted)
        self._clock = first
        if disagrees:
            raise Stop("cheat", disagrees)

    def _record_timing(self, result: EvalResult, samples: list[float], mode: str, reason: str, op: dict) -> None:
        """The compared figure, its timing mode and why; the per-call pass kept beside it, labelled."""
        target = self.spec.target
        stats = timing.stats_of(samples, target.graph_method if mode == "graph" else target.event_method,
                                "rounds").as_dict()
        per_call = result.timing or {}
        result.timing = {**stats, "mode": timing.recorded_mode(mode, target), "mode_reason": reason,
                         "op_mode": timing.recorded_mode(op["mode"], target),
                         "flush": op["flush"] if mode == op["mode"] else self.settings.timing.get("flush", "write"),
                         "graph_calls": op["graph_calls"] if mode == "graph" else 0,
                         "per_call_ms": per_call.get("median_ms"),
                         "swap_check": getattr(self, "_swap_check", None) if mode == "graph" else None,
                         "per_call": {k: per_call.get(k) for k in PER_CALL_KEYS}}

    def _limit(self, time_ms: float, mode: str) -> dict | None:
        if getattr(self, "_work", None) is None:
            self._work = limits.op_work(getattr(self, "task", None))
        flops, dtype = self._work
        return limits.physical_limit(self._bytes_moved(), self.floor(), mode, time_ms, flops, dtype)

    def _check_timed_outputs(self, outputs: dict, mode: str) -> None:
        """The comparison's last candidate round computed the verified answers (a graph replay
        included; in-place ops replayed many times are exempt: their inputs moved on)."""
        if mode == "graph" and self.task.inplace_args:
            return
        keys, cases = self._time_cases()
        for key, (inputs, expected) in zip(keys, cases):
            got = outputs.get(key)
            if got is None:
                continue  # not every set is reached by a short events round
            if not self.verifier.ok(got, Case(key, inputs, expected, key)):
                raise Stop("cheat", f"the compared calls on input set {key} ({mode}) did not compute the verified outputs")

    def _bytes_moved(self) -> int:
        return sum(nbytes(self.inputs)) + sum(nbytes(self.expected))

    def null_check(self) -> dict | None:
        """The Model against itself: the task's Model loaded by the harness into a fresh
        candidate runner and compared with the trusted runner's Model exactly as a candidate
        is. Its ratio is what "no faster" looks like on this device for this op (placement,
        runner); on the H100 it reached 1.04 for one op
        (bench/results/truth_h100/NOTES-2026-11-24.md)."""
        self._null_run = True
        self.candidates = self._take_runner()
        try:
            with self._device(VERIFICATION):
                reply = self.candidates.call("load_task", self.settings.limits.compile_s,
                                             path=str(self.ref.path.resolve()), source=self.ref.source,
                                             shapes=self.shapes, which="Model", init_inputs=self.init_inputs,
                                             policy=self.ref.policy)
                if not reply.ok:
                    return None
                self._put_time_cases()
            result = EvalResult(verdict="pass")
            with self._device(TIMING, pin=True):  # the Model's ratio is the null: no Reference rounds
                self._compare_all(result, rounds=self.settings.retime_rounds, only=("Model",))
            return result.comparison.get("model")
        except (Stop, RunnerDied):
            return None
        finally:
            self._null_run = False
            self._retire()

    def retime(self, candidate_code: str, name: str = "retime") -> dict:
        """The independent re-timing before promotion: the candidate re-verified and re-timed
        against the baselines by a harness that shares no state with the search's runners (a
        fresh candidate runner, a fresh trusted runner, secret input sets drawn now), with the
        promotion's number of rounds, after the null check; farm.evaluate.speedup.promotion
        reads the result beside the search's own figure."""
        if self.spec.target.interpret:  # the interpreter's timings would re-time nothing
            return {"timed": False, "runner": "none", "skipped": "interpreter timings are not kernel timings"}
        with self._independent():
            return self._retime(candidate_code, name)

    @contextmanager
    def _independent(self) -> Iterator[None]:
        """A trusted runner of its own and secret cases drawn for it, for the re-timing; the
        search's are put back after (the search's runners hold nothing the re-timing uses)."""
        saved = (self.trusted, self._cases, self._seeds, self._slots)
        self.trusted = self._new_trusted()
        self._slots = None
        try:
            self.trusted.ensure_started()
            if not self.uses_secret_inputs:  # else the stored secret sets are all the truth there is
                drawn, seeds = self.draw_cases(self.settings.fresh_inputs, fresh=True, prefix="retime")
                self._cases, self._seeds = drawn + (saved[1] or [])[-self._probe_count():], seeds
            yield
        finally:
            fresh, (self.trusted, self._cases, self._seeds, self._slots) = self.trusted, saved
            close_all([fresh])

    def _retime(self, candidate_code: str, name: str) -> dict:
        """The device alone only for the rounds (farm.evaluate.lease): the fresh runners' starts,
        loads and first runs share it with other ops' verifications."""
        with self._device(VERIFICATION):
            model_runs = self.model_runs()
        result = EvalResult(verdict="pass")
        started = self._started = time.monotonic()
        self.candidates = self._take_runner()
        try:
            self.trusted.ensure_started()
            with self._device(VERIFICATION):
                first = self._compile(candidate_code, name)
                self._verify(first, result)  # re-verified on the re-timing's own secret cases
                self._put_time_cases()
            with self._device(TIMING, pin=True):
                self._compare_all(result, rounds=self.settings.retime_rounds)
            if speedups.too_wide(result.comparison.get("model")):
                with self._device(TIMING, pin=True):
                    self._compare_all(result, rounds=self.settings.retime_rounds * speedups.WIDE_ROUNDS)
        except Stop as stop:
            return {"error": f"{stop.verdict}: {stop.reason}"}
        except RunnerDied as died:
            return {"error": f"{died.kind}: {str(died).splitlines()[0]}"}
        finally:
            self._retire()
        model = result.comparison.get("model")
        assert result.timing is not None  # verified and timed, or returned above
        # the null check only where it can decide: a ratio that cannot clear the bar even over a
        # null of 1.0 is not promoted whatever the Model does against itself (its fresh runner and
        # rounds held the device for about a second of every op)
        needed = model_runs and speedups.may_promote(model)
        null = self.null_check() if needed else None
        return {"runner": "fresh", "harness": "independent", "time_ms": result.timing["median_ms"],
                "timing": result.timing, "model": model, "reference": result.comparison.get("reference"),
                "mix": result.comparison.get("mix"),
                "comparison": result.comparison, "limit": result.limit, "null": null,
                "seeds_checked": result.seeds_checked,
                "null_skipped": "" if needed or not model_runs else "the ratio cannot clear the promotion bar",
                "timed": not self.spec.target.interpret,
                "seconds": time.monotonic() - started}

    def model_runs(self) -> bool:
        return self._baseline_slots().get("Model") == ""
