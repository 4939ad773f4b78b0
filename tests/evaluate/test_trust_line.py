"""The trust line (issue 33): nothing that comes back from a runner is trusted as a path, a
size or a time, and nothing a candidate did survives it.

Most of this runs without a runner (the codec, the hostile-folder reads, the clock, the
promotion rule); the rest starts a few runners directly, each attack in one candidate whose
constructor reports what it found by raising it, so that the reply (and so the verdict) holds
the answer.
"""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from farm.evaluate import pids, protocol, sandbox, wire
from farm.evaluate.pool import RunnerPool
from farm.evaluate.result import Stop
from farm.evaluate.runner import Limits, Runner, RunnerDied
from farm.evaluate.speedup import promotion, summarize
from farm.evaluate.timer import RoundClock
from farm.evaluate.verifier import Case, Verifier
from farm.runtime import scratch
from farm.runtime.tolerance import DEFAULT_TOLERANCE
from farm.targets import resolve_device

CPU = resolve_device("cpu")
LIMITS = Limits(start_s=60, compile_s=20, run_s=10, time_s=20, host_memory_mb=4096, log_mb=512,
                scratch_mb=64, tmp_mb=32, tasks=64)
SECRET = "SENTINEL-" + os.urandom(8).hex()


def sandboxed() -> sandbox.Boundary:
    found = sandbox.probe()
    if not found.on:
        if os.environ.get("CI"):
            pytest.fail(f"no sandbox here ({found.why}): CI must run the sandbox tests")
        pytest.skip(found.why)
    return found


def report(body: str) -> str:
    """A candidate whose constructor runs `body` (which sets FOUND) and raises it as JSON."""
    code = "\n".join("        " + line for line in body.strip().splitlines())
    return f'''
import json
import torch


class ModelNew(torch.nn.Module):
    def __init__(self):
        super().__init__()
{code}
        raise RuntimeError("FOUND " + json.dumps(FOUND))
'''


def found(reply) -> dict:
    text = reply.get("error", "")
    assert "FOUND " in text, text[-2000:]
    return json.loads(text.rsplit("RuntimeError: FOUND ", 1)[1].strip().splitlines()[0])


@pytest.fixture
def secret_file(tmp_path):
    path = Path("/var/tmp") / f"farm-secret-{os.getpid()}"
    path.write_text(f"aws_secret_access_key = {SECRET}\n")
    yield path
    path.unlink(missing_ok=True)


# ---------------------------------------------------------------- replies: the codec


def test_a_reply_round_trips_every_dtype_and_nothing_else():
    tensors = [torch.randn(3, 2), torch.arange(5).to(torch.uint64), torch.ones(2, dtype=torch.bfloat16),
               torch.tensor([True, False]), torch.zeros(0, 4), torch.randn(2, dtype=torch.complex64)]
    tree = {"ok": True, "outputs": tensors, "n": 3, "x": float("nan"), "s": "t", "nested": {"a": [1, None]}}
    back = wire.decode(wire.encode(tree))
    assert all(torch.equal(a, b) if not a.is_floating_point() else torch.allclose(a, b, equal_nan=True)
               for a, b in zip(tensors, back["outputs"]))
    assert back["n"] == 3 and back["nested"] == {"a": [1, None]}
    with pytest.raises(wire.ProtocolError, match="not plain data"):
        wire.decode(wire.encode({"ok": True, "obj": object()}))


def _frame(header: dict, body: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "big") + raw + body


@pytest.mark.parametrize("header, body, why", [
    ({"$t": 0, "dtype": "float32", "shape": [1 << 40], "nbytes": 8}, b"\0" * 8, "claims shape"),  # a huge tensor
    ({"$t": 0, "dtype": "float32", "shape": [4], "nbytes": 1 << 40}, b"\0" * 16, "declares"),  # a huge byte count
    ({"$t": 0, "dtype": "float64", "shape": [4], "nbytes": 16}, b"\0" * 16, "claims shape"),  # a lying dtype
    ({"$t": 0, "dtype": "object", "shape": [1], "nbytes": 8}, b"\0" * 8, "unknown dtype"),
    ({"$t": 0, "dtype": "float32", "shape": [-1], "nbytes": 4}, b"\0" * 4, "impossible shape"),
    ([{"$t": 0, "dtype": "uint8", "shape": [1], "nbytes": 1}] * 2, b"\0", "once each"),  # one blob, two tensors
    ({"$d": [["a", {"$t": 1, "dtype": "uint8", "shape": [1], "nbytes": 1}]]}, b"\0", "numbered"),
], ids=["huge-shape", "huge-bytes", "lying-dtype", "unknown-dtype", "negative-shape", "shared-blob", "bad-index"])
def test_a_reply_that_lies_about_its_tensors_is_refused_before_any_allocation(header, body, why):
    with pytest.raises(wire.ProtocolError, match=why):
        wire.decode(_frame(header, body))


