"""Prompts for the llm generator, built from what the search knows.

The text lives in templates/*.txt (string.Template, `$name` placeholders); this module only
chooses sections and fills them in. A request is a system message and one user message:

    task        the op's docstring, and the task file without its Triton kernels
                (Model, Reference, get_inputs, get_init_inputs, constants)
    target      the rules of the target (ascend, cuda, cpu) and the device's core counts
    parent      the candidate to improve, with its verdict, time and speedup
    inspirations  elites of other lineages, trimmed
    errors      the last errors of this task's candidates, trimmed
    answer      the answer format: one ```python block, ModelNew with Model's signature,
                Triton kernels, the constructs farm.evaluate.static_checks rejects

A parent that failed evaluation is not shown as a parent: it becomes the model's previous
answer, followed by a message with its error (repair_eval), so the model fixes its own code.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Iterable
from importlib import resources
from string import Template

from farm import pyast
from farm.evaluate import static_checks
from farm.generators.base import Candidate, Context
from farm.targets import known

TASK_CHARS = 12_000  # the task file, after its kernels are left out
PARENT_CHARS = 24_000  # the parent is the code to change: trimmed only when huge
INSPIRATION_CHARS = 4_000  # each inspiration
MAX_INSPIRATIONS = 3
ERROR_CHARS = 2_000  # each recent error (tracebacks keep their end)
MAX_ERRORS = 3
REPAIR_ERROR_CHARS = 6_000  # the error sent back in a repair message
KERNEL_DECORATORS = ("triton.jit", "jit", "triton.autotune", "autotune", "triton.heuristics", "heuristics")


@functools.cache
def template(name: str) -> Template:
    text = resources.files("farm.generators.llm").joinpath("templates").joinpath(f"{name}.txt").read_text(encoding="utf-8")
    return Template(text.strip())


def render(name: str, **values: object) -> str:
    return template(name).substitute({k: str(v) for k, v in values.items()})


def trim(text: str, limit: int, head: float = 0.6) -> str:
    """At most about `limit` characters: the start and the end, with a marked cut between."""
    text = text.strip()
    if len(text) <= limit:
        return text
    start = text[:int(limit * head)]
    end = text[len(text) - (limit - len(start)):]
    if "\n" in start:  # cut between lines
        start = start[:start.rindex("\n")]
    if "\n" in end:
        end = end[end.index("\n") + 1:]
    cut = len(text) - len(start) - len(end)
    return f"{start}\n# ... [{cut} characters cut] ...\n{end}"


# -- sections ------------------------------------------------------------------------------------


def task_section(ctx: Context) -> str:
    doc = ctx.task_doc or "(no docstring: see the task file)"
    code = trim(task_without_kernels(ctx.task_code), TASK_CHARS)
    return render("task", op=ctx.op, source=ctx.source or "-", doc=doc, code=code)


def task_without_kernels(task_code: str) -> str:
    """The task file without its module docstring and its Triton kernels (the parent shows those)."""
    try:
        tree = pyast.parse(task_code)
    except SyntaxError:
        return task_code
    lines: list[str | None] = [*task_code.splitlines()]
    for i, node in enumerate(tree.body):
        docstring = i == 0 and isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
        if docstring or _is_kernel(node):  # the docstring is shown as prose
            start = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            end = pyast.last_line(node)
            lines[start - 1:end] = [None] * (end - start + 1)
    text = "\n".join(line for line in lines if line is not None)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _is_kernel(node: ast.stmt) -> bool:
    if not isinstance(node, ast.FunctionDef):
        return False
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        if ast.unparse(target) in KERNEL_DECORATORS:
            return True
    return False


def target_section(ctx: Context) -> str:
    """The target's own section (Target.prompt_text: its rules and tips), else a generic one."""
    caps = known(ctx.target)
    text = caps.prompt_text() if caps else None
    values = {"target": ctx.target, "device": _device(ctx.device)}
    if text is None:
        return render("target_other", **values)
    return Template(text.strip()).substitute(values)


def _device(device: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(device.items())) if device else "no properties reported"


