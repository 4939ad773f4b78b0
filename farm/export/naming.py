"""The import name and version of an exported package.

The name is what a model team writes in `import`, so it is stable: `--name`, or the default
`kfarm_kernels`, never derived from the run (each run would otherwise be a new import path).
A name that is already something else on this interpreter (a standard-library module, an
installed package that is not an earlier export) is refused: `--name torch` or `--name json`
would shadow the real module for everything installed beside it.

The version increases with every export of the same name: `0.1.N`, N one more than the
highest of the store's record (`exports/<name>.json`) and the earlier export in --out, so pip
sees a newer package each time.
"""

from __future__ import annotations

import importlib.util
import json
import keyword
import re
import sys
from pathlib import Path
from typing import Any

from farm.errors import FarmError
from farm.reference.manifest import now
from farm.storage import Store

DEFAULT_NAME = "kfarm_kernels"
PKG_NAME = re.compile(r"^[a-z_][a-z0-9_]*$")
EXPORT_MARKER = "Kernels exported by Kernel Farm"  # the first words of every package's __init__.py


def package_name(name: str | None) -> str:
    name = DEFAULT_NAME if name is None else name
    if not PKG_NAME.match(name):
        raise FarmError(f"--name {name!r}: a package name is lower-case letters, digits and '_', not starting with a digit")
    if keyword.iskeyword(name):
        raise FarmError(f"--name {name!r}: a Python keyword; `import {name}` would not parse "
                        "(choose another name)")
    if name in sys.stdlib_module_names or name in sys.builtin_module_names or name == "__main__":
        raise FarmError(f"--name {name!r}: that is a module of Python's standard library; installing the package would "
                        "shadow it (choose another name)")
    other = _installed_elsewhere(name)
    if other:
        raise FarmError(f"--name {name!r}: an installed module has that name ({other}); the package would shadow it "
                        "or be shadowed (choose another name)")
    return name


def _installed_elsewhere(name: str) -> str:
    """Where an importable module of that name lives, unless it is an earlier export."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ""
    if spec is None:
        return ""
    init = Path(spec.origin) if spec.origin and spec.origin not in ("built-in", "frozen") else None
    if init is not None and init.name == "__init__.py" and init.is_file():
        try:
            if EXPORT_MARKER in init.read_text(errors="replace")[:400]:
                return ""
        except OSError:
            pass
    return spec.origin or ", ".join(spec.submodule_search_locations or []) or "built in"


def _key(name: str) -> str:
    return f"exports/{name}.json"


def next_version(store: Store, name: str, out: Path) -> str:
    """0.1.N, N one past the store's record and the package already in `out`."""
    seen = 0
    if store.exists(_key(name)):
        seen = int(store.read_json(_key(name)).get("count") or 0)
    try:
        earlier = json.loads((out / "export.json").read_text())
        if earlier.get("package") == name:
            seen = max(seen, int(str(earlier.get("version", "0.1.0")).rsplit(".", 1)[-1]))
    except (OSError, ValueError, AttributeError):
        pass
    return f"0.1.{seen + 1}"


def record_version(store: Store, name: str, version: str, run: str | None, ops: list[str]) -> None:
    doc: dict[str, Any] = store.read_json(_key(name)) if store.exists(_key(name)) else {"package": name, "history": []}
    doc["count"] = int(version.rsplit(".", 1)[-1])
    doc["history"] = (doc.get("history") or [])[-49:] + [{"version": version, "at": now(), "run": run, "ops": ops}]
    store.put_bytes(_key(name), (json.dumps(doc, indent=1) + "\n").encode())
