"""`farm ops list` without running any task file in the farm's own process.

Every file is loaded in one child (a child per file would cost a fresh process each, seconds
on 2 cores for a corpus of hundreds). What one file does at import stays that file's error:
an exception, `sys.exit()`, `os._exit()`, a segfault, a hang (SIGALRM in the child, and a
per-file deadline in the parent for a hang the alarm cannot break), and output (the child's
stdout and stderr go to a file: `--json` on the farm's stdout stays valid). When the child
dies on a file, that file gets the reason and a new child takes the files after it. A corpus
of more than SHARD_FILES files on a host of several cores is split among children that load at
once (AKG's 141 files, a few of which hang at import on a GPU host, took minutes in one child).
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from farm.corpus import tasks as taskfiles
from farm.errors import TaskError

PER_FILE_TIMEOUT_S = 30.0
SHARD_FILES = 16  # files per child below which one child loads them all


class _Hang(BaseException):  # not an Exception: no `except Exception` of the task or the loader takes it
    pass


def invalid(ref: taskfiles.TaskRef, error: str) -> dict[str, Any]:
    return {"status": "invalid", "source": ref.source, "op": ref.op, "path": str(ref.path), "origin": ref.origin,
            "error": error}


def _row(ref: taskfiles.TaskRef) -> dict[str, Any]:
    try:
        task = taskfiles.load_task(ref)
    except TaskError as exc:
        return invalid(ref, str(exc))
    except Exception as exc:  # noqa: BLE001 - a file no rule foresaw is still that file's error
        return invalid(ref, f"{ref.path}: cannot be loaded: {type(exc).__name__}: {exc}")
    row = {"status": "ok", **taskfiles.describe(task)}
    row["_static"] = {"mode": task.mode, "comparison": task.comparison, "reason": task.mode_reason,
                      "reference": task.reference_cls.__name__ if task.reference_cls is not None else None}
    return row


def _alarm(signum, frame):
    raise _Hang()


def load_rows_child(report: Callable[[str], None], refs: list[taskfiles.TaskRef], out_path: str,
                    per_file_s: float) -> int:
    """In the child: one JSON line per file in `out_path`, as each is loaded."""
    # a task's output (Python's or a C library's) never reaches the farm's stdout: what it writes
    # to stdout is its error (a top level only defines), what it writes to stderr (warnings) a note
    captured = {fd: os.open(f"{out_path}.{fd}", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600) for fd in (1, 2)}
    for fd, into in captured.items():
        os.dup2(into, fd)
    signal.signal(signal.SIGALRM, _alarm)
    with open(out_path, "a") as out:
        for ref in refs:
            report(ref.key)
            before = {fd: os.lseek(into, 0, os.SEEK_END) for fd, into in captured.items()}
            signal.setitimer(signal.ITIMER_REAL, per_file_s)
            try:
                row = _row(ref)
            except _Hang:
                row = invalid(ref, f"{ref.path}: hangs at import: no answer in {per_file_s:.0f} s")
            finally:
                signal.setitimer(signal.ITIMER_REAL, 0)
            printed, noted = (_read_from(f"{out_path}.{fd}", before[fd]) for fd in (1, 2))
            if printed and row["status"] == "ok":
                row = invalid(ref, f"{ref.path}: prints at import (a task file's top level only defines): "
                                   f"{printed.splitlines()[0][:200]}")
            if noted:
                row["import_stderr"] = noted[:1000]
            out.write(json.dumps(row, default=str) + "\n")
            out.flush()
    return len(refs)


def _read_from(path: str, offset: int) -> str:
    with open(path, "rb") as f:
        f.seek(offset)
        return f.read(4000).decode(errors="replace").strip()


def _death(ref: taskfiles.TaskRef, outcome) -> str:
    if outcome.status == "timeout":
        return f"{ref.path}: hangs at import: no answer in {PER_FILE_TIMEOUT_S:.0f} s"
    if outcome.status == "crash":
        how = outcome.error.split("child process ", 1)[-1].split(" in stage", 1)[0]
        return f"{ref.path}: ends the process at import ({how})"
    lines = [line for line in outcome.error.splitlines() if line.strip()]
    return f"{ref.path}: cannot be loaded: {lines[-1] if lines else outcome.status}"


def load_rows(refs: list[taskfiles.TaskRef], per_file_s: float = PER_FILE_TIMEOUT_S,
              on_row: Callable[[dict], None] = lambda row: None) -> dict[str, dict[str, Any]]:
    """Each ref's row (source/op -> row), loaded in children; rows of loaded files carry
    `_static` (what farm.corpus.modes.decide needs, decided in the parent). `on_row` is called
    once per row, never from two threads at once."""
    shards = max(1, min(len(refs) // SHARD_FILES, (os.cpu_count() or 1) // 2, 8))
    if shards == 1:
        return _load_shard(refs, per_file_s, on_row)
    lock = threading.Lock()

    def one_at_a_time(row: dict) -> None:
        with lock:
            on_row(row)

    with ThreadPoolExecutor(max_workers=shards, thread_name_prefix="farm-list") as pool:
        parts = [pool.submit(_load_shard, refs[i::shards], per_file_s, one_at_a_time) for i in range(shards)]
        found = [part.result() for part in parts]  # an interrupted shard raises here
    return {key: row for part in found for key, row in part.items()}


def _load_shard(refs: list[taskfiles.TaskRef], per_file_s: float,
                on_row: Callable[[dict], None]) -> dict[str, dict[str, Any]]:
    from farm.runtime.children import run_in_child
    from farm.targets import resolve_device

    rows: dict[str, dict[str, Any]] = {}
    todo = list(refs)
    while todo:
        with tempfile.TemporaryDirectory(prefix="farm-list-") as tmp:
            out_path = os.path.join(tmp, "rows.jsonl")
            Path(out_path).touch()
            outcome = run_in_child(load_rows_child, (todo, out_path, per_file_s), timeout_s=per_file_s * len(todo) + 60,
                                   stage_timeout_s=per_file_s + 10, env=resolve_device("cpu").child_env())
            for line in Path(out_path).read_text().splitlines():
                try:
                    row = json.loads(line)
                except ValueError:
                    continue  # the line the child was writing when it died
                rows[f"{row['source']}/{row['op']}"] = row
                on_row(row)
        if outcome.status == "interrupted":
            raise KeyboardInterrupt
        rest = [r for r in todo if r.key not in rows]
        if outcome.ok or not rest:
            break
        culprit = next((r for r in rest if r.key == outcome.stage), rest[0])
        rows[culprit.key] = invalid(culprit, _death(culprit, outcome))
        on_row(rows[culprit.key])
        todo = [r for r in rest if r is not culprit]
    return rows
