"""Static checks of candidate source: each rule on one bad and one clean source, and every
bundled Triton task's Model, as a candidate, passes all of them."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from farm.evaluate import static_checks as sc

REPO = Path(__file__).resolve().parents[2]

CLEAN = textwrap.dedent('''
    """A clean candidate: a Triton kernel and a module that launches it."""
    import math
    import os

    import torch
    import torch.nn as nn
    import triton
    import triton.language as tl

    SCALE = math.sqrt(2.0)
    NAME = "row scale, float32"


    @triton.jit
    def _scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0, mask=mask)


    class ModelNew(nn.Module):
        def __init__(self):
            super().__init__()
            self.block = 64
            self.device_count = os.cpu_count()

        def forward(self, x):
            y = torch.empty_like(x)
            self.block += 0
            _scale[(triton.cdiv(x.numel(), self.block),)](x, y, x.numel(), BLOCK=self.block)
            return y
''')


def check(fn, source: str) -> str:
    source = textwrap.dedent(source)
    return fn(ast.parse(source), source)


def test_clean_candidate_passes_every_check():
    for fn in [sc.check_defines_model_new, *sc.CHECKS]:
        assert check(fn, CLEAN) == "", fn.__name__
    assert sc.static_verdict(CLEAN) == ("", "")


# ---------------------------------------------------------------- one function at a time


@pytest.mark.parametrize("bad", [
    "class Model(nn.Module):\n    pass\n",
    "def make():\n    class ModelNew(nn.Module):\n        pass\n    return ModelNew\n",  # not top level
    "ModelNew = type('ModelNew', (), {})\n",
])
def test_check_defines_model_new(bad):
    assert "ModelNew" in check(sc.check_defines_model_new, bad)
    assert check(sc.check_defines_model_new, "class ModelNew(nn.Module):\n    pass\n") == ""


@pytest.mark.parametrize("clean", [
    "@triton.jit\ndef k(x):\n    pass\n",
    "@triton.jit(do_not_specialize=['n'])\ndef k(x, n):\n    pass\n",
    "@triton.autotune(configs=[], key=['n'])\n@triton.jit\ndef k(x, n):\n    pass\n",
    "from triton import jit\n\n@jit\ndef k(x):\n    pass\n",
    "@triton.heuristics({'B': lambda a: 4})\n@triton.jit\ndef k(x, B):\n    pass\n",
])
def test_check_has_triton_kernel_clean(clean):
    assert check(sc.check_has_triton_kernel, clean) == ""


@pytest.mark.parametrize("bad", [
    "import torch\n\ndef f(x):\n    return x.sum(-1)\n",
    "@torch.compile\ndef f(x):\n    return x.sum(-1)\n",
    "import triton\nKERNEL = '@triton.jit'\n",  # a string is not a kernel
])
def test_check_has_triton_kernel_bad(bad):
    assert "not a Triton kernel" in check(sc.check_has_triton_kernel, bad)


@pytest.mark.parametrize("bad, name", [
    ("import gc\n", "gc"),
    ("import torch\nimport ctypes.util\n", "ctypes.util"),
    ("from subprocess import run\n", "subprocess"),
    ("from importlib import import_module\n", "importlib"),
    ("def f():\n    import threading\n", "threading"),  # nested imports too
    ("import pickle as p\n", "pickle"),
    ("from concurrent.futures import ThreadPoolExecutor\n", "concurrent.futures"),
])
def test_check_imports_bad(bad, name):
    reason = check(sc.check_imports, bad)
    assert reason.startswith(f"imports {name} (line ")


def test_check_imports_clean():
    assert check(sc.check_imports, "import math\nimport os\nimport functools\nfrom typing import Optional\n"
                                   "import torch.nn.functional as F\nfrom triton import language as tl\n") == ""


@pytest.mark.parametrize("bad, name", [
    ("x = os.environ['FARM_STORE']\n", "os.environ"),
    ("x = os.environ.get('AWS_SECRET_ACCESS_KEY')\n", "os.environ.get"),
    ("os.getenv('HOME')\n", "os.getenv"),
    ("os.listdir('.')\n", "os.listdir"),
    ("data = torch.load('x')\n", "torch.load"),
    ("s = torch.cuda.Stream()\n", "torch.cuda.Stream"),
    ("with torch.cuda.stream(s):\n    pass\n", "torch.cuda.stream"),
    ("g = torch.cuda.CUDAGraph()\n", "torch.cuda.CUDAGraph"),
    ("f = sys._getframe(1)\n", "sys._getframe"),
    ("m = sys.modules['farm']\n", "sys.modules"),
])
def test_check_attributes_bad(bad, name):
    assert check(sc.check_attributes, bad).startswith(f"uses {name} (line 1)")


def test_check_attributes_clean():
    clean = """
        s = torch.cuda.current_stream()
        p = os.path.join('a', 'b')
        e = self.environ
        n = os.cpu_count()
        t = torch.loads_nothing
        x = torch.empty(3).load
    """
    assert check(sc.check_attributes, clean) == ""


@pytest.mark.parametrize("call", ["open('x')", "exec('1')", "eval('1')", "compile('1', 'f', 'exec')",
                                  "__import__('gc')", "globals()", "breakpoint()", "input()",
                                  "getattr(torch, 'load')", "setattr(torch, 'sum', None)"])
def test_check_calls_bad(call):
    name = call.split("(")[0]
    assert check(sc.check_calls, f"y = 1\nx = {call}\n") == f"calls {name}() (line 2), which a kernel does not need"


def test_check_calls_clean():
    assert check(sc.check_calls, "x = tl.load(p)\nf = torch.compile(g)\ny = self.open()\nz = len([1])\n"
                                 "w = max(1, 2)\nopen_count = 3\n") == ""


@pytest.mark.parametrize("bad", ["p = '/proc/self/environ'\n", "p = '~/.farm/store'\n", "k = 'refs/demo/row_sum'\n",
                                 "f = 'row_sum.pt'\n", "def f(p='/proc/1/mem'):\n    pass\n"])
def test_check_strings_bad(bad):
    assert "points at files a kernel must not read" in check(sc.check_strings, bad)


def test_check_strings_clean():
    assert check(sc.check_strings, "a = 'float32'\nb = 'BLOCK_SIZE'\nc = f'{1}'\ne = 'output'\n") == ""


@pytest.mark.parametrize("bad, name", [
    ("torch.sum = lambda x: x\n", "torch.sum"),
    ("triton.runtime.jit.JITFunction.run = f\n", "triton.runtime.jit.JITFunction.run"),
    ("time.perf_counter = lambda: 0.0\n", "time.perf_counter"),
    ("torch.cuda.Event.elapsed_time += 0\n", "torch.cuda.Event.elapsed_time"),
    ("sys.stdout: object = None\n", "sys.stdout"),
    ("np.random.seed = f\n", "np.random.seed"),
])
def test_check_monkeypatching_bad(bad, name):
    assert check(sc.check_monkeypatching, bad).startswith(f"assigns to {name} (line 1)")


def test_check_monkeypatching_clean():
    clean = """
        self.block = 64
        x = torch.sum
        out.data = y
        cfg.num_warps += 1
        sizes: list = []
    """
    assert check(sc.check_monkeypatching, clean) == ""


def test_static_verdict_kinds():
    verdict, reason = sc.static_verdict("def forward(:\n")
    assert verdict == "compile_error" and reason.startswith("line 1:")
    assert sc.static_verdict(CLEAN.replace("class ModelNew", "class Model")) == \
        ("compile_error", "defines no top-level class ModelNew")
    assert sc.static_verdict(CLEAN + "\nimport gc\n")[0] == "cheat"
    assert sc.static_verdict(CLEAN.replace("@triton.jit\n", ""))[0] == "cheat"
    # the first failing check names the line
    verdict, reason = sc.static_verdict(CLEAN.replace("NAME = \"row scale, float32\"", "NAME = open('x')"))
    assert verdict == "cheat" and "calls open() (line 12)" in reason


# ---------------------------------------------------------------- the bundled kernels


def _bundled():
    for source in ("sglang", "vllm_triton", "demo"):
        for path in sorted((REPO / "tasks" / source).glob("*.py")):
            yield pytest.param(path, id=f"{source}/{path.stem}")


@pytest.mark.parametrize("path", list(_bundled()))
def test_every_bundled_triton_model_passes_as_a_candidate(path):
    text = path.read_text()
    assert text.count("class Model(") == 1
    candidate = text.replace("class Model(", "class ModelNew(")
    failures = [f"{fn.__name__}: {reason}" for fn in [sc.check_defines_model_new, *sc.CHECKS]
                if (reason := fn(ast.parse(candidate), candidate))]
    assert not failures, failures
    assert sc.static_verdict(candidate) == ("", "")


def test_the_bundled_sources_are_all_there():
    counts = {s: len(list((REPO / "tasks" / s).glob("*.py"))) for s in ("sglang", "vllm_triton", "demo")}
    assert counts["sglang"] >= 10 and counts["vllm_triton"] >= 6 and counts["demo"] >= 3, counts
