"""Shape spaces: declared (SHAPE_SPACE, get_inputs keywords), derived from files that say nothing
(module constants, tuple elements, literals inside get_inputs), the cases drawn from them, and
one-line errors for spaces a file cannot honour."""

from __future__ import annotations

import json

import pytest

from farm.corpus import cases as cases_mod
from farm.corpus import shapes as shapes_mod
from farm.corpus import tasks as taskfiles
from farm.corpus.inputs import draw_inputs
from farm.corpus.shapes import ShapePolicy
from farm.corpus.space_types import ShapeSpace
from farm.errors import TaskError
from tests.conftest import write_task

HEAD = '''
import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x, weight, residual):
        return (x.float() * weight.float() + residual.float()).to(x.dtype)

'''

DECLARED = HEAD + '''
TOKENS = 12
HIDDEN = 16
DTYPE = torch.float32
SHAPE_SPACE = {"TOKENS": (1, 300), "DTYPE": ("float32", "float16")}


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN).to(DTYPE), torch.randn(HIDDEN).to(DTYPE), torch.randn(TOKENS, HIDDEN).to(DTYPE)]


def get_init_inputs():
    return []
'''

KEYWORD = HEAD + '''
HIDDEN = 16
SHAPE_SPACE = {"num_tokens": (2, 40)}


def get_inputs(num_tokens=9):
    return [torch.randn(num_tokens, HIDDEN), torch.randn(HIDDEN), torch.randn(num_tokens, HIDDEN)]


def get_init_inputs():
    return []
'''

# nothing declared: TOKENS is the leading dimension x and residual share; HIDDEN is not
PLAIN = DECLARED.replace('SHAPE_SPACE = {"TOKENS": (1, 300), "DTYPE": ("float32", "float16")}\n', "")

# index inputs: the kv_indptr must stay a valid prefix sum over the requests at every case
INDEXED = '''
import torch
import torch.nn as nn

BATCH = 6
POOL = 64


class Model(nn.Module):
    def forward(self, lens, indptr, pool_index):
        return indptr[1:] - indptr[:-1] + pool_index * 0


def get_inputs():
    lens = torch.randint(1, 9, (BATCH,), dtype=torch.int32)
    indptr = torch.zeros(BATCH + 1, dtype=torch.int32)
    indptr[1:] = torch.cumsum(lens, 0)
    pool_index = torch.randperm(POOL)[:BATCH]
    return [lens, indptr, pool_index]


def get_init_inputs():
    return []
'''

# AKG's style: the sizes are literals inside get_inputs, not module constants
LOCALS = HEAD + '''

def get_inputs():
    batch_size = 5
    hidden = 24
    x = torch.randn(batch_size, hidden)
    return [x, torch.randn(hidden), torch.randn(batch_size, hidden)]


def get_init_inputs():
    return []
'''


def _task(tmp_path, body: str, name: str = "op", shapes: str = "bench", policy: ShapePolicy | None = None):
    path = write_task(tmp_path / "src", name, body)
    return taskfiles.load_task(taskfiles.ref_from_file(path, "src", policy=policy or ShapePolicy()), shapes)


def _draw(task, case):
    with cases_mod.applied(task, task.space, case):
        return draw_inputs(task, case.seed)


def test_declared_space_and_its_cases(tmp_path):
    task = _task(tmp_path, DECLARED)
    space = task.space
    assert (space.origin, space.describe()) == ("declared", "TOKENS 1..300, DTYPE float32|float16")
    cases = cases_mod.draw_cases(space, 12, seed=3, bench_seed=0)
    by_label = {c.label: c for c in cases}
    assert by_label["bench"].values == (("TOKENS", 12),) and by_label["bench"].seed == 0
    values = {dict(c.values)["TOKENS"] for c in cases}
    assert {1, 300, 257} <= values  # 1, the largest, one past a power of two
    prime = dict(by_label["prime"].values)["TOKENS"]
    assert all(prime % p for p in range(2, prime)) and 1 < prime < 300
    assert len(cases) == 12 and len({c.seed for c in cases}) == 12
    assert cases_mod.draw_cases(space, 12, seed=3, bench_seed=0) == cases  # reproducible from its seed
    for case in cases:
        x, weight, residual = _draw(task, case)
        tokens = dict(case.values)["TOKENS"]
        assert x.shape == (tokens, 16) and residual.shape == (tokens, 16) and weight.shape == (16,)
        assert str(x.dtype) == f"torch.{case.dtype}"
    assert task.module.TOKENS == 12 and task.module.DTYPE.is_floating_point  # restored after each case
    assert {c.dtype for c in cases} == {"float32", "float16"}
    # the round trip a store record goes through
    assert [cases_mod.Case.from_dict(json.loads(json.dumps(c.as_dict()))) for c in cases] == cases
    assert ShapeSpace.from_dict(json.loads(json.dumps(space.as_dict()))) == space


