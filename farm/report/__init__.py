"""Report: a run in the store as a static page to look at (docs/report.md).

Takes what a run left in the store (run.json or ledger.json, each op's report.json,
state.json, status.json and candidates); gives index.html with SVG plots and per-op kernel
pages (`write_report`), and a copy of it in the store at runs/<run>/report/ (`publish`).
collect gathers the numbers, figures draws them (matplotlib: the optional extra `report`),
page writes the HTML.

May import: every stage below it (farm.export and lower).
"""

from __future__ import annotations

from pathlib import Path

from farm.report import collect, figures, page
from farm.storage import Store, owned

STORE_FOLDER = "report"


def write_report(store: Store, run: str, out: Path, force: bool = False, settings=None,
                 found: dict | None = None) -> Path:
    """Write OUT/index.html and its files for `run`; returns the page's path. Only the farm's own
    files in `out` are replaced (farm.storage.owned): --force to write into someone else's folder.
    `settings` finds the current task files (their results are judged against them:
    farm.search.provenance); `found`, where given, gets the ops flagged stale and those of
    unknown provenance."""
    figures.pyplot()  # the install hint before any work
    view = collect.load_run(store, run, settings)
    if found is not None:
        found["stale"] = {o.key: o.provenance["why"] for o in view.ops if o.stale}
        found["unknown_provenance"] = [o.key for o in view.ops if o.provenance.get("status") == "unknown"]
    with owned.writing(out, "--out", force) as stage:
        plots = figures.draw_all(view, stage / "plots")
        links = page.write_kernel_pages(store, view, stage)
        (stage / "report.css").write_text(page.CSS)
        (stage / "index.html").write_text(page.index_html(view, plots, links))
    return out / "index.html"


def store_prefix(run: str) -> str:
    return f"runs/{run}/{STORE_FOLDER}"


def publish(store: Store, run: str, folder: Path) -> str:
    """Copy a written report into the store (runs/<run>/report/...); returns the page's key."""
    prefix = store_prefix(run)
    for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.name != owned.MARKER):
        store.put_file(f"{prefix}/{path.relative_to(folder).as_posix()}", path)
    return f"{prefix}/index.html"
