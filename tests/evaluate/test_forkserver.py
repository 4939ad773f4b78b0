"""Runners forked by a fork server (farm.evaluate.forkserver, farm.evaluate.zygote): as fresh
as a new interpreter. Each test runs candidates one after the other on ONE server, the case a
pool avoids only by luck of rotation, and checks that nothing of the first reaches the next."""

import os
import shutil
import time

import pytest

from farm.evaluate import forkserver, sandbox
from farm.evaluate.forkserver import ForkedChild, ForkServer
from farm.evaluate.pool import RunnerPool
from farm.evaluate.runner import Limits, Runner, RunnerDied
from farm.targets import resolve_device

LIMITS = Limits(start_s=90, compile_s=30, run_s=10, time_s=20, host_memory_mb=4096, log_mb=64, scratch_mb=64,
                tmp_mb=32, tasks=64)

pytestmark = pytest.mark.skipif(not os.environ.get("CI") and shutil.which("bwrap") is None,
                                reason="bubblewrap is not installed (CI=true makes this a failure)")


@pytest.fixture
def server():
    found = sandbox.probe()
    assert found.on, found.why
    srv = ForkServer(resolve_device("cpu"), LIMITS, found)  # not among those the process lends
    srv.start()
    srv.busy = True
    yield srv
    srv.close()


def _runner(server: ForkServer) -> Runner:
    box = Runner(server.spec, server.limits, server.boundary)
    box.server = server
    box.start()
    return box


def _load(box: Runner, code: str) -> str:
    """Runs `code` at load in the runner; what it raises comes back as the reply's error."""
    reply = box.call("load_source", 30, source=code, init_inputs=[])
    return str(reply.get("error"))


def _once(server: ForkServer, code: str) -> str:
    """`code` in a runner forked by `server`, which is closed after."""
    box = _runner(server)
    try:
        return _load(box, code)
    finally:
        box.close()


def test_forked_runners_are_children_of_the_server_and_answer(server):
    box = _runner(server)
    try:
        assert isinstance(box.proc, ForkedChild) and box.server is server
        assert "no ModelNew" in _load(box, "X = 1\n") or "ModelNew" in _load(box, "X = 1\n")
    finally:
        box.close()
    assert box.server is None and server.forks == 1 and not server.busy and server.alive


LEAVE = r'''
import os, subprocess, sys, torch
open("/tmp/stash", "w").write("x")
open("/dev/shm/stash", "w").write("x")
open(os.path.join(os.environ["HOME"], "stash"), "w").write("x")
os.makedirs("/tmp/deep/er", exist_ok=True)
os.symlink("/usr", "/tmp/deep/link")
torch.add = lambda *a, **k: "patched"
subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"],
                 start_new_session=True)
raise RuntimeError("LEFT")
'''

LOOK = r'''
import os, torch
found = [p for p in ("/tmp/stash", "/dev/shm/stash", os.path.join(os.environ["HOME"], "stash"), "/tmp/deep")
         if os.path.lexists(p)]
others = []
for pid in os.listdir("/proc"):
    if pid.isdigit() and int(pid) not in (1, os.getpid(), os.getppid()):
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            others.append(open(f"/proc/{pid}/cmdline").read().replace("\0", " ")[:60])
raise RuntimeError(f"FOUND files={found} procs={others} patched={torch.add(torch.ones(1), 1) == 'patched'}")
'''


def test_nothing_a_candidate_leaves_reaches_the_next_runner_of_the_same_server(server):
    assert "LEFT" in _once(server, LEAVE)
    assert server.alive, "an honest clean-up must not retire the server"
    error = _once(server, LOOK)
    assert "FOUND files=[] procs=[] patched=False" in error, error
    assert os.path.isdir("/usr/bin"), "the clean-up followed no link out of the sandbox"


REACH = r'''
import os, signal
parent = os.getppid()
try:
    open(f"/proc/{parent}/mem", "rb").read(1)
    mem = "read"
except OSError as exc:
    mem = type(exc).__name__
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
traced = libc.ptrace(16, parent, 0, 0)  # PTRACE_ATTACH
raise RuntimeError(f"REACH mem={mem} ptrace={traced}")
'''


