"""Merge the perf JSONs of bench/search_gpu.py and print the Markdown table
of bench/results/perf_h100/NOTES-2026-11-21.md.

usage: python bench/perf_table.py bench/results/perf_h100/*.json
Later files win for the same task (re-runs after evaluator fixes).
"""

import json
import sys

LARGE = 64 * 2**20  # bytes: a "large" memory-bound task
INDEX_LIKE = ("index", "cache")  # traffic is not the whole input: bandwidth means nothing


def fmt(v, spec=".3f"):
    return "-" if v is None else format(v, spec)


def main(paths):
    rows, copy_bw = {}, None
    for p in paths:
        doc = json.load(open(p))
        copy_bw = doc.get("copy_bw_bytes_s", copy_bw)
        for r in doc["rows"]:
            if r.get("status") == "succeeded" or r["task"] not in rows:
                rows[r["task"]] = r
    print(f"Copy bandwidth (device-to-device, read + write): {copy_bw / 1e12:.2f} TB/s\n")
    print("| task | result | tried | best ms | Model ms | Reference ms | compile ms | vs Model | vs Reference | vs compile | BW fraction |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    beat, total, bw_ok, bw_total = 0, 0, 0, 0
    for task in sorted(rows):
        r = rows[task]
        best = r.get("best_time_ms")
        base = r.get("baseline", {})
        model, ref, comp = base.get("model_ms"), base.get("reference_ms"), r.get("compile_ms")
        vs = lambda b, best=best: b / best if (b and best) else None  # noqa: E731
        bw = r.get("bandwidth_fraction")
        tags_ok = r.get("memory_bound") and not any(t in task for t in ("kv_indices", "reshape_and_cache", "compute_position"))
        show_bw = bw if tags_ok else None
        if best and comp:
            total += 1
            beat += comp > best
        if tags_ok and r.get("bytes", 0) >= LARGE and bw:
            bw_total += 1
            bw_ok += bw >= 0.85
        print(f"| {task} | {r.get('status')} | {r.get('submitted')} | {fmt(best, '.4f')} | {fmt(model, '.4f')} | "
              f"{fmt(ref, '.4f')} | {fmt(comp, '.4f')} | {fmt(vs(model), '.2f')} | {fmt(vs(ref), '.2f')} | "
              f"{fmt(vs(comp), '.2f')} | {fmt(show_bw, '.2f')} |")
    print(f"\nBeat torch.compile(max-autotune): {beat}/{total} tasks ({100 * beat / max(total, 1):.0f}%).")
    print(f"Large memory-bound tasks (>= 64 MiB of traffic) at >= 85% of copy bandwidth: {bw_ok}/{bw_total}.")


if __name__ == "__main__":
    main(sys.argv[1:])
