"""The search's pipeline (#17): compile-ahead runners, the device lease, fixed costs kept with
the checkpoint. CPU and the Triton interpreter; the GPU figures come from bench/throughput_gpu.py."""

import threading
import time
from dataclasses import replace
from pathlib import Path

import pytest

from farm.config import load_settings
from farm.corpus.tasks import find_tasks
from farm.evaluate import lease as device_lease
from farm.evaluate.evaluator import EvalSettings, Evaluator
from farm.evaluate.options import EvalOptions
from farm.evaluate.runner import Limits
from farm.generators import Generator, Proposal
from farm.reference.generate import generate_references
from farm.search import pipeline
from farm.search.batch import load_reference
from farm.search.context import SearchConfig, SearchContext
from farm.search.controller import OpSearch, search_op
from farm.storage import open_store
from farm.targets import resolve_device

CPU = resolve_device("cpu")
CHEATS = Path(__file__).resolve().parents[1] / "evaluate" / "cheats"
COMPILE_S = 15.0  # the compile limit in these tests
# the compile limit of the hang test: what a hanging candidate costs, waited out twice (sequential,
# pipelined); a candidate's load and first run in the interpreter take under 1 s on a quiet 2-core
# machine, so 8 s leaves room for a loaded one
HANG_S = 8.0


class Listed(Generator):
    """Seeds exactly the given sources, proposes nothing: the same candidates for both paths."""

    name = "listed"

    def __init__(self, names):
        self.names = names

    def initial_candidates(self, ctx):
        return [Proposal((CHEATS / f"{n}.py").read_text() if n in CHEAT_NAMES else SOURCES[n], self.name, n)
                for n in self.names]

    def propose(self, parent, inspirations, ctx, n=1):
        return []


CHEAT_NAMES = {"good_row_sum", "hang", "crash_segv", "mutate_zero_input", "pytorch_only_static"}
SOURCES = {"syntax_error": "import torch\nclass ModelNew(:\n", "no_model": "import triton\n@triton.jit\ndef k(x):\n"
           "    pass\nclass Other:\n    pass\n"}


@pytest.fixture(scope="module")
def row_sum(tmp_path_factory):
    store = open_store(f"file://{tmp_path_factory.mktemp('pipestore')}")
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    refs = find_tasks(settings, ["demo"], ["row_sum"])
    assert all(r["success"] for r in generate_references(refs, store, CPU, 0, "small", 120))
    return store, refs[0], load_reference(store, "demo", "row_sum")


def _settings(compile_s=COMPILE_S):
    base = EvalSettings.for_device(CPU)
    return replace(base, limits=replace(Limits(), compile_s=compile_s))


def _search(row_sum, run, names, workers, devices=(CPU,), on_event=None, factory=Evaluator, concurrent=3,
            compile_s=COMPILE_S):
    store, ref, data = row_sum
    config = SearchConfig(max_tasks=len(names), max_concurrent=concurrent, chunk_size=len(names),
                          generators=("listed",), early_stop=False)
    return search_op(ref, data, SearchContext(store, run, "cpu", devices, [Listed(names)], config,
                                              EvalOptions(compile_workers=workers, base=_settings(compile_s)),
                                              on_event=on_event, evaluator_factory=factory))


def _verdicts(store, run):
    state = store.read_json(f"runs/{run}/demo/row_sum/state.json")
    return {r["note"]: r["verdict"] for r in state["db"]["records"]}


