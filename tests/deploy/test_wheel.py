"""The built wheel on its own (issue 37): installed into a fresh virtualenv, run from a folder
that is not a checkout with a fresh HOME, `farm run` finds the bundled demo source and the
default config the wheel carries. The virtualenv reuses this interpreter's packages
(--system-site-packages: torch is 200 MB) but not its farm: the test checks which farm ran.
One op and one candidate keep it to a few CPU seconds."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# what a wheel is built from: the sdist's files (MANIFEST.in), copied so that the build's
# build/ and egg-info never land in the checkout, where parallel tests would share them
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "farm", "tasks", "configs")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("src")
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        elif (ROOT / name).is_file():
            shutil.copy2(ROOT / name, src / name)
    out = tmp_path_factory.mktemp("dist")
    # no build isolation: setuptools is already here, and a test must not need the network
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                           "-w", str(out), str(src)], capture_output=True, text=True, cwd=src)
    assert done.returncode == 0, done.stdout + done.stderr
    [built] = out.glob("kernel_farm-*.whl")
    return built


def test_the_wheel_carries_every_task_and_the_default_config(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    tasks = {p.relative_to(ROOT / "tasks").as_posix() for p in (ROOT / "tasks").glob("**/*.py")
             if "__pycache__" not in p.parts}
    assert tasks and {n.removeprefix("farm/bundled/tasks/") for n in names if n.startswith("farm/bundled/tasks/")} == tasks
    assert "farm/bundled/farm.yaml" in names
    assert not [n for n in names if n.startswith(("tasks/", "configs/"))], "top-level folders would litter site-packages"


def test_farm_run_from_the_installed_wheel_in_a_fresh_home(wheel, tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("FARM_")}
    home = tmp_path / "home"
    home.mkdir()
    env.update(HOME=str(home), PIP_DISABLE_PIP_VERSION_CHECK="1")
    # --force-reinstall: the test environment's own (editable) kernel-farm must not satisfy it
    pip = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                          "--force-reinstall", str(wheel)], capture_output=True, text=True, env=env, cwd=home)
    assert pip.returncode == 0, pip.stdout + pip.stderr
    farm = str(venv / "bin" / "farm")

    where = subprocess.run([str(venv / "bin" / "python"), "-c", "import farm; print(farm.__file__)"],
                           capture_output=True, text=True, env=env, cwd=home)
    assert Path(where.stdout.strip()).is_relative_to(venv), where.stdout + where.stderr
    config = subprocess.run([farm, "config", "show", "--json"], capture_output=True, text=True, env=env, cwd=home)
    assert config.returncode == 0, config.stderr
    assert "farm/bundled/farm.yaml" in config.stdout  # the default config the wheel carries

    run = subprocess.run([farm, "run", "--ops", "vector_add_scale", "--max-tasks", "1", "--no-report", "--json"],
                         capture_output=True, text=True, env=env, cwd=home, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    [op] = json.loads(run.stdout)["ops"]
    assert op["source"] == "demo" and op["status"] == "succeeded", op
    assert list((home / ".farm" / "store" / "refs" / "demo").glob("vector_add_scale*")), "no reference data in HOME"