def test_a_keyword_of_get_inputs_is_a_dimension(tmp_path):
    task = _task(tmp_path, KEYWORD)
    assert task.space.describe() == "num_tokens 2..40" and task.space.dims[0].keyword
    case = cases_mod.draw_cases(task.space, 3, 1, 0)[1]
    x = _draw(task, case)[0]
    assert x.shape[0] == dict(case.values)["num_tokens"]
    assert task.inputs()[0].shape[0] == 9  # outside a case, the default again


def test_derived_space_is_the_shared_leading_dimension(tmp_path):
    task = _task(tmp_path, PLAIN)
    space = task.space
    assert space.origin == "derived" and [d.name for d in space.dims] == ["TOKENS"]
    assert (space.dims[0].low, space.dims[0].high, space.dtypes) == (1, 16384, ("float32",))
    small = _task(tmp_path, PLAIN, "op2", shapes="small")
    assert small.space.dims[0].high == 64  # the interpreter runs every case: corpus.small_space_max


def test_derived_space_keeps_index_inputs_valid(tmp_path):
    task = _task(tmp_path, INDEXED)
    assert [d.name for d in task.space.dims] == ["BATCH"]
    assert task.space.dims[0].high == 64  # randperm(POOL)[:BATCH] cannot give more than POOL
    for case in cases_mod.draw_cases(task.space, 6, 2, 0):
        lens, indptr, pool_index = _draw(task, case)
        batch = dict(case.values)["BATCH"]
        assert lens.shape == (batch,) and pool_index.shape == (batch,)
        assert int(indptr[-1]) == int(lens.sum()) and bool((indptr[1:] >= indptr[:-1]).all())


def test_derived_from_literals_inside_get_inputs(tmp_path):
    task = _task(tmp_path, LOCALS)
    assert task.space.describe() == "get_inputs.batch_size 1..16384"
    case = cases_mod.draw_cases(task.space, 4, 5, 0)[2]
    x = _draw(task, case)[0]
    assert x.shape == (dict(case.values)["get_inputs.batch_size"], 24)
    assert task.inputs()[0].shape == (5, 24)


def test_tuple_shape_constant(tmp_path):
    body = HEAD.replace("x.float() * weight.float() + residual.float()", "x * 2") + '''
SHAPE = (3, 4, 8)


def get_inputs():
    return [torch.randn(*SHAPE), torch.randn(8), torch.randn(*SHAPE)]


def get_init_inputs():
    return []
'''
    task = _task(tmp_path, body)
    assert [d.name for d in task.space.dims] == ["SHAPE[0]"]
    x = _draw(task, cases_mod.draw_cases(task.space, 2, 0, 0)[1])[0]
    assert x.shape == (1, 4, 8) and task.module.SHAPE == (3, 4, 8)


