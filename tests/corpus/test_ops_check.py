"""`farm ops check`: Model against Reference in a child process per op."""

import json

from farm.corpus import opcheck
from farm.targets import resolve_device
from tests.conftest import GOOD_TASK, write_task


def test_check_passes_good_task_and_reports_numbers(cli, task_dir):
    result = cli("ops", "check", "--device", "cpu", "--json")
    assert result.exit_code == 0, result.output
    [row] = json.loads(result.stdout)["results"]
    assert row["status"] == "pass" and row["max_abs"] == 0.0
    assert row["input_shapes"] == [[37]] and row["input_dtypes"] == ["torch.float32"]


def test_reference_that_disagrees_fails_with_exit_1(cli, task_dir):
    write_task(task_dir / "mini", "wrong", GOOD_TASK.replace("return x * 2.0", "return x * 2.5"))
    result = cli("ops", "check", "--device", "cpu", "--ops", "wrong")
    assert result.exit_code == 1
    assert "mismatch" in result.stdout and "outside atol" in result.stdout


def test_hang_and_crash_cost_one_op_each(task_dir):
    hang = write_task(task_dir / "mini", "hangs", GOOD_TASK.replace(
        "return x * 2.0", "import time\n        time.sleep(60)\n        return x"))
    crash = write_task(task_dir / "mini", "aborts", GOOD_TASK.replace(
        "y = torch.empty_like(x)", "import os; os.abort()"))
    from farm.corpus.tasks import ref_from_file

    refs = [ref_from_file(hang, "mini"), ref_from_file(crash, "mini"), ref_from_file(task_dir / "mini/scale2.py", "mini")]
    results = opcheck.check_ops(refs, resolve_device("cpu"), "small", 0, timeout_s=8)
    by_op = {r["op"]: r for r in results}
    assert by_op["hangs"]["status"] == "error" and by_op["hangs"]["stage"] == "reference"
    assert "no result after" in by_op["hangs"]["error"]
    # the memory guard runs forward on the meta device first: that is where the abort lands
    assert by_op["aborts"]["status"] == "error" and by_op["aborts"]["stage"] == "size_check"
    assert "SIGABRT" in by_op["aborts"]["error"]
    assert by_op["scale2"]["status"] == "pass"


def test_non_deterministic_get_inputs_is_reported(cli, task_dir):
    write_task(task_dir / "mini", "random_inputs", GOOD_TASK.replace(
        "return [torch.randn(N)]", "import random\n    return [torch.full((N,), random.random())]"))
    result = cli("ops", "check", "--device", "cpu", "--ops", "random_inputs", "--json")
    assert result.exit_code == 1
    [row] = json.loads(result.stdout)["results"]
    assert row["stage"] == "get_inputs" and "deterministic" in row["error"] and "inputs [0]" in row["error"]


def test_one_spoiled_pair_of_draws_is_drawn_again(cli, task_dir):
    """A thread that takes from torch's generator between seeding and drawing spoils one pair of
    draws: the check draws once more before calling the task nondeterministic."""
    write_task(task_dir / "mini", "spoiled_once", GOOD_TASK.replace(
        "return [torch.randn(N)]",
        "global _CALLS\n    _CALLS = globals().get('_CALLS', 0) + 1\n"
        "    if _CALLS == 2:\n        torch.rand(1)  # what another thread's draw does to the generator\n"
        "    return [torch.randn(N)]"))
    result = cli("ops", "check", "--device", "cpu", "--ops", "spoiled_once", "--json")
    [row] = json.loads(result.stdout)["results"]
    assert result.exit_code == 0 and row["status"] == "pass", row


def test_whole_bundled_corpus_passes_on_cpu_at_small_shapes(cli, monkeypatch):
    result = cli("ops", "check", "--device", "cpu", "--json")
    rows = json.loads(result.stdout)["results"]
    assert len(rows) >= 25
    failed = [(r["source"], r["op"], r["error"]) for r in rows if r["status"] != "pass"]
    assert failed == [] and result.exit_code == 0


def test_bad_options_are_usage_errors(cli, task_dir):
    assert cli("ops", "check", "--device", "tpu").exit_code == 2
    r = cli("ops", "check", "--device", "cpu", "--shapes", "huge")
    assert r.exit_code == 2 and "--shapes" in r.stderr
    r = cli("ops", "check", "--source", "nope")
    assert r.exit_code == 2 and "unknown source" in r.stderr and "Traceback" not in r.output


TRAINING_TASK = GOOD_TASK.replace('SMALL_SHAPES = {"N": 37}', 'SMALL_SHAPES = {"N": 37}\nBACKWARD = True').replace(
    '''class Model(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _scale[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y
''', '''def _twice(x):
    y = torch.empty_like(x)
    _scale[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
    return y


class _Scale(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _twice(x)

    @staticmethod
    def backward(ctx, g):
        return _twice(g.contiguous())


class Model(nn.Module):
    def forward(self, x):
        return _Scale.apply(x)
''')


def test_training_op_gradients_are_checked_against_reference(cli, task_dir):
    write_task(task_dir / "mini", "scale_train", TRAINING_TASK)
    write_task(task_dir / "mini", "scale_train_bad_grad",
               TRAINING_TASK.replace("return _twice(g.contiguous())", "return _twice(g.contiguous()) * 1.5"))
    result = cli("ops", "check", "--device", "cpu", "--ops", "scale_train", "--ops", "scale_train_bad_grad", "--json")
    rows = {r["op"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["scale_train"]["status"] == "pass" and rows["scale_train"]["backward_checked"]
    bad = rows["scale_train_bad_grad"]  # the forward agrees; only the backward is wrong
    assert bad["status"] == "mismatch" and bad["stage"] == "backward" and "gradient of input 0" in bad["error"]
    assert result.exit_code == 1