def test_a_deeply_nested_or_malformed_reply_is_refused():
    deep = "[" * 5000 + "]" * 5000
    with pytest.raises(wire.ProtocolError):
        wire.decode(len(deep).to_bytes(8, "big") + deep.encode())
    with pytest.raises(wire.ProtocolError):
        wire.decode(b"\xff" * 3)
    assert protocol.parse_reply(protocol.Run(key="pt"), {"ok": True, "launches": "many"}).kind == "cheat"
    assert protocol.parse_reply(protocol.Run(key="pt"), {"ok": False, "kind": "pass"}).kind == "cheat"
    assert protocol.parse_reply(protocol.Run(key="pt"), [1, 2]).kind == "cheat"


def test_a_frame_over_its_size_or_past_its_deadline_is_not_read():
    a, b = socket.socketpair()
    try:
        a.sendall((1 << 40).to_bytes(8, "big"))
        with pytest.raises(wire.FrameTooLarge):
            wire.recv_frame(b, 1 << 20, time.monotonic() + 5)
        a.sendall((10).to_bytes(8, "big") + b"abc")  # then nothing more
        started = time.monotonic()
        with pytest.raises(wire.FrameTimeout):
            wire.recv_frame(b, 1 << 20, time.monotonic() + 0.3)
        assert time.monotonic() - started < 2
    finally:
        a.close()
        b.close()


def test_commands_are_typed_and_a_misspelt_field_fails_in_the_evaluator():
    cmd = protocol.command("time_round", slot=None, keys=["seed0"], mode="events", reps=4)
    assert cmd.verb == "time_round" and cmd.output_sets == 0
    with pytest.raises(TypeError):
        protocol.command("run", key="pt", ghots=True)
    with pytest.raises(TypeError):
        protocol.command("rm -rf", key="pt")


# ---------------------------------------------------------------- hostile folders


def test_a_hostile_folder_is_read_without_following_blocking_or_overreading(tmp_path, secret_file):
    folder = tmp_path / "scratch"
    folder.mkdir()
    (folder / "ok.json").write_text("{}")
    (folder / "link.json").symlink_to(secret_file)
    (folder / "zero.json").symlink_to("/dev/zero")
    os.mkfifo(folder / "fifo.json")
    (folder / "dir.json").mkdir()
    try:
        os.link(secret_file, folder / "hard.json")  # a hard link to a host file: a regular file, two links
    except OSError:
        pass
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(folder / "sock.json"))
    (folder / "big.json").write_bytes(b"x" * 5000)
    assert scratch.read_capped(folder, "ok.json", 100) == b"{}"
    started = time.monotonic()
    for name in ("link.json", "zero.json", "fifo.json", "dir.json", "sock.json", "big.json",
                 *(["hard.json"] if (folder / "hard.json").exists() else [])):
        with pytest.raises(scratch.UnsafeFile):
            scratch.read_capped(folder, name, 1000)
    assert time.monotonic() - started < 2  # the FIFO never blocked
    sock.close()


def test_a_hostile_folder_is_removed_without_touching_what_its_links_point_at(tmp_path, secret_file):
    folder = tmp_path / "scratch"
    (folder / "deep").mkdir(parents=True)
    for i in range(3000):  # many names
        (folder / f"f{i}").write_bytes(b"")
    (folder / "deep" / "out").symlink_to(secret_file.parent)
    (folder / "file_link").symlink_to(secret_file)
    locked = folder / "locked"
    (locked / "inner").mkdir(parents=True)
    os.chmod(locked, 0)
    scratch.remove_tree(folder)
    assert not folder.exists() and secret_file.read_text().endswith(f"{SECRET}\n")


def test_the_folders_of_a_killed_evaluator_go_at_the_next_start(tmp_path):
    driver = ("from farm.targets import resolve_device\n"
              "from farm.evaluate.runner import Limits, Runner\n"
              "import os, signal\n"
              "box = Runner(resolve_device('cpu'), Limits(start_s=60))\n"  # no sandbox: a host folder
              "box._fresh_folder()\n"
              "(box.workdir / 'left').write_text('x')\n"
              "print(box.workdir, flush=True)\n"
              "os.kill(os.getpid(), signal.SIGKILL)\n")
    out = subprocess.run([sys.executable, "-c", driver], capture_output=True, text=True, timeout=120,
                         env={**os.environ, "TMPDIR": str(tmp_path)})
    left = Path(out.stdout.strip())
    assert left.parent == tmp_path and (left / "left").exists(), out.stderr
    assert left in scratch.sweep_stale(tmp_path)
    assert not left.exists()


