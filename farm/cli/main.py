"""The `farm` entry point: signals first (farm.cli.signals), then the application (farm.cli.app).

Nothing heavy is imported before the handlers are set: a Ctrl-C or SIGTERM in the first
second (while typer, rich or torch load) ends the command as one later does, with one line
and exit 130 (143 for SIGTERM), never a traceback.
"""

from __future__ import annotations

import sys

from farm.cli import signals


def main() -> None:
    signals.install()
    try:
        from farm.cli.app import Stopped, run

        try:
            run(sys.argv[1:])
        except Stopped:
            signals.stopped()
    except KeyboardInterrupt:  # while the application itself was imported
        signals.stopped()
    finally:  # interpreter shutdown (joining threads, atexit) is no place for a traceback either
        signals.at_exit()


def __getattr__(name: str):
    """The application's names (app, COMMANDS, split_ops, ...) where callers have always found them."""
    if name.startswith("__"):  # the import system's own questions (__path__, ...)
        raise AttributeError(name)
    from farm.cli import app as application

    try:
        return getattr(application, name)
    except AttributeError:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None
