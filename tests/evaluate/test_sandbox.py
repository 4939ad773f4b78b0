"""The sandbox around candidate runners (farm.evaluate.sandbox: bubblewrap), attacked as
issue 21 describes, with the static checks turned off: the boundary itself must stop each
attack. Every attack is a candidate whose constructor reaches for something and raises what it
found, so that a leak would land in the verdict's reason or log (and so in reports and
repair prompts). The attacks that a sandbox-less runner lets through are also run with
`sandbox="off"` as a control, so these tests fail if the boundary stops working.

Secrets live under /var/tmp (outside the test's /tmp, so that the sandbox's private /tmp is
not what hides them), as a worker's HOME would hold them.
"""

from __future__ import annotations

import json
import os
import secrets
import shutil
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from farm.config import Settings
from farm.errors import FarmError
from farm.evaluate import sandbox
from farm.evaluate.evaluator import LOG_CHARS, REASON_CHARS, EvalSettings, Evaluator
from tests.evaluate.test_evaluator import CPU, GOOD, LIMITS, TASK, refs  # noqa: F401 - the shared fixture
from tests.redis_server import redis_server  # noqa: F401


def require_bwrap() -> None:
    found = sandbox.probe()
    if not found.on:
        if os.environ.get("CI"):
            pytest.fail(f"no sandbox here ({found.why}): CI must run the sandbox tests (scripts/install-test-tools)")
        pytest.skip(found.why)


class Secrets:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="farm-secret-", dir="/var/tmp"))
        self.value = "SENTINEL-" + secrets.token_hex(12)
        self.credentials = self.dir / ".aws" / "credentials"
        self.credentials.parent.mkdir()
        self.credentials.write_text(f"[default]\naws_secret_access_key = {self.value}\n")
        self.pt = self.dir / "secret.pt"
        torch.save({"key": torch.tensor(list(self.value.encode()), dtype=torch.uint8)}, self.pt)
        self.planted = self.dir / "planted"

    def forms(self) -> list[str]:
        """How the secret reads in a verdict: as text, as a list of byte values, as hex."""
        raw = self.value.encode()
        return [self.value, str(list(raw))[1:40], ", ".join(map(str, raw[:12])), raw.hex()[:24]]

    def assert_absent(self, *texts: str) -> None:
        for text in texts:
            for form in self.forms():
                assert form not in text, f"secret ({form[:20]}...) in: {text[:300]}"


@pytest.fixture(scope="module")
def secret():
    s = Secrets()
    yield s
    shutil.rmtree(s.dir, ignore_errors=True)


@pytest.fixture
def no_static_checks(monkeypatch):
    monkeypatch.setattr("farm.evaluate.evaluator.static_checks.static_verdict", lambda source: ("", ""))


def evaluator(refs, sandbox: str | None, config: Settings | None = None) -> Evaluator:  # noqa: F811
    settings = EvalSettings.for_device(CPU)
    settings.limits = LIMITS
    settings.sandbox = sandbox
    return Evaluator(refs.task, refs.data, CPU, settings, config)


def attack(body: str) -> str:
    """The good kernel, with a constructor that runs `body` (which sets FOUND) and raises it."""
    code = "\n".join("        " + line for line in body.strip().splitlines())
    return GOOD.replace("class ModelNew(nn.Module):", f'''
class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
{code}
        raise RuntimeError("LEAK " + str(FOUND))


class _Unused(nn.Module):''', 1)


def run(ev: Evaluator, source: str, name: str):
    result = ev.evaluate(source, name)
    return result, json.dumps(result.as_dict())


READS = {
    "torch_from_file": "FOUND = torch.from_file({path!r}, size=60, dtype=torch.uint8).tolist()",
    "numpy_fromfile": "import numpy\nFOUND = numpy.fromfile({path!r}, dtype=numpy.uint8).tolist()",
    "torch_load_path": "FOUND = torch.load({pt!r}, weights_only=True)['key'].tolist()",
}


def test_credentials_files_cannot_be_read(refs, secret, no_static_checks):  # noqa: F811
    require_bwrap()
    with evaluator(refs, "auto") as ev:
        for name, body in READS.items():
            result, stored = run(ev, attack(body.format(path=str(secret.credentials), pt=str(secret.pt))), name)
            assert result.sandbox == "bwrap"
            assert result.verdict == "runtime_error", (name, result.verdict, result.reason)
            assert "LEAK" not in result.reason and "No such file" in result.reason + result.log, (name, result.reason)
            secret.assert_absent(stored)
    # the control: without the boundary the same candidates read the file
    with evaluator(refs, "off") as ev:
        for name, body in READS.items():
            result, _ = run(ev, attack(body.format(path=str(secret.credentials), pt=str(secret.pt))), name)
            assert result.sandbox == "none" and "LEAK" in result.reason, (name, result.reason)
            assert str(list(secret.value.encode()[:10]))[1:-1] in result.reason


