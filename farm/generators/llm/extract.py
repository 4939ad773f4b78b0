"""Strict extraction of a candidate from a model's answer.

An answer is accepted only when it holds exactly one fenced block labelled python (```python,
```py or ```python3; other labelled blocks are ignored), whose text parses, defines a top-level
class ModelNew and passes farm.evaluate.static_checks. Anything else is rejected with a reason precise
enough to send back to the model as it stands.
"""

from __future__ import annotations

import ast
import re
from typing import NamedTuple

from farm import pyast
from farm.evaluate.static_checks import static_verdict

PYTHON_LABELS = {"python", "py", "python3"}
# an opening fence: up to 3 spaces, 3+ backticks or tildes, then an info string
_OPEN = re.compile(r"^ {0,3}(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>[^`\n]*?)[ \t]*$")


class Extracted(NamedTuple):
    source: str  # the candidate module, "" when rejected
    reason: str  # why the answer was rejected, "" when accepted

    @property
    def ok(self) -> bool:
        return not self.reason


class _Block(NamedTuple):
    label: str
    text: str
    closed: bool
    line: int


def fenced_blocks(text: str) -> list[_Block]:
    """Every fenced block in order: its label (first word of the info string), body, closed or not."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        opening = _OPEN.match(lines[i])
        if not opening:
            i += 1
            continue
        fence, label = opening["fence"], (opening["info"].split() or [""])[0].lower()
        close = re.compile(rf"^ {{0,3}}{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = next((j for j in range(i + 1, len(lines)) if close.match(lines[j])), None)
        body = lines[i + 1:end if end is not None else len(lines)]
        blocks.append(_Block(label, "\n".join(body) + "\n", end is not None, i + 1))
        i = (end if end is not None else len(lines)) + 1
    return blocks


def extract(answer: str) -> Extracted:
    """The candidate source of an answer, or the reason it is not acceptable."""
    blocks = fenced_blocks(answer)
    python = [b for b in blocks if b.label in PYTHON_LABELS]
    if not python:
        unlabelled = sum(1 for b in blocks if not b.label)
        hint = f" (found {unlabelled} unlabelled fenced block(s): label the code ```python)" if unlabelled else ""
        return _reject(f"the answer has no ```python fenced block{hint}")
    if len(python) > 1:
        lines = ", ".join(str(b.line) for b in python)
        return _reject(f"the answer has {len(python)} ```python fenced blocks (lines {lines}); "
                       "give exactly one, holding the complete module")
    block = python[0]
    if not block.closed:
        return _reject("the ```python block is never closed (was the answer cut off?); "
                       "give the complete module in one closed block")
    return check_source(block.text)


def check_source(source: str) -> Extracted:
    """The checks a candidate module must pass before anyone runs it."""
    if not source.strip():
        return _reject("the ```python block is empty")
    try:
        tree = pyast.parse(source)
    except SyntaxError as exc:
        where = f"line {exc.lineno}" + (f", column {exc.offset}" if exc.offset else "")
        code = (exc.text or "").strip()
        return _reject(f"syntax error at {where}: {exc.msg}" + (f": {code}" if code else ""))
    if not any(isinstance(node, ast.ClassDef) and node.name == "ModelNew" for node in tree.body):
        return _reject("the module defines no top-level class ModelNew")
    verdict, reason = static_verdict(source)
    if verdict:
        return _reject(f"rejected by the static checks ({verdict}): {reason}")
    return Extracted(source, "")


def _reject(reason: str) -> Extracted:
    return Extracted("", reason)
