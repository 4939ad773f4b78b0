"""The `farm` application: global options, and the command groups of the flow (the entry point,
with its signal handling, is farm.cli.main)."""

from __future__ import annotations

import importlib
from typing import Annotated, Optional

import typer
from typer.core import TyperGroup
from typer.models import CommandInfo

from farm import __version__
from farm.cli import signals
from farm.cli.common import parse_sets, setup_logging

# name -> (module, attribute): a command's module is imported only when that command runs (or
# --help lists them all), so `farm --version`, `status`, `workers`, `cancel`, `scale` and
# `config` start without torch or triton, which only the commands that run kernels need.
COMMANDS = {
    "ops": ("ops", "app"),
    "reference": ("reference", "reference"),
    "eval": ("eval_cmd", "eval_candidate"),
    "search": ("search", "search"),
    "run": ("search", "run_local"),
    "lint": ("lint", "lint"),
    "ascend": ("ascend_cmd", "app"),
    "cache": ("cache", "app"),
    "config": ("config_cmd", "app"),
    "submit": ("distributed", "submit"),
    "status": ("status_cmd", "status"),
    "fetch": ("distributed", "fetch"),
    "export": ("export_cmd", "export"),
    "report": ("report_cmd", "report"),
    "cancel": ("distributed", "cancel"),
    "recover": ("status_cmd", "recover"),
    "workers": ("distributed", "workers"),
    "worker": ("distributed", "worker"),
    "scale": ("distributed", "scale"),
    "exporter": ("exporter_cmd", "exporter"),
}


class LazyGroup(TyperGroup):
    """The top-level group: builds a command from its module the first time it is asked for."""

    def list_commands(self, ctx) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx, name: str):
        if name not in self.commands and name in COMMANDS:
            module, attr = COMMANDS[name]
            target = getattr(importlib.import_module(f"farm.cli.{module}"), attr)
            if signals.received():  # a Ctrl-C the import swallowed (an extension module's loader)
                raise KeyboardInterrupt
            if isinstance(target, typer.Typer):
                self.commands[name] = typer.main.get_group(target)
            else:
                self.commands[name] = typer.main.get_command_from_info(
                    CommandInfo(name=name, callback=target), pretty_exceptions_short=app.pretty_exceptions_short,
                    rich_markup_mode=app.rich_markup_mode)
            self.commands[name].name = name
        return self.commands.get(name)

    # typer turns a KeyboardInterrupt into a silent exit 130 (SIGTERM's included): farm.cli.main
    # says what was stopped and exits 130 or 143, wherever the signal lands
    def make_context(self, *args, **kwargs):
        try:
            return super().make_context(*args, **kwargs)
        except KeyboardInterrupt as exc:
            raise Stopped(exc) from None

    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt as exc:
            raise Stopped(exc) from None


class Stopped(Exception):
    """A Ctrl-C or SIGTERM outside a command's own handling, carried past click to farm.cli.main."""

    def __init__(self, interrupt: KeyboardInterrupt):
        super().__init__("stopped")
        self.interrupt = interrupt


app = typer.Typer(
    name="farm",
    cls=LazyGroup,
    help="Kernel Farm: port and optimise Triton kernels of LLM-serving frameworks across accelerators.",
    no_args_is_help=True,
    pretty_exceptions_show_locals=False,  # locals may hold storage credentials
)


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


def run(argv: list[str]) -> None:
    app(args=split_ops(joined_devices(argv)), prog_name="farm")