# ---------------------------------------------------------------- the clock and the verdict


def _scripted_rounds(claimed: float, wall_extra: float, overhead: float = 1.0) -> RoundClock:
    clock = RoundClock(lead_allowed=False)
    for who in ("candidate", "Model", "candidate", "Reference", "candidate"):
        real = 40.0
        claim = claimed if who == "candidate" else real
        reply = protocol.reply_for("time_round", {"ok": True, "samples": [claim / 4] * 4})
        clock.time(who, "events", 4, lambda r=reply: r)
        clock.rounds[-1].wall_ms = real + overhead + (wall_extra if who == "candidate" else 0.0)
    return clock


def test_a_runner_that_claims_less_time_than_the_evaluators_clock_saw_is_caught():
    honest = _scripted_rounds(claimed=40.0, wall_extra=0.0)
    assert honest.check("candidate", {"Model", "Reference"}) == ""
    stalled_host = _scripted_rounds(claimed=40.0, wall_extra=30.0)  # its calls took longer, and it says so
    assert stalled_host.check("candidate", {"Model", "Reference"}) == ""
    one_stall = _scripted_rounds(claimed=4.0, wall_extra=0.0)  # a fast honest kernel...
    one_stall.rounds[0].wall_ms += 200.0  # ...one of whose rounds a busy host held up
    one_stall.rounds[2].claimed_ms, one_stall.rounds[4].claimed_ms = 40.0, 40.0
    assert one_stall.check("candidate", {"Model", "Reference"}) == ""
    forged = _scripted_rounds(claimed=40.0 / 15, wall_extra=0.0)  # a patched clock: 15x
    assert "not measured on the calls it ran" in forged.check("candidate", {"Model", "Reference"})


def _graph_rounds(candidate_ms: float, model_ms: float, median_ms: float | None = None,
                  replays: int = 20, captured: int = 400, harness_ms: float = 1.5) -> RoundClock:
    """Rounds of a graph comparison as a device runs them: each round replays a graph of
    `captured` calls `replays` times; a sample is one replay's time per call."""
    clock = RoundClock(lead_allowed=True)
    for who in ("candidate", "Model", "candidate", "Reference", "candidate", "Model"):
        per_call = candidate_ms if who == "candidate" else model_ms
        claim = median_ms if (who == "candidate" and median_ms is not None) else per_call
        samples = [claim] * (replays - 1) + [per_call * replays]  # one slow replay
        reply = protocol.reply_for("time_round", {"ok": True, "samples": samples})
        clock.time(who, "graph", replays * captured, lambda r=reply: r)
        clock.rounds[-1].wall_ms = replays * captured * per_call + harness_ms
    return clock


def test_a_slow_honest_kernel_timed_in_graph_rounds_is_not_called_a_cheat():
    # a graph round's samples are per call, one per replay of `captured` calls: a tune candidate
    # 7x slower than a 3.5 us Model spent 20 x 400 x 25 us in each round and said so
    slow = _graph_rounds(candidate_ms=0.025, model_ms=0.0035)
    assert slow.check("candidate", {"Model", "Reference"}) == ""
    assert _graph_rounds(candidate_ms=0.0035, model_ms=0.0035).check("candidate", {"Model", "Reference"}) == ""
    # the same rounds with a rewritten clock: a per-call median 10x under what the replays took
    forged = _graph_rounds(candidate_ms=0.025, model_ms=0.0035, median_ms=0.0025)
    assert "not measured on the calls it ran" in forged.check("candidate", {"Model", "Reference"})


def test_a_trusted_claim_above_its_wall_time_counts_as_no_overhead_not_a_negative_one():
    clock = RoundClock(lead_allowed=False)
    for who in ("candidate", "Model", "candidate", "Model", "candidate"):
        reply = protocol.reply_for("time_round", {"ok": True, "samples": [0.01] * 4})
        clock.time(who, "graph", 400, lambda r=reply: r)  # 4 ms claimed by each
        clock.rounds[-1].wall_ms = 4.5 if who == "candidate" else 0.5  # a scripted Model's claim over its wall
    assert clock.overhead_ms("graph", {"Model"}) == 0.0
    assert clock.check("candidate", {"Model"}) == ""


