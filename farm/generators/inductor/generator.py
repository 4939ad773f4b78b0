"""inductor: Triton seeds from torch.compile of the task's ground truth (Reference, else Model).

For each compile mode, a child process pinned to the target compiles the ground-truth module
with `torch.compile(mode, dynamic=False, fullgraph=True)`, runs it once on the task's inputs
and records inductor's wrapper, kernels, launch configs and grids
(farm.generators.inductor.capture.capture_child); this process then assembles a self-contained
candidate: plain `@triton.jit` kernels and a `ModelNew` whose forward allocates the outputs
and launches them (farm.generators.inductor.assemble). See docs/inductor.md.

Targets: those with `inductor_modes` (farm.targets.base): cuda (modes "default" and
"max-autotune-no-cudagraphs"); cpu, through `cpu_backend = "triton"` and the Triton interpreter
(mode "default": the interpreter does not autotune). Any other target gets no seeds, with a log
line saying why: on ascend, stock inductor has no NPU backend (torch_npu brings its own, which
the farm has never run).

Candidates are shape-specialized (they assert the captured shapes, strides, dtypes and
constructor arguments). Where the search passes the recorded cases of the op's shape space
(`ctx.device["cases"]`), the child compiles at each case's inputs too and the candidate
dispatches on its inputs' shapes (farm.generators.inductor.dispatch), so it is right at every
case the evaluator verifies. The shape set is the generator's `shapes` option, else
`ctx.device["shapes"]` (the search passes the reference data's), else "small" on cpu and
"bench" elsewhere (as `farm reference --shapes auto`). The device is `ctx.device["label"]`
("cuda:1", as the evaluator's device_info names it), else `ctx.device["index"]`, else 0.
Beyond compile's defaults, `propose` explores inductor's own tuning space on an inductor
parent: one capture per variant of VARIANTS not tried yet for the op (coordinate-descent tuning,
persistent and split reductions off, block pointers, max-autotune with coordinate descent),
each a child in the parent's lineage, so tune can refine it further (docs/inductor.md,
"Inductor's tuning space"). Variants the target cannot run say why instead.
"""

from __future__ import annotations

import logging
import tempfile
import threading
from pathlib import Path

from farm.evaluate import static_checks
from farm.generators.base import Candidate, Context, Generator, Proposal
from farm.generators.inductor import backward as bwd
from farm.generators.inductor.assemble import interprets
from farm.generators.inductor.capture import capture_child
from farm.generators.inductor.dispatch import assemble_cases
from farm.generators.inductor.layers import Unsupported
from farm.runtime.children import run_in_child
from farm.targets import DeviceSpec, get_target, known, resolve_device

log = logging.getLogger(__name__)

# variant -> (torch.compile mode, inductor config options, why the interpreter cannot take it)
VARIANTS: dict[str, tuple[str, dict, str]] = {
    "coordinate-descent": ("default", {"coordinate_descent_tuning": True},
                           "coordinate descent times configs on the device; the interpreter times nothing"),
    "no-persistent-reductions": ("default", {"triton.persistent_reductions": False}, ""),
    "no-split-reductions": ("default", {"split_reductions": False}, ""),
    "block-pointers": ("default", {"triton.use_block_ptr": True},
                       "the Triton interpreter of triton 3.9 does not run block pointers"),
    "max-autotune+coordinate-descent": ("max-autotune-no-cudagraphs", {"coordinate_descent_tuning": True},
                                        "max-autotune benchmarks configs on the device"),
}
MARKER = "by the farm's inductor generator"  # in every candidate's docstring (assemble._doc)


