"""Reference data for a whole KernelBench level, the way a user makes it: `farm reference --jobs N`
over the level's folder pointed at through `corpus.sources`, on one device.

    python bench/kernelbench_reference.py --level .kb/level1 --jobs 8 --out bench/results/kb_reference_h100
    python bench/kernelbench_reference.py --level /work/ext/kb/KernelBench/level1 --ops 19_ReLU,23_Softmax \
        --device cpu --shapes small --out /tmp/kbref        # the CPU check at small shapes

Writes <out>/reference.json (the command, the device, the wall time, and per op: result, seconds
in its child, bytes written (.pt and its .cases companion), whether it was drawn on the device and
whether it is compact) and <out>/reference.md (the table docs/corpus.md quotes). The per-op figures
come from the store's refs/manifest.json, which the farm updates as each op ends, so a call cut off
at its wall limit (no --json summary) still records every op it finished. The store is
<out>/store unless --store is given; a second call resumes (current ops are skipped, and the
JSON keeps the first call's figures for them), so a level fits calls of a few minutes each.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))

from benchinfo import commit


def _farm(args: list[str], env: dict, timeout: float, log: Path) -> tuple[int, str, float]:
    """The farm command, its stderr (progress, one line per op) kept in `log` as it goes; at the
    wall limit it gets SIGINT (it stops as on Ctrl-C) and 20 s later SIGKILL."""
    t0 = time.time()
    with log.open("a") as err:
        proc = subprocess.Popen([sys.executable, "-m", "farm", *args], cwd=REPO, env=env, stdout=subprocess.PIPE,
                                stderr=err, text=True)
        try:
            text, _ = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                text, _ = proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                text, _ = proc.communicate()
            return 124, text or "", time.time() - t0
    return proc.returncode, text or "", time.time() - t0


def _stored_ops(store: Path, source: str) -> dict[str, float]:
    """op -> the time its .pt was written: what a call cut off at its wall limit did make."""
    return {p.stem: p.stat().st_mtime for p in (store / "refs" / source).glob("*.pt")}


def _bytes(store: Path, source: str, op: str) -> int:
    return sum(p.stat().st_size for p in (store / "refs" / source / f"{op}.pt", store / "refs" / source / f"{op}.cases")
               if p.exists())


def _manifest_entries(store: Path, source: str) -> dict[str, dict]:
    """op -> its entry in the store's refs/manifest.json, which `farm reference` updates as each
    op ends, so a call cut off before its --json summary still says what every finished op took."""
    try:
        doc = json.loads((store / "refs" / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}
    return {e["op_name"]: e for e in (doc.get("entries") or {}).values()
            if isinstance(e, dict) and e.get("source") == source and "op_name" in e}


def _made_in_call(store: Path, source: str, started: float) -> dict[str, dict]:
    """The rows of the ops this call made or failed (their manifest entries were created after
    it started; ops it was stopped in the middle of are left out)."""
    rows = {}
    for name, e in _manifest_entries(store, source).items():
        try:
            created = datetime.fromisoformat(e.get("created_at") or "").timestamp()
        except ValueError:
            continue
        if created >= int(started) and not e.get("interrupted"):
            rows[name] = _op_row(e, store, source)
    return rows


def _op_row(e: dict, store: Path, source: str) -> dict:
    """One op's row from its manifest entry (or the --json result, which has the same fields)."""
    return {"ok": bool(e.get("success")), "seconds": e.get("elapsed_s"), "bytes": _bytes(store, source, e["op_name"]),
            "drawn_on": e.get("inputs_drawn_on"), "compact": bool(e.get("compact")),
            "error": (e.get("error") or "").splitlines()[-1:] or None}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--level", required=True, help="a KernelBench level folder (level1, level2, ...)")
    ap.add_argument("--out", required=True)
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--device", default="cuda:0")
    ap.add_argument("--shapes", default="bench")
    ap.add_argument("--ops", default=None, help="comma-separated op names (file stems); default: every file")
    ap.add_argument("--ship-max-mb", type=float, default=256.0)
    ap.add_argument("--cases", type=int, default=-1, help="reference.cases (-1: the farm's default)")
    ap.add_argument("--store", default=None)
    ap.add_argument("--timeout-s", type=float, default=560.0, help="this call's wall limit (the farm command's)")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    level = Path(args.level).resolve()
    source = level.name.replace("level", "kb")
    store = Path(args.store) if args.store else out / "store"
    home = out / "home"
    home.mkdir(exist_ok=True)
    config = out / "farm.yaml"
    config.write_text(f"store: file://{store}\ncorpus:\n  sources: {{{source}: {level}}}\n"
                      f"reference:\n  jobs: {args.jobs}\n  cases: {args.cases}\n  ship_max_mb: {args.ship_max_mb}\n"
                      "  timeout_s: 600\n")
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(REPO)}
    cmd = ["-c", str(config), "reference", "--source", source, "--device", args.device, "--shapes", args.shapes,
           "--json"] + [x for op in (args.ops.split(",") if args.ops else []) for x in ("--ops", op.strip())]
    started = time.time()
    code, text, wall = _farm(cmd, env, args.timeout_s, out / "farm-reference.log")
    try:
        doc = json.loads(text[text.index("{"):text.rindex("}") + 1]) if "{" in text else {}
    except ValueError:
        doc = {}
    results = doc.get("results", [])
    report_path = out / "reference.json"
    previous = json.loads(report_path.read_text()) if report_path.exists() else {"calls": [], "ops": {}}
    ops = previous["ops"]
    made = _made_in_call(store, source, started)
    for r in results:  # the summary of a call that ended: its skipped ops, and any op the manifest lacks
        name = r["op_name"]
        if (r.get("skipped") and name in ops) or name in made:
            continue  # made by an earlier call: its figures stay; made now: the manifest's below
        made[name] = _op_row(r, store, source)
    for name, written in _stored_ops(store, source).items():
        if name in made and written >= started:
            made[name]["written_after_s"] = round(written - started, 1)
    ops.update(made)
    previous["calls"].append({"command": "python " + " ".join(sys.argv), "farm": "farm " + " ".join(cmd),
                              "exit": code, "wall_s": round(wall, 1), "ops_in_call": len(made),
                              "device": doc.get("device") or args.device, "commit": commit()})
    if code not in (0, 1):
        previous["calls"][-1]["tail"] = text[-2000:]
    report_path.write_text(json.dumps(previous, indent=1))
    _table(previous, out / "reference.md")
    ok = sum(1 for o in ops.values() if o["ok"])
    print(json.dumps({"exit": code, "wall_s": round(wall, 1), "ok": ok, "ops": len(ops),
                      "bytes": sum(o["bytes"] for o in ops.values())}))


def _table(doc: dict, path: Path) -> None:
    ops = doc["ops"]
    walls = sum(c["wall_s"] for c in doc["calls"])
    lines = [f"{sum(1 for o in ops.values() if o['ok'])}/{len(ops)} ok in {walls:.0f} s over {len(doc['calls'])} call(s); "
             f"{sum(o['bytes'] for o in ops.values()) / 2**30:.2f} GiB written", "",
             "| op | result | seconds | MiB written | drawn on | compact |", "|---|---|---|---|---|---|"]
    for name in sorted(ops, key=lambda n: (int(n.split("_")[0]) if n.split("_")[0].isdigit() else 0, n)):
        o = ops[name]
        result = "ok" if o["ok"] else f"failed: {(o.get('error') or [''])[0][:80]}"
        secs = f"{o['seconds']:.1f}" if o.get("seconds") is not None else "-"
        lines.append(f"| {name} | {result} | {secs} | {o['bytes'] / 2**20:.1f} | {o.get('drawn_on') or '-'} | "
                     f"{'yes' if o['compact'] else 'no'} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
