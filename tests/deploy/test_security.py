"""The search pools' seccomp profile (deploy/security/farm-bwrap.json), tried for real: loaded
with libseccomp the way the container runtime loads it (scripts/seccomp-exec), it lets bubblewrap
build the farm's sandbox as the pods' non-root user, it is what makes that possible (the same
profile without its namespace rules refuses), it still refuses what a container has no business
calling, and the farm's own `farm run` with the sandbox required succeeds under it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from farm.evaluate import sandbox

ROOT = Path(__file__).resolve().parents[2]
PROFILE = ROOT / "deploy" / "security" / "farm-bwrap.json"
SECCOMP_EXEC = ROOT / "scripts" / "seccomp-exec"
POD_USER = ["setpriv", "--reuid", "10001", "--regid", "10001", "--clear-groups"]
NAMESPACE_CALLS = {"clone", "unshare", "mount", "umount2", "pivot_root", "chroot"}

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="seccomp is Linux's")


def under(profile: Path, *argv: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SECCOMP_EXEC), str(profile), "--", *argv], capture_output=True,
                          text=True, timeout=120, **kw)


def bwrap_probe() -> list[str]:
    """The very command line the farm's sandbox probe runs (farm.evaluate.sandbox)."""
    binary = shutil.which("bwrap")
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("bubblewrap is not installed (scripts/install-test-tools)")
        pytest.skip("bubblewrap is not installed")
    return [binary, *sandbox._base_args(), "--", "/bin/true"]


@pytest.fixture
def as_pod_user():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to become the pods' uid 10001")
    return POD_USER


def without_namespace_rules(tmp_path: Path) -> Path:
    profile = json.loads(PROFILE.read_text())
    profile["syscalls"] = [r for r in profile["syscalls"] if not set(r["names"]) & NAMESPACE_CALLS]
    path = tmp_path / "runtime-default-like.json"
    path.write_text(json.dumps(profile))
    return path


def test_bubblewrap_builds_the_sandbox_as_the_pod_user_under_the_profile(as_pod_user, tmp_path):
    argv = bwrap_probe()
    done = under(PROFILE, *as_pod_user, *argv)
    assert done.returncode == 0, done.stderr
    refused = under(without_namespace_rules(tmp_path), *as_pod_user, *argv)
    assert refused.returncode != 0 and "namespace" in refused.stderr, refused.stderr


def test_the_profile_refuses_what_it_does_not_list():
    # add_key (the kernel keyring) works for any process without a filter, and a new time
    # namespace is the one namespace bubblewrap never asks for
    code = (
        "import ctypes, os, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "key = libc.syscall(248, b'user', b'farm-test', b'v', 1, ctypes.c_long(-4))\n"  # add_key, x86_64
        "print('add_key', key, ctypes.get_errno())\n"
        "r = libc.unshare(0x80)\n"  # CLONE_NEWTIME
        "print('newtime', r, ctypes.get_errno())\n")
    if os.uname().machine != "x86_64":
        pytest.skip("the syscall number above is x86_64's")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "add_key -1" not in plain.stdout, plain.stdout  # the call itself works here
    done = under(PROFILE, sys.executable, "-c", code)
    assert done.returncode == 0, done.stderr
    lines = dict(line.split(" ", 1) for line in done.stdout.splitlines())
    assert lines["add_key"] == "-1 1", done.stdout  # EPERM
    assert lines["newtime"] == "-1 1", done.stdout


def test_farm_run_with_the_sandbox_required_succeeds_under_the_profile(tmp_path):
    bwrap_probe()
    env = {**os.environ, "HOME": str(tmp_path), "FARM_EVALUATOR_REQUIRE_SANDBOX": "1",
           "PYTHONPATH": str(ROOT)}
    done = under(PROFILE, sys.executable, "-m", "farm", "run", "--ops", "vector_add_scale", "--max-tasks", "1",
                 "--no-report", "--json", env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    [op] = json.loads(done.stdout)["ops"]
    assert op["status"] == "succeeded" and op["passed"] >= 1, op
