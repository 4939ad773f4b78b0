import os

# CI has no accelerator: every Triton kernel a test runs in-process runs in the interpreter.
# Triton decides this when it is first imported (its built-ins such as tl.sum are made then),
# so it is set here, before any test module imports triton.
os.environ.setdefault("TRITON_INTERPRET", "1")

import textwrap  # noqa: E402
from pathlib import Path  # noqa: E402

import pytest  # noqa: E402
from typer.testing import CliRunner  # noqa: E402

from farm.cli.main import app  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No FARM_*/AWS_* variable or the user's store leaks into a test."""
    for var in list(os.environ):
        if var.startswith(("FARM_", "AWS_")):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FARM_STORE", f"file://{tmp_path / 'store'}")
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def cli():
    runner = CliRunner()

    def invoke(*args, **kwargs):
        return runner.invoke(app, [str(a) for a in args], catch_exceptions=False, **kwargs)

    return invoke


def write_task(folder: Path, name: str, body: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.py"
    path.write_text(textwrap.dedent(body))
    return path


GOOD_TASK = '''
"""Scale a vector by two with a Triton kernel."""
import torch
import torch.nn as nn
import triton
import triton.language as tl

N = 1000
SMALL_SHAPES = {"N": 37}


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


class Model(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _scale[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y


class Reference(nn.Module):
    def forward(self, x):
        return x * 2.0


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''


@pytest.fixture
def task_dir(tmp_path):
    """A tasks/ folder with one valid source, pointed at by the config."""
    root = tmp_path / "tasks"
    write_task(root / "mini", "scale2", GOOD_TASK)
    cfg = tmp_path / "farm.yaml"
    cfg.write_text(f"corpus:\n  tasks_dir: {root}\n")
    os.environ["FARM_CONFIG"] = str(cfg)
    yield root
    os.environ.pop("FARM_CONFIG", None)