@pytest.mark.parametrize("space, message", [
    ('{"NOPE": (1, 4)}', "names 'NOPE', which is neither a module constant nor a keyword parameter"),
    ('{"TOKENS": (0, 4)}', "must be a (low, high) pair of ints, 1 <= low <= high"),
    ('{"TOKENS": [4]}', "must be a (low, high) pair"),
    ('{"DTYPE": ("float32", "floaty")}', "must be a tuple of torch dtype names"),
    ('["TOKENS"]', "SHAPE_SPACE must be a non-empty dict"),
    # get_inputs ignores HIDDEN_UNUSED: the space cannot be honoured
    ('{"HIDDEN_UNUSED": (1, 64)}', "declares HIDDEN_UNUSED 1..64, which get_inputs() does not honour"),
    # 2**40 tokens x 16 fp32 is far past any memory limit
    ('{"TOKENS": (1, 2**40)}', "largest case (TOKENS=1099511627776; seed 0) needs"),
])
def test_bad_declared_spaces_name_the_file_and_case(tmp_path, space, message):
    body = DECLARED.replace('SHAPE_SPACE = {"TOKENS": (1, 300), "DTYPE": ("float32", "float16")}',
                            f"HIDDEN_UNUSED = 3\nSHAPE_SPACE = {space}")
    task = _task(tmp_path, body)
    with pytest.raises(TaskError) as info:
        _ = task.space
    assert message in str(info.value) and "op.py" in str(info.value)


def test_a_case_get_inputs_fails_at_is_named(tmp_path):
    body = DECLARED.replace("def get_inputs():\n", "def get_inputs():\n    assert TOKENS != 300, 'no'\n")
    with pytest.raises(TaskError, match=r"get_inputs\(\) fails at the corner case \(TOKENS=300, dtype=float32"):
        _ = _task(tmp_path, body).space


def test_ops_list_shows_each_space_and_its_origin(tmp_path, cli, monkeypatch):
    for name, body in (("declared", DECLARED), ("plain", PLAIN), ("local", LOCALS)):
        write_task(tmp_path / "tasks" / "sp", name, body)
    write_task(tmp_path / "tasks" / "sp", "broken", DECLARED.replace("(1, 300)", "(0, 300)"))
    (tmp_path / "farm.yaml").write_text(f"corpus:\n  tasks_dir: {tmp_path / 'tasks'}\n")
    monkeypatch.setenv("FARM_CONFIG", str(tmp_path / "farm.yaml"))
    res = cli("ops", "list", "--source", "sp", "--json")
    rows = {r["op"]: r for r in json.loads(res.stdout)}
    assert (rows["declared"]["space_text"], rows["declared"]["space_origin"]) == (
        "TOKENS 1..300, DTYPE float32|float16", "declared")
    assert (rows["plain"]["space_text"], rows["plain"]["space_origin"]) == ("TOKENS 1..16384", "derived")
    assert rows["local"]["space_text"] == "get_inputs.batch_size 1..16384"
    assert rows["broken"]["status"] == "invalid" and "SHAPE_SPACE['TOKENS']" in rows["broken"]["error"]
    table = cli("ops", "list", "--source", "sp", env={"COLUMNS": "300"}).stdout
    assert "TOKENS 1..16384 (derived)" in table


def test_a_device_shared_by_jobs_bounds_the_largest_case(tmp_path):
    """Found on a device, the space's largest case fits one job's share of it, not half the
    host's memory (250 GB on a 4-GPU host, far over one GPU)."""
    host = _task(tmp_path, PLAIN)
    shared = _task(tmp_path, PLAIN, "op2")
    shared.device_budget_bytes = 2**20
    assert shared.space.dims[0].high < host.space.dims[0].high == 16384
    assert shared.space.dims[0].high >= 1


def test_the_largest_case_passes_its_own_guard_when_the_host_has_less_memory_later(tmp_path, monkeypatch):
    """The host's limit (half its available memory) is read once per task: the largest case,
    sized by it, failed its own guard when read again with a little less available (other
    processes, the earlier cases), after the other cases had been made."""
    available = {"bytes": 4 * 2**20}
    monkeypatch.setattr(shapes_mod, "available_bytes", lambda: available["bytes"])
    task = _task(tmp_path, PLAIN)
    dim = task.space.dims[0]
    assert 1 < dim.high < 16384
    available["bytes"] -= 2**19
    high = cases_mod.with_values(cases_mod.bench_case(task.space, 0), {dim.name: dim.high}, "high")
    assert _draw(task, high)[0].shape[0] == dim.high