def test_a_claim_is_the_median_the_verdict_uses_not_a_sum_one_sample_can_inflate():
    # 19 forged samples 15x too fast and one huge one: their sum covers the round, their median,
    # which is the figure, does not
    clock = RoundClock(lead_allowed=False)
    for who in ("candidate", "Model", "candidate", "Reference", "candidate"):
        samples = [2.0] * 20 if who != "candidate" else [2.0 / 15] * 19 + [40.0]
        reply = protocol.reply_for("time_round", {"ok": True, "samples": samples})
        clock.time(who, "events", 20, lambda r=reply: r)
        clock.rounds[-1].wall_ms = 40.0 + 1.0
    assert "not measured on the calls it ran" in clock.check("candidate", {"Model", "Reference"})


def test_a_claimed_speedup_the_independent_re_timing_does_not_confirm_is_not_promoted():
    independent = summarize([1.30, 1.31, 1.29, 1.30, 1.32, 1.28])
    ok, why = promotion({"model": independent, "null": None, "claimed": {"ratio": 1.33}}, model_runs=True)
    assert ok, why
    ok, why = promotion({"model": independent, "null": None, "claimed": {"ratio": 15.0}}, model_runs=True)
    assert not ok and "not confirmed by the independent re-timing" in why


def test_a_failed_case_is_named_with_its_shapes_dtypes_and_seed_unless_secret():
    verifier = Verifier(DEFAULT_TOLERANCE)
    x = torch.randn(7, 300)
    public = Case("pt", [x], [x.sum(1)], "against the reference data (.pt)", seed=123)
    secret = Case("seed0", [x], [x.sum(1)], "fresh input set 1 against Reference on the target", seed=99, secret=True)
    with pytest.raises(Stop, match=r"\(.pt\) \(inputs \[7, 300\] float32; seed 123\): output 0"):
        verifier.check([x.sum(1) * 2], public)
    with pytest.raises(Stop) as stop:
        verifier.check([x.sum(1) * 2], secret)
    assert "secret seed" in stop.value.reason and "99" not in stop.value.reason


# ---------------------------------------------------------------- runners


LEAKS = '''
import os, socket, stat
made = []
for name in ("child.log", "log", "out.log"):
    for kind, make in (("link", lambda p: os.symlink(SECRET_PATH, p)), ("zero", lambda p: os.symlink("/dev/zero", p)),
                       ("fifo", os.mkfifo), ("dir", os.mkdir)):
        path = f"{name}.{kind}" if kind != "link" else name
        try:
            make(path)
            made.append(path)
        except OSError:
            pass
s = socket.socket(socket.AF_UNIX)
s.bind("child.sock")
print("planted", made, flush=True)
os.abort()
'''


def test_a_runners_log_comes_through_its_descriptor_not_a_path_it_planted(secret_file):
    """The candidate replaces every log-like name in its folder by a link to a host secret, a
    link to /dev/zero, a FIFO, a folder or a socket, then aborts: the crash's log is what it
    printed, read promptly and bounded, and holds no host byte."""
    box = Runner(CPU, LIMITS, sandboxed())
    started = time.monotonic()
    try:
        body = LEAKS.replace("SECRET_PATH", repr(str(secret_file)))
        with pytest.raises(RunnerDied) as died:
            box.call("load_source", 30, source=report(body + "\nFOUND = 0"), init_inputs=[])
        text = str(died.value) + box.log_tail(100_000)
    finally:
        box.close()
    assert died.value.kind == "crash" and "planted" in text
    assert SECRET not in text and len(text) < 200_000
    assert time.monotonic() - started < 60


FLOOD_FRAME = '''
import os, stat, struct, time
fds = [fd for fd in range(3, 64) if _is_sock(fd)]
for fd in fds:
    os.write(fd, struct.pack("!Q", 1 << 40) + b"x" * 4096)  # a frame of a terabyte, announced
time.sleep(30)
FOUND = fds
'''


def test_a_frame_a_candidate_forges_on_the_control_socket_is_refused_and_ends_the_runner():
    body = ("def _is_sock(fd):\n    try:\n        return stat.S_ISSOCK(os.fstat(fd).st_mode)\n"
            "    except OSError:\n        return False\n" + FLOOD_FRAME)
    box = Runner(CPU, LIMITS, sandboxed())
    started = time.monotonic()
    try:
        reply = box.call("load_source", 20, source=report(body), init_inputs=[])
        assert not reply.ok and reply.kind == "cheat" and "larger than" in reply.error, reply
        assert not box.alive  # out of step with the protocol: finished
    finally:
        box.close()
    assert time.monotonic() - started < 15


