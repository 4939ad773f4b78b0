"""The order in which the suite hands tests to its two processes (pytest-xdist, `--dist loadgroup`).

The suite is a few dozen tests of a minute or so (real workers, real servers, `farm run` in a
subprocess) and a thousand of a second. Handed out in file order, a one-minute test can start
when the other process has nothing left, and the run waits for it alone. Sorted longest first
by their time in the last measurement (tests/durations.json), the long ones start at once and
the short ones fill in behind them, so the two processes finish together.

The tests of a module that holds a module-scoped fixture (a `farm run` made once, a package
installed once) form one unit: one process runs them one after another, so the fixture is made
once, not once per process, and is never torn down and made again between them.

A test missing from durations.json counts DEFAULT_S. To refresh the figures after the suite
changed: `python -m pytest -q -n 2 --durations=0 > out.txt; python -m tests.durations out.txt`.
"""

from __future__ import annotations

import json
import re
import sys
from collections import defaultdict
from pathlib import Path

import pytest

FIGURES = Path(__file__).with_name("durations.json")
DEFAULT_S = 0.5  # most tests take less
KEEP_S = 2.0  # durations.json lists the tests that take at least this long
SHARED_SCOPES = ("module", "package", "class")
LINE = re.compile(r"^\s*([0-9.]+)s (setup|call|teardown)\s+(\S.*?)\s*$")


def _shared_module(item: pytest.Item) -> str | None:
    """The module's path if the test uses a fixture made once for several of its tests."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope in SHARED_SCOPES:
            return item.nodeid.split("::", 1)[0]
    return None


def order(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Sort `items` in place, longest unit first; a unit is a test, or a module of tests that
    share a fixture (marked xdist_group, so that loadgroup hands it to one process). Only in an
    xdist process: a run in one process keeps the files' order."""
    if not hasattr(config, "workerinput"):
        return
    figures = json.loads(FIGURES.read_text()) if FIGURES.exists() else {}
    units: dict[str, list[pytest.Item]] = defaultdict(list)
    for item in items:
        shared = _shared_module(item)
        if shared is not None and config.getoption("loadgroup", False):  # a worker's dist is "no"
            item.add_marker(pytest.mark.xdist_group(shared))
        units[shared or item.nodeid].append(item)
    weight = {key: sum(figures.get(i.nodeid, DEFAULT_S) for i in unit) for key, unit in units.items()}
    first = {key: n for n, key in enumerate(units)}  # ties keep the collection's order
    items[:] = [i for key in sorted(units, key=lambda k: (-weight[k], first[k])) for i in units[key]]


def figures_from(text: str) -> dict[str, float]:
    """Seconds per test (setup, call and teardown together) from pytest's --durations=0 report."""
    total: dict[str, float] = defaultdict(float)
    for line in text.splitlines():
        m = LINE.match(line)
        if m:
            nodeid = m.group(3)
            if nodeid.rfind("@") > nodeid.rfind("]"):  # loadgroup's suffix, as xdist reads it
                nodeid = nodeid.rsplit("@", 1)[0]
            total[nodeid] += float(m.group(1))
    return {k: round(v, 1) for k, v in sorted(total.items()) if v >= KEEP_S}


if __name__ == "__main__":
    figures = figures_from(Path(sys.argv[1]).read_text())
    FIGURES.write_text(json.dumps(figures, indent=1, sort_keys=True) + "\n")
    print(f"{FIGURES}: {len(figures)} tests of {KEEP_S:g} s or more")
