"""The `farm` application: global options, and the command groups of the flow."""

from __future__ import annotations

import signal
import sys
from typing import Annotated, Optional

import typer

from farm import __version__
from farm.cli import (ascend_cmd, cache, config_cmd, distributed, eval_cmd, export_cmd, exporter_cmd, lint, ops,
                      reference, report_cmd, search)
from farm.cli.common import on_sigterm, parse_sets, setup_logging

app = typer.Typer(
    name="farm",
    help="Kernel Farm: port and optimise Triton kernels of LLM-serving frameworks across accelerators.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold storage credentials
)
app.add_typer(ops.app, name="ops")
app.command("reference")(reference.reference)
app.command("eval")(eval_cmd.eval_candidate)
app.command("search")(search.search)
app.command("run")(search.run_local)
app.command("lint")(lint.lint)
app.add_typer(ascend_cmd.app, name="ascend")
app.add_typer(cache.app, name="cache")
app.add_typer(config_cmd.app, name="config")
app.command("submit")(distributed.submit)
app.command("status")(distributed.status)
app.command("fetch")(distributed.fetch)
app.command("export")(export_cmd.export)
app.command("report")(report_cmd.report)
app.command("cancel")(distributed.cancel)
app.command("workers")(distributed.workers)
app.command("worker")(distributed.worker)
app.command("scale")(distributed.scale)
app.command("exporter")(exporter_cmd.exporter)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"farm {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    ctx: typer.Context,
    config: Annotated[Optional[str], typer.Option("--config", "-c", envvar="FARM_CONFIG",
                                                  help="Config file (default: configs/farm.yaml).")] = None,
    set_: Annotated[Optional[list[str]], typer.Option("--set", metavar="KEY=VALUE",
                                                       help="Override any setting, e.g. --set store=file:///data (repeatable).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log debug messages to stderr.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print the version and exit.")] = False,
) -> None:
    """Global options apply to every command."""
    setup_logging(verbose)
    ctx.obj = {"config": config, "overrides": parse_sets(set_ or [])}


def joined_devices(argv: list[str]) -> list[str]:
    """`--devices 0 1 2 3`, the existing tool chain's form, as `--devices 0,1,2,3` (Typer
    options take one value each)."""
    out, i = [], 0
    while i < len(argv):
        out.append(argv[i])
        end = i + 1
        if argv[i] == "--devices":
            while end < len(argv) and argv[end].isdigit():
                end += 1
            if end - i > 2:
                out.append(",".join(argv[i + 1:end]))
                i = end
                continue
        i += 1
    return out


def split_ops(argv: list[str]) -> list[str]:
    """`--ops A B C`, the existing tool chain's form, as `--ops A --ops B --ops C` (Typer
    options take one value each; no command with --ops takes a positional argument, so
    every word up to the next option is an op)."""
    out, i = [], 0
    while i < len(argv):
        out.append(argv[i])
        if argv[i] == "--ops":
            end = i + 1
            while end < len(argv) and not argv[end].startswith("-"):
                end += 1
            values = argv[i + 1:end]
            for n, value in enumerate(values):
                out.extend([value] if n == 0 else ["--ops", value])
            i = end
            continue
        i += 1
    return out


def main() -> None:
    signal.signal(signal.SIGTERM, on_sigterm)
    app(args=split_ops(joined_devices(sys.argv[1:])), prog_name="farm")