def test_no_network_but_loopback(refs, secret, redis_server, no_static_checks):  # noqa: F811
    require_bwrap()
    # asyncio: a socket API the static checks do not list
    body = f'''
import asyncio

async def poke():
    reader, writer = await asyncio.open_connection("127.0.0.1", {redis_server.port})
    writer.write(b"SET farm_leak {secret.value}\\r\\n")
    await writer.drain()
    return await reader.readline()

FOUND = asyncio.run(poke())
'''
    client = redis_server.client()
    with evaluator(refs, "auto") as ev:
        result, stored = run(ev, attack(body), "tcp_to_redis")
    assert result.sandbox == "bwrap" and result.verdict == "runtime_error", result.reason
    assert "ConnectionRefusedError" in result.reason + result.log or "Connect call failed" in result.reason
    assert client.get("farm_leak") is None
    with evaluator(refs, "off") as ev:  # the control: the same candidate reaches the server
        result, _ = run(ev, attack(body), "tcp_to_redis")
    assert "LEAK b'+OK" in result.reason, result.reason
    assert client.get("farm_leak") == secret.value.encode()
    client.delete("farm_leak")


def test_writes_only_to_scratch(refs, secret, no_static_checks):  # noqa: F811
    require_bwrap()
    package_file = Path(sandbox.PACKAGE_DIR) / "evaluate" / "planted_by_candidate.py"
    body = f'''
import numpy
wrote = []
for path in ({str(secret.planted)!r}, {str(package_file)!r}, "candidate_scratch.bin"):
    try:
        numpy.arange(4).tofile(path)
        wrote.append(path)
    except OSError as exc:
        wrote.append(type(exc).__name__)
FOUND = wrote
'''
    try:
        with evaluator(refs, "auto") as ev:
            result, _ = run(ev, attack(body), "write_outside")
        assert result.sandbox == "bwrap"
        # outside: no such folder, and the farm package read-only; inside its scratch: written
        assert "LEAK ['FileNotFoundError', 'OSError', 'candidate_scratch.bin']" in result.reason, result.reason
        assert not secret.planted.exists() and not package_file.exists()
    finally:
        package_file.unlink(missing_ok=True)
    with evaluator(refs, "off") as ev:  # the control (only the harmless path)
        result, _ = run(ev, attack(body.replace(repr(str(package_file)), "'/nonexistent/x'")), "write_outside")
    assert secret.planted.exists(), result.reason
    secret.planted.unlink()


def test_the_parents_proc_is_out_of_sight(refs, secret, no_static_checks, monkeypatch):  # noqa: F811
    require_bwrap()
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", secret.value)  # the worker's environment holds it
    body = f'''
import os
found = []
for name in ("environ", "maps", "mem"):
    try:
        with open("/proc/{os.getpid()}/" + name, "rb") as f:
            found.append(f.read(4096))
    except OSError as exc:
        found.append(type(exc).__name__)
found.append(os.getppid())
FOUND = found
'''
    with evaluator(refs, "auto") as ev:
        result, stored = run(ev, attack(body), "proc_parent")
    assert result.sandbox == "bwrap"
    # its parent is the sandbox's init (1), or the fork server (2) that init started: a PID
    # namespace of its own either way
    assert any(f"LEAK ['FileNotFoundError', 'FileNotFoundError', 'FileNotFoundError', {ppid}]" in result.reason
               for ppid in (1, 2)), result.reason
    secret.assert_absent(stored)


def test_secrets_are_masked_and_words_are_bounded(refs, secret, no_static_checks, monkeypatch):  # noqa: F811
    # without the boundary (the case it cannot cover), a configured secret read from anywhere
    # is masked in the verdict; and whatever a candidate says is cut to a stated size
    monkeypatch.setenv("FARM_LLM_API_KEY", secret.value)
    with evaluator(refs, "off") as ev:
        result, stored = run(ev, attack(f"FOUND = open({str(secret.credentials)!r}).read()"), "masked")
        assert result.reason == "aws_secret_access_key = ****" and "LEAK [default]" in result.log, result.log
        secret.assert_absent(stored)
        result, _ = run(ev, attack("FOUND = 'x' * 100000"), "long")
        assert len(result.reason) <= REASON_CHARS + 100 and len(result.log) <= LOG_CHARS + 100
        printer = attack("print('y' * 200000)\nFOUND = 1")
        result, _ = run(ev, printer, "printer")
        assert len(result.log) <= LOG_CHARS + 100