def test_a_child_can_neither_read_nor_trace_the_server(server):
    error = _once(server, REACH)
    assert "REACH mem=PermissionError ptrace=-1" in error, error


def test_a_server_a_child_killed_is_replaced_by_a_fresh_start(server):
    box = _runner(server)
    try:
        with pytest.raises(RunnerDied):  # its sandbox ends with the server, and the child with it
            _load(box, "import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\nimport time\ntime.sleep(5)\n")
    finally:
        box.close()
    assert not server.alive
    again = Runner(server.spec, server.limits, server.boundary)
    again.server = server
    again.start()  # the server is gone: a new interpreter, and the runner works
    try:
        assert not isinstance(again.proc, ForkedChild)
        assert "ModelNew" in _load(again, "X = 1\n")
    finally:
        again.close()


def test_a_server_shrugs_off_the_signals_a_child_may_send_and_its_children_get_them_back(server):
    code = ("import os, signal, time\nfor s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1):\n"
            "    os.kill(os.getppid(), s)\ntime.sleep(0.3)\n"
            "raise RuntimeError(f'HANDLERS {signal.getsignal(signal.SIGTERM)} {signal.getsignal(signal.SIGINT)}')\n")
    error = _once(server, code)
    assert server.alive
    assert "HANDLERS 0 <built-in function default_int_handler>" in error, error  # SIG_DFL, Python's own
    assert "ModelNew" in _once(server, "X = 1\n")  # and it still forks


IPC = r'''
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
shmid = libc.shmget(0, 4096, 0o1000 | 0o600)  # IPC_PRIVATE, IPC_CREAT
raise RuntimeError(f"SHM {shmid}")
'''


def test_a_system_v_object_left_behind_retires_the_server(server):
    """Shared memory outlives the process that made it: no clean-up is trusted with it."""
    error = _once(server, IPC)
    assert "SHM " in error and "SHM -1" not in error, error
    assert not server.alive


def test_pools_fork_their_runners_from_servers_the_process_keeps():
    """The servers outlive an op's pool: the next op's first runner is forked too (an op of four
    candidates paid the imports of its own servers and gained nothing on an H100). On an
    interpreted target the first op's first runner starts a server too, where none waits."""
    found = sandbox.probe()
    forkserver.close_idle()  # none left by an earlier test of this process
    kinds = []
    for _ in range(2):  # two ops, one after the other
        pool = RunnerPool(resolve_device("cpu"), LIMITS, found, size=1)
        try:
            for _ in range(3):
                box = pool.take()
                kinds.append(type(box.proc).__name__)
                box.close()
        finally:
            pool.close()
    try:
        assert kinds == ["ForkedChild"] * 6, kinds
        kept = [s for s in forkserver._SERVERS if s.limits == LIMITS]
        for _ in range(100):  # a starter thread cut short by close() gives its server back after
            if not any(s.busy for s in kept):
                break
            time.sleep(0.1)
        assert kept and [(s.alive, s.busy) for s in kept] == [(True, False)] * len(kept)
        assert len(forkserver._SERVERS) <= forkserver.IDLE_KEPT
    finally:
        forkserver.close_idle()
    assert not forkserver._SERVERS


def test_a_server_that_shows_a_folder_is_lent_only_for_that_folder(tmp_path):
    """A trusted runner's server shows its task's folder: a candidate's runner (nothing shown)
    never gets it, and neither does the trusted runner of a task in another folder."""
    found, cpu = sandbox.probe(), resolve_device("cpu")
    forkserver.close_idle()  # none left by an earlier test of this process
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shown = forkserver.lend(cpu, LIMITS, found, read_only=(tmp_path / "a",))
    assert shown is not None and shown.alive and shown.read_only == (tmp_path / "a",)
    shown.release()
    try:
        assert forkserver.lend(cpu, LIMITS, found, start=False) is None
        assert forkserver.lend(cpu, LIMITS, found, start=False, read_only=(tmp_path / "b",)) is None
        again = forkserver.lend(cpu, LIMITS, found, start=False, read_only=(tmp_path / "a",))
        assert again is shown
        again.release()
    finally:
        forkserver.close_idle()


