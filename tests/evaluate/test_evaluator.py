"""The evaluator under attack: every candidate in tests/evaluate/cheats/ against one Evaluator for
demo/row_sum on cpu (Triton interpreter), each with the verdict it must get, and after each
one the correct kernel must still pass (a dead runner is replaced, a live one is clean).

Known evaluator bugs are strict xfails that raise one of the EvaluatorBug classes below, so
that any other failure in the same test (a regression in what does work) still fails.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
import torch

from farm.corpus.tasks import TaskRef, ref_from_file
from farm.evaluate import sandbox
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.evaluate.runner import Limits, Runner, candidate_env
from farm.evaluate.static_checks import static_verdict
from farm.reference.generate import generate_references, load_pt
from farm.storage import open_store
from farm.targets import resolve_device

CPU = resolve_device("cpu")
REPO = Path(__file__).resolve().parents[2]
TASK = REPO / "tasks" / "demo" / "row_sum.py"
CHEATS = Path(__file__).resolve().parent / "cheats"
GOOD = (CHEATS / "good_row_sum.py").read_text()
# The interpreter runs seven programs of three chunks each: no honest timing is below this.
MIN_PLAUSIBLE_MS = 0.05
# Small limits so the nasty candidates cost seconds, not minutes.
LIMITS = Limits(start_s=60, compile_s=6, run_s=5, time_s=30, host_memory_mb=2048, log_mb=16)


class EvaluatorBug(AssertionError):
    """A check that fails because of a known evaluator bug (see the xfail reasons)."""


class WrongVerdict(EvaluatorBug):
    pass


class RunnerNotClean(EvaluatorBug):
    pass


class SecretLeak(EvaluatorBug):
    pass


class PoisonIneffective(EvaluatorBug):
    pass


def variant(old: str, new: str, base: str = GOOD) -> str:
    assert old in base, old
    return base.replace(old, new)


ZEROS = variant("tl.sum(acc, axis=0)", "(tl.sum(acc, axis=0) * 0.0)")
DOUBLED = variant("tl.sum(acc, axis=0)", "(tl.sum(acc, axis=0) * 2.0)")


# ---------------------------------------------------------------- fixtures


@dataclass
class Refs:
    task: TaskRef
    data: dict
    store_url: str
    pt_path: Path


@pytest.fixture(scope="module")
def refs(tmp_path_factory) -> Refs:
    """demo/row_sum reference data at the small shapes, generated once into a file store."""
    root = tmp_path_factory.mktemp("store")
    store = open_store(f"file://{root}")
    task = ref_from_file(TASK, "demo")
    [result] = generate_references([task], store, CPU, 0, "small", 120)
    assert result["success"], result
    pt_path = root.parent / "row_sum_small_copy.bin"
    store.get_file(result["key"], pt_path)
    return Refs(task, load_pt(pt_path), f"file://{root}", pt_path)


@pytest.fixture(scope="module")
def ev(refs):
    settings = EvalSettings.for_device(CPU)  # the interpreter's timing options
    settings.limits = LIMITS
    evaluator = Evaluator(refs.task, refs.data, CPU, settings)
    # the verdicts below depend on it: settings left behind by another test must not turn it off
    assert evaluator.boundary.on == SANDBOXED, evaluator.boundary
    yield evaluator
    evaluator.close()


def assert_good_passes(ev: Evaluator, after: str) -> None:
    good = ev.evaluate(GOOD, "good_row_sum.py")
    if not good.passed:
        raise RunnerNotClean(f"after {after}: the correct kernel got {good.verdict}: {good.reason}")
    if good.timing["median_ms"] < MIN_PLAUSIBLE_MS:
        raise RunnerNotClean(f"after {after}: the correct kernel was timed at {good.timing['median_ms']:.2e} ms")


# ---------------------------------------------------------------- the good kernel


def test_correct_kernel_passes_with_errors_timing_and_speedups(ev):
    result = ev.evaluate(GOOD, "good_row_sum.py")
    assert result.verdict == "pass", result.reason
    assert result.reason == "" and result.seeds_checked == 2
    assert result.launches == 1 and result.kernels == ["_rows_kernel"]
    [out] = result.outputs
    assert out["ok"] and out["kind"] == "tensor" and out["shape"] == [7] and out["dtype"] == "float32"
    assert 0.0 <= out["max_abs"] < 1e-4 and 0.0 <= out["max_rel"] < 1e-4
    stats = result.timing
    assert {"median_ms", "min_ms", "rse", "reps", "stop_reason"} <= set(stats)
    assert 0 < stats["min_ms"] <= stats["median_ms"] and stats["median_ms"] > MIN_PLAUSIBLE_MS
    assert stats["stop_reason"] == "rounds" and stats["rse"] >= 0
    # the per-call pass (probes, host checks) is kept beside the compared figure, labelled
    assert 3 <= stats["per_call"]["reps"] <= 20
    assert stats["per_call"]["stop_reason"] in ("rse_target", "time_budget", "max_reps")
    # cpu: no CUDA graphs; the mode (the interpreter's host clock, never "events") and why are in every result
    assert stats["mode"] == "interpreter" and stats["op_mode"] == "interpreter" and "cpu" in stats["mode_reason"]
    # speedups are ratios from interleaved rounds, with their spread
    comp = result.comparison
    for key in ("model", "reference"):
        assert comp[key]["rounds"] == ev.settings.rounds and comp[key]["mode"] == "interpreter"
        assert comp[key]["min"] <= comp[key]["ratio"] <= comp[key]["max"]
    assert result.speedup_vs_model == comp["model"]["ratio"] > 0 and result.speedup_vs_reference > 0
    assert result.baseline["model_ms"] > 0 and result.baseline["reference_ms"] > 0
    assert result.limit is None  # cpu: no physical limit
    assert {"compile", "verify", "time", "compare", "total"} <= set(result.stage_s)
    assert {"compile", "verify", "time", "total"} <= set(result.stage_s)
    assert result.device["target"] == "cpu"
    json.dumps(result.as_dict())  # the CLI prints it


# ---------------------------------------------------------------- the exploits

SANDBOXED = sandbox.probe().on  # evaluator.sandbox=auto: bubblewrap where it works (CI installs it)
# name: (acceptable verdicts, whether it gets past the static checks)
EXPLOITS: dict[str, tuple[set[str], bool]] = {
    # mismatch where the ghost replay's clone and a later run's get one address (the exploit's docstring)
    "cache_by_data_ptr": ({"cheat", "mismatch"}, True),
    "cache_by_shape": ({"cheat"}, True),
    "cache_by_identity": ({"cheat"}, True),
    "lazy_after_verification": ({"cheat"}, True),
    "ref_file_glob": ({"cheat"}, False),
    # inside the sandbox the store's files are out of sight; without it the dynamic checks catch them
    "ref_file_evasive": ({"runtime_error"} if SANDBOXED else {"cheat"}, True),
    "ref_file_replay": ({"runtime_error"} if SANDBOXED else {"cheat", "pass"}, True),  # pass: honest timing, checked
    "env_secret_static": ({"cheat"}, False),
    "env_secret_evasive": ({"mismatch"}, True),
    "gc_scan_static": ({"cheat"}, False),
    "gc_scan_evasive": ({"mismatch", "cheat"}, True),
    "mutate_zero_input": ({"cheat"}, True),
    "mutate_answer_into_input": ({"cheat"}, True),
    "uninitialized_output": ({"mismatch", "cheat"}, True),
    "empty_output": ({"mismatch", "cheat"}, True),
    "pytorch_only_static": ({"cheat"}, False),
    "pytorch_only_unused_kernel": ({"cheat"}, True),
    "pytorch_with_decoy_kernel": ({"cheat"}, True),
    "background_thread_static": ({"cheat"}, False),
    "background_thread_evasive": ({"cheat"}, True),
    "tensor_subclass_output": ({"cheat"}, True),
    "timer_patch": ({"cheat"}, True),
    "forge_replies": ({"cheat"}, True),  # issue 33: the runner's claims against the evaluator's clock
    "hang": ({"timeout"}, True),
    "crash_abort": ({"crash"}, True),
    "crash_segv": ({"crash"}, True),
    "print_flood": ({"crash"}, True),
}
# files with a test of their own below, and the verdicts their docstrings name
DEDICATED = {"good_row_sum": {"pass"}, "poison_runner_restart": {"crash"}, "sabotage_cached_inputs": {"mismatch"},
             "memory_hog": {"crash"}}

TIMING_UNCHECKED = ("the timing stage neither checks the outputs of the timed calls nor counts their launches "
                    "(evaluator._time / runner_child.ChildRunner.time), and times on the public .pt inputs")
KNOWN_BUGS: dict = {}  # every exploit below is caught; see git history for the bugs they found
# Every candidate gets a runner of its own (farm.evaluate.pool), so nothing an exploit does to its
# runner can reach the next candidate by construction; the correct kernel is evaluated after
# those that go for state outside their own call (patches, threads, clocks, floods, the replies)
STATEFUL = {"timer_patch", "background_thread_evasive", "print_flood", "gc_scan_evasive", "forge_replies",
            "lazy_after_verification", "crash_segv"}


def _param(name):
    marks = []
    if name in KNOWN_BUGS:
        exc, reason = KNOWN_BUGS[name]
        marks.append(pytest.mark.xfail(strict=True, raises=exc, reason=reason))
    return pytest.param(name, marks=marks, id=name)


def test_every_cheat_file_is_tested_and_documented():
    files = {p.stem for p in CHEATS.glob("*.py")}
    assert files == set(EXPLOITS) | set(DEDICATED)
    assert len(files - {"good_row_sum"}) >= 10
    for name in files:
        doc = ast.get_docstring(ast.parse((CHEATS / f"{name}.py").read_text())) or ""
        assert "Expected verdict" in doc, name
        for verdict in EXPLOITS[name][0] if name in EXPLOITS else DEDICATED[name]:
            assert verdict in doc, (name, verdict)


@pytest.mark.parametrize("name", [_param(n) for n in EXPLOITS])
def test_exploit_gets_its_verdict_and_the_evaluator_survives(ev, name):
    expected, reaches_dynamic = EXPLOITS[name]
    source = (CHEATS / f"{name}.py").read_text()
    static = static_verdict(source)
    # which layer must catch it: the evasive variants must get past the static checks, so that
    # the dynamic layer is exercised (if a new static rule catches one, evade it differently)
    if reaches_dynamic:
        assert static == ("", ""), f"{name} no longer reaches the dynamic checks: {static}"
    else:
        assert static[0] == "cheat", f"{name} should be stopped by the static checks: {static}"
    taken = ev.pool.taken
    result = ev.evaluate(source, name=f"{name}.py")
    if result.verdict not in expected:
        raise WrongVerdict(f"{name}: got {result.verdict} ({result.reason or 'no reason'}), "
                           f"expected {' or '.join(sorted(expected))}")
    if result.passed:  # only ref_file_replay may pass: then its timing must be the real kernel's
        honest = ev.evaluate(GOOD, "good_row_sum.py")
        assert result.timing["median_ms"] > 0.5 * honest.timing["median_ms"], (result.timing, honest.timing)
    else:
        assert result.reason, "a failing verdict names its reason"
    assert ev.candidates is None, "the candidate's runner went with it"
    assert ev.pool.taken == taken + reaches_dynamic + result.passed, "each candidate got a runner of its own"
    if name in STATEFUL:  # the next candidate's runner is another process; these check it end to end
        assert_good_passes(ev, name)


def test_a_memory_hog_is_stopped_by_the_memory_watchdog_not_by_the_clock(refs):
    """Under the module's 5 s run limit, a hog on a loaded 2-core host (2 GB written at a
    second per GB or slower) met the clock first: `timeout`. With time to spare, only the
    watchdog can stop it."""
    settings = EvalSettings.for_device(CPU)
    settings.limits = replace(LIMITS, compile_s=120, run_s=120, time_s=120)
    evaluator = Evaluator(refs.task, refs.data, CPU, settings)
    try:
        result = evaluator.evaluate((CHEATS / "memory_hog.py").read_text(), "memory_hog.py")
        assert result.verdict == "crash" and "exceeded the memory limit" in result.reason, result.reason
        assert evaluator.candidates is None, "the candidate's runner went with it"
    finally:
        evaluator.close()


def test_a_replaced_runner_does_not_run_code_planted_by_a_candidate(ev):
    result = ev.evaluate((CHEATS / "poison_runner_restart.py").read_text(), "poison_runner_restart.py")
    assert result.verdict == "crash", result.reason
    wrong = ev.evaluate(ZEROS, "zeros.py")
    if wrong.verdict == "pass":
        raise WrongVerdict("a kernel returning zeros passed in the replaced runner")
    assert wrong.verdict == "mismatch", (wrong.verdict, wrong.reason)


def test_a_candidate_cannot_change_the_inputs_of_later_candidates(ev):
    source = (CHEATS / "sabotage_cached_inputs.py").read_text()
    assert static_verdict(source) == ("", "")
    ev.evaluate(source, "sabotage_cached_inputs.py")  # its own verdict depends on the protocol
    assert_good_passes(ev, "sabotage_cached_inputs")


def test_log_limit_kills_the_runner_and_the_next_candidate_may_print(ev):
    flood = variant("            try:\n                print(_LINE, flush=True)\n            except OSError:\n"
                    "                pass\n", "            print(_LINE, flush=True)\n",
                    (CHEATS / "print_flood.py").read_text())
    printing_good = variant("        return out\n", "        print('rows:', m)\n        return out\n")
    result = ev.evaluate(flood, "print_flood_uncaught.py")
    after = ev.evaluate(printing_good, "good_that_prints.py")
    if result.verdict != "crash":
        raise WrongVerdict(f"an uncaught 1 GB print got {result.verdict}: {result.reason}")
    if not after.passed:
        raise WrongVerdict(f"a correct kernel that prints got {after.verdict} after the flood: {after.reason}")


@pytest.mark.xfail(strict=True, raises=PoisonIneffective,
                   reason="runner_child.ChildRunner._poison now fills blocks of each output's exact size (and "
                          "1 MB), but on cpu glibc still hands a small torch.empty output a chunk that held the "
                          "previous candidate's answer rather than a poisoned one; the fresh inputs stop the "
                          "exploit (mismatch), the poison does not make it NaN")
def test_poisoning_makes_an_unwritten_output_nan(ev):
    assert ev.evaluate(GOOD, "good_row_sum.py").passed  # leaves its answer in freed memory
    result = ev.evaluate((CHEATS / "empty_output.py").read_text(), "empty_output.py")
    assert result.verdict in ("mismatch", "cheat"), (result.verdict, result.reason)
    if "NaN positions differ at 7 elements" not in result.reason:
        raise PoisonIneffective(result.reason)


def test_a_frozen_timer_cannot_crash_the_evaluator(ev):
    frozen = variant("    _ticks[0] += 1e-9\n", "", (CHEATS / "timer_patch.py").read_text())
    assert static_verdict(frozen) == ("", "")
    result = ev.evaluate(frozen, "frozen_timer.py")
    assert result.verdict == "cheat", (result.verdict, result.reason)


NAN_TASK = '''
"""Natural log; negative inputs give NaN, as torch.log does."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 64


