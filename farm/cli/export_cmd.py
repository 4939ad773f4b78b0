"""`farm export`: promoted kernels as an installable package (dispatcher, fallback, tests, docs, AOT C)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from farm.cli.common import JsonOption, handle_errors, out, print_json, settings, table
from farm.cli.run_view import provenance_lines
from farm.errors import FarmError
from farm.search import provenance
from farm.search.results import fmt_best
from farm.storage import open_store


@handle_errors
def export(
    ctx: typer.Context,
    run: Annotated[Optional[str], typer.Option("--run", help="Only the ops this run searched (farm run or farm submit).")] = None,
    latest: Annotated[bool, typer.Option("--latest", help="The ops of the newest run (farm run, farm search or farm submit).")] = False,
    target: Annotated[Optional[str], typer.Option(help="Only this target.")] = None,
    source: Annotated[Optional[str], typer.Option("--source", "-s", help="Only this source.")] = None,
    op: Annotated[Optional[str], typer.Option(help="Only this op.")] = None,
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Folder to write the package to (farm's earlier export there is replaced; files you added stay).")] = Path("kfarm_export"),
    force: Annotated[bool, typer.Option("--force", help="Write into a non-empty folder farm did not write (your files there are kept).")] = False,
    name: Annotated[Optional[str], typer.Option("--name", help="Python import name; stable across exports, its version rises with each [kfarm_kernels].")] = None,
    cases: Annotated[int, typer.Option("--cases", min=0, help="Cases of each op's shape space the kernel is checked at before dispatch covers the space (0: the stored seed set only).")] = 8,
    aot_mode: Annotated[str, typer.Option("--aot", help="AOT C for CUDA kernels: auto (where a CUDA GPU or --aot-arch allows), on (fail if not), off.")] = "auto",
    aot_arch: Annotated[Optional[int], typer.Option("--aot-arch", help="Generate AOT C for this CUDA architecture (e.g. 90) without a GPU: launches recorded in Triton's interpreter.")] = None,
    allow_stale: Annotated[bool, typer.Option("--allow-stale", help="Export kernels verified on another task file or reference data than the current ones (refused otherwise).")] = False,
    store: Annotated[Optional[str], typer.Option(help="Storage URL, file:///path or s3://bucket/prefix [store].")] = None,
    as_json: bool = JsonOption,
) -> None:
    """Export promoted kernels as a pip-installable package: per op a dispatcher with a PyTorch fallback,
    the task's reference, generated pytest tests and a docs page; AOT C for CUDA kernels."""
    from farm.export import naming, package

    if run and latest:
        raise FarmError("give --run RUN or --latest, not both")
    s = settings(ctx, {"store": store})
    st = open_store(s.store, s)
    name_run = package.latest(st) if latest else run
    pkg = naming.package_name(name)
    metas = package.select(st, name_run, target, source, op)
    unknown = provenance.guard(st, s, metas, "export", allow_stale)

    def progress(i: int, n: int, what: str) -> None:
        if not as_json:
            out.print(f"[{i + 1}/{n}] {what}", highlight=False)

    index = package.export(st, metas, out_dir, s, pkg, name_run, aot_mode, aot_arch, progress, cases, force)
    if as_json:
        print_json(index)
        return
    out.print(table(f"package {pkg} {index['version']} -> {out_dir}",
                    ["op", "call", "kernels", "fallback", "envelope", "layers", "vs Model", "AOT C"],
                    [[f"{e['source']}/{e['op']}", f"{e['module']}.{e['function']}", ", ".join(e["targets"]),
                      e["truth"] or "none", ", ".join(f"{t}: {v}" for t, v in e["envelope"].items()),
                      ", ".join(layer["kind"] for layer in e["layers"]) or "-",
                      ", ".join(fmt_best({"speedup_vs_model": v, "timing_mode": e["timing_mode"].get(t),
                                                "retimed": e["retimed"].get(t)})
                                for t, v in e["speedup_vs_model"].items()),
                      ", ".join(f"{t}: {v}" for t, v in e["aot"].items()) or "-"] for e in index["ops"]]))
    out.print(f"pip install {out_dir} && pytest {out_dir}/tests", highlight=False)
    provenance_lines(metas, unknown)
