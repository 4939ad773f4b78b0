"""After the README's first command: did every demo op get reference data and a passing kernel?

    python .ci/check_front_door.py STORE_DIR TASKS_DIR

Reads the store the command wrote (refs/manifest.json and runs/*/ledger.json) rather than
its console output, and fails naming each op that did not succeed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def problems(store: Path, tasks: Path) -> list[str]:
    ops = sorted(p.stem for p in tasks.glob("*.py") if p.stem != "__init__")
    manifest = store / "refs" / "manifest.json"
    if not manifest.is_file():
        return [f"{manifest}: missing (no reference data was made)"]
    entries = json.loads(manifest.read_text())["entries"]
    ledgers = sorted(store.glob("runs/*/ledger.json"))
    if not ledgers:
        return [f"{store}/runs/*/ledger.json: missing (no search finished)"]
    searched = {}
    for ledger in ledgers:
        searched.update(json.loads(ledger.read_text()).get("ops", {}))
    bad = []
    for op in ops:
        name = f"demo/{op}"
        entry = entries.get(name) or {}
        if not entry.get("success"):
            bad.append(f"{name}: no reference data ({(entry.get('error') or 'no manifest entry').splitlines()[-1]})")
            continue
        result = (searched.get(name) or {}).get("result", {})
        if result.get("status") != "succeeded":
            bad.append(f"{name}: search {result.get('status', 'never ran')} {result.get('error', '')}".rstrip())
    return bad


def main(argv: list[str]) -> None:
    store, tasks = Path(argv[0]), Path(argv[1])
    bad = problems(store, tasks)
    for line in bad:
        print(f"front door: {line}", file=sys.stderr)
    if bad:
        raise SystemExit(1)
    print(f"front door: every demo op of {tasks} succeeded")


if __name__ == "__main__":
    main(sys.argv[1:])