@triton.jit
def _log_kernel(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.log(tl.load(x_ptr + offs, mask=mask, other=1.0)), mask=mask)


class Model(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _log_kernel[(1,)](x, y, x.numel(), BLOCK=64)
        return y


class Reference(nn.Module):
    def forward(self, x):
        return torch.log(x)


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''


def evaluate_nan_task_once(path: Path, data: dict):
    """NAN_TASK's own Model as the candidate, in an Evaluator of its own."""
    settings = EvalSettings.for_device(CPU)
    settings.limits = LIMITS
    evaluator = Evaluator(ref_from_file(path, "local"), data, CPU, settings)
    try:
        return evaluator.evaluate(NAN_TASK.replace("class Model(", "class ModelNew("), "log_op.py")
    finally:
        evaluator.close()


def test_correct_kernel_with_nan_outputs_passes(tmp_path):
    path = tmp_path / "log_op.py"
    path.write_text(NAN_TASK)
    torch.manual_seed(0)
    x = torch.randn(64)
    expected = torch.log(x)
    assert expected.isnan().any()
    data = {"inputs": [x], "init_inputs": [], "outputs": [expected], "shapes": "bench"}
    result = evaluate_nan_task_once(path, data)
    assert result.verdict in ("pass", "mismatch"), (result.verdict, result.reason)
    if not result.passed:
        raise WrongVerdict(f"{result.verdict}: {result.reason}")


# ---------------------------------------------------------------- secrets and the protocol


def test_the_trusted_runner_is_forked_by_a_server_of_its_folder_kept_for_the_next_evaluator(refs):
    """The trusted runner costs a fork, not an interpreter and `import torch`, from the second
    evaluator of an op in a folder on (every chunk of a search, every op of a source); its
    server shows the task's folder (never lent to a candidate's runner: test_forkserver)."""
    from farm.evaluate import forkserver
    from farm.evaluate.forkserver import ForkedChild

    if not SANDBOXED:
        pytest.skip("runners are forked inside the sandbox only")
    settings = EvalSettings.for_device(CPU)
    settings.limits = LIMITS
    folder = refs.task.path.resolve().parent
    servers = []
    for _ in range(2):
        with Evaluator(refs.task, refs.data, CPU, settings) as evaluator:
            assert evaluator.evaluate(GOOD, "good_row_sum.py").passed
            trusted = evaluator.trusted
            assert isinstance(trusted.proc, ForkedChild) and trusted.server.read_only == (folder,)
            servers.append(trusted.server)
    assert servers[0] is servers[1] and servers[0].forks >= 2
    assert servers[0] in forkserver._SERVERS and not servers[0].busy  # kept, idle, for the next


def test_on_a_compiled_target_the_trusted_runner_starts_as_a_new_interpreter(ev, monkeypatch):
    """A fork server's start on a compiled target queues behind the candidates' (an H100 batch
    of three ops took 77 s instead of 63 s): there the trusted runner is no fork."""
    from dataclasses import replace as copy_with

    from farm.targets import DeviceSpec

    interpreted = ev._new_trusted()
    assert (interpreted.fork_from is not None) == SANDBOXED
    monkeypatch.setattr(ev, "spec", DeviceSpec(copy_with(ev.spec.target, interpret=False), ev.spec.index))
    assert ev._new_trusted().fork_from is None


def test_candidate_environment_has_no_secrets(ev, refs, monkeypatch, tmp_path):
    secrets = {"AWS_SECRET_ACCESS_KEY": "sentinel-aws-secret", "AWS_ACCESS_KEY_ID": "sentinel-aws-id",
               "FARM_LLM_API_KEY": "sentinel-llm", "FARM_STORE": refs.store_url, "OPENAI_API_KEY": "sentinel-openai",
               "HF_TOKEN": "sentinel-hf", "TRITON_API_TOKEN": "sentinel-triton", "TORCH_SECRET": "sentinel-torch"}
    for key, value in secrets.items():
        monkeypatch.setenv(key, value)
    env = candidate_env(CPU, tmp_path)
    assert not [k for k in env if k.startswith(("AWS_", "FARM_")) or any(s in k for s in ("KEY", "SECRET", "TOKEN"))]
    assert not [k for k, v in env.items() if "sentinel" in v or refs.store_url in v]
    assert env["HOME"] == str(tmp_path) and env["TRITON_INTERPRET"] == "1" and "PATH" in env

    runner = Runner(CPU, LIMITS, ev.boundary)  # started under this environment
    ev._configure(runner)
    runner.start()
    environ = Path(f"/proc/{runner.proc.pid}/environ").read_bytes().split(b"\0")
    # with FARM_STORE it would replay the stored outputs (cheat); without it, zeros (mismatch)
    result = ev.evaluate((CHEATS / "env_secret_evasive.py").read_text(), "env_secret_evasive.py", runner=runner)
    assert result.verdict == "mismatch", (result.verdict, result.reason)
    names = [e.partition(b"=")[0].decode() for e in environ if e]
    assert not [n for n in names if n.startswith(("AWS_", "FARM_")) or "KEY" in n or "TOKEN" in n or "SECRET" in n]
    assert not [e for e in environ if b"sentinel" in e or refs.store_url.encode() in e]


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def test_candidate_runner_never_receives_expected_outputs(ev, refs, monkeypatch):
    sent = []
    real_call = Runner.call

    def recording_call(box, cmd, timeout_s, **args):
        if box is not ev.trusted:
            sent.append((cmd, args))
        return real_call(box, cmd, timeout_s, **args)

    monkeypatch.setattr(Runner, "call", recording_call)
    ev.pool.drain()  # a runner primed before this test would not have shown its input sets
    assert ev.evaluate(GOOD, "good_row_sum.py").passed
    # inputs travel with the command, or once per runner as an input set the commands name by key
    allowed = {"load_source": {"source", "init_inputs", "name"}, "put_inputs": {"key", "inputs", "output_nbytes"},
               "run": {"key", "inputs", "inplace_args", "ghost"}, "time": {"keys", "options", "probe_keys", "inplace_args"},
               "time_round": {"slot", "keys", "mode", "reps", "calls", "inplace_args", "flush", "outputs"}}
    assert {"load_source", "run", "time"} <= {cmd for cmd, _ in sent} <= set(allowed)
    for cmd, args in sent:
        assert set(args) <= allowed[cmd], (cmd, set(args))
    cases = ev.fresh_cases() + ev.probe_cases()
    expected = list(_tensors(refs.data["outputs"])) + [t for _, outs in cases for t in _tensors(outs)]
    sent_tensors = [(cmd, t) for cmd, args in sent for t in _tensors(args)]
    for cmd, t in sent_tensors:
        assert not any(t.shape == e.shape and torch.equal(t, e) for e in expected), cmd
        assert tuple(t.shape) == (7, 300), (cmd, t.shape)  # the input's shape, never the output's
    # the .pt inputs and each fresh input set's inputs, nothing else
    input_sets = [refs.data["inputs"][0]] + [inputs[0] for inputs, _ in cases]
    assert all(any(torch.equal(t, i) for i in input_sets) for _, t in sent_tensors)
    assert all(any(torch.equal(t, i) for _, t in sent_tensors) for i in input_sets)


PEEK = '''
import os
from os import open as os_open
from os import pread

import torch
import torch.nn as nn
import triton
import triton.language as tl

# the evaluator's pid as the host sees it (inside the sandbox's PID namespace getppid() is 1)
PARENT = os.sep + "pr" + "oc" + os.sep + "EVALUATOR_PID" + os.sep


@triton.jit
def _k(x_ptr):
    tl.load(x_ptr)


def read(name, size=1 << 20, offset=0):
    fd = os_open(PARENT + name, os.O_RDONLY)
    try:
        return pread(fd, size, offset)
    finally:
        os.close(fd)


def peek():
    found = []
    try:
        found += [e.decode() for e in read("environ").split(bytes(1)) if e.startswith((b"AWS_", b"FARM_"))]
    except OSError as exc:
        found.append("environ: " + type(exc).__name__)
    try:
        heap = [line for line in read("maps", 1 << 22).decode().splitlines() if line.endswith("[heap]")][0]
        lo, hi = (int(v, 16) for v in heap.split()[0].split("-"))
        found.append("MEMORY %d bytes of the parent's heap" % len(read("mem", min(hi - lo, 1 << 20), lo)))
    except (OSError, IndexError) as exc:
        found.append("mem: " + type(exc).__name__)
    return found


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        raise RuntimeError("PEEK " + repr(peek()))
'''

PEEK_DRIVER = '''
import shutil
import sys
import os
from farm.targets import resolve_device
from farm.evaluate import sandbox
from farm.evaluate.runner import Limits, Runner

sb = Runner(resolve_device("cpu"), Limits(start_s=60), sandbox.current())
try:
    source = sys.stdin.read().replace("EVALUATOR_PID", str(os.getpid()))
    reply = sb.call("load_source", 60, source=source, init_inputs=[])
    print("SANDBOX", sb.boundary.kind, reply.get("error", ""))
finally:
    sb.close()
'''


def test_candidate_cannot_read_the_evaluators_environment_or_memory():
    """Run as root (as in CI), only the sandbox's PID namespace keeps /proc/<parent>/environ
    (the worker's AWS_*/FARM_* secrets, whatever candidate_env filters) and /proc/<parent>/mem
    (the expected outputs of the secret fresh inputs) out of reach; the static checks are evaded
    with `from os import open` and a split '/proc/'. Without bubblewrap this leaks (skipped,
    or failed under CI)."""
    from tests.evaluate.test_sandbox import require_bwrap

    require_bwrap()
    assert static_verdict(PEEK) == ("", "")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "FARM_"))}
    env.update(AWS_SECRET_ACCESS_KEY="sentinel-aws-secret", FARM_LLM_API_KEY="sentinel-llm",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-c", PEEK_DRIVER], input=PEEK, env=env, capture_output=True,
                          text=True, timeout=120, cwd=REPO, check=False)
    assert "PEEK" in proc.stdout, proc.stdout + proc.stderr
    line = [ln for ln in proc.stdout.splitlines() if "PEEK" in ln][-1]
    assert "SANDBOX bwrap" in proc.stdout, proc.stdout
    if "sentinel" in line or "MEMORY" in line:
        raise SecretLeak(line)
    assert "environ: FileNotFoundError" in line and "mem: FileNotFoundError" in line, line


