"""Render the GPU corpus results (bench/corpus_gpu.sh output) as the Markdown tables
of bench/results/corpus_h100/NOTES-2026-11-21.md.

usage: python bench/corpus_table.py RESULTS_DIR
"""

import json
import sys
from pathlib import Path


def shapes(row: dict) -> str:
    parts = []
    for shp, dt in zip(row.get("input_shapes") or [], row.get("input_dtypes") or []):
        if shp is not None:
            parts.append(f"{dt.removeprefix('torch.')}[{','.join(map(str, shp))}]")
    return " ".join(parts)


def fmt(v, spec):
    return "-" if v is None else format(v, spec)


def main(folder: Path) -> None:
    env = (folder / "env.txt").read_text().strip().replace("\n", "; ")
    check = json.loads((folder / "check.json").read_text())
    print(f"Device: {env}\n")
    print("| source | op | result | max abs err | inputs | Model ms (median of 5 warm runs, host-timed) |")
    print("|---|---|---|---|---|---|")
    for r in check["results"]:
        status = r["status"] if r["status"] != "error" else f"error ({r['stage']}): {r['error'][:60]}"
        print(f"| {r['source']} | {r['op']} | {status} | {fmt(r.get('max_abs'), '.2e')} "
              f"| {shapes(r)} | {fmt(r.get('model_ms'), '.3f')} |")
    ref_path = folder / "reference.json"
    if ref_path.exists():
        ref = json.loads(ref_path.read_text())
        print("\n| source | op | result | stage | .pt size (MiB) | seconds (child, incl. save) |")
        print("|---|---|---|---|---|---|")
        total = 0
        for r in ref["results"]:
            size = (r.get("size_bytes") or 0) / 2**20
            total += size
            print(f"| {r['source']} | {r['op_name']} | {'ok' if r['success'] else 'failed'} | {r.get('stage')} "
                  f"| {size:.1f} | {fmt(r.get('elapsed_s'), '.2f')} |")
        ok = sum(1 for r in ref["results"] if r["success"])
        print(f"\n{ok}/{len(ref['results'])} ok, {total:.1f} MiB in all.")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
