"""What every command shares: settings from the global options, output, error handling."""

from __future__ import annotations

import functools
import json
import logging
import os
import re
import signal
import sys
from typing import Annotated, Any, Callable, NoReturn, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from farm.config import Settings, load_settings
from farm.errors import EXIT_STORAGE, EXIT_USAGE, FarmError, Terminated

# Data goes to stdout (tables, --json); messages and progress go to stderr.
out = Console(width=None if sys.stdout.isatty() else 200)
err = Console(stderr=True)

JsonOption = typer.Option(False, "--json", help="Print machine-readable JSON on stdout instead of a table.")
SourceOpt = Annotated[Optional[list[str]], typer.Option("--source", "-s", help="Source name (repeatable); default all.")]
OpsOpt = Annotated[Optional[list[str]], typer.Option("--ops", "--op", help="Op name or source/op (repeatable); default all.")]
TimingModeOpt = typer.Option("--timing-mode", help="auto (a CUDA graph for ops whose original runs under 20 us, "
                             "else per call), events (per call, flushed) or graph (docs/evaluator.md).")
FlushOpt = typer.Option(help="Cache flush before each timed call: write (as triton's do_bench) or clean "
                             "(a read sweep: the flush's write-back stays out of the timing; docs/evaluator.md).")


def settings(ctx: typer.Context, overrides: dict[str, Any] | None = None) -> Settings:
    return settings_with_origin(ctx, overrides)[0]


def settings_with_origin(ctx: typer.Context, overrides: dict[str, Any] | None = None) -> tuple[Settings, dict[str, str]]:
    """Settings from the global --config/--set plus this command's own options (which win)."""
    obj = ctx.find_root().obj or {}
    return load_settings(obj.get("config"), overrides, sets=obj.get("overrides"))


def use_frontend_setting(s: Settings) -> None:
    """ascend.frontend_python for this process and the children it starts (evaluators read the
    variable: farm.ascend.frontend.configured_python)."""
    if s.ascend.frontend_python:
        os.environ["FARM_ASCEND_FRONTEND_PYTHON"] = s.ascend.frontend_python


def parse_sets(items: list[str]) -> dict[str, str]:
    pairs = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise typer.BadParameter(f"expected KEY=VALUE, got {item!r}", param_hint="--set")
        pairs[key.strip()] = value
    return pairs


def handle_errors(fn: Callable) -> Callable:
    """User mistakes end with a one-line message and a non-zero exit code, never a traceback
    (--verbose adds it). Ctrl-C and SIGTERM unwind like an exception, so every `finally` runs:
    temporary folders go, the store keeps only whole objects, and the next run resumes."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except FarmError as exc:
            _fail(str(exc), getattr(exc, "exit_code", EXIT_USAGE))
        except Terminated:
            say("terminated (SIGTERM): finished work is stored; run the same command again to resume", style="yellow")
            raise typer.Exit(128 + signal.SIGTERM) from None
        except KeyboardInterrupt:
            say("interrupted: finished work is stored; run the same command again to resume", style="yellow")
            raise typer.Exit(130) from None
        except OSError as exc:  # the machine said no (permissions, a full disk): not a bug of ours
            where = f"{exc.filename}: " if exc.filename else ""
            _fail(f"{where}{exc.strerror or exc}", EXIT_STORAGE)

    return wrapper


def _fail(message: str, code: int) -> NoReturn:
    if _verbose:
        err.print_exception(show_locals=False)
    say(f"error: {message}", style="bold red")
    raise typer.Exit(code) from None


def say(message: str, style: str | None = None) -> None:
    """A message on stderr, printed as is: paths and option names keep their brackets
    (kernel-farm[s3]) where console markup would eat them."""
    err.print(Text(message, style=style or ""), highlight=False, soft_wrap=True)


def error_line(text: str | None) -> str:
    """The line of a child's traceback that says what went wrong, without farm's exception class."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    last = lines[-1] if lines else "no reason recorded"
    return re.sub(r"^farm\.errors\.\w+: ", "", last)


def common_cause(failures: list[dict], total: int) -> str | None:
    """When every op failed the same way (a missing package, a broken environment), the one
    message that says so, with its fix: shown once, before the table."""
    if total < 2 or len(failures) != total or len({_cause(f["error"]) for f in failures}) != 1:
        return None
    cause = _cause(failures[0]["error"])
    missing = re.search(r"No module named '([\w.]+)'", cause)
    fix = f" (install it: pip install {missing.group(1).split('.')[0]})" if missing else ""
    return f"every op failed the same way: {cause}{fix}"


def _cause(error: str) -> str:
    """An error without the file it happened in, so that the same cause in two files compares equal."""
    return re.sub(r"^\S+\.py: ", "", error)


def same_op(ref: Any, data: dict, pt: Any, task_named: str, source_too: bool = False) -> None:
    """A .pt (--ref-pt) of one op with the task of another is the .pt's mistake, said before any
    candidate runs (else every candidate fails verification, blamed for it)."""
    op, source = data.get("op_name"), data.get("source")
    if op is not None and op != ref.op:
        raise FarmError(f"{pt} (--ref-pt) holds the reference data of op {op!r}, but {task_named} is op {ref.op!r}: "
                        "give the pair of one op")
    if source_too and source not in (None, ref.source):
        raise FarmError(f"{pt} (--ref-pt) holds the reference data of {source}/{op}, but {task_named} is {ref.key}: "
                        "give the pair of one op")


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")
    sys.stdout.flush()


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, show_lines=False)
    for c in columns:
        t.add_column(c, overflow="fold")
    for r in rows:
        t.add_row(*[Text("" if v is None else str(v)) for v in r])  # cells are data, never markup
    return t


def fmt_num(value: Any, spec: str = ".2e") -> str:
    if value is None:
        return "-"
    return format(value, spec)


_verbose = False  # --verbose: errors come with their traceback


def setup_logging(verbose: bool) -> None:
    global _verbose
    _verbose = verbose
    logging.basicConfig(level=logging.DEBUG if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)


def fmt_size(n: int | None) -> str:
    if n is None:
        return "-"
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return str(size)


def progress_bar(enabled: bool) -> Progress:
    """A progress bar on stderr, so stdout stays clean for tables and --json."""
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=err, disable=not enabled, transient=True)
