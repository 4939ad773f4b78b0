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
from tests import durations  # noqa: E402

REPO = Path(__file__).resolve().parent.parent


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks it adds
def pytest_collection_modifyitems(config, items):
    """Longest first, a module's shared fixture made once (tests/durations.py)."""
    durations.order(config, items)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch, tmp_path):
    """No FARM_*/AWS_* variable or the user's store leaks into a test."""
    for var in list(os.environ):
        if var.startswith(("FARM_", "AWS_")):
            monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("FARM_STORE", f"file://{tmp_path / 'store'}")
    # where farm.corpus.modes remembers Reference trials: per test, so each test tries afresh
    monkeypatch.setenv("FARM_CACHE_DIR", str(tmp_path / "farm-cache"))
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


SCALE_CANDIDATE = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    x = tl.load(x_ptr + offs, mask=mask)
    tl.store(y_ptr + offs, VALUE * 2.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _scale[(triton.cdiv(x.numel(), GRID_BLOCK),)](x, y, x.numel(), BLOCK=GRID_BLOCK)
        return y
'''
# correct, and fine for community Triton and its interpreter; triton-ascend 3.2's language has
# no tl.unsqueeze / tl.squeeze (later APIs)
NEWER_TRITON_API = "tl.squeeze(tl.unsqueeze(x, 0), 0)"


def scale_candidate(value: str = "x", block: int = 64) -> str:
    """A ModelNew for GOOD_TASK (y = 2x) whose kernel stores `value * 2.0`."""
    return SCALE_CANDIDATE.replace("VALUE", value).replace("GRID_BLOCK", str(block))


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


@pytest.fixture(scope="session")
def ascend_frontend_python() -> Path:
    """The triton-ascend virtualenv of the Ascend frontend check (scripts/install-test-tools
    makes it; made here if missing). Without it the tests that need it skip, or fail under CI=true."""
    from farm.ascend import frontend
    from farm.errors import FarmError

    try:
        return frontend.setup_frontend(progress=lambda text: None)
    except FarmError as exc:
        if os.environ.get("CI") == "true":
            pytest.fail(f"the triton-ascend frontend environment cannot be created: {exc}")
        pytest.skip(f"no triton-ascend frontend environment: {exc}")
