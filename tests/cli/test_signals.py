"""Ctrl-C and SIGTERM stop a long command within seconds wherever they land: at start-up
(while the application imports), or while children make reference data. One line, no
traceback from any process, exit 130 / 143, and the op in flight recorded as interrupted, not
failed, so the next run makes it (farm.cli.main, farm.runtime.children.stop_children)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from farm.runtime import children
from tests.conftest import REPO

# forward writes a marker, then sleeps while FARM_TEST_SLOW is set: the signal lands mid-op
SLOW_TASK = '''
import os
import pathlib
import time
from pathlib import Path
import torch
import torch.nn as nn

N = 8


class Model(nn.Module):
    def forward(self, x):
        slow = os.environ.get("FARM_TEST_SLOW")
        if slow:
            pathlib.Path(slow).write_text("in forward")
            time.sleep(120)
        return x * 2


def get_inputs():
    return [torch.randn(N)]


def get_init_inputs():
    return []
'''


@pytest.fixture
def slow(tmp_path):
    for op in ("a1", "a2"):
        (tmp_path / "tasks" / "slow").mkdir(parents=True, exist_ok=True)
        (tmp_path / "tasks" / "slow" / f"{op}.py").write_text(SLOW_TASK)
    (tmp_path / "farm.yaml").write_text(f"corpus:\n  tasks_dir: {tmp_path / 'tasks'}\n")
    (tmp_path / "tmp").mkdir()
    return tmp_path


def _farm(tmp_path, *args, slow_marker=None):
    env = {**os.environ, "HOME": str(tmp_path / "home"), "TMPDIR": str(tmp_path / "tmp"),
           "FARM_CONFIG": str(tmp_path / "farm.yaml"), "FARM_STORE": f"file://{tmp_path / 'store'}",
           "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    env.pop("TRITON_INTERPRET", None)
    env.pop("FARM_TEST_SLOW", None)
    if slow_marker:
        env["FARM_TEST_SLOW"] = str(slow_marker)
    # SIGINT at its default in the child, as in a terminal (tests/search/test_resume.py)
    return subprocess.Popen([sys.executable, "-c", "from farm.cli.main import main; main()", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))


def _stopped(proc, sig, within_s: float) -> str:
    sent = time.monotonic()
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=60)
    took = time.monotonic() - sent
    assert proc.returncode == {signal.SIGINT: 130, signal.SIGTERM: 143}[sig], err
    assert "Traceback" not in err and "Error" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and ("interrupted" in lines[0] or "terminated" in lines[0]), err
    assert took < within_s, f"stopped after {took:.1f} s"
    return err


@pytest.mark.parametrize("sig, delay", [(signal.SIGINT, 0.4), (signal.SIGTERM, 1.2), (signal.SIGINT, 2.5)])
def test_a_signal_at_start_up_ends_with_one_line(slow, sig, delay):
    proc = _farm(slow, "reference", "--source", "slow")
    time.sleep(delay)  # typer, rich, then torch are being imported
    if proc.poll() is None:
        _stopped(proc, sig, within_s=12)


def _manifest(tmp_path) -> dict:
    return json.loads((tmp_path / "store" / "refs" / "manifest.json").read_text())["entries"]


def _wait_for(path, proc, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not path.exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline, "the op never started"
        time.sleep(0.1)


@pytest.mark.parametrize("command, sig", [(("reference", "--source", "slow"), signal.SIGINT),
                                          # unnamed variant: SIGTERM during the reference stage of `farm run`
                                          (("run", "--source", "slow", "--target", "cpu", "--generators", "tune"),
                                           signal.SIGTERM)])
def test_a_signal_mid_reference_records_the_op_interrupted_and_the_next_run_makes_it(slow, command, sig):
    marker = slow / "in-forward"
    proc = _farm(slow, *command, slow_marker=marker)
    _wait_for(marker, proc)
    _stopped(proc, sig, within_s=10)
    entries = _manifest(slow)
    assert entries["slow/a1"]["stage"] == "interrupted" and entries["slow/a1"].get("interrupted")
    assert not entries["slow/a1"]["success"]
    assert "slow/a2" not in entries  # not started: the batch did not go on with the rest
    assert not list((slow / "tmp").glob("farm-ref-*"))  # the staging folder went with it
    again = _farm(slow, "reference", "--source", "slow", "--json")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert [r["success"] for r in json.loads(out)["results"]] == [True, True]


def _sleeper(report, seconds, marker=None):
    report("sleeping")
    if marker:
        Path(marker).touch()
    time.sleep(seconds)


def test_stop_children_ends_children_in_flight_as_interrupted_and_allow_children_resumes(tmp_path):
    outcomes, marker = [], tmp_path / "sleeping"
    waiter = threading.Thread(target=lambda: outcomes.append(
        children.run_in_child(_sleeper, (60, str(marker)), timeout_s=120)))
    waiter.start()
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline:  # the child is in its work, not starting
        time.sleep(0.05)
    assert marker.exists(), "the child never started"
    try:
        children.stop_children()
        waiter.join(timeout=10)
        assert not waiter.is_alive()
        [outcome] = outcomes
        assert outcome.status == "interrupted" and not outcome.ok
        # while stopped, nothing new starts
        assert children.run_in_child(_sleeper, (0,), timeout_s=30).status == "interrupted"
    finally:
        children.allow_children()
    assert children.run_in_child(_sleeper, (0,), timeout_s=60).ok  # a new forkserver after the old one ended


# the signal lands where Python can only report an exception, not raise it: an at-fork hook
# (a runner's Popen with preexec_fn), a __del__, a weakref callback
SWALLOWED = '''
import os, signal, subprocess, sys, time, weakref
from farm.cli import signals

signals.install()


def hit(*_):
    os.kill(os.getpid(), signal.SIGTERM)  # os.kill runs the handler at once: inside the hook
    for _ in range(1000):
        pass


class Dying:
    def __del__(self):
        hit()


class Target:
    pass


try:
    where = sys.argv[1]
    if where == "at-fork":
        os.register_at_fork(after_in_parent=hit)
        subprocess.Popen(["true"], preexec_fn=lambda: None).wait()
    elif where == "del":
        d = Dying()
        del d
    else:
        t = Target()
        ref = weakref.ref(t, hit)
        del t
    for _ in range(100):
        time.sleep(0.01)
    print("went on")
except KeyboardInterrupt:
    signals.stopped()
finally:
    signals.at_exit()
'''


@pytest.mark.parametrize("where", ["at-fork", "del", "weakref"])
def test_a_signal_where_python_cannot_raise_still_stops_the_command_without_a_traceback(tmp_path, where):
    script = tmp_path / "swallowed.py"
    script.write_text(SWALLOWED)
    done = subprocess.run([sys.executable, str(script), where], capture_output=True, text=True, timeout=60,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 143, done.stderr
    assert "went on" not in done.stdout
    assert "Traceback" not in done.stderr and "Exception ignored" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        "terminated (SIGTERM): finished work is stored; run the same command again to resume"]