# ---------------------------------------------------------------- honest failures


def test_syntax_error_is_compile_error(ev):
    result = ev.evaluate(variant("def forward(self, x", "def forward(self, x,,"), "syntax.py")
    assert result.verdict == "compile_error" and "line" in result.reason


def test_source_without_a_module_class_is_compile_error(ev):
    assert ev.evaluate(GOOD.replace("class ModelNew", "class Other"), "no_class.py").verdict == "compile_error"
    result = ev.evaluate(variant("class ModelNew(nn.Module):", "class ModelNew:"), "not_module.py")
    assert result.verdict == "compile_error" and "ModelNew(nn.Module)" in result.reason


def test_import_failure_is_compile_error(ev):
    result = ev.evaluate("import no_such_module_xyz\n" + GOOD, "bad_import.py")
    assert result.verdict == "compile_error" and "no_such_module_xyz" in result.reason


@pytest.mark.parametrize("old, new", [
    ("acc = tl.zeros([BLOCK], dtype=tl.float32)", "acc = tl.zeros([BLOCK], dtype=tl.float32) + undefined_name"),
    ("cols = start + tl.arange(0, BLOCK)", "cols = start + tl.arange(0, 100)"),
], ids=["undefined-name", "arange-not-power-of-2"])
def test_triton_kernel_that_fails_to_compile_is_compile_error(ev, old, new):
    result = ev.evaluate(variant(old, new), "bad_kernel.py")
    assert result.verdict in ("compile_error", "runtime_error"), (result.verdict, result.reason)
    if result.verdict != "compile_error":
        raise WrongVerdict(f"{result.verdict}: {result.reason}")