def test_pipeline_gives_the_sequential_verdicts_and_a_hang_does_not_hold_the_device(row_sum):
    # the good kernel right behind the hang: it goes to the other compile-ahead runner and is judged on
    # the device while the hang sits out its limit (behind crash_segv, it came only after that crash was judged)
    names = ["hang", "good_row_sum", "crash_segv", "syntax_error", "no_model", "mutate_zero_input",
             "pytorch_only_static"]
    order = []
    _search(row_sum, "seq", names, workers=0, compile_s=HANG_S)
    t0 = time.monotonic()
    _search(row_sum, "pipe", names, workers=2, compile_s=HANG_S,
            on_event=lambda kind, info: order.append((info["id"], info["verdict"], time.monotonic() - t0))
            if kind == "candidate" else None)
    store = row_sum[0]
    sequential, piped = _verdicts(store, "seq"), _verdicts(store, "pipe")
    assert sequential == piped, (sequential, piped)
    assert piped["hang"] == "timeout" and piped["crash_segv"] == "crash" and piped["good_row_sum"] == "pass"
    assert piped["syntax_error"] == "compile_error" and piped["no_model"] == "compile_error"
    # the hang sat in a compile-ahead runner for its whole limit while the good kernel was judged on the device
    got = {verdict: at for _id, verdict, at in order}
    assert got["pass"] < got["timeout"] and got["timeout"] >= HANG_S * 0.9, order
    report = store.read_json("runs/pipe/demo/row_sum/state.json")
    assert report["status"] == "done"
    # the dashboard's figures: the device's time by phase over the chunk, the queues drained
    from prometheus_client import REGISTRY

    share = {p: REGISTRY.get_sample_value("farm_device_time_share", {"target": "cpu", "device": "cpu", "phase": p})
             for p in ("timing", "verification", "idle")}
    assert abs(sum(share.values()) - 1.0) < 1e-6 and share["timing"] > 0 and share["verification"] > 0
    for stage in ("compile", "device"):
        assert REGISTRY.get_sample_value("farm_compile_queue_depth",
                                         {"target": "cpu", "device": "cpu", "stage": stage}) == 0


def test_run_window_keeps_slots_in_flight_and_stops_when_nothing_is_left():
    from concurrent.futures import ThreadPoolExecutor

    lock, now, peak, left = threading.Lock(), [0], [0], [7]

    def job():
        with lock:
            if left[0] == 0:
                return False
            left[0] -= 1
            now[0] += 1
            peak[0] = max(peak[0], now[0])
        time.sleep(0.05)
        with lock:
            now[0] -= 1
        return True

    with ThreadPoolExecutor(4) as ex:
        assert pipeline.run_window(ex, job, quota=5, slots=3) == 5  # bounded by the quota
        assert peak[0] == 3  # and by the slots: the queue never grows past them
        assert pipeline.run_window(ex, job, quota=10, slots=3) == 2  # only 2 jobs had work: it ends


def test_the_lease_lets_verifications_share_and_keeps_timing_alone():
    lease = device_lease.DeviceLease("test:0")
    spans, lock = [], threading.Lock()

    def use(phase):
        with lease.hold(phase):
            t0 = time.monotonic()
            time.sleep(0.05)
            with lock:
                spans.append((phase, t0, time.monotonic()))

    threads = [threading.Thread(target=use, args=(p,)) for p in ["verification", "timing"] * 4]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    _assert_timing_alone(spans)
    verif = sorted((a, b) for p, a, b in spans if p == "verification")
    assert any(a2 < b1 for (_, b1), (a2, _) in zip(verif, verif[1:]))  # verifications did share the device
    seconds = lease.seconds()
    assert seconds["timing"] >= 4 * 0.05 and seconds["verification"] > 0
    share = device_lease.shares({}, seconds, wall_s=10.0)
    assert abs(sum(share.values()) - 1.0) < 1e-9


def _assert_timing_alone(spans):
    timings = [(a, b) for p, a, b in spans if p == "timing"]
    for a, b in timings:
        others = [(c, d) for p, c, d in spans if (c, d) != (a, b)]
        assert not any(c < b and a < d for c, d in others), "a timing shared the device"


def test_two_evaluators_on_one_device_never_time_at_once(row_sum):
    spans, lock = [], threading.Lock()

    class Recording(Evaluator):
        def _span(self, phase, run, *args):
            t0 = time.monotonic()
            try:
                return run(*args)
            finally:
                with lock:
                    spans.append((phase, t0, time.monotonic()))

        def _verify(self, first, result):
            return self._span("verification", super()._verify, first, result)

        def _time(self, result):
            return self._span("timing", super()._time, result)

        def _compare_all(self, result, rounds=None, best_so_far=None, only=None):
            return self._span("timing", super()._compare_all, result, rounds, best_so_far, only)

    # the same device twice: two evaluators (two runners) sharing one lease, candidates in flight on both
    store, ref, data = row_sum
    config = SearchConfig(max_tasks=5, max_concurrent=2, chunk_size=5, generators=("tune",), early_stop=False)
    from farm.generators import load_generator

    outcome = search_op(ref, data, SearchContext(store, "two-tune", "cpu", [CPU, CPU], [load_generator("tune")], config,
                                                 EvalOptions(compile_workers=1, base=_settings()),
                                                 evaluator_factory=Recording))
    assert outcome.status == "succeeded"
    assert sum(p == "timing" for p, _, _ in spans) >= 4
    _assert_timing_alone(spans)


