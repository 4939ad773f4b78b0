"""Summarise bench/akg_corpus_gpu.sh: how many of AKG's files load, produce reference data,
and get a passing kernel; per op its mode, reference result and best search result.

usage: python bench/akg_corpus_table.py RESULTS_DIR [STORE_DIR]
With STORE_DIR (the farm store the run used) the search reports are read from it and
RESULTS_DIR/search.json is written; without it, RESULTS_DIR/search.json is read.
"""

import json
import sys
from collections import Counter
from pathlib import Path


def searched(store: Path) -> dict:
    """Every op's report.json of run 'akg' (a search stopped mid-op has none: not counted)."""
    rows = {}
    for report in sorted((store / "runs" / "akg").glob("*/*/report.json")):
        r = json.loads(report.read_text())
        best = r.get("best") or {}
        rows[f"{r['source']}/{r['op']}"] = {
            "status": r.get("status"), "submitted": r.get("submitted"), "passed": r.get("passed"),
            "best_generator": best.get("generator"), "speedup_vs_model": best.get("speedup_vs_model"),
            "verified": r.get("verified", {}).get("by"), "sets": r.get("verified", {}).get("sets")}
    return rows


def main(folder: Path, store: Path | None) -> None:
    listed = json.loads((folder / "list.json").read_text())
    ref = {f"{r['source']}/{r['op_name']}": r for r in json.loads((folder / "reference.json").read_text())["results"]}
    if store is not None:
        search = searched(store)
        (folder / "search.json").write_text(json.dumps(search, indent=1))
    else:
        search = json.loads((folder / "search.json").read_text()) if (folder / "search.json").exists() else {}
    akg = [r for r in listed if r.get("origin") == "akg"]
    usable = [r for r in akg if r["status"] == "ok"]
    modes = Counter(r.get("mode") for r in usable)
    made = [k for k in (f"{r['source']}/{r['op']}" for r in usable) if ref.get(k, {}).get("success")]
    passing = [k for k, v in search.items() if (v.get("passed") or 0) > 0]
    print(f"Device: {(folder / 'env.txt').read_text().strip().replace(chr(10), '; ')}\n")
    print("| files listed | usable | Reference / reference-data / Model modes | reference data | searched | "
          "passing kernel |")
    print("|---|---|---|---|---|---|")
    print(f"| {len(akg)} | {len(usable)} | {modes['reference']} / {modes['reference-data']} / {modes['model']} | "
          f"{len(made)} | {len(search)} | {len(passing)} |\n")
    print("| source | op | status | mode | reference data | secret sets | search | passed/tried | best "
          "generator | vs Model |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in akg:
        k = f"{r['source']}/{r['op']}"
        rf, s = ref.get(k, {}), search.get(k, {})
        refcol = "ok" if rf.get("success") else (f"failed ({rf.get('stage')})" if rf else "-")
        sp = s.get("speedup_vs_model")
        print(f"| {r['source']} | {r['op']} | {r['status']} | {r.get('mode', '-')} | {refcol} | "
              f"{rf.get('seed_sets') or '-'} | {s.get('status', '-')} | {s.get('passed', '-')}/{s.get('submitted', '-')}"
              f" | {s.get('best_generator') or '-'} | {'-' if sp is None else f'{sp:.2f}x'} |")
    failed = [(k, v) for k, v in ref.items() if not v.get("success")]
    if failed:
        print("\nReference failures:\n")
        for k, v in failed:
            print(f"- {k} ({v.get('stage')}): {(v.get('error') or '').strip().splitlines()[-1][:200]}")
    invalid = [r for r in akg if r["status"] != "ok"]
    if invalid:
        print("\nInvalid files:\n")
        for r in invalid:
            print(f"- {r['source']}/{r['op']}: {r['error'].split(': ', 1)[-1][:200]}")


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]) if len(sys.argv) > 2 else None)
