"""`farm lint`: check Triton sources against a target's porting rules (farm.lint)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from farm import lint as rules
from farm.cli.common import JsonOption, err, handle_errors, out, print_json, table
from farm.errors import EXIT_FAILED, FarmError

SEVERITY_STYLE = {"error": "[red]error[/]", "warning": "[yellow]warning[/]", "info": "[dim]info[/]"}


@handle_errors
def lint(
    files: Annotated[list[Path], typer.Argument(help="Python files with Triton kernels (task files or candidates).",
                                                show_default=False)],
    target: Annotated[str, typer.Option("--target", "-t", help=f"Rules to apply: {', '.join(rules.TARGETS)}.")]
    = "ascend",
    as_json: bool = JsonOption,
) -> None:
    """Report what breaks (error) or hurts (warning) a kernel on the target; exit 1 if any error."""
    if target not in rules.TARGETS:
        raise FarmError(f"unknown lint target '{target}' (--target); known: {', '.join(rules.TARGETS)}")
    found = []
    for path in files:
        if not path.is_file():
            raise FarmError(f"{path}: no such file")
        try:
            text = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise FarmError(f"{path}: cannot be read: {exc}") from None
        found += [{"file": str(path), **f.as_dict()} for f in rules.lint(text, target)]
    if as_json:
        print_json({"target": target, "files": [str(p) for p in files], "findings": found})
    else:
        rows = [[f["file"], f["line"], SEVERITY_STYLE[f["severity"]], f["rule"], f["message"]] for f in found]
        out.print(table(f"lint --target {target}: {len(found)} finding(s)",
                        ["file", "line", "severity", "rule", "message"], rows))
    errors = sum(f["severity"] == "error" for f in found)
    if errors:
        err.print(f"[red]{errors} error(s)[/] for target {target}")
        raise typer.Exit(EXIT_FAILED)
