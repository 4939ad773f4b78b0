"""farm.pyast.parse from several threads at once (ops searched in threads of one process):
CPython 3.11's ast.parse fails with "AST constructor recursion depth mismatch" when another
thread parses while it waits (here: a garbage collection that releases the GIL mid-parse)."""

import ast
import gc
import threading
import time
from pathlib import Path

import pytest

from farm import pyast

SOURCE = Path(pyast.__file__).read_text() * 8


def _parse_in_threads(parse) -> list[str]:
    errors: list[str] = []

    def work():
        try:
            for _ in range(4):
                parse(SOURCE)
        except Exception as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(repr(exc))

    def sleepy(phase, _info):
        if phase == "start":
            time.sleep(0.0005)  # releases the GIL in the middle of a parse

    threshold = gc.get_threshold()
    gc.callbacks.append(sleepy)
    gc.set_threshold(50, 1, 1)
    try:
        threads = [threading.Thread(target=work) for _ in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        gc.callbacks.remove(sleepy)
        gc.set_threshold(*threshold)
    return errors


def test_parsing_in_threads_at_once_never_fails():
    assert _parse_in_threads(pyast.parse) == []


def test_the_race_is_real_for_plain_ast_parse_where_python_has_it():
    errors = _parse_in_threads(ast.parse)
    if not errors:
        pytest.skip("this Python's ast.parse is thread-safe (the lock then costs nothing but order)")
    assert "recursion depth mismatch" in errors[0]
