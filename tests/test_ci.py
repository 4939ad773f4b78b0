"""CI runs the README's two commands as written there: .ci/readme_commands.py reads them from
the README, .ci/run runs both (the first in a fresh virtualenv and HOME) and
.ci/check_front_door.py fails unless every demo op got reference data and a passing kernel."""

import json
import subprocess
import sys

from tests.conftest import REPO

CI = REPO / ".ci"


def readme_command(name: str) -> str:
    done = subprocess.run([sys.executable, str(CI / "readme_commands.py"), name], capture_output=True, text=True,
                          check=True)
    return done.stdout.strip()


def test_the_readme_commands_are_what_ci_runs():
    first, tests = readme_command("first"), readme_command("test")
    assert first.startswith("pip install ") and first.endswith("&& farm run")
    assert "python -m pytest" in tests
    readme = (REPO / "README.md").read_text()
    assert f"    {first}\n" in readme and f"    {tests}\n" in readme
    run = (CI / "run").read_text()
    # .ci/run holds no copy of either command: it reads both, and runs the first in a new venv and HOME
    assert "pip install" not in run and "pytest" not in run.replace("the test suite", "")
    assert "readme_commands.py first" in run and "readme_commands.py test" in run
    assert 'eval "$first"' in run and 'eval "$tests"' in run
    assert "python3 -m venv" in run and 'HOME="$scratch/home"' in run and "check_front_door.py" in run


def test_a_readme_without_two_commands_stops_ci(tmp_path):
    sys.path.insert(0, str(CI))
    try:
        import readme_commands
    finally:
        sys.path.remove(str(CI))
    readme = tmp_path / "README.md"
    readme.write_text(f"{readme_commands.SECTION}\n\n    pip install . && farm run\n\n## Next\n")
    try:
        readme_commands.commands(readme)
    except SystemExit as exc:
        assert "holds 1 indented commands, expected 2" in str(exc)
    else:
        raise AssertionError("one command was accepted")


def _store(tmp_path, search_status: str, ref_ok: bool = True):
    store, tasks = tmp_path / "store", tmp_path / "tasks"
    tasks.mkdir(parents=True)
    (tasks / "row_sum.py").write_text("# a task\n")
    (store / "refs").mkdir(parents=True)
    (store / "runs" / "local-demo-cpu").mkdir(parents=True)
    entry = {"success": ref_ok, "error": None if ref_ok else "Traceback...\nModuleNotFoundError: No module named 'numpy'"}
    (store / "refs" / "manifest.json").write_text(json.dumps({"entries": {"demo/row_sum": entry}}))
    (store / "runs" / "local-demo-cpu" / "ledger.json").write_text(json.dumps(
        {"ops": {"demo/row_sum": {"status": "done", "result": {"status": search_status}}}}))
    return [sys.executable, str(CI / "check_front_door.py"), str(store), str(tasks)]


def test_the_front_door_check_fails_unless_every_demo_op_succeeded(tmp_path):
    ok = subprocess.run(_store(tmp_path / "a", "succeeded"), capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    zero = subprocess.run(_store(tmp_path / "b", "zero_pass"), capture_output=True, text=True)
    assert zero.returncode == 1 and "demo/row_sum: search zero_pass" in zero.stderr
    noref = subprocess.run(_store(tmp_path / "c", "succeeded", ref_ok=False), capture_output=True, text=True)
    assert noref.returncode == 1 and "No module named 'numpy'" in noref.stderr
