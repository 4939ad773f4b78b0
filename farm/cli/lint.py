"""`farm lint`: check Triton sources against a target's porting rules (farm.ascend.lint), and
with --compile (ascend) compile their kernels with triton-ascend itself (farm.ascend.frontend)."""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Annotated, Optional

import typer

from farm import pyast
from farm.ascend import lint as rules
from farm.cli.common import JsonOption, err, handle_errors, out, print_json, settings, table
from farm.errors import EXIT_FAILED, FarmError
from farm.targets import get_target

SEVERITY_STYLE = {"error": "[red]error[/]", "warning": "[yellow]warning[/]", "info": "[dim]info[/]"}


@handle_errors
def lint(
    ctx: typer.Context,
    files: Annotated[list[Path], typer.Argument(help="Python files with Triton kernels (task files or candidates).",
                                                show_default=False)],
    target: Annotated[str, typer.Option("--target", "-t", help=f"Rules to apply: {', '.join(rules.TARGETS)}.")]
    = "ascend",
    compile_: Annotated[bool, typer.Option(
        "--compile", help="ascend: also compile every kernel launch with triton-ascend up to Linalg (launches "
                          "recorded under the CPU interpreter; `farm ascend setup-frontend` first).")] = False,
    task: Annotated[Optional[Path], typer.Option(
        help="Task file whose get_inputs feed a candidate (ModelNew) under --compile; a task file is its own.")]
    = None,
    as_json: bool = JsonOption,
) -> None:
    """Report what breaks (error) or hurts (warning) a kernel on the target; exit 1 if any error."""
    if target not in rules.TARGETS:
        raise FarmError(f"unknown lint target '{target}' (--target); known: {', '.join(rules.TARGETS)}")
    if compile_ and get_target(target).frontend_check() is None:
        raise FarmError(f"--compile checks with triton-ascend: it needs --target ascend, not {target}")
    texts = {}
    for path in files:
        if not path.is_file():
            raise FarmError(f"{path}: no such file")
        try:
            texts[path] = path.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise FarmError(f"{path}: cannot be read: {exc}") from None
    found = []
    for path, text in texts.items():
        found += [{"file": str(path), **f.as_dict()} for f in rules.lint(text, target)]
    compiled = compile_files(ctx, texts, task) if compile_ else {}
    if as_json:
        print_json({"target": target, "files": [str(p) for p in files], "findings": found,
                    **({"frontend": compiled} if compile_ else {})})
    else:
        rows = [[_shown(f["file"]), f["line"], SEVERITY_STYLE[f["severity"]], f["rule"], f["message"]] for f in found]
        out.print(table(f"lint --target {target}: {len(found)} finding(s)",
                        ["file", "line", "severity", "rule", "message"], rows))
        if compile_:
            print_frontend(compiled)
    errors = sum(f["severity"] == "error" for f in found)
    failed = [f for f, rep in compiled.items() if not rep["ok"]]
    if errors:
        err.print(f"[red]{errors} error(s)[/] for target {target}")
    if failed:
        err.print(f"[red]{len(failed)} file(s) fail the triton-ascend frontend[/]")
    if errors or failed:
        raise typer.Exit(EXIT_FAILED)


def compile_files(ctx: typer.Context, texts: dict[Path, str], task: Path | None) -> dict[str, dict]:
    from farm.ascend import frontend
    from farm.corpus import opcheck
    from farm.corpus import tasks as taskfiles

    python = frontend.configured_python(settings(ctx).ascend.frontend_python)
    if python is None:
        raise FarmError(frontend.not_configured_notice())
    if task is not None and not task.is_file():
        raise FarmError(f"task file {task} (--task) does not exist")
    reports = {}
    for path, text in texts.items():
        cls = "ModelNew" if _defines(text, "ModelNew") else "Model"
        source = task or path
        if cls == "ModelNew" and task is None and not _defines(text, "get_inputs"):
            raise FarmError(f"{path}: a candidate (ModelNew) without get_inputs: pass --task FILE for its inputs")
        loaded = taskfiles.load_task(taskfiles.ref_from_file(source), "small")
        err.print(f"compiling {path} ({cls}) with triton-ascend ...", highlight=False)
        report = frontend.check_file(python, path.resolve(), cls, opcheck.draw_init_inputs(loaded, 0),
                                     opcheck.draw_inputs(loaded, 0))
        reports[str(path)] = report.as_dict()
    return reports


def _defines(text: str, name: str) -> bool:
    try:
        tree = pyast.parse(text)
    except SyntaxError:
        return False
    return any(isinstance(n, (ast.ClassDef, ast.FunctionDef)) and n.name == name for n in tree.body)


def print_frontend(compiled: dict[str, dict]) -> None:
    from farm.ascend.frontend import first_line

    rows = []
    version = ""
    for path, rep in compiled.items():
        version = rep["triton_version"] or version
        for r in rep["results"]:
            rows.append([path, r["kernel"], r["launches"], r["stage"], "[green]ok[/]" if r["ok"] else "[red]fail[/]",
                         first_line(r["message"])[:160]])
    out.print(table(f"triton-ascend {version} frontend: stages run = frontend, TTIR, Linalg "
                    "(bishengir and the NPU not run)", ["file", "kernel", "launches", "stage", "result", "message"],
                    rows))


def _shown(path: str) -> str:
    """A file under the working directory by its relative path: a table column of long absolute
    paths folds a file's name across lines."""
    try:
        return str(Path(path).resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return path
