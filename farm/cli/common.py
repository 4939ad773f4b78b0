"""What every command shares: settings from the global options, output, error handling."""

from __future__ import annotations

import functools
import json
import logging
import sys
from typing import Annotated, Any, Callable, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from farm.config import Settings, load_settings
from farm.errors import EXIT_USAGE, FarmError

# Data goes to stdout (tables, --json); messages and progress go to stderr.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)

JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON on stdout instead of a table.")
SourceOpt = Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Source name (repeatable); default all.")]
OpsOpt = Annotated[Optional[list[str]], typer.Option("--ops", "--op", help="Op name or source/op (repeatable); default all.")]
FlushOpt = typer.Option(help="Cache flush before each timed call: write (as triton's do_bench) or clean "
                             "(a read sweep: the flush's write-back stays out of the timing; docs/evaluator.md).")


def settings(ctx: typer.Context, overrides: dict[str, Any] | None = None) -> Settings:
    return settings_with_origin(ctx, overrides)[0]


def settings_with_origin(ctx: typer.Context, overrides: dict[str, Any] | None = None) -> tuple[Settings, dict[str, str]]:
    """Settings from the global --config/--set plus this command's own options (which win)."""
    obj = ctx.find_root().obj or {}
    merged = dict(obj.get("overrides") or {})
    merged.update({k: v for k, v in (overrides or {}).items() if v is not None})
    return load_settings(obj.get("config"), merged)


def parse_sets(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        pairs[key.strip()] = value
    return pairs


def handle_errors(fn: Callable) -> Callable:
    """User mistakes end with a one-line message and a non-zero exit code, never a traceback."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FarmError as exc:
            err.print(f"[bold red]error:[/] {exc}", highlight=False, soft_wrap=True)
            raise typer.Exit(getattr(exc, "exit_code", EXIT_USAGE)) from None
        except KeyboardInterrupt:
            err.print("[yellow]interrupted[/]")
            raise typer.Exit(130) from None

    return wrapper


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*["" if v is None else str(v) for v in r])
    return t


def fmt_num(value: Any, spec: str = ".2e") -> str:
    if value is None:
        return "-"
    return format(value, spec)


def setup_logging(verbose: bool) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def progress_bar(enabled: bool) -> Progress:
    """A progress bar on stderr, so stdout stays clean for tables and --json."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=not enabled, transient=True)
