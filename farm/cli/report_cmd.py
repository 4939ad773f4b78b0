"""`farm report`: a run as a static page with plots (farm.report), and the report line that
`farm run`, `farm status` and `farm submit --wait` print at their end."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.markup import escape

from farm.cli.common import JsonOption, err, handle_errors, out, print_json, settings
from farm.errors import FarmError
from farm.storage import Store, open_store

DEFAULT_DIR = Path("reports")  # reports/<run>/index.html under the working directory, like coverage's htmlcov/


def default_out(run: str) -> Path:
    return DEFAULT_DIR / run


def write(st: Store, run: str, out_dir: Path | None = None, publish: bool = False, force: bool = False,
          s=None) -> dict:
    """Write the report (and copy it into the store with publish); what was written, where, and
    the ops it flags stale (verified on another task file or reference data: farm.search.provenance)."""
    import farm.report as reporting

    found: dict = {}
    page = reporting.write_report(st, run, out_dir or default_out(run), force, s, found)
    result = {"run": run, "page": str(page), "uri": page.resolve().as_uri(), **found}
    if publish:
        result["store_key"] = reporting.publish(st, run, page.parent)
    return result


ReportOption = typer.Option(True, "--report/--no-report", help="Write the run's report page at the end "
                            "(reports/<run>/index.html; needs the extra `report`).")


def try_write(st: Store, run: str, publish: bool = False, s=None) -> dict:
    """The report at the end of another command: never fails that command (matplotlib may be
    missing: `farm run` needs only the core dependencies)."""
    try:
        return write(st, run, publish=publish, s=s)
    except (FarmError, OSError) as exc:
        return {"error": str(exc)}


def print_line(written: dict) -> None:
    """The report's path (or why there is none) as the last line, on stdout with the table."""
    if written.get("error"):
        err.print(f"[yellow]report not written: {escape(written['error'])}[/]", highlight=False, soft_wrap=True)
    elif written:
        where = f" (also in the store: {written['store_key']})" if written.get("store_key") else ""
        out.print(f"report: {written['page']}{where}", highlight=False, soft_wrap=True)
    if written.get("stale"):
        err.print(f"[yellow]{len(written['stale'])} op(s) flagged stale in the report: "
                  f"{escape('; '.join(f'{k}: {v}' for k, v in written['stale'].items()))}[/]",
                  highlight=False, soft_wrap=True)


@handle_errors
def report(
    ctx: typer.Context,
    run: Annotated[Optional[str], typer.Argument(help="Run name (farm run, farm search or farm submit).")] = None,
    latest: Annotated[bool, typer.Option("--latest", help="The newest run (farm run, farm search or farm submit).")] = False,
    out_dir: Annotated[Optional[Path], typer.Option("--out", "-o", help="Folder for index.html and its files "
                                                    "(default: reports/<run>).")] = None,
    publish: Annotated[bool, typer.Option("--publish", help="Also copy the report into the store at "
                                          "runs/<run>/report/ (farm fetch brings it home).")] = False,
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty folder farm did not write (your files there are kept).")] = False,
    store: Annotated[Optional[str], typer.Option(help="Storage URL (default: the store setting).")] = None,
    as_json: bool = JsonOption,
) -> None:
    """A run as one HTML page with plots that opens offline: summary, per-op speedups, search
    progress, verdicts per generator, failures by reason, lineage of each best kernel."""
    from farm.report.collect import latest_run

    if run and latest:
        raise FarmError("give a run or --latest, not both")
    if not run and not latest:
        raise FarmError("name a run, or give --latest for the newest (farm status lists runs)")
    s = settings(ctx, {"store": store})
    st = open_store(s.store, s)
    name = run or latest_run(st)  # one of the two, as checked above
    written = write(st, name, out_dir, publish, force, s)
    if as_json:
        print_json(written)
        return
    if written.get("stale"):
        err.print(f"[yellow]stale (verified on another task file or reference data; `farm run` searches them again): "
                  f"{escape('; '.join(f'{k}: {v}' for k, v in written['stale'].items()))}[/]",
                  highlight=False, soft_wrap=True)
    out.print(f"report of run {name}: {written['page']}", highlight=False, soft_wrap=True)
    out.print(f"open {written['uri']}", highlight=False, soft_wrap=True)
    if written.get("store_key"):
        out.print(f"in the store: {st.url}/{written['store_key']}", highlight=False, soft_wrap=True)