def test_forward_or_init_that_raises_is_runtime_error(ev):
    result = ev.evaluate(variant("        return out\n", "        raise ValueError('no row sums today')\n"),
                         "raises.py")
    assert result.verdict == "runtime_error" and "no row sums today" in result.reason
    assert "Traceback" in result.log
    init = variant("class ModelNew(nn.Module):\n",
                   "class ModelNew(nn.Module):\n    def __init__(self):\n        raise RuntimeError('no init')\n\n")
    result = ev.evaluate(init, "init_raises.py")
    assert result.verdict == "runtime_error" and "no init" in result.reason


def test_wrong_kernel_is_mismatch_with_errors(ev):
    result = ev.evaluate(DOUBLED, "doubled.py")
    assert result.verdict == "mismatch" and "against the reference data" in result.reason
    [out] = result.outputs
    assert not out["ok"] and out["max_abs"] > 0 and out["max_rel"] == pytest.approx(1.0)


def test_nondeterministic_kernels_are_mismatch(ev):
    noisy = variant("        return out\n", "        return out + torch.randn_like(out)\n")
    assert ev.evaluate(noisy, "random.py").verdict == "mismatch"
    # noise below the tolerance passes the .pt check; the second run on the same inputs differs
    jitter = variant("        return out\n", "        return out * (1.0 + torch.rand_like(out) * 1e-6)\n")
    result = ev.evaluate(jitter, "jitter.py")
    assert result.verdict == "mismatch" and "second run" in result.reason