def test_fixed_costs_are_paid_once_per_op_and_adopted_by_later_chunks(row_sum):
    store, ref, data = row_sum
    paid = {"seeds": 0, "baselines": 0}

    class Counting(Evaluator):
        def _reference_run(self, which, key, inputs):
            if key.startswith("seed"):
                paid["seeds"] += 1
            return super()._reference_run(which, key, inputs)

        def _time_baseline(self, which, key, base):
            paid["baselines"] += 1
            return super()._time_baseline(which, key, base)

    from farm.generators import load_generator

    config = SearchConfig(max_tasks=4, max_concurrent=1, chunk_size=2, generators=("tune",), early_stop=False)

    def chunk():  # as a distributed worker runs one: a fresh search object, one chunk, the checkpoint
        search = OpSearch(ref, data, SearchContext(store, "fixed", "cpu", [CPU], [load_generator("tune")], config,
                                                   EvalOptions(compile_workers=0, base=_settings()),
                                                   evaluator_factory=Counting))
        search.step(max_chunks=1)
        return search

    first = chunk()
    assert first.fixed_paid and paid["seeds"] > 0 and paid["baselines"] > 0
    assert store.exists("runs/fixed/demo/row_sum/fixed.pt")
    before = dict(paid)
    second = chunk()
    assert not second.fixed_paid and paid == before  # nothing drawn, run or timed again
    assert second.db.submitted == 4 and all(r.verdict != "pending" for r in second.db.records.values())


def _eventually(predicate, limit_s: float = 30) -> bool:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def test_timings_take_turns_in_the_order_they_asked_and_nest_safely():
    lease = device_lease.DeviceLease("test:1")
    order, started, release = [], threading.Event(), threading.Event()

    def hold_verification():
        with lease.hold("verification"):
            started.set()
            release.wait(30)
            with lease.hold("verification"):  # nested: already covered, no deadlock behind the waiting timings
                pass

    def timing(i):
        with lease.hold("timing"):
            order.append(i)

    first = threading.Thread(target=hold_verification)
    first.start()
    assert started.wait(30)
    threads = []
    for i in range(4):
        threads.append(threading.Thread(target=timing, args=(i,)))
        threads[-1].start()
        # asked in order 0, 1, 2, 3 while the verification holds the device: the next starts once this one waits
        assert _eventually(lambda n=i + 1: lease.timings_waiting == n), f"timing {i} never asked"
    release.set()
    for t in [first, *threads]:
        t.join(30)
    assert order == [0, 1, 2, 3]
    with pytest.raises(RuntimeError):
        with lease.hold("verification"):
            with lease.hold("timing"):
                pass


def test_a_batch_searches_several_ops_at_once_on_one_device(tmp_path):
    from farm.generators import load_generator
    from farm.search import ledger
    from farm.search.batch import search_batch

    store = open_store(f"file://{tmp_path / 'store'}")
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    refs = find_tasks(settings, ["demo"], ["row_sum", "vector_add_scale"])
    assert all(r["success"] for r in generate_references(refs, store, CPU, 0, "small", 120))
    events = []
    config = SearchConfig(max_tasks=2, max_concurrent=1, chunk_size=2, generators=("tune",))
    ctx = SearchContext(store, "both", "cpu", [CPU], [load_generator("tune")], config, EvalOptions(compile_workers=0))
    rows = search_batch(refs, ctx, on_op=lambda phase, row: events.append((phase, row["op"])), ops_per_device=2)
    assert [r["op"] for r in rows] == [r.op for r in refs]  # rows in the order of the refs
    assert all(r["status"] == "succeeded" for r in rows)
    assert [p for p, _ in events[:2]] == ["start", "start"]  # the second op began before the first ended
    assert set(ledger.read(store, "both")) == {r.key for r in refs}