class InductorGenerator(Generator):
    name = "inductor"

    def __init__(self, modes: list[str] | tuple[str, ...] | None = None, timeout_s: float = 600.0,
                 shapes: str | None = None):
        self.modes = tuple(modes) if modes else None
        self.timeout_s = float(timeout_s)
        self.shapes = shapes
        self.reasons: list[str] = []  # why a mode gave no seed (also logged), for callers and tests
        # what each mode's child recorded (farm.generators.inductor.capture), last initial_candidates()
        self.captures: list[dict] = []
        self._tried: dict[tuple, set[str]] = {}  # (source, op, target, shapes) -> variants proposed (ops share it)
        self._made: dict[tuple, set[str]] = {}  # the same key -> kernels made (sources without their docstring)
        self._tried_lock = threading.Lock()

    def _skip(self, reason: str) -> None:
        self.reasons.append(reason)
        log.info("inductor: %s", reason)

    def _spec(self, ctx: Context) -> DeviceSpec:
        target = get_target(ctx.target)
        if target.visible_env is None:  # no device to pin (cpu)
            return DeviceSpec(target, None)
        label = str(ctx.device.get("label") or "")
        if label.startswith(ctx.target + ":"):
            return resolve_device(label)
        return resolve_device(f"{ctx.target}:{int(ctx.device.get('index', 0) or 0)}")

    def initial_candidates(self, ctx: Context) -> list[Proposal]:
        self.reasons, self.captures = [], []
        if not modes_of(ctx.target):
            self._skip(f"target {ctx.target}: no seeds: the target names no torch.compile mode whose Triton output "
                       "the inductor generator knows (cuda and cpu do; ascend would need torch_npu's inductor "
                       "backend, never run here)")
            return []
        if ctx.device.get("mode") == "reference-data":
            self._skip("no PyTorch truth to compile: the op is in reference-data mode (a Triton Model, and no "
                       "comparison class of its file runs without sglang/vllm)")
            return []
        shapes = self._shapes(ctx)
        for name, why in self.skipped_variants(ctx.target).items():
            log.info("inductor: variant %s left out on %s: %s", name, ctx.target, why)
        with self._tried_lock:
            self._tried[self._key(ctx, shapes)] = set()
            self._made[self._key(ctx, shapes)] = set()
        return self._capture(ctx, shapes, [(mode, {}, f"torch.compile mode={mode}") for mode in
                                           (self.modes or modes_of(ctx.target))])

    def _shapes(self, ctx: Context) -> str:
        # the shape set of the reference data the candidates will be judged on (the search puts
        # it in ctx.device); else what `farm reference --shapes auto` picks: small on cpu
        return self.shapes or ctx.device.get("shapes") or ("small" if interprets(ctx.target) else "bench")

    @staticmethod
    def _key(ctx: Context, shapes: str) -> tuple:
        return (ctx.source, ctx.op, ctx.target, shapes)

    def _capture(self, ctx: Context, shapes: str, plans: list[tuple[str, dict, str]]) -> list[Proposal]:
        """One capture per (mode, options, label); identical candidates dropped."""
        spec = self._spec(ctx)
        out: list[Proposal] = []
        backward, grad_inputs = bwd.declared_backward(ctx.task_code)
        with tempfile.TemporaryDirectory(prefix="farm-inductor-") as tmp:
            path = Path(tmp) / f"{ctx.op}.py"
            path.write_text(ctx.task_code)
            env = dict(spec.child_env())
            env["TORCHINDUCTOR_CACHE_DIR"] = str(Path(tmp) / "inductor-cache")
            for mode, options, label in plans:
                plan = (mode, options)
                source = self._one(ctx, spec, str(path), shapes, plan, env)
                if source is not None and backward:
                    source = self._with_backward(ctx, spec, path, shapes, plan, env, source, grad_inputs)
                if source is None:
                    continue
                body = source.split('"""', 2)[-1]  # a variant that changes nothing differs in its docstring only
                with self._tried_lock:
                    made = self._made.setdefault(self._key(ctx, shapes), set())
                    if body in made:
                        self._skip(f"{label}: the same kernels as an earlier capture")
                        continue
                    made.add(body)
                out.append(Proposal(source, self.name, note=f"{label} ({shapes} shapes{_per_case(source)})"))
        return out

    def _one(self, ctx: Context, spec: DeviceSpec, path: str, shapes: str, plan: tuple[str, dict],
             env: dict) -> str | None:
        mode, options = plan
        if options:
            mode = f"{mode} {_describe(options)}"  # for the reasons below
        cases = ctx.device.get("cases") if not path.endswith("_vjp.py") else None  # the backward: bench only
        args = (path, ctx.source, shapes, plan[0], ctx.target, 0, True, ctx.shape_policy,
                ctx.device.get("reference_class"), options, cases or None)
        # one compile per case: the timeout is per compile
        outcome = run_in_child(capture_child, args, timeout_s=self.timeout_s * (1 + len(cases or [])), env=env)
        if not outcome.ok:
            last = outcome.error.strip().splitlines()[-1] if outcome.error.strip() else outcome.status
            self._skip(f"mode {mode}: capture {outcome.status} in stage {outcome.stage}: {last}")
            return None
        cap = outcome.value
        self.captures.append(cap)
        if not cap.get("ok"):
            self._skip(f"mode {mode}: no seed: {cap.get('reason')}")
            return None
        try:
            source = assemble_cases(cap, ctx.target)
        except Unsupported as exc:
            self._skip(f"mode {mode}: inductor's output cannot become a candidate: {exc}")
            return None
        verdict, reason = static_checks.static_verdict(source)
        if verdict:
            self._skip(f"mode {mode}: the assembled candidate fails the static checks ({verdict}: {reason})")
            return None
        log.info("inductor: mode %s on %s: %d launch(es) in %.1f s", mode, spec.label, len(cap["launches"]),
                 outcome.elapsed_s)
        return source

    def _with_backward(self, ctx: Context, spec: DeviceSpec, path: Path, shapes: str, plan: tuple[str, dict],
                       env: dict, forward: str, grad_inputs: tuple[int, ...] | None) -> str | None:
        """A training op gets a differentiable seed or none: never a forward-only one."""
        cap = self.captures[-1]
        mode = plan[0]
        indices = bwd.grad_indices(cap, grad_inputs)
        vjp_path = path.with_name(f"{ctx.op}_vjp.py")
        vjp_path.write_text(bwd.vjp_task(str(path), ctx.source, shapes, len(cap["inputs"]), indices))
        backward = self._one(ctx, spec, str(vjp_path), shapes, plan, env)
        if backward is None:
            self._skip(f"mode {mode}: no seed: the op declares BACKWARD and its backward could not be captured")
            return None
        try:
            return bwd.join(forward, backward, ctx.op, indices, len(cap["inputs"]))
        except (Unsupported, SyntaxError) as exc:
            self._skip(f"mode {mode}: no seed: forward and backward kernels cannot be joined: {exc}")
            return None

    def no_initial_reason(self, ctx: Context) -> str:
        return "; ".join(self.reasons) or "no seed"

    def propose(self, parent: Candidate, inspirations: list[Candidate], ctx: Context, n: int = 1) -> list[Proposal]:
        """The next variant of inductor's tuning space not tried for this op, as a child of an
        inductor-made parent (tuned by tune or not); nothing for other parents, or once every
        variant the target can run has been tried."""
        if parent is None or not modes_of(ctx.target) or MARKER not in (parent.source or ""):
            return []
        shapes = self._shapes(ctx)
        out: list[Proposal] = []
        for name in self.variants(ctx.target):
            if len(out) >= n:
                break
            with self._tried_lock:
                tried = self._tried.setdefault(self._key(ctx, shapes), set())
                if name in tried:
                    continue
                tried.add(name)
            mode, options, _ = VARIANTS[name]
            self.reasons, self.captures = [], []
            out += self._capture(ctx, shapes, [(mode, options, f"torch.compile mode={mode} +{name}")])
        return out

    @staticmethod
    def variants(target: str) -> list[str]:
        """The variants of VARIANTS a target runs (the interpreter has no timer and no block pointers)."""
        return [name for name, (_, _, why) in VARIANTS.items() if not interprets(target) or not why]

    @staticmethod
    def skipped_variants(target: str) -> dict[str, str]:
        """Variant -> why this target cannot take it."""
        return {name: why for name, (_, _, why) in VARIANTS.items() if interprets(target) and why}


def _per_case(source: str) -> str:
    """The note's word on a seed compiled per case of the shape space (farm.generators.inductor.dispatch)."""
    sets = source.count("def _forward_")
    return f"; dynamic=False per case: {sets} kernel sets, one per recorded case, picked by input shape" if sets else ""


def _describe(options: dict) -> str:
    return "+" + ",".join(f"{k}={v}" for k, v in options.items())


def modes_of(target: str) -> tuple[str, ...]:
    """The torch.compile modes the target seeds from (Target.inductor_modes); none where it is not installed here."""
    caps = known(target)
    return caps.inductor_modes if caps else ()
