"""Peak client memory of put_file / get_file for a large object, file:// and s3://.

Each measurement runs in a fresh child process that imports the store and builds its client,
notes its resident memory (the baseline), lowers the kernel's peak-RSS mark to it
(/proc/self/clear_refs), performs one operation, and reads the peak again: the difference
is what the transfer cost. The s3:// store talks to a moto server in a subprocess on a free port
(moto is a Python server: its throughput says nothing about real S3, only the client's
memory matters here).

    python bench/storage_memory.py [--size-mib 1024] [--repeat 3] [--out bench/results/storage_memory.json]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
MIB = 1024 * 1024
WRITE_CHUNK = 8 * MIB


def ru_maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def _status_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024  # kB
    raise RuntimeError(f"no {field} in /proc/self/status")


def peak_rss_mib() -> float:
    """This process's own peak RSS (VmHWM). ru_maxrss is the same mark, except that the
    kernel also folds in the peak of the memory image replaced by exec: a child started by
    fork/vfork + exec inherits its parent's peak there, and clear_refs cannot lower it."""
    return _status_mib("VmHWM")


def reset_peak() -> bool:
    """Lower the peak-RSS mark to the current RSS (Linux >= 4.0), so that the peak after the
    transfer is the transfer's own, not the import's; False where the kernel refuses."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def current_rss_mib() -> float:
    """Resident memory now (the peak so far may be higher: imports allocate and free)."""
    return _status_mib("VmRSS")


# ---------------------------------------------------------------- child: one operation


def child(op: str, url: str, endpoint: str | None, key: str, path: str) -> dict:
    from farm.config import Settings
    from farm.storage import open_store
    from farm.storage import s3 as _s3  # noqa: F401  (boto3 loaded before the baseline)

    settings = Settings()
    settings.s3.endpoint_url = endpoint
    settings.s3.access_key_id, settings.s3.secret_access_key = "bench", "bench"
    settings.s3.region = "us-east-1"
    store = open_store(url, settings)
    store.head("warm-up")  # build the client and its connection pool before the baseline
    baseline_peak = peak_rss_mib()
    reset = reset_peak()
    baseline = current_rss_mib()
    start = time.perf_counter()
    info = store.put_file(key, Path(path)) if op == "put" else store.get_file(key, Path(path))
    seconds = time.perf_counter() - start
    return {
        "baseline_mib": baseline,
        "baseline_peak_mib": baseline_peak,
        "peak_mib": peak_rss_mib(),
        "ru_maxrss_mib": ru_maxrss_mib(),
        "peak_reset": reset,
        "seconds": seconds,
        "sha256": info.sha256,
    }


def run_child(op: str, url: str, endpoint: str | None, key: str, path: Path, env: dict) -> dict:
    cmd = [sys.executable, __file__, "--child", op, url, endpoint or "", key, str(path)]
    env = dict(os.environ, PYTHONPATH=str(REPO), **env)
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


# ---------------------------------------------------------------- parent: the benchmark


def make_file(path: Path, size: int) -> str:
    """Random bytes written chunk by chunk, never the whole file in memory; returns its sha256."""
    h = hashlib.sha256()
    with open(path, "wb") as f:
        left = size
        while left:
            chunk = os.urandom(min(WRITE_CHUNK, left))
            h.update(chunk)
            f.write(chunk)
            left -= len(chunk)
    return h.hexdigest()


def measure(
    backend: str, url: str, endpoint: str | None, src: Path, sha: str, work: Path, repeat: int, env: dict | None = None
) -> list[dict]:
    """One row per operation: the worst of `repeat` fresh-process runs, with every run's figures."""
    rows = []
    key = "refs/bench/large.pt"
    dest = work / f"{backend}-download.pt"
    size = src.stat().st_size
    for op, path in (("put", src), ("get", dest)):
        runs = []
        for _ in range(repeat):
            result = run_child(op, url, endpoint, key, path, env or {})
            if result["sha256"] != sha:
                raise SystemExit(f"{backend} {op}: sha256 mismatch")
            runs.append(result)
            dest.unlink(missing_ok=True)
        rows.append(_row(backend, op, size, runs) | {"env": env or {}})
    return rows


