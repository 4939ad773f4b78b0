"""The trusted side of an Evaluator (farm.evaluate.evaluator): the trusted runner, which loads the
task's Model and Reference and never runs candidate code; the truth it computes on secret fresh
seeds (the cases a candidate is verified on: farm.evaluate.verifier); the baselines. A mixin: it
uses the Evaluator's settings, task and lease."""

from __future__ import annotations

import functools
import secrets
from typing import Any

from farm.corpus.inputs import draw_inputs
from farm.errors import FarmError
from farm.evaluate import forkserver, profiles, verified
from farm.evaluate import lease as device_lease
from farm.evaluate.protocol import Reply
from farm.evaluate.result import REASON_CHARS
from farm.evaluate.result import nbytes as _nbytes
from farm.evaluate.runner import Runner, RunnerDied
from farm.evaluate.state import EvaluatorState
from farm.evaluate.verifier import Case

PROBES = 3  # input sets never shown to a candidate before its first timed call on them


class TrustedSide(EvaluatorState):
    """Mixed into Evaluator: the trusted runner (`trusted`), the cases and the baselines."""

    def _new_trusted(self) -> Runner:
        """A trusted runner: the task file runs there; it may import from its folder, and
        nothing else it needs. On an interpreted target, inside the sandbox, it is forked by a
        fork server that shows the task's folder (never lent to a candidate), kept for the next
        evaluator of an op in that folder: there a new interpreter costs as much CPU as judging
        a candidate. On a compiled target a new interpreter starts at once, where a server's
        start would queue behind the candidates' (docs/evaluator.md, "Isolation")."""
        box = Runner(self.spec, self.settings.limits, self.boundary, read_only=(self.ref.path.resolve().parent,))
        # without the sandbox a fork would share the host's view (as the pool's)
        if self.boundary.on and self.spec.target.interpret:
            box.fork_from = functools.partial(forkserver.lend, self.spec, self.settings.limits, self.boundary,
                                              read_only=box.read_only)
        self._configure(box)
        return box

    def _configure(self, box: Runner) -> None:
        """What a runner is told before it starts: the sizes its outputs take (it poisons them
        before each run; a reply may carry no more than twice as much per output set)."""
        box.output_nbytes = _nbytes(self.expected)
        largest = max([sum(box.output_nbytes)] + [sum(_nbytes(c.expected)) for c in self.space_cases])
        box.output_cap = max(1 << 20, 2 * largest)

    def _prime(self, box: Runner) -> None:
        """A pool runner gets the public input sets before its candidate (never the probes),
        sent while no timing holds the device."""
        sets = [("pt", self.inputs)]
        box.primed_for = self._cases  # which case sets its seed keys hold (_take_runner)
        if self._cases is not None:
            sets += [(f"seed{i}", inputs) for i, (inputs, _o) in enumerate(self.fresh_cases())]
        with self.lease.hold(device_lease.VERIFICATION):
            for key, inputs in sets:
                if box.call("put_inputs", self.settings.limits.run_s, key=key, inputs=inputs,
                            output_nbytes=box.output_nbytes).ok:
                    box.cached_inputs.add(key)

    def _take_runner(self) -> Runner:
        """A pool runner for the cases in use now. One primed for other cases (the search's,
        taken by the re-timing that drew its own) keeps other inputs under the same seed keys:
        they are forgotten, so the candidate is run on the inputs its outputs are compared for
        (on an H100 every re-timing compared a kernel's outputs for the search's inputs with the
        truth for its own, and refused the promotion)."""
        box = self.pool.take()
        if getattr(box, "primed_for", None) is not self._cases:
            box.cached_inputs = {key for key in box.cached_inputs if key == "pt"}
        return box

    def _load_trusted(self, which: str) -> Reply:
        return self.trusted.call("load_task", self.settings.limits.compile_s, path=str(self.ref.path.resolve()),
                                    source=self.ref.source, shapes=self.shapes, which=which,
                                    init_inputs=self.init_inputs, policy=self.ref.policy,
                                    reference=self.task.reference_cls.__name__ if self.task.reference_cls else None)

    def _reference_run(self, which: str, key: str, inputs: list) -> Reply:
        reply = self._load_trusted(which)
        if not reply.ok:
            raise FarmError(f"{self.ref.path}: {which} cannot be built on {self.spec.label}: "
                            f"{self._clean(str(reply.get('error')), REASON_CHARS)}")
        return self.trusted.with_inputs("run", self.settings.limits.compile_s, key, inputs, poison=False)

    def reference_backward(self, key: str, inputs: list, indices: list[int], upstream: list) -> Reply:
        """Reference's gradients on an input set, in the trusted runner."""
        loaded = self._load_trusted("Reference")
        reply = self.trusted.with_inputs("run_backward", self.settings.limits.compile_s, key, inputs,
                                            indices=indices, grad_outputs=upstream) if loaded.ok else loaded
        if not reply.ok:
            raise FarmError(f"{self.ref.path}: Reference's backward fails on {self.spec.label}: {reply.get('error')}")
        return reply

    @property
    def uses_secret_inputs(self) -> bool:
        """Reference-data mode: the stored secret input sets stand in for Reference on fresh inputs."""
        return self.task.reference_cls is None and bool(self.secret_inputs)

    def _probe_count(self) -> int:
        return len(self.secret_inputs or ()) // 2 if self.uses_secret_inputs else 0 if self.pt_only else PROBES

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
        return {**self._unseen_verification(), **self.cases_verified(len(self.space_cases))}

    def _unseen_verification(self) -> dict:
        if self.pt_only:
            return verified.pt_only(self.data.get("device_name"))
        if self.uses_secret_inputs:
            return {"by": "seed_sets", "sets": len(self.secret_inputs or ()),
                    "truth": f"original Model recorded on {self.data.get('device_name') or 'the reference platform'}"}
        return {"by": "reference", "sets": len(self._all_cases()),
                "truth": f"{self.task.truth_cls.__name__} on the target, fresh secret seeds",
                **({"fitted": self.data["fitted"]} if self.data.get("fitted") else {})}

    def cases_verified(self, checked: int) -> dict:
        """What a verdict records of the shape-space cases: how many of which, and what was left out."""
        if not self.space_cases and not self.cases_note:
            return {}
        return {"cases": checked, "case_labels": [c.tag for c in self.space_cases][:checked],
                **({"cases_note": self.cases_note} if self.cases_note else {})}

    def _all_cases(self) -> list[tuple[list, list]]:
        if self.pt_only:
            return []
        if self._cases is None and self.uses_secret_inputs:
            self._cases = [(list(i), list(o)) for i, o in self.secret_inputs or ()]
            self._seeds = [None] * len(self._cases)
        if self._cases is None:
            self._cases, self._seeds = self.draw_cases(self.settings.fresh_inputs + PROBES)
        return self._cases

    def draw_cases(self, n: int, fresh: bool = False, prefix: str = "seed") -> tuple[list, list]:
        """`n` secret input sets and Reference's outputs for them on the target, from the trusted
        runner, and their seeds. `fresh`: never the profile's derived seeds (the re-timing's)."""
        cases, seeds = [], []
        for i in range(n):
            seed = secrets.randbelow(2**31 - 1) + 1
            if self.profile.derived_seeds and i < self.settings.fresh_inputs and not fresh:
                seed = profiles.trial_seed(int(self.data.get("seed", 0) or 0), i)
            inputs = draw_inputs(self.task, seed)
            with self._device(device_lease.VERIFICATION):  # Reference on the device: never beside a timing
                reply = self._reference_run("Reference", f"{prefix}{i}", inputs)
            if not reply.ok:
                raise FarmError(f"{self.ref.path}: Reference fails on {self.spec.label} for a fresh input set: "
                                f"{self._clean(str(reply.get('error')), REASON_CHARS)}")
            cases.append((inputs, reply["outputs"]))
            seeds.append(seed)
        return cases, seeds

    def cases(self) -> list[Case]:
        """What a candidate is verified on: the reference data's case, then the secret fresh
        ones (more cases per op, shapes of its space among them, plug in here)."""
        pt = Case("pt", self.inputs, self.expected, "against the reference data (.pt)", self.data.get("seed"))
        label = ("secret input set {} recorded from the original Model" if self.uses_secret_inputs
                 else "fresh input set {} against Reference on the target")
        fresh = [Case(f"seed{i}", inputs, expected, label.format(i + 1), secret=True)
                 for i, (inputs, expected) in enumerate(self.fresh_cases())]
        return [pt, *fresh]

    def fixed_costs(self) -> dict:
        """What this evaluator paid once per op: the secret fresh-input cases (inputs and the
        truth on the target) and the baselines. The search stores them with its checkpoint so
        that later chunks and other workers adopt them instead of paying again."""
        return {"cases": None if self.uses_secret_inputs else self._all_cases(), "baseline": self.baseline()}

    def adopt(self, fixed: dict) -> None:
        """Take the fixed costs another evaluator of this op paid (`fixed_costs`)."""
        if fixed.get("cases") is not None and not self.uses_secret_inputs:
            self._cases = [(list(i), list(o)) for i, o in fixed["cases"]]
            self._seeds = [None] * len(self._cases)
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
                except (RunnerDied, FarmError) as exc:
                    base[f"{key}_error"] = str(exc)[-300:]
            self._baseline = base
        return self._baseline

    def _time_baseline(self, which: str, key: str, base: dict) -> None:
        """Loaded and run once as a verification, then timed alone: only the timing calls hold
        the device from other ops."""
        self.trusted.ensure_started()
        with self._device(device_lease.VERIFICATION):
            run = self._reference_run(which, "pt", self.inputs)
        if not run.ok:
            base[f"{key}_error"] = run.get("error", "")[-300:]
            return
        with self._device(device_lease.TIMING):
            reply = self.trusted.call("time", self.settings.limits.time_s, keys=["pt"], options=self.settings.timing)
            if reply.ok:
                base[f"{key}_ms"] = reply["stats"]["median_ms"]
                base[f"{key}_timing"] = reply["stats"]
            if self.backward is not None:
                reply = self.trusted.call("time", self.settings.limits.time_s, keys=["pt"],
                                             options=self.backward.timing_options(self.data["grad_outputs"]))
                if reply.ok:
                    base[f"{key}_fwd_bwd_ms"] = reply["stats"]["median_ms"]