def test_an_interrupted_batch_of_parallel_ops_stops_at_their_next_candidate(tmp_path):
    """Ctrl-C and SIGTERM reach the main thread only. Before the fix, the ops searching in worker
    threads ran their whole budgets after an interrupt (found on an H100: a `timeout`-ed batch
    search outlived its SIGTERM by minutes)."""
    import os
    import signal

    from farm.generators import load_generator
    from farm.search import ledger
    from farm.search.batch import search_batch

    store = open_store(f"file://{tmp_path / 'store'}")
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    refs = find_tasks(settings, ["demo"], ["row_sum", "vector_add_scale"])
    assert all(r["success"] for r in generate_references(refs, store, CPU, 0, "small", 120))
    after = []
    interrupted = threading.Event()

    def on_event(kind, info):
        if kind != "candidate":
            return
        if interrupted.is_set():
            after.append(info)
        else:
            interrupted.set()
            os.kill(os.getpid(), signal.SIGINT)

    config = SearchConfig(max_tasks=12, max_concurrent=1, chunk_size=4, generators=("tune",), early_stop=False)
    # Ctrl-C's own handler: a suite started in the background (`cmd &` in a script) inherits
    # SIGINT ignored, and then the signal would never arrive
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with pytest.raises(KeyboardInterrupt):
            search_batch(refs, SearchContext(store, "ctrlc", "cpu", [CPU], [load_generator("tune")], config,
                                             EvalOptions(compile_workers=0), on_event=on_event), ops_per_device=2)
    finally:
        signal.signal(signal.SIGINT, previous)
    assert len(after) <= 2, after  # each running op finishes the candidate it had in hand, no more
    # both marked interrupted, neither done: both resume from their checkpoints
    assert {v["status"] for v in ledger.read(store, "ctrlc").values()} == {"interrupted"}

AUTOTUNED = '''
import torch, triton, triton.language as tl
from farm import targets
from farm.evaluate.runner_child import LaunchLog, install_launch_hook

@triton.autotune(configs=[triton.Config({"BLOCK": 32}), triton.Config({"BLOCK": 64})], key=["n"])
@triton.jit
def double(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

log = LaunchLog(targets.resolve_device("cpu"))
install_launch_hook(log)
x = torch.ones(100)
y = torch.zeros(100)
LaunchLog.compile_only = True
double[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
print("warm", double.configs_timings == {c: [0.0] * 3 for c in double.configs}, float(y.sum()), log.count)
'''


def test_compiling_ahead_an_autotuned_kernel_times_no_config_and_runs_nothing(tmp_path):
    import os
    import subprocess
    import sys

    script = tmp_path / "autotuned.py"
    script.write_text(AUTOTUNED)
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    # every config went through the compile-only path (no benchmark: on the interpreter, with no
    # device driver, Triton's benchmarker would fail), and no kernel ran
    assert "warm True 0.0 0" in out.stdout, out.stdout + out.stderr[-2000:]


def _time_in_another_process(lock_dir, out):
    import os

    os.environ["FARM_LEASE_DIR"] = lock_dir
    lease = device_lease.DeviceLease("gpu:7")
    for _ in range(3):
        with lease.hold("timing"):
            t0 = time.time()
            time.sleep(0.1)
            out.put(("timing", t0, time.time()))


def test_the_lease_keeps_timing_alone_across_the_processes_of_a_host(tmp_path, monkeypatch):
    import multiprocessing as mp

    monkeypatch.setenv("FARM_LEASE_DIR", str(tmp_path))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    other = ctx.Process(target=_time_in_another_process, args=(str(tmp_path), out))
    other.start()
    lease = device_lease.DeviceLease("gpu:7")  # same label, this process: one lock file
    spans = []
    deadline = time.time() + 60
    while other.is_alive() and time.time() < deadline:
        for phase in ("verification", "timing"):
            with lease.hold(phase):
                t0 = time.time()
                time.sleep(0.03)
                spans.append((phase, t0, time.time()))
    other.join(30)
    while not out.empty():
        spans.append(out.get())
    assert sum(1 for s in spans if s[0] == "timing") >= 4
    _assert_timing_alone(spans)
    assert not device_lease.DeviceLease("cpu", host_wide=False).host_wide