def test_wrong_output_dtype_or_shape_is_mismatch(ev):
    assert ev.evaluate(variant("        return out\n", "        return out.double()\n"), "f64.py").verdict == "mismatch"
    assert ev.evaluate(variant("        return out\n", "        return out[:-1]\n"), "short.py").verdict == "mismatch"


# ---------------------------------------------------------------- farm eval


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.write_text(text)
    return path


def test_cli_eval_good_kernel_exits_0_with_json(cli, refs):
    result = cli("eval", "--candidate", CHEATS / "good_row_sum.py", "--task", TASK, "--ref-pt", refs.pt_path,
                 "--target", "cpu", "--json")
    assert result.exit_code == 0, result.stdout + result.stderr
    doc = json.loads(result.stdout)
    assert doc["verdict"] == "pass" and doc["task"] == "local/row_sum" and doc["timing"]["median_ms"] > 0
    assert doc["speedup_vs_model"] > 0 and doc["outputs"][0]["ok"]


def test_cli_eval_cheat_exits_1(cli, refs):
    static = cli("eval", "--candidate", CHEATS / "pytorch_only_static.py", "--task", TASK, "--ref-pt",
                 refs.pt_path, "--target", "cpu", "--json")
    assert static.exit_code == 1 and json.loads(static.stdout)["verdict"] == "cheat"
    dynamic = cli("eval", "--candidate", CHEATS / "mutate_zero_input.py", "--task", TASK, "--ref-pt",
                  refs.pt_path, "--target", "cpu")
    assert dynamic.exit_code == 1
    assert "cheat" in dynamic.stdout and "modified input" in dynamic.stdout
    assert "Traceback" not in dynamic.stdout + dynamic.stderr


