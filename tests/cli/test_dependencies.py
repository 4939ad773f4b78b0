"""Every package that `farm run` imports is a declared dependency (core, or an extra that the
README's first command installs), or one of theirs.

The list is not written by hand: a real `farm run` runs with an import recorder on its
PYTHONPATH (tests/data/import_recorder), in the parent and in every child it forks (task
files, candidates), and each package it found is looked up in the installed distributions.
numpy was the gap this catches: Triton's interpreter imports it, neither torch nor triton
declares it, and a fresh virtualenv ran every demo op into ModuleNotFoundError.
"""

import os
import re
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.conftest import REPO

tomllib = pytest.importorskip("tomllib")
from packaging.requirements import Requirement  # noqa: E402  (pytest depends on packaging)
from packaging.utils import canonicalize_name  # noqa: E402

RECORDER = REPO / "tests" / "data" / "import_recorder"
# Imported by a dependency only when present (try: import ... except ImportError), so
# farm run works without them: where a test environment has them, they are not gaps.
OPTIONAL_OF_DEPENDENCIES = {
    "colorama": "torch/_inductor/runtime/runtime_utils.py (the inductor generator)",
    "hypothesis": "torch/testing/_internal/common_utils.py (reached through the inductor generator)",
    "pynvml": "torch/cuda/__init__.py (_HAS_PYNVML); the farm's own use is the optional extra nvml",
}


def front_door_extras() -> list[str]:
    """The extras the README's first command installs (`-e '.[report]'`), read where CI reads it."""
    first = subprocess.run([sys.executable, str(REPO / ".ci" / "readme_commands.py"), "first"], capture_output=True,
                           text=True, check=True).stdout
    found = re.search(r"-e\s+'?\.\[([\w,-]+)\]", first)
    return found.group(1).split(",") if found else []


def declared_closure() -> set[str]:
    """What the README's first command installs: the core dependencies of pyproject.toml and
    the extras it names, and, recursively, the non-extra requirements of each."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + [d for extra in front_door_extras() for d in project["optional-dependencies"][extra]]
    todo, closure = [Requirement(d) for d in deps], set()
    while todo:
        req = todo.pop()
        if req.marker and not req.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(req.name)
        if name in closure:
            continue
        closure.add(name)
        try:
            todo.extend(Requirement(r) for r in metadata.requires(req.name) or [])
        except metadata.PackageNotFoundError:
            pass  # a dependency for another platform
    return closure


def imported_by_farm_run(tmp_path: Path) -> set[str]:
    log = tmp_path / "imports.log"
    (tmp_path / "one").mkdir()  # one demo op keeps it short; every task file imports the same packages
    (tmp_path / "one" / "row_sum.py").write_text((REPO / "tasks" / "demo" / "row_sum.py").read_text())
    (tmp_path / "farm.yaml").write_text(f"corpus:\n  sources:\n    one: {tmp_path / 'one'}\n")
    env = {**os.environ, "FARM_IMPORT_LOG": str(log), "HOME": str(tmp_path / "home"),
           "PYTHONPATH": os.pathsep.join([str(RECORDER), str(REPO)])}
    env.pop("TRITON_INTERPRET", None)  # the cpu target sets it in its children, as for a user
    done = subprocess.run([sys.executable, "-c", "from farm.cli.main import main; main()", "--config", str(tmp_path / "farm.yaml"),
                           "run", "--source", "one", "--target", "cpu",
                           "--max-tasks", "1", "--store", f"file://{tmp_path / 'store'}"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    return set(log.read_text().split())


@pytest.mark.slow
def test_every_package_farm_run_imports_is_declared(tmp_path):
    packages = metadata.packages_distributions()
    closure = declared_closure()
    undeclared = {}
    for module in sorted(imported_by_farm_run(tmp_path)):
        if module in sys.stdlib_module_names or module in ("farm", "sitecustomize") or \
                module in OPTIONAL_OF_DEPENDENCIES:
            continue
        dists = {canonicalize_name(d) for d in packages.get(module, [])}
        if dists and not dists & closure:
            undeclared[module] = sorted(dists)
    assert "numpy" in packages, "numpy must be installed where this test runs"
    assert not undeclared, f"farm run imports packages that pyproject.toml does not declare: {undeclared}"