LIMIT_PROBES = '''
import ctypes, os, subprocess
found = {}
kids = []
try:
    for i in range(400):
        pid = os.fork()
        if pid == 0:
            os.execv("/bin/sleep", ["sleep", "5"])
        kids.append(pid)
    found["forks"] = len(kids)
except OSError as exc:
    found["forks"] = len(kids)
    found["fork_error"] = exc.errno
for pid in kids:
    os.kill(pid, 9)
for place in ("/tmp", "/dev/shm", "."):
    try:
        with open(os.path.join(place, "fill"), "wb") as f:
            for _ in range(256):
                f.write(b"x" * (1 << 20))
        found[place] = "wrote 256 MB"
    except OSError as exc:
        found[place] = exc.errno
    try:
        os.unlink(os.path.join(place, "fill"))
    except OSError:
        pass
libc = ctypes.CDLL(None, use_errno=True)
found["unshare_user"] = libc.unshare(0x10000000)
found["home"] = os.environ["HOME"]
found["caches"] = {v: os.environ.get(v, "") for v in ("TRITON_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR")}
found["left_by_earlier"] = sorted(n for n in os.listdir(".") if n.startswith("marker")) + sorted(
    n for n in os.listdir("/tmp") if n.startswith("marker"))
os.makedirs(os.environ["TRITON_CACHE_DIR"], exist_ok=True)
for folder in (".", "/tmp", os.environ["TRITON_CACHE_DIR"]):
    open(os.path.join(folder, "marker-" + str(os.getpid())), "w").write("x")
mine = "marker-" + str(os.getpid())
found["cache_left"] = [n for n in os.listdir(os.environ["TRITON_CACHE_DIR"]) if n != mine]
FOUND = found
'''


def test_a_runner_has_its_limits_and_the_next_one_finds_nothing_of_it():
    """Processes (400 forks), /tmp, /dev/shm and its folder (tmpfs of a stated size), no nested
    user namespace; and a second runner from the same pool finds none of the first one's files,
    compiler cache entries included."""
    pool = RunnerPool(CPU, LIMITS, sandboxed(), size=0)
    reports = []
    try:
        for _ in range(2):
            box = pool.take()
            try:
                reports.append(found(box.call("load_source", 60, source=report(LIMIT_PROBES), init_inputs=[])))
            finally:
                box.close()
    finally:
        pool.close()
    first, second = reports
    assert first["forks"] < LIMITS.tasks and first.get("fork_error") == 11, first  # EAGAIN
    for place in ("/tmp", "/dev/shm", "."):
        assert first[place] == 28, (place, first)  # ENOSPC: 256 MB does not fit
    assert first["unshare_user"] == -1
    assert first["caches"]["TRITON_CACHE_DIR"].startswith(first["home"])  # its own, in its folder
    assert second["left_by_earlier"] == [] and second["cache_left"] == []
    assert pids.mechanism() in ("cgroup", "rlimit")


def test_a_process_a_candidate_leaves_running_ends_with_its_runner():
    marker = str(9_000_000 + os.getpid() % 100_000)
    body = f'''
import os
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv("/bin/sleep", ["sleep", "{marker}"])
    os._exit(0)
FOUND = 1
'''
    box = Runner(CPU, LIMITS, sandboxed())
    try:
        box.call("load_source", 60, source=report(body), init_inputs=[])
        deadline = time.monotonic() + 10
        while not _sleepers(marker) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert _sleepers(marker), "the daemon runs while its runner does"
    finally:
        box.close()
    deadline = time.monotonic() + 5
    while _sleepers(marker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _sleepers(marker)


def _sleepers(marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes()
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cmd == f"sleep\0{marker}\0".encode() and state != "Z":
                out.append(int(entry.name))
    return out


def test_the_sandboxs_command_line_has_its_limits():
    argv = sandbox.wrap(["true"], scratch=sandbox.SCRATCH, env={}, scratch_mb=64, tmp_mb=32)
    joined = " ".join(argv)
    assert "--unshare-user --disable-userns" in joined
    assert f"--size {32 << 20} --tmpfs /tmp" in joined and f"--size {32 << 20} --tmpfs /dev/shm" in joined
    assert f"--size {64 << 20} --tmpfs /scratch" in joined and "--bind /scratch" not in joined
    assert stat.S_ISDIR(os.stat("/").st_mode)