def stats(c: Candidate) -> str:
    parts = [f"verdict {c.verdict or 'not evaluated'}"]
    if c.time_ms is not None:
        parts.append(f"{c.time_ms:.4g} ms")
    if c.speedup is not None:
        parts.append(f"speedup {c.speedup:.3g}x")
    parts.append(f"lineage {c.lineage}, generation {c.generation}")
    if c.note:
        parts.append(f"last change: {c.note}")
    return "; ".join(parts)


def parent_section(parent: Candidate) -> str:
    return render("parent", stats=stats(parent), source=trim(parent.source, PARENT_CHARS))


def inspirations_section(inspirations: Iterable[Candidate], parent: Candidate | None = None) -> str:
    chosen = [c for c in inspirations if c.source.strip() and (parent is None or c.id != parent.id)]
    items = [
        render("inspiration", index=i, stats=stats(c), source=trim(c.source, INSPIRATION_CHARS))
        for i, c in enumerate(chosen[:MAX_INSPIRATIONS], 1)
    ]
    return render("inspirations", items="\n\n".join(items)) if items else ""


def errors_section(errors: Iterable[str], skip: str = "") -> str:
    recent = [e for e in errors if e.strip() and e.strip() != skip.strip()][-MAX_ERRORS:]
    items = [render("error", error=trim(e, ERROR_CHARS, head=0.3)) for e in recent]
    return render("errors", items="\n\n".join(items)) if items else ""


def answer_section(ctx: Context) -> str:
    return render(
        "answer",
        target=ctx.target,
        signature=model_signature(ctx.task_code),
        modules=", ".join(sorted(static_checks.BANNED_MODULES)),
        calls=", ".join(f"{name}()" for name in sorted(static_checks.BANNED_CALLS)),
        attributes=", ".join(sorted(static_checks.BANNED_ATTRIBUTES)),
        strings=", ".join(repr(s) for s in static_checks.BANNED_PATHS),
        roots=", ".join(sorted(static_checks.MONKEYPATCH_ROOTS)),
    )


def model_signature(task_code: str) -> str:
    """`__init__(self, eps)` and `forward(self, x, w)` of the task's Model, as far as it can be read."""
    try:
        tree = pyast.parse(task_code)
    except SyntaxError:
        return "see Model in the task file"
    model = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Model"), None)
    methods = {n.name: n for n in (model.body if model else []) if isinstance(n, ast.FunctionDef)}
    init = methods.get("__init__")
    forward = methods.get("forward")
    if forward is None:
        return "see Model in the task file"
    init_text = f"__init__({ast.unparse(init.args)})" if init else "__init__(self)"
    return f"`{init_text}` and `forward({ast.unparse(forward.args)})`"


# -- messages ------------------------------------------------------------------------------------


def failed(parent: Candidate) -> bool:
    """A parent that was evaluated and did not pass: the request becomes a repair."""
    return parent.verdict not in ("", "pass")


def build_messages(parent: Candidate, inspirations: list[Candidate], ctx: Context) -> list[dict[str, str]]:
    """The conversation asking for one new candidate (a repair when the parent failed)."""
    repair = failed(parent) and bool(parent.source.strip())
    sections = [
        task_section(ctx),
        target_section(ctx),
        "" if repair or not parent.source.strip() else parent_section(parent),
        inspirations_section(inspirations, parent),
        errors_section(ctx.recent_errors, skip=parent.error if repair else ""),
        answer_section(ctx),
    ]
    messages = [
        {"role": "system", "content": render("system")},
        {"role": "user", "content": "\n\n".join(s for s in sections if s)},
    ]
    if repair:
        messages += [
            {"role": "assistant", "content": f"```python\n{trim(parent.source, PARENT_CHARS)}\n```"},
            {"role": "user", "content": repair_eval_message(parent, ctx)},
        ]
    return messages


def repair_eval_message(parent: Candidate, ctx: Context) -> str:
    error = trim(parent.error or "(no error text recorded)", REPAIR_ERROR_CHARS, head=0.3)
    return render("repair_eval", target=ctx.target, verdict=parent.verdict, error=error)


def repair_answer_message(reason: str) -> str:
    return render("repair_answer", reason=reason)
