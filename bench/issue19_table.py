"""Markdown table of a search run (issue 19): per op the promoted figures with their timing
mode, the physical limit and the fraction of it, the promotion decision, and the independent
re-timing of bench/retime.py beside the reported speedup.

    python bench/issue19_table.py file:///store RUN retime.json > table.md
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from farm.storage import open_store  # noqa: E402


def fmt(v, spec=".3f") -> str:
    return "-" if v is None else format(v, spec)


def main() -> None:
    store = open_store(sys.argv[1])
    run = sys.argv[2]
    retime = {}
    if len(sys.argv) > 3 and Path(sys.argv[3]).is_file():
        retime = {r["op"]: r for r in json.loads(Path(sys.argv[3]).read_text())["rows"]}
    reports = sorted(i.key for i in store.list(f"runs/{run}/") if i.key.endswith("/report.json"))
    print("| op | mode (why) | best us | Model us (per call, events) | vs Model [95% CI] | vs Reference | "
          "limit us (bound) | of limit | promoted | independent vs Model | diff |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for key in reports:
        rep = store.read_json(key)
        op = f"{rep['source']}/{rep['op']}"
        conf = rep.get("confirmation") or {}
        timing = conf.get("timing") or (rep.get("best") or {}).get("timing") or {}
        model = conf.get("model") or {}
        ref = conf.get("reference") or {}
        limit = conf.get("limit") or {}
        promo = rep.get("promotion") or {}
        ind = retime.get(op, {})
        ci = f"{fmt(model.get('ratio'))} [{fmt(model.get('ci_low'))}, {fmt(model.get('ci_high'))}]" if model else "-"
        print(f"| {op} | {timing.get('mode', '-')} ({timing.get('mode_reason', '')}) | "
              f"{fmt(conf.get('time_ms') and conf['time_ms'] * 1e3, '.2f')} | "
              f"{fmt((rep.get('baseline') or {}).get('model_ms') and rep['baseline']['model_ms'] * 1e3, '.2f')} | "
              f"{ci} | {fmt(ref.get('ratio'), '.2f')} | "
              f"{fmt(limit.get('limit_ms') and limit['limit_ms'] * 1e3, '.2f')} ({limit.get('bound', '-')}) | "
              f"{fmt(limit.get('fraction'), '.2f')} | {'yes' if promo.get('allowed') else 'no: ' + promo.get('reason', '')[:60]} | "
              f"{fmt(ind.get('independent'))} ({ind.get('mode', '-')}) | "
              f"{fmt(ind.get('diff') and ind['diff'] * 100, '+.1f')}{'%' if ind.get('diff') is not None else ''} |")


if __name__ == "__main__":
    main()
