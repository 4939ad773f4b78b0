"""One Triton driver per process, named by the target: a host with two active Triton backends
(installed as plug-ins here) runs each target in its own process without Triton's
"2 active drivers" refusal."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PLUGIN = REPO / "tests" / "data" / "triton_backends_plugin"


@pytest.fixture(scope="module")
def two_backends(tmp_path_factory) -> dict:
    """farmtest_alpha and farmtest_beta, both always active, installed the way pip installs any package."""
    where = tmp_path_factory.mktemp("triton-backends")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                    "--target", str(where), str(PLUGIN)], check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("TRITON_DEFAULT_BACKEND", "TRITON_INTERPRET")}
    return {**env, "PYTHONPATH": f"{where}{os.pathsep}{REPO}"}


def python(code: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], check=False, env=env, capture_output=True, text=True,
                          timeout=120)


def test_without_a_choice_triton_refuses_two_active_drivers(two_backends):
    done = python("import triton; triton.runtime.driver.active.get_current_target()", two_backends)
    assert done.returncode != 0 and "2 active drivers" in done.stderr


@pytest.mark.parametrize("backend", ["farmtest_alpha", "farmtest_beta"])
def test_each_target_process_gets_the_driver_it_names(two_backends, backend):
    code = ("from farm.targets import DeviceSpec, import_device_runtime\n"
            "from farm.targets.base import Target\n"
            f"t = Target('chip', 'cpu', None, 0, triton_backend='{backend}')\n"
            "import_device_runtime(DeviceSpec(t, None))\n"
            "import triton\n"
            "print(triton.runtime.driver.active.get_current_target().backend)\n")
    done = python(code, two_backends)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [backend]


def test_a_target_whose_backend_is_missing_says_so(two_backends):
    code = ("from farm.targets import DeviceSpec, import_device_runtime\n"
            "from farm.targets.base import Target\n"
            "from farm.errors import FarmError\n"
            "try:\n"
            "    import_device_runtime(DeviceSpec(Target('chip', 'cpu', None, 0, triton_backend='nope'), None))\n"
            "except FarmError as exc:\n"
            "    print(exc)\n")
    done = python(code, two_backends)
    assert "runs Triton's 'nope' backend, which is not installed here" in done.stdout, done.stderr
    assert "farmtest_alpha" in done.stdout


def test_choosing_the_cuda_driver_touches_no_device(two_backends):
    """The choice is made at child start on every host: it must not initialise CUDA."""
    code = ("from farm.targets import import_device_runtime, resolve_device\n"
            "import triton\n"
            "spec = resolve_device('cuda:0')\n"
            "spec.target.choose_triton_driver()\n"
            "print(repr(triton.runtime.driver.active))\n")
    done = python(code, {**two_backends, "CUDA_VISIBLE_DEVICES": ""})
    assert done.returncode == 0, done.stderr
    assert "chosen by the farm target" in done.stdout


def test_the_cpu_target_runs_kernels_beside_two_active_backends(two_backends, tmp_path):
    """The interpreter uses no driver: a cpu child is unaffected by the installed backends."""
    kernel = tmp_path / "k.py"
    kernel.write_text(
        "import torch, triton, triton.language as tl\n"
        "from farm.targets import import_device_runtime, resolve_device\n"
        "import_device_runtime(resolve_device('cpu'))\n"
        "@triton.jit\n"
        "def k(x, n, B: tl.constexpr):\n"
        "    o = tl.arange(0, B)\n"
        "    tl.store(x + o, tl.load(x + o, mask=o < n) + 1, mask=o < n)\n"
        "x = torch.zeros(5)\n"
        "k[(1,)](x, 5, B=8)\n"
        "print(x.sum().item())\n")
    done = subprocess.run([sys.executable, str(kernel)], check=False, env={**two_backends, "TRITON_INTERPRET": "1"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["5.0"]