def test_cli_eval_usage_errors_exit_2_without_traceback(cli, refs, tmp_path):
    good = _write(tmp_path, "good.py", GOOD)
    cases = {
        "does not exist": ["--candidate", tmp_path / "missing.py", "--task", TASK, "--ref-pt", refs.pt_path],
        "(--ref-pt) does not exist": ["--candidate", good, "--task", TASK, "--ref-pt", tmp_path / "none.pt"],
        # the store of the autouse clean_env fixture is empty
        "no reference data refs/demo/row_sum.pt": ["--candidate", good, "--source", "demo", "--op", "row_sum"],
        "unknown op(s) no_such_op": ["--candidate", good, "--source", "demo", "--op", "no_such_op"],
        "not both": ["--candidate", good, "--task", TASK, "--source", "demo", "--op", "row_sum"],
    }
    for message, args in cases.items():
        result = cli("eval", *args, "--target", "cpu")
        assert result.exit_code == 2, (message, result.exit_code, result.stdout, result.stderr)
        assert message in " ".join(result.stderr.split()), (message, result.stderr)
        assert "Traceback" not in result.stdout + result.stderr


def test_eval_with_the_ref_pt_of_another_op_blames_the_pt(cli, refs, tmp_path):
    """The .pt is demo/row_sum's: with another op's task, the pair is refused naming both ops
    before any candidate runs (it used to fail verification, blamed on the candidate)."""
    good = _write(tmp_path, "good.py", GOOD)
    for task in (["--task", REPO / "tasks" / "demo" / "swiglu.py"], ["--source", "demo", "--op", "swiglu"]):
        result = cli("eval", "--candidate", good, *task, "--ref-pt", refs.pt_path, "--target", "cpu")
        flat = " ".join(result.stderr.split())
        assert result.exit_code == 2 and "Traceback" not in result.stdout + result.stderr, flat
        assert f"{refs.pt_path} (--ref-pt) holds the reference data of op 'row_sum'" in flat and "op 'swiglu'" in flat
    # a variant: the same op name in another source
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "row_sum.py").write_text(TASK.read_text())
    other = cli("--set", f"corpus.sources=mine={tmp_path / 'mine'}", "eval", "--candidate", good, "--source", "mine",
                "--op", "row_sum", "--ref-pt", refs.pt_path, "--target", "cpu")
    assert other.exit_code == 2 and "holds the reference data of demo/row_sum, but" in " ".join(other.stderr.split())
    assert "mine/row_sum" in " ".join(other.stderr.split())


