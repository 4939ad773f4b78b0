"""`farm ascend`: the Ascend tooling that runs without an NPU."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from farm.cli.common import JsonOption, handle_errors, out, print_json

app = typer.Typer(help="Ascend tooling that needs no NPU (the triton-ascend frontend check).", no_args_is_help=True)


@app.command("setup-frontend")
@handle_errors
def setup_frontend(
    venv: Annotated[Optional[Path], typer.Option(help="Virtualenv folder [~/.farm/ascend-frontend].")] = None,
    python: Annotated[Optional[str], typer.Option(help="Base Python 3.9-3.11 [this one, or python3.11/3.10/3.9].")]
    = None,
    as_json: bool = JsonOption,
) -> None:
    """Create the triton-ascend virtualenv (its own: triton-ascend replaces the `triton` package)."""
    from farm.ascend import frontend

    where = venv or frontend.DEFAULT_VENV
    py = frontend.setup_frontend(where, python, progress=lambda text: out.print(text, highlight=False))
    info = frontend.probe(py) or {}
    if as_json:
        print_json({"python": str(py), **info})
        return
    out.print(f"triton-ascend {info.get('triton_version')} ready: {py}", highlight=False)
    if where.expanduser() != frontend.DEFAULT_VENV:
        out.print(f"use it with: --set ascend.frontend_python={py}  (or FARM_ASCEND_FRONTEND_PYTHON={py})",
                  highlight=False)
