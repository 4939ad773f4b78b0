"""`farm config`: what the farm will use, and where each value came from."""

from __future__ import annotations

import typer

from farm import config as cfg
from farm.cli.common import JsonOption, handle_errors, out, print_json, settings_with_origin, table

app = typer.Typer(help="Inspect the effective configuration.", no_args_is_help=True)


@app.command("show")
@handle_errors
def show(ctx: typer.Context, as_json: bool = JsonOption) -> None:
    """Print every setting, its value (secrets masked) and its source: option, env, file or default."""
    loaded, origin = settings_with_origin(ctx)
    rows = cfg.describe(loaded, origin)
    if as_json:
        print_json(rows)
        return
    out.print(table("farm configuration", ["key", "value", "source", "env"],
                    [[r["key"], r["value"], r["source"], r["env"]] for r in rows]))
