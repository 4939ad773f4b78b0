"""`farm run` on training ops on the CPU: the offline generators find kernels that pass forward
and backward, each re-verified on fresh inputs (issue: training ops)."""

import json
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# one op of each kind: unary (silu takes gelu's path; tests/evaluate/test_backward.py judges its
# kernels), two inputs, random with a residual
OPS = ("gelu", "swiglu", "dropout_residual")


@pytest.mark.slow
def test_farm_run_finds_forward_and_backward_kernels_for_training_ops(cli, tmp_path):
    folder = tmp_path / "training4"
    folder.mkdir()
    for op in OPS:
        shutil.copy(REPO / "tasks" / "training" / f"{op}.py", folder)
    config = tmp_path / "farm.yaml"
    config.write_text(f"corpus:\n  sources:\n    training4: {folder}\n")
    store = tmp_path / "store"
    result = cli("--config", config, "run", "--source", "training4", "--target", "cpu", "--max-tasks", "1",
                 "--generators", "inductor", "--store", f"file://{store}", "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["summary"]["succeeded"] == len(OPS)
    for op in OPS:
        best = json.loads((store / "kernels" / "cpu" / "training4" / op / "best.json").read_text())
        report = json.loads(next(store.glob(f"runs/*/training4/{op}/report.json")).read_text())
        passed = [c for c in report["candidates"] if c["verdict"] == "pass"]
        assert passed and best, op
        assert all(c["backward"]["verified"] and c["backward"]["seeds_checked"] >= 2 for c in passed), op
        source = (store / "kernels" / "cpu" / "training4" / op / "best.py").read_text()
        assert "torch.autograd.Function" in source and "bwd_triton_" in source
