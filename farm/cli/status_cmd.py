"""`farm status` (a run's ops, stalled ones with their way out; --all lists the runs) and
`farm recover` (re-enqueue a run's stranded work now)."""

from __future__ import annotations

import time
from typing import Annotated

import typer
from rich.markup import escape

from farm.cli import report_cmd
from farm.cli.common import JsonOption, err, handle_errors, out, print_json, table
from farm.cli.distributed import RunArg, StoreOpt, _need_celery, _store
from farm.cli.run_view import REPORT_MAX_OPS, stalled_lines, status_table


@handle_errors
def status(
    ctx: typer.Context,
    run: RunArg = None,
    watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh until the run finishes (Ctrl-C stops watching).")] = False,
    every: Annotated[bool, typer.Option("--all", help="List every run of the store (local and submitted), newest first.")] = False,
    store: StoreOpt = None,
    as_json: bool = JsonOption,
) -> None:
    """Per op: reference and search state, candidates tried and passed, best speedup, worker; totals, ETA.
    Runs of `farm run`/`farm search` and of `farm submit` alike."""
    from farm.distributed import reconcile, runs
    from farm.distributed.control import POLL_S

    s, st = _store(ctx, store)
    if every:
        _list_runs(st, as_json)
        return
    name = run or runs.latest_run(st)

    def look() -> dict:
        return reconcile.observe(s, runs.summarize(st, name))

    view = look()
    stale = _judge(s, st, view)
    if as_json:
        print_json(view)
        return
    if watch:
        from rich.live import Live

        with Live(status_table(view), console=out, refresh_per_second=1) as live:
            while view["status"] in ("running", "cancelling"):
                time.sleep(POLL_S)
                view = look()
                live.update(status_table(view))
    else:
        out.print(status_table(view))
    for line in stalled_lines(view) + stale:
        err.print(f"[yellow]{escape(line)}[/]", highlight=False, soft_wrap=True)
    if view["status"] in ("running", "stalled", "cancelling", "interrupted"):
        out.print(f"report: `farm report {name}` writes a page of the run so far", highlight=False)
    elif len(view["ops"]) > REPORT_MAX_OPS:
        out.print(f"report: `farm report {name}` writes the page ({len(view['ops'])} ops)", highlight=False)
    else:
        report_cmd.print_line(report_cmd.try_write(st, name, s=s))


def _judge(s, st, view: dict) -> list[str]:
    """Each finished op's result judged against the task file and reference data as they are
    now (farm.search.provenance): one verified on an older task is marked stale in the table
    and in --json ("provenance_check"), and a line says how to verify it again. Runs past
    REPORT_MAX_OPS finished ops are not judged here (one read per op); `farm report` judges them."""
    from farm.search import ledger, provenance
    from farm.search.results import op_prefix

    done = [r for r in view["ops"] if r["phase"] == "done"]
    if not done or len(done) > REPORT_MAX_OPS:
        return []
    results = ledger.read(st, view["run"]) if view["kind"] == "local" else {}
    docs = {(r["source"], r["op"]): (results.get(f"{r['source']}/{r['op']}") or {}).get("result")
            or _checkpoint(st, op_prefix(view["run"], r["source"], r["op"])) for r in done}
    judged = provenance.judge(st, s, docs)
    stale: dict[str, list[str]] = {}
    for r in done:
        verdict = judged[(r["source"], r["op"])]
        r["provenance_check"] = {"status": verdict["status"], "why": verdict["why"]}
        if verdict["status"] == provenance.STALE:
            stale.setdefault(verdict["why"], []).append(r["op"])
    return [f"stale: {len(ops)} op(s) ({', '.join(ops[:5])}{', ...' if len(ops) > 5 else ''}) were verified on "
            f"other inputs than they have now ({why}); `farm run` (or `farm search`) again verifies them"
            for why, ops in stale.items()]


def _checkpoint(st, prefix: str) -> dict | None:
    from farm.errors import FarmError

    try:
        return st.read_json(f"{prefix}/state.json") or None
    except FarmError:  # a damaged checkpoint: its provenance is unknown, never a crash here
        return None


def _list_runs(st, as_json: bool) -> None:
    from farm.search import catalog

    found = sorted(catalog.runs(st).items(), key=lambda kv: (kv[1].get("created_at") or "", kv[0]), reverse=True)
    if as_json:
        print_json({"store": st.url, "runs": [{"run": name, **entry} for name, entry in found]})
        return
    out.print(table(f"{len(found)} run(s) in {st.url}", ["run", "kind", "source", "target", "started"],
                    [[name, e.get("kind"), e.get("source"), e.get("target"), e.get("created_at")] for name, e in found]))


@handle_errors
def recover(ctx: typer.Context, run: RunArg = None, store: StoreOpt = None, as_json: bool = JsonOption) -> None:
    """Re-enqueue the run's stranded work now: ops neither queued nor running (Redis lost its data),
    ops whose worker died holding them, and ops whose task a worker took before Redis restarted.
    `farm worker` does the same every queue.reconcile_interval_s."""
    _need_celery()
    from farm.distributed import control, reconcile, runs

    s, st = _store(ctx, store)
    name = run or runs.latest_run(st)
    control.connect(s)
    done = reconcile.recover(s, st, name)
    if as_json:
        print_json({"run": name, "recovered": done})
        return
    out.print(table(f"run {name}: {len(done)} task(s) enqueued again", ["op", "task", "why"],
                    [[f"{d['source']}/{d['op']}", d["task"], d["reason"]] for d in done]))