def _row(backend: str, op: str, size: int, runs: list[dict]) -> dict:
    deltas = [r["peak_mib"] - r["baseline_mib"] for r in runs]
    worst = runs[deltas.index(max(deltas))]
    seconds = sorted(r["seconds"] for r in runs)[len(runs) // 2]  # median
    return {
        "backend": backend,
        "op": op,
        "size_mib": size / MIB,
        "runs": len(runs),
        "baseline_rss_mib": round(worst["baseline_mib"], 1),
        "baseline_peak_rss_mib": round(worst["baseline_peak_mib"], 1),
        "peak_rss_mib": round(worst["peak_mib"], 1),
        "delta_mib": round(max(deltas), 1),
        "delta_mib_runs": [round(d, 1) for d in deltas],
        "peak_reset_before_transfer": all(r["peak_reset"] for r in runs),
        "ru_maxrss_mib": round(worst["ru_maxrss_mib"], 1),
        "seconds": round(seconds, 2),
        "seconds_runs": [round(r["seconds"], 2) for r in runs],
        "mib_per_s": round(size / MIB / seconds, 1),
    }


def table(rows: list[dict]) -> str:
    head = (
        f"{'store':6} {'op':4} {'size MiB':>9} {'baseline MiB':>13} {'peak MiB':>9} {'delta MiB':>10} "
        f"{'delta range':>13} {'s':>7} {'MiB/s':>7}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        spread = f"{min(r['delta_mib_runs']):.0f}-{max(r['delta_mib_runs']):.0f}"
        lines.append(
            f"{r['backend']:6} {r['op']:4} {r['size_mib']:>9.0f} {r['baseline_rss_mib']:>13.1f} "
            f"{r['peak_rss_mib']:>9.1f} {r['delta_mib']:>10.1f} {spread:>13} {r['seconds']:>7.2f} {r['mib_per_s']:>7.1f}"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=3, help="fresh-process runs per operation")
    parser.add_argument("--out", default=str(REPO / "bench" / "results" / "storage_memory.json"))
    args = parser.parse_args()

    sys.path.insert(0, str(REPO))
    from farm.config import S3Settings
    from tests.s3_server import MotoServer

    with tempfile.TemporaryDirectory(prefix="farm-bench-") as tmp, MotoServer() as server:
        work = Path(tmp)
        src = work / "source.pt"
        sha = make_file(src, args.size_mib * MIB)
        bucket = server.new_bucket()
        rows = measure("file", f"file://{work / 'store'}", None, src, sha, work, args.repeat)
        rows += measure("s3", f"s3://{bucket}/bench", server.endpoint, src, sha, work, args.repeat)
        # boto3 moves data on ~10 threads; glibc gives each its own malloc arena and keeps
        # freed blocks there, which shows as RSS. Two arenas show what the transfer itself holds.
        arenas = {"MALLOC_ARENA_MAX": "2"}
        rows += measure("s3 *", f"s3://{bucket}/bench2", server.endpoint, src, sha, work, args.repeat, arenas)

    s3 = S3Settings()
    options = [f"--size-mib {args.size_mib}"] if args.size_mib != 1024 else []
    options += [f"--repeat {args.repeat}"] if args.repeat != 3 else []
    result = {
        "command": " ".join(["python bench/storage_memory.py", *options]),
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPUs",
        "s3_transfer": {
            "multipart_threshold_mib": s3.multipart_threshold_mb,
            "multipart_chunksize_mib": s3.multipart_chunksize_mb,
            "max_concurrency": "boto3 default (10)",
        },
        "store_read_chunk_mib": 8,
        "columns": {
            "baseline_rss_mib": "resident memory after imports and client set-up, before the transfer",
            "baseline_peak_rss_mib": "VmHWM at that moment, before it is lowered (imports peak above what stays resident)",
            "peak_rss_mib": "VmHWM after the transfer; the mark is first lowered to the baseline "
            "through /proc/self/clear_refs when peak_reset_before_transfer",
            "ru_maxrss_mib": "getrusage ru_maxrss after the transfer: max(VmHWM, the parent's peak at exec)",
            "delta_mib": "peak_rss_mib - baseline_rss_mib: what the transfer added at most (worst run)",
            "delta_mib_runs": "the same for every run, each in a fresh process",
            "seconds": "the put_file/get_file call, sha256 pass included (median run)",
        },
        "rows": rows,
        "notes": "'s3 *' rows ran with MALLOC_ARENA_MAX=2: the default glibc allocator keeps freed "
        "blocks in one arena per transfer thread, which inflates (and scatters) the default rows' peaks.",
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(table(rows))
    print("s3 *: the same with MALLOC_ARENA_MAX=2 in the client's environment")
    print(f"written to {out}")


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        op, url, endpoint, key, path = sys.argv[2:7]
        print(json.dumps(child(op, url, endpoint or None, key, path)))
    else:
        main()
