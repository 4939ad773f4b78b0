"""How `farm status` and `farm submit --wait` show a run: its table (the ops that need a look
first when there are thousands) and the lines that say why ops are stalled and what recovers them."""

from __future__ import annotations

from farm.cli.common import say, table
from farm.search.results import fmt_best


def _fmt_eta(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    minutes, sec = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m" if hours else f"{minutes}m{sec:02d}s"


TABLE_ROWS = 40  # a run of thousands of ops: the ops that need a look first, the rest counted
REPORT_MAX_OPS = 500  # status writes the report page of a finished run up to this size (farm report: any)
_ORDER = {"stalled": 0, "failed": 1, "cancelling": 2, "reference": 3, "searching": 3, "interrupted": 3, "queued": 4}


def _shown(view: dict) -> list[dict]:
    ops = view["ops"]
    if len(ops) <= TABLE_ROWS:
        return ops
    key = lambda r: _ORDER.get("stalled" if r.get("state") == "stalled" else r["phase"], 9)  # noqa: E731
    return sorted(ops, key=key)[:TABLE_ROWS]


def _best(row: dict) -> str:
    """The op's best speedup as every surface writes it (farm.search.results.best_speedup)."""
    return fmt_best({"speedup_vs_model": row.get("best_speedup"), "timing_mode": row.get("best_timing_mode"),
                     "retimed": row.get("best_retimed")})


def _phase(row: dict) -> str:
    if row.get("state") == "stalled":
        return "stalled"
    return "done, stale" if (row.get("provenance_check") or {}).get("status") == "stale" else row["phase"]


def status_table(view: dict):
    shown = _shown(view)
    rows = [[r["op"], _phase(r), r["reference"], f"{r['chunk']}",
             f"{r['tried']}", f"{r['passed']}", _best(r), r["worker"] or "-",
             (r.get("stalled") or r["error"] or "")[:60]] for r in shown]
    if len(shown) < len(view["ops"]):
        counts: dict[str, int] = {}
        for r in view["ops"]:
            phase = "stalled" if r.get("state") == "stalled" else r["phase"]
            counts[phase] = counts.get(phase, 0) + 1
        rows.append([f"... {len(view['ops']) - len(shown)} more", ", ".join(f"{n} {p}" for p, n in sorted(counts.items())),
                     "", "", "", "", "", "", "--json lists every op"])
    t = view["totals"]
    stalled = (view.get("ops_by_state") or {}).get("stalled", 0)
    eta = "ETA -" if view["status"] != "running" else (
        f"no ETA ({stalled} op(s) stalled)" if stalled else f"ETA {_fmt_eta(view['eta_s'])}")
    title = (f"run {view['run']} ({view['spec']['source']} -> {view['spec']['target']}): {view['status']}, "
             f"{t['finished']}/{t['ops']} ops finished, {t['tried']}/{t['budget']} candidates, "
             f"{t['passed']} passed, {eta}")
    return table(title, ["op", "phase", "reference", "chunks", "tried", "passed", "best vs Model", "worker", "error"], rows)


def stalled_lines(view: dict) -> list[str]:
    """One line per reason an op does not move, with the command that recovers it."""
    if view.get("broker"):
        return [f"broker {view['broker']}: states and ETA unknown; the ops keep what the store says"]
    reasons: dict[tuple[str, str], list[str]] = {}
    for r in view["ops"]:
        if r.get("state") == "stalled":
            reasons.setdefault((r["stalled"], r["fix"]), []).append(r["op"])
    return [f"stalled: {len(ops)} op(s) ({', '.join(ops[:5])}{', ...' if len(ops) > 5 else ''}): {why}; recover: {fix}"
            for (why, fix), ops in reasons.items()]


def provenance_lines(kernels: list[dict], unknown: list[str]) -> None:
    """fetch/export: say which kernels were taken stale (--allow-stale) or of unknown provenance."""
    stale = [f"{k['target']}/{k['source']}/{k['op']}: {k['provenance_check']['why']}" for k in kernels
             if (k.get("provenance_check") or {}).get("status") == "stale"]
    if stale:
        say(f"{len(stale)} stale kernel(s) taken (--allow-stale): {'; '.join(stale)}", style="bold yellow")
    if unknown:
        say(f"{len(unknown)} kernel(s) of unknown provenance (promoted before the farm recorded the task file and "
            f"reference data they were verified on; `farm run` again verifies them): {', '.join(unknown)}",
            style="yellow")