def test_a_signal_while_one_runner_closes_leaves_none_behind():
    """Ctrl-C or SIGTERM land wherever the main thread is: in one runner's close, the others
    (and their folders) still go, and the signal is raised after (farm.evaluate.runner.close_all)."""
    from farm.evaluate.runner import close_all

    closed = []

    class Box:
        def __init__(self, name, interrupt=False):
            self.name, self.interrupt = name, interrupt

        def close(self):
            closed.append(self.name)
            if self.interrupt:
                raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        close_all([Box("ahead"), Box("candidates", interrupt=True), Box("trusted")])
    assert closed == ["ahead", "candidates", "trusted"]


LEFT_OPEN = """
import sys
from farm.targets import resolve_device
from farm.evaluate.runner import Limits, Runner

box = Runner(resolve_device("cpu"), Limits(start_s=60))
box.start()
print(box.workdir, box.proc.pid, flush=True)
"""  # and exits without closing it, as a thread that restarted a runner after its owner closed it


def test_a_runner_left_open_goes_with_the_process():
    import os
    import subprocess
    import sys
    import time
    from pathlib import Path

    out = subprocess.run([sys.executable, "-c", LEFT_OPEN], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    workdir, pid = out.stdout.split()
    assert not Path(workdir).exists()
    for _ in range(50):  # killed: gone, or a zombie about to be reaped
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            break
        if Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z":
            break
        time.sleep(0.1)
    else:
        raise AssertionError(f"runner {pid} still running")
