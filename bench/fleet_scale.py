"""What the control side costs at fleet scale: `farm submit` and `farm status` of one run of N
ops (10,000 by default), and the exporter's refresh and scrape of it, against a real Redis
started here and a file store in a temporary folder. No worker runs: the ops are made to look
half-way (statuses written as workers write them) before status and the exporter are timed.

Each command runs as a user runs it, `python -m farm ...` in a fresh process, so start-up is in
the figure. The source is N copies of tasks/demo/row_sum.py in a folder of its own.

    python bench/fleet_scale.py [--ops 10000] [--out bench/results/fleet_scale.json]
    PYTHONPATH=/path/to/other/tree python bench/fleet_scale.py ...   # the same for another tree
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.redis_server import RedisServer  # noqa: E402


def farm(env: dict, *args: str) -> tuple[dict, subprocess.CompletedProcess]:
    """Wall time and CPU time (user + system, the command and its children): on a shared machine
    the CPU time is the steadier figure."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "farm", *args], env=env, capture_output=True, text=True, timeout=1800)
    took = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"farm {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall_s": round(took, 2), "cpu_s": round(cpu, 2)}, done


def make_source(folder: Path, n: int) -> None:
    folder.mkdir(parents=True)
    text = (REPO / "tasks" / "demo" / "row_sum.py").read_text()
    for i in range(n):
        (folder / f"op{i:05d}.py").write_text(text)


def half_way(store_url: str, run: str, n: int) -> None:
    """Statuses as the workers leave them: a third done, a third searching, a third queued."""
    from farm.distributed.runs import update_op
    from farm.storage import open_store

    store = open_store(store_url)

    def one(i: int) -> None:
        op = f"op{i:05d}"
        if i % 3 == 0:
            update_op(store, run, "big", op, phase="done", tried=8, passed=3, best_speedup=1.2,
                      verdicts={"pass": 3, "mismatch": 5})
        elif i % 3 == 1:
            update_op(store, run, "big", op, phase="searching", chunk=1, tried=4, passed=1, best_speedup=1.1,
                      worker="bench@host", verdicts={"pass": 1, "mismatch": 3})

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, range(n)))


def exporter(env: dict, store_url: str) -> dict:
    """One store refresh (all runs read), a second one (nothing changed), and a scrape."""
    code = f"""
import json, time
from farm.config import load_settings
from farm.distributed.exporter import FarmCollector, registry
from farm.storage import open_store
s = load_settings()[0]
st = open_store({store_url!r})
c = FarmCollector(s, st)
if not hasattr(c, "refresh"):  # a tree whose scrape reads the store itself: time one scrape
    from prometheus_client import generate_latest
    t = time.monotonic(); body = generate_latest(registry(s, st)); scrape = time.monotonic() - t
    print(json.dumps({{"scrape_reads_the_store_s": round(scrape, 2), "scrape_bytes": len(body)}}))
    raise SystemExit
t = time.monotonic(); c.refresh("store"); first = time.monotonic() - t
t = time.monotonic(); c.refresh("store"); again = time.monotonic() - t
t = time.monotonic(); body = c.render(); scrape = time.monotonic() - t
print(json.dumps({{"refresh_s": round(first, 2), "refresh_unchanged_s": round(again, 3),
                  "scrape_s": round(scrape, 4), "scrape_bytes": len(body), "errors": c.errors}}))
"""
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=1800)
    if done.returncode:  # a tree without the cached exporter
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=10_000)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="farm-fleet-"))
    redis = RedisServer().start()
    try:
        make_source(tmp / "big", args.ops)
        (tmp / "farm.yaml").write_text(f"corpus:\n  sources:\n    big: {tmp / 'big'}\n")
        store_url = f"file://{tmp / 'store'}"
        env = {**os.environ, "HOME": str(tmp), "FARM_CONFIG": str(tmp / "farm.yaml"), "FARM_STORE": store_url,
               "FARM_QUEUE_BROKER_URL": redis.url()}
        results: dict = {"ops": args.ops, "python": platform.python_version(), "machine": platform.machine(),
                         "cpus": os.cpu_count(), "load_1m": os.getloadavg()[0],
                         "tree": os.environ.get("PYTHONPATH") or str(REPO)}
        results["version"], _ = farm(env, "--version")
        results["submit"], done = farm(env, "submit", "--source", "big", "--target", "cpu", "--max-tasks", "8",
                                         "--run", "big", "--generators", "tune")
        results["queued_messages"] = redis.client().llen("reference.cpu")
        results["status_all_queued"], _ = farm(env, "status", "big")
        half_way(store_url, "big", args.ops)
        results["status"], done = farm(env, "status", "big")
        results["status_table_lines"] = len(done.stdout.splitlines())
        results["status_json"], _ = farm(env, "status", "big", "--json")
        results["exporter"] = exporter(env, store_url)
    finally:
        redis.cleanup()
        shutil.rmtree(tmp, ignore_errors=True)
    text = json.dumps(results, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