HOG = r'''
import os, subprocess, sys, time
# a daemon that is no child of the runner any more: double fork, its own session
subprocess.Popen([sys.executable, "-c", "import os, time\nif os.fork(): os._exit(0)\nos.setsid()\n"
                  "block = b'x' * (1536 << 20)\ntime.sleep(60)"])
time.sleep(15)
'''


def test_the_memory_watchdog_counts_what_a_runner_left_to_the_sandbox_init(server):
    """A forked runner's own tree is not all it can use: an orphan goes to the sandbox's init."""
    server.limits = Limits(**{**vars(LIMITS), "host_memory_mb": 1024})
    box = _runner(server)
    try:
        with pytest.raises(RunnerDied, match="memory limit"):
            _load(box, HOG)
    finally:
        box.close()


UNDER_TMP = r'''
from farm.evaluate import sandbox
from farm.evaluate.forkserver import ForkServer
from farm.evaluate.runner import Limits, Runner
from farm.targets import resolve_device
server = ForkServer(resolve_device("cpu"), Limits(start_s=90, scratch_mb=64, tmp_mb=32), sandbox.probe())
server.start()
server.busy = True
box = Runner(server.spec, server.limits, server.boundary)
box.server = server
box.start()
box.call("load_source", 30, source="open('/tmp/left', 'w').write('x')\n", init_inputs=[])
box.close()
print("ALIVE", server.alive)
server.close()
'''


def test_a_farm_checked_out_under_tmp_keeps_its_servers(tmp_path):
    """The sandbox binds the farm (and a virtualenv) read-only where they are: under /tmp, a
    fresh clone's place in CI, their mount points sit in the runner's /tmp, which the clean-up
    empties around them instead of retiring the server at every candidate."""
    import subprocess
    import sys
    from pathlib import Path

    checkout = tmp_path / "clone"
    shutil.copytree(Path(__file__).resolve().parents[2] / "farm", checkout / "farm",
                    ignore=shutil.ignore_patterns("__pycache__"))
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PYTHONPATH": str(checkout)}
    res = subprocess.run([sys.executable, "-c", UNDER_TMP], env=env, cwd=tmp_path, capture_output=True, text=True,
                         timeout=240)
    assert "ALIVE True" in res.stdout, res.stdout + res.stderr[-3000:]


WARM = r'''
import os, sys
from triton.runtime.cache import triton_key
from farm.evaluate import zygote
before = set(sys.modules)
zygote.warm_triton()
print(triton_key.cache_info().currsize)
print(" ".join(sorted(m for m in zygote._FIRST_CALL + zygote._FIRST_CALL_INTERPRETED if m in sys.modules)))
print("triton.compiler.code_generator" in before)
'''


@pytest.mark.parametrize("interpret", ["", "1"])
def test_a_server_computes_triton_s_key_of_its_own_build_once_for_every_fork(tmp_path, interpret):
    """Every fresh runner's first compile hashed libtriton (about a second on a CUDA wheel):
    the server does it, from files alone, where Triton compiles at all."""
    import subprocess
    import sys

    env = {**os.environ, "TRITON_INTERPRET": interpret}
    done = subprocess.run([sys.executable, "-c", WARM], capture_output=True, text=True, env=env, timeout=120, check=True)
    key, *imported, generator_before = done.stdout.split()
    assert key == ("0" if interpret else "1") and generator_before == "False"
    # and what a first jit call imports: the code generator; the interpreter where it runs
    assert imported == (["triton.compiler.code_generator", "triton.runtime.interpreter"] if interpret
                        else ["triton.compiler.code_generator"]), done.stdout


def test_servers_start_two_at_a_time_on_a_small_machine_and_more_on_a_large_host():
    assert [forkserver.starters(n) for n in (None, 1, 2, 16, 64, 128, 256)] == [2, 2, 2, 2, 8, 8, 8]
    assert forkserver.starters(32) == 4
