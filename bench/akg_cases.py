"""Kernels verified and timed over the cases of each op's shape space (issue 32): `farm run`
(reference data with its .cases, then a search) per op of a task corpus, then a per-op
per-case table.

usage (device machine, repo root):
    python bench/akg_cases.py --corpus /path/to/akg/thirdparty --ops all --target cuda \\
        --budget-s 3000 --out results_dir
    python bench/akg_cases.py --target cpu --max-tasks 2 --ops demo/row_sum --out /tmp/cases   # quick, CPU

--corpus: an AKG checkout, its akg_agents/ or its thirdparty/ folder (corpus.akg_root); without
it, the bundled tasks/. --ops: `all`, or a comma list of source/op (a bare source takes all its
ops). Each op is one `farm run` in a child process (so this script imports no torch, celery,
redis or boto3), stopped at what is left of --budget-s; an op not reached is listed as such.

Writes under --out: env.txt, cases.jsonl (one line per op: status, the cases verified with
their values and labels, whether 1 and a non-power-of-two are among them, the per-case timing
rows {case, label, shape, time_ms, model_ms, speedup}, the geomean, the slower cases, the
promotion), summary.md (the same as a table), and logs/<source>__<op>.log.

The figures are the re-timing's before promotion where there is one (a GPU), else the best
candidate's (cpu: the interpreter's timings rank nothing, and its mix is the benchmark case
alone unless --timed-cases says otherwise).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
RUN = "akg-cases"


def farm(args: list[str], env: dict, timeout: float, log: Path | TextIO) -> subprocess.CompletedProcess:
    """`farm ARGS`, its stderr appended to `log` (a file, or this script's stderr)."""
    cmd = [sys.executable, "-m", "farm", *args]
    with open(log, "a") if isinstance(log, Path) else contextlib.nullcontext(log) as sink:
        sink.write(f"$ {' '.join(cmd)}\n")
        sink.flush()
        try:
            return subprocess.run(cmd, env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=sink, text=True,
                                  timeout=max(1.0, timeout), check=False)
        except subprocess.TimeoutExpired:
            return subprocess.CompletedProcess(cmd, 124, "", "")


def listed_ops(env: dict, wanted: str, akg: bool) -> list[tuple[str, str]]:
    names = [w.strip() for w in wanted.split(",") if w.strip()]
    if wanted != "all" and all("/" in n for n in names):
        # named ops need no listing: loading every file of AKG's corpus in children took most of
        # a 9-minute budget on an H100 host; `farm run` names an op that does not exist itself
        return [(n.partition("/")[0], n.partition("/")[2]) for n in dict.fromkeys(names)]
    sources = sorted({n.partition("/")[0] for n in names}) if wanted != "all" else []
    proc = farm(["ops", "list", "--json", *[x for s in sources for x in ("--source", s)]], env, 600, sys.stderr)
    try:  # exit 1 with a table: some files of the corpus are invalid (their rows say why); the rest run
        listed = json.loads(proc.stdout)
    except ValueError:
        sys.exit(f"error: `farm ops list` failed (exit {proc.returncode}); see its message above")
    rows = [r for r in listed if r.get("status") == "ok" and (not akg or r.get("origin") == "akg")]
    every = [(r["source"], r["op"]) for r in rows]
    if wanted == "all":
        return every
    out = []
    for name in names:
        source, _, op = name.partition("/")
        found = [(s, o) for s, o in every if s == source and (not op or o == op)]
        if not found:
            sys.exit(f"error: --ops: {name} is not an op of the corpus (see `farm ops list`)")
        out += [f for f in found if f not in out]
    return out


def case_values(store: Path, source: str, op: str) -> list[dict]:
    """The recorded cases of an op (refs/<source>/<op>.cases): values, dtype, label."""
    path = store / "refs" / source / f"{op}.cases"
    if not path.is_file():
        return []
    import torch  # only here: the table needs the companion's case list

    doc = torch.load(path, weights_only=True, map_location="cpu")
    return [c.get("case", {}) for c in doc.get("cases", [])]


def _odd(n: int) -> bool:
    return n > 2 and n & (n - 1) != 0


def op_row(store: Path, source: str, op: str, status: str, seconds: float) -> dict:
    row = {"op": f"{source}/{op}", "status": status, "seconds": round(seconds, 1)}
    report_path = store / "runs" / RUN / source / op / "report.json"
    cases = case_values(store, source, op)
    values = [v for c in cases for v in (c.get("values") or {}).values()]
    row.update(cases_recorded=len(cases), case_values=[{**(c.get("values") or {}), "dtype": c.get("dtype"),
                                                        "label": c.get("label")} for c in cases],
               has_one=1 in values, has_non_pow2=any(_odd(int(v)) for v in values))
    if not report_path.is_file():
        return row
    report = json.loads(report_path.read_text())
    verified = report.get("verified") or {}
    confirmation = report.get("confirmation") or {}
    best = report.get("best") or {}
    timing = confirmation.get("timing") if confirmation.get("time_ms") is not None else best.get("timing")
    rows = (timing or {}).get("cases") or []
    mix = (confirmation.get("mix") if confirmation.get("time_ms") is not None else (best.get("comparison") or {}).get("mix"))
    speeds = [r["speedup"] for r in rows if r.get("speedup")]
    geomean = mix["ratio"] if mix else (math.exp(sum(map(math.log, speeds)) / len(speeds)) if speeds else None)
    row.update(search=report.get("status"), submitted=report.get("submitted"), passed=report.get("passed"),
               cases_verified=verified.get("cases", 0), case_labels=verified.get("case_labels", []),
               timed=[{k: r.get(k) for k in ("case", "label", "shape", "time_ms", "model_ms", "speedup")} for r in rows],
               geomean=geomean, slower=[r["label"] for r in rows if r.get("speedup") is not None and r["speedup"] < 1],
               figures_from="re-timing" if confirmation.get("time_ms") is not None else "search",
               promotion=(report.get("promotion") or {}).get("reason"))
    return row


def _fmt(x, spec=".3f") -> str:
    return "-" if x is None else format(x, spec)


def summary(rows: list[dict], env_text: str) -> str:
    lines = [f"Environment: {env_text}", "",
             "| op | status | cases verified | 1 / non-pow2 | per-case speedups (label: x) | geomean | slower |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        per_case = ", ".join(f"{t['label']}: {_fmt(t['speedup'], '.2f')}" for t in r.get("timed", [])) or "-"
        flags = f"{'yes' if r['has_one'] else 'no'} / {'yes' if r['has_non_pow2'] else 'no'}"
        lines.append(f"| {r['op']} | {r.get('search') or r['status']} | {r.get('cases_verified', '-')} of "
                     f"{r['cases_recorded']} | {flags} | {per_case} | {_fmt(r.get('geomean'))} | "
                     f"{', '.join(r.get('slower', [])) or '-'} |")
    passing = [r for r in rows if r.get("passed")]
    good = [r for r in passing if r.get("cases_verified", 0) >= 6 and r["has_one"] and r["has_non_pow2"]]
    lines += ["", (f"{len(passing)} of {len(rows)} ops have a passing kernel; {len(good)} of them verified at 6 or "
                   "more cases including 1 and a non-power-of-two.")]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--corpus", help="AKG checkout or its thirdparty/ folder [the bundled tasks/]")
    p.add_argument("--ops", default="all", help="all, or comma-separated source/op (or source)")
    p.add_argument("--target", default="cuda", choices=("cuda", "cpu", "ascend"))
    p.add_argument("--device", default="0", help="device index (cuda/ascend)")
    p.add_argument("--budget-s", type=float, default=3600.0, help="seconds for the whole run")
    p.add_argument("--max-tasks", type=int, default=8, help="candidates per op (farm run --max-tasks)")
    p.add_argument("--max-ops", type=int, default=0, help="at most this many ops (0: every one listed)")
    p.add_argument("--cases", type=int, default=None, help="cases recorded per op (reference.cases) [6; 2 on cpu]")
    p.add_argument("--timed-cases", default=None, help="evaluator.timed_cases [auto]")
    p.add_argument("--generators", default=None, help="farm run --generators [its default]")
    p.add_argument("--store", default=None, help="store folder to use/keep [a temporary one]")
    p.add_argument("--verbose", action="store_true", help="farm -v: each op's debug log in logs/")
    p.add_argument("--out", required=True, help="folder for cases.jsonl, summary.md, logs/")
    a = p.parse_args(argv)
    start = time.monotonic()
    out = Path(a.out)
    (out / "logs").mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="akg-cases-"))
    store = Path(a.store).resolve() if a.store else work / "store"
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}".rstrip(os.pathsep),
           "PYTHONUNBUFFERED": "1", "FARM_STORE": f"file://{store}"}
    if a.corpus:
        (work / "farm.yaml").write_text(f"corpus:\n  akg_root: {json.dumps(str(Path(a.corpus).resolve()))}\n")
        env["FARM_CONFIG"] = str(work / "farm.yaml")
    if a.target != "cpu":  # the farm reads the mask where a device is named (farm.targets.through_mask)
        env["CUDA_VISIBLE_DEVICES" if a.target == "cuda" else "ASCEND_RT_VISIBLE_DEVICES"] = a.device
    sets = [f"reference.cases={a.cases}"] * (a.cases is not None) + [f"evaluator.timed_cases={a.timed_cases}"] * bool(a.timed_cases)
    ops = listed_ops(env, a.ops, bool(a.corpus))
    if a.max_ops:
        ops = ops[:a.max_ops]
    probe = "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
    versions = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=False).stdout.strip()
    env_text = (f"{versions or 'torch/triton not importable'}; target {a.target}; corpus {a.corpus or 'bundled tasks/'}; "
                f"{len(ops)} ops; max_tasks {a.max_tasks}; budget {a.budget_s:g} s; {' '.join(sets) or 'default cases'}")
    (out / "env.txt").write_text(env_text + "\n")
    rows = []
    with open(out / "cases.jsonl", "w") as jsonl:
        for source, op in ops:
            left = a.budget_s - (time.monotonic() - start)
            began = time.monotonic()
            if left <= 5:
                status = "not reached (budget)"
            else:
                args = ["-v"] * a.verbose + [x for s in sets for x in ("--set", s)] + [
                    "run", "--ops", f"{source}/{op}", "--target", a.target, "--max-tasks", str(a.max_tasks),
                    "--run", RUN, "--json"] + (["--generators", a.generators] if a.generators else [])
                proc = farm(args, env, left, out / "logs" / f"{source}__{op}.log")
                status = {0: "ok", 124: "stopped (budget)"}.get(proc.returncode, f"exit {proc.returncode}")
            row = op_row(store, source, op, status, time.monotonic() - began)
            rows.append(row)
            jsonl.write(json.dumps(row) + "\n")
            jsonl.flush()
            print(f"{row['op']}: {row.get('search') or status}, {row.get('cases_verified', 0)} cases verified, "
                  f"geomean {_fmt(row.get('geomean'))}", flush=True)
    (out / "summary.md").write_text(summary(rows, env_text))
    print(summary(rows, env_text))
    return 0


if __name__ == "__main__":
    sys.exit(main())
