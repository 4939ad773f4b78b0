"""Inputs that hold addresses (AKG's vLLM block-table files): drawn as tokens, stored in the
.pt, pointed at the right tensors wherever inputs are moved or copied, carried to the candidate
runner; and a Model that writes into the buffers it is passed lets a candidate do the same."""

import json
import os
import pickle

import pytest
import torch

from farm.corpus.tasks import ref_from_file
from farm.evaluate.evaluator import Evaluator
from farm.evaluate.runner import Limits
from farm.reference import secret_inputs
from farm.reference.generate import load_pt
from farm.runtime import pointers
from farm.runtime.tensors import clone_values, dumps, to_device
from farm.storage import open_store
from farm.targets import resolve_device
from tests.conftest import write_task

CPU = resolve_device("cpu")
LIMITS = Limits(start_s=60, compile_s=30, run_s=20, time_s=60, host_memory_mb=4096, log_mb=16)

# Written for this test in the pattern of AKG's gather_block_tables_kernel: the source table is
# passed only as its address (get_inputs() does not return it), the destination both as an
# address and as itself, and the kernel counts rows into a buffer in place.
BLOCK_TABLES = 'import torch\nimport torch.nn as nn\nimport triton\nimport triton.language as tl\n\n\n@triton.jit\ndef _pointer(ptr_to_ptr, dtype):\n    return tl.load(ptr_to_ptr).to(tl.pointer_type(dtype))\n\n\n@triton.jit\ndef _gather_rows(idx_ptr, src_ptrs, dst_ptrs, count_ptr, stride, BLOCK: tl.constexpr):\n    row = tl.program_id(0)\n    src_row = tl.load(idx_ptr + row)\n    src = _pointer(src_ptrs, tl.int32)\n    dst = _pointer(dst_ptrs, tl.int32)\n    offs = tl.arange(0, BLOCK)\n    tl.store(dst + row * stride + offs, tl.load(src + src_row * stride + offs) + 1)\n    tl.atomic_add(count_ptr + src_row, 1)\n\n\nclass Model(nn.Module):\n    def forward(self, idx, src_ptrs, dst_ptrs, counts, dst):\n        _gather_rows[(idx.shape[0],)](idx, src_ptrs, dst_ptrs, counts, dst.stride(0), BLOCK=dst.shape[1])\n        return dst\n\n\nclass ModelVLLM(nn.Module):\n    def forward(self, *args):\n        from vllm.v1.worker.gpu.block_table import gather_rows  # noqa: F401 - not on a farm host\n        raise RuntimeError("unreachable")\n\n\ndef get_inputs():\n    src = torch.randint(0, 1000, (8, 16), dtype=torch.int32)\n    dst = torch.zeros(4, 16, dtype=torch.int32)\n    idx = torch.randperm(8)[:4]\n    counts = torch.zeros(8, dtype=torch.int32)\n    # like AKG\'s gather_block_tables_kernel: the source table is reachable only through its address\n    return [idx, torch.tensor([src.data_ptr()], dtype=torch.uint64), torch.tensor([dst.data_ptr()], dtype=torch.uint64),\n            counts, dst]\n\n\ndef get_init_inputs():\n    return []\n'


def _address(n: int) -> bool:
    return n != 0 and (n >> 48) != pointers.TAG


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pointers")
    task = write_task(tmp / "tasks", "block_tables", BLOCK_TABLES)
    (tmp / "farm.yaml").write_text(f"corpus:\n  sources:\n    akgish: {task.parent}\n")
    from typer.testing import CliRunner

    from farm.cli.main import app

    env = {"FARM_STORE": f"file://{tmp / 'store'}", "FARM_CACHE_DIR": str(tmp / "trials"),
           "FARM_CONFIG": str(tmp / "farm.yaml")}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = CliRunner().invoke(app, ["reference", "--device", "cpu", "--source", "akgish", "--ops", "block_tables",
                                       "--json"], catch_exceptions=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["results"][0]["success"]
    store = open_store(f"file://{tmp / 'store'}")
    data = secret_inputs.attach(store, load_pt(tmp / "store" / "refs" / "akgish" / "block_tables.pt"))
    return {"task": task, "data": data}


def test_addresses_are_stored_as_tokens_and_the_reference_is_the_kernels_answer(made):
    data = made["data"]
    idx, src_ptrs, dst_ptrs, counts, dst = data["inputs"]
    assert src_ptrs.dtype == torch.uint64 and not any(_address(int(n)) for n in src_ptrs.tolist() + dst_ptrs.tolist())
    src = pointers.pointees_of(src_ptrs)[0]  # kept alive with the tensor that points at it
    assert torch.equal(data["outputs"][0], src[idx] + 1)
    assert data["mutated_inputs"] == [3, 4]  # counts and dst: written in place by the original Model
    for inputs, outputs in data["_secret_inputs"]:
        assert torch.equal(outputs[0], pointers.pointees_of(inputs[1])[0][inputs[0]] + 1)


def test_moved_and_copied_inputs_point_at_their_own_tensors(made):
    inputs = made["data"]["inputs"]
    placed = to_device(clone_values(inputs), "cpu")
    assert placed[2].tolist() == [placed[4].data_ptr()]
    assert placed[1].tolist() == [pointers.pointees_of(placed[1])[0].data_ptr()]
    copy = clone_values(placed)
    assert copy[2].tolist() == [copy[4].data_ptr()] != placed[2].tolist()
    assert copy[1].tolist() == [pointers.pointees_of(copy[1])[0].data_ptr()] != placed[1].tolist()
    assert pointers.holders(copy) == {1, 2}
    assert inputs[2].tolist() != placed[2].tolist()  # the stored tokens are untouched


def test_unsigned_tables_and_their_pointees_cross_to_the_runner(made):
    inputs = made["data"]["inputs"]
    with pytest.raises(Exception):  # noqa: B017 - torch's own pickling of a uint64 storage: why dumps exists
        pickle.loads(pickle.dumps(inputs[1], protocol=pickle.HIGHEST_PROTOCOL))
    got = pickle.loads(dumps(inputs))
    assert got[1].dtype == torch.uint64 and torch.equal(got[1], inputs[1])
    assert torch.equal(pointers.pointees_of(got[1])[0], pointers.pointees_of(inputs[1])[0])


def _evaluate(made, source: str):
    with Evaluator(ref_from_file(made["task"], "akgish"), made["data"], CPU) as ev:
        ev.settings.limits = LIMITS
        return ev.evaluate(source)


def test_a_kernel_that_writes_the_buffers_it_is_passed_as_the_original_does_passes(made):
    result = _evaluate(made, BLOCK_TABLES.replace("class Model(", "class ModelNew("))
    assert result.passed, result.reason


def test_a_kernel_that_reads_a_stale_table_fails(made):
    # reads the destination through the source's address: right shape, wrong rows
    wrong = BLOCK_TABLES.replace("class Model(", "class ModelNew(").replace(
        "(idx, src_ptrs, dst_ptrs, counts", "(idx, dst_ptrs, dst_ptrs, counts", 1)
    result = _evaluate(made, wrong)
    assert not result.passed and result.verdict == "mismatch", result.reason
