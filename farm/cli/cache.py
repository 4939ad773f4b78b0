"""`farm cache`: the stored reference data. List, re-verify, and copy between a folder and a store."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm.cli.common import (
    JsonOption,
    SourceOpt,
    fmt_size,
    handle_errors,
    out,
    print_json,
    progress_bar,
    say,
    settings,
    table,
)
from farm.config import named
from farm.errors import EXIT_FAILED, FarmError
from farm.reference import refcache
from farm.search.repair import repair_runs
from farm.storage import open_folder, open_store

app = typer.Typer(help="Inspect, verify and move stored reference data (.pt).", no_args_is_help=True)

StoreOpt = Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store].")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Also replace a .pt the destination's manifest says was made later; "
                                                   "pull: also write into a non-empty folder farm did not write (your files there are kept).")]


def _store(ctx: typer.Context, url: str | None, reading: bool = False):
    """The store of --store or the settings; one only read from must exist."""
    s = settings(ctx, {"store": url})
    st = open_store(s.store, s)
    if reading:
        st.require_present(named(s, "store"))
    return st


@app.command("ls")
@handle_errors
def ls(ctx: typer.Context, store: StoreOpt = None, source: SourceOpt = None, as_json: bool = JsonOption) -> None:
    """List the reference data with sizes and status (ok, failed, missing, unlisted)."""
    target = _store(ctx, store, reading=True)
    rows = refcache.inventory(target, source)
    if as_json:
        print_json(rows)
        return
    total = sum(r["size_bytes"] or 0 for r in rows if r["status"] == "ok")
    out.print(table(f"{target.url}: {len(rows)} ops, {fmt_size(total)}",
                    ["source", "op", "status", "size", "sha256", "created", "device"],
                    [[r["source"], r["op"], r["status"], fmt_size(r["size_bytes"]), (r["sha256"] or "-")[:12],
                      r["created_at"] or "-", r["device"] or "-"] for r in rows]))


@app.command("verify")
@handle_errors
def verify(ctx: typer.Context, store: StoreOpt = None, source: SourceOpt = None, as_json: bool = JsonOption) -> None:
    """Re-read every stored .pt and check its sha256; exit 1 if any object is corrupt or missing."""
    target = _store(ctx, store, reading=True)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("verifying", total=None)
        rows = refcache.verify(target, source, on_done=lambda r: progress.update(bar, advance=1, description=r["name"]))
    _report(rows, f"verify {target.url}", as_json)


@app.command("push")
@handle_errors
def push(
    ctx: typer.Context,
    from_dir: Annotated[str, typer.Option("--from", help="Local cache folder: <dir>/<source>/<op>.pt [+ manifest.json].")],
    store: StoreOpt = None,
    source: SourceOpt = None,
    force: ForceOpt = False,
    as_json: bool = JsonOption,
) -> None:
    """Copy a local reference folder into the store (replaces scp); the store's manifest is merged.
    Every object is checked first (sha256, loads as a reference .pt, its secret input sets from
    the folder's .secrets/ against the sha256 it records): a bad one is refused and never
    replaces what the store holds."""
    folder = Path(from_dir).expanduser()
    if not folder.is_dir():
        raise FarmError(f"folder {folder} (--from) does not exist or is not a folder")
    _require_refs(folder, "--from")
    _copy(open_folder(folder), _store(ctx, store), source, as_json, force)


@app.command("pull")
@handle_errors
def pull(
    ctx: typer.Context,
    to_dir: Annotated[str, typer.Option("--to", help="Local folder to fill as <dir>/<source>/<op>.pt + manifest.json.")],
    store: StoreOpt = None,
    source: SourceOpt = None,
    force: ForceOpt = False,
    as_json: bool = JsonOption,
) -> None:
    """Copy the store's reference data into a local folder, verifying every object."""
    folder = Path(to_dir).expanduser()
    if folder.exists() and not folder.is_dir():
        raise FarmError(f"{folder} (--to) is a file, not a folder")
    _copy(_store(ctx, store, reading=True), open_folder(folder, "--to", force), source, as_json, force)


@app.command("repair")
@handle_errors
def repair(
    ctx: typer.Context,
    store: StoreOpt = None,
    folder: Annotated[Optional[str], typer.Option("--dir", help="A local cache folder (<dir>/<source>/<op>.pt) instead of a store.")] = None,
    force: Annotated[bool, typer.Option("--force", help="With --dir: also replace a manifest.json that "
                                                         "farm did not write (another tool's).")] = False,
    as_json: bool = JsonOption,
) -> None:
    """Rebuild refs/manifest.json from the stored objects: each .pt is re-read and loaded; good
    ones are listed with their sha256 and metadata, bad ones marked failed (farm reference
    regenerates them). In a store, also set right the runs' damaged records: a ledger is rebuilt
    from its ops' checkpoints, a damaged checkpoint is removed (that op is searched again), the
    run index is rebuilt from the runs' folders. Use it when a command reports a corrupt record."""
    if store and folder:
        raise FarmError("give either --store or --dir, not both")
    if folder and not Path(folder).expanduser().is_dir():
        raise FarmError(f"folder {folder} (--dir) does not exist")
    if folder:
        _require_refs(Path(folder).expanduser(), "--dir")
        _keep_their_manifest(Path(folder).expanduser(), force)
    target = open_folder(folder) if folder else _store(ctx, store)
    with progress_bar(not as_json) as progress:
        bar = progress.add_task("repairing", total=None)
        rows = refcache.repair(target, on_done=lambda r: progress.update(bar, advance=1, description=r["name"]))
        if not folder:
            rows += repair_runs(target, on_done=lambda r: progress.update(bar, advance=1, description=r["name"]))
    _report(rows, f"manifest rebuilt for {target.url}", as_json)


def _require_refs(folder: Path, option: str) -> None:
    """A folder given as reference data holds some: a typo'd or foreign folder is no empty success."""
    if not any(p.parent.parent == folder and not p.parent.name.startswith(".") for p in folder.glob("*/*.pt")):
        raise FarmError(f"no reference data (<source>/<op>.pt) in {folder} ({option})")


def _keep_their_manifest(folder: Path, force: bool) -> None:
    """Another tool's manifest.json (valid JSON, not the farm's: no 'entries') is theirs: repair
    replaces it only when told to. A damaged one, or the farm's, is what repair is for."""
    path = folder / "manifest.json"
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return
    if not force and not (isinstance(doc, dict) and "entries" in doc):
        raise FarmError(f"{path} is not a manifest farm wrote (another tool's?): `farm cache repair --dir` would "
                        "replace it; move it away, or give --force to replace it")


def _copy(src, dst, sources, as_json: bool, force: bool = False) -> None:
    with progress_bar(not as_json) as progress:
        bar = progress.add_task(f"{src.url} -> {dst.url}", total=None)
        rows = refcache.copy_refs(src, dst, sources, force=force,
                                  on_done=lambda r: progress.update(bar, advance=1, description=r["name"]))
    _report(rows, f"{src.url} -> {dst.url}", as_json)


def _report(rows: list[dict], title: str, as_json: bool) -> None:
    if as_json:
        print_json(rows)
    else:
        seed_sets = any("seed_sets" in r for r in rows)  # copies: the secret input sets that went with each .pt
        out.print(table(f"{title}: {len(rows)} objects",
                        ["source", "op", "status", "size"] + (["secret input sets"] if seed_sets else []) + ["error"],
                        [[r["source"], r["op"], r["status"], fmt_size(r.get("size_bytes"))]
                         + ([r.get("seed_sets", "")] if seed_sets else []) + [r.get("error", "")] for r in rows]))
    bad = [r for r in rows if r["status"] not in ("ok", "copied", "up to date", "repaired")]
    if bad:
        say(f"{len(bad)} of {len(rows)} objects failed: see the error column (--json for all of it)", style="red")
        raise typer.Exit(EXIT_FAILED)
