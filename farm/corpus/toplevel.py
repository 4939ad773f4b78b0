"""A task file's top level, run so that what it does there stays the file's business: a
`sys.exit()` is that file's error, not the command's end (`farm ops list` once printed
nothing and exited 0), and so is a print: it never reaches stdout, where `--json` goes.
(farm.corpus.listing adds what needs a child: crashes, hangs, output below Python.)"""

from __future__ import annotations

import contextlib
import io
from pathlib import Path

from farm.errors import TaskError


def run_top_level(code, namespace: dict, path: Path) -> None:
    printed = io.StringIO()
    try:
        with contextlib.redirect_stdout(printed):
            exec(code, namespace)
    except SystemExit as exc:
        raise TaskError(path, "exits at import", f"sys.exit({exc.code!r}) at its top level") from None
    except Exception as exc:  # noqa: BLE001 - any failure of a task's top level is the task's
        raise TaskError(path, "fails on import", f"{type(exc).__name__}: {exc}") from None
    text = printed.getvalue().strip()
    if text:  # stdout is where tables and --json go: a task's top level only defines
        raise TaskError(path, "prints at import", f"{text.splitlines()[0][:200]!r} (a top level only defines)")