def test_required_sandbox_that_cannot_be_set_up_is_an_error(refs, monkeypatch):  # noqa: F811
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Boundary("none", "no namespaces in this test"))
    required = Settings()
    required.evaluator.require_sandbox = True
    with pytest.raises(FarmError, match="evaluator.require_sandbox.*no namespaces in this test"):
        evaluator(refs, None, required)
    with evaluator(refs, None, Settings()) as ev:  # not required: runs, and says so
        assert ev.boundary.kind == "none"


def test_one_evaluators_sandbox_setting_never_reaches_another(refs, cli, monkeypatch):  # noqa: F811
    """Each evaluator takes the settings it is given: one built under evaluator.sandbox=off, or a
    command run with --set evaluator.sandbox=off, leaves the next evaluator its boundary."""
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Boundary("bwrap"))  # as where bubblewrap works
    off = Settings()
    off.evaluator.sandbox = "off"
    with evaluator(refs, None, off) as ev:
        assert ev.boundary.kind == "none" and "evaluator.sandbox=off" in ev.boundary.why
    assert cli("--set", "evaluator.sandbox=off", "config", "show").exit_code == 0
    for config in (Settings(), None):  # given, or none given (the environment's and config file's)
        with evaluator(refs, None, config) as ev:
            assert ev.boundary.kind == "bwrap"


def test_farm_worker_requires_the_sandbox_by_default(cli, monkeypatch):
    pytest.importorskip("celery")
    monkeypatch.setattr(sandbox, "probe", lambda: sandbox.Boundary("none", "no namespaces in this test"))
    proc = cli("worker", "--pool", "search", "--target", "cpu", "--devices", "0")
    assert proc.exit_code == 2, proc.stdout + proc.stderr
    assert "evaluator.require_sandbox" in proc.stderr and "no namespaces in this test" in proc.stderr


def test_cli_eval_reports_the_sandbox_and_no_secret(cli, refs, secret, monkeypatch, tmp_path):  # noqa: F811
    require_bwrap()
    candidate = tmp_path / "leak.py"
    # the static checks stay on here; torch.from_file is not one of their rules
    candidate.write_text(attack(READS["torch_from_file"].format(path=str(secret.credentials))))
    proc = cli("eval", "--candidate", candidate, "--task", TASK, "--ref-pt", refs.pt_path, "--target", "cpu", "--json")
    data = json.loads(proc.stdout)
    assert data["sandbox"] == "bwrap" and data["verdict"] == "runtime_error", data["reason"]
    secret.assert_absent(proc.stdout)
    text = cli("--set", "evaluator.sandbox=off", "eval", "--candidate", candidate, "--task", TASK, "--ref-pt",
               refs.pt_path, "--target", "cpu")
    assert "sandbox: none" in text.stdout + text.stderr


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))


def test_a_compiler_outside_usr_is_reachable_inside_the_boundary(tmp_path, monkeypatch):
    """Triton builds its launcher with the C compiler on PATH: a CUDA image keeps gcc in
    /opt/gcc, and the boundary must show that installation (read-only), or every candidate
    fails to compile."""
    require_bwrap()
    import subprocess

    prefix = tmp_path / "opt-gcc"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "libexec").mkdir()
    (prefix / "libexec" / "cc1").write_text("the compiler proper\n")
    gcc = prefix / "bin" / "gcc"
    gcc.write_text(f"#!/bin/sh\ncat {prefix}/libexec/cc1\n")
    gcc.chmod(0o755)
    env = {"PATH": f"{prefix / 'bin'}:/usr/bin:/bin"}
    monkeypatch.setenv("PATH", env["PATH"])
    assert prefix in sandbox.toolchain_paths(env)
    argv = sandbox.wrap(["gcc"], scratch=tmp_path / "scratch", env=env, scratch_mb=8)
    out = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env)
    assert out.returncode == 0 and "the compiler proper" in out.stdout, out.stderr
    # read-only: a candidate cannot replace the compiler the trusted runner also uses
    argv = sandbox.wrap(["sh", "-c", f"echo x > {gcc}"], scratch=tmp_path / "scratch", env=env, scratch_mb=8)
    assert subprocess.run(argv, capture_output=True, timeout=60, env=env).returncode != 0
