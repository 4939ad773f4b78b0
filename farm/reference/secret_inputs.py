"""Secret input sets: the truth of a task in reference-data mode beyond the public .pt.

A task whose Model launches Triton kernels and that has no usable Reference cannot be run
on fresh inputs on the target: nothing there computes the right answer. So the reference
worker, which runs the original Model on the reference platform, records further sets of
inputs and outputs from seeds it draws at random and never publishes. They are stored
apart from the .pt (which keeps exactly the existing keys, plus a pointer to them), at

    secrets/<source>/<op>.pt   {"op_name", "source", "pt_seed", "task_sha256", "sets": [
                                 {"seed", "inputs", "outputs"}, ...]}

in a store, or at <dir>/.secrets/<source>/<op>.pt in an --output-dir folder: a hidden folder
the existing tools' loaders never read, which a copy of the folder (scp -r) takes along
(farm.reference.folder). The evaluator holds them in its own process and only ever sends a
candidate the inputs, as it does with fresh Reference seeds: verification and timing rotate
through them, and a candidate that memorised the public outputs fails on them.
"""

from __future__ import annotations

import secrets as _secrets
from pathlib import Path
from typing import Any

from farm.corpus.tasks import validate_name
from farm.errors import FarmError
from farm.reference.ptfile import load_companion, load_pt_file
from farm.storage import Store

SECRET_PREFIX = "secrets"
POINTER = "seed_sets"  # the extra key of the public .pt: {"key", "sha256", "count"}


def secret_key(source: str, op: str) -> str:
    return f"{SECRET_PREFIX}/{validate_name(source, 'source')}/{validate_name(op, 'op')}.pt"


def draw_seeds(n: int, public_seed: int) -> list[int]:
    """Random, distinct, and never the public seed."""
    seeds: list[int] = []
    while len(seeds) < n:
        s = _secrets.randbelow(2**31 - 2) + 1
        if s != public_seed and s not in seeds:
            seeds.append(s)
    return seeds


def pointer_of(data: dict[str, Any], where: str) -> dict[str, Any] | None:
    """The .pt's pointer to its secret input sets, checked: the .pt is untrusted, so the key must be the
    one its own source and op give (never a path of its choosing)."""
    pointer = data.get(POINTER)
    if not pointer:
        return None
    try:
        expected = secret_key(str(data.get("source")), str(data.get("op_name")))
    except FarmError:
        expected = None
    if not isinstance(pointer, dict) or pointer.get("key") != expected or not isinstance(pointer.get("sha256"), str):
        raise FarmError(f"{where}: its pointer to secret input sets ({POINTER!r}) is malformed: regenerate the "
                        "reference data with `farm reference`")
    return pointer


def read_sets(path: Path, where: str) -> list[tuple[list, list]]:
    """The (inputs, outputs) pairs of a secret-input file (weights_only)."""
    return _pairs(load_pt_file(path), where)


def _pairs(doc: Any, where: str) -> list[tuple[list, list]]:
    sets = doc.get("sets") if isinstance(doc, dict) else None
    if not sets or not all(isinstance(s, dict) and "inputs" in s and "outputs" in s for s in sets):
        raise FarmError(f"{where}: holds no secret input sets")
    return [(list(s["inputs"]), list(s["outputs"])) for s in sets]


def load_sets(store: Store, data: dict[str, Any]) -> list[tuple[list, list]] | None:
    """The (inputs, outputs) secret input sets the .pt points at, checked against its recorded sha256;
    None when the .pt records none (Reference mode, or data made by other tools)."""
    name = f"{data.get('source')}/{data.get('op_name')}"
    pointer = pointer_of(data, f"the reference data of {name}")
    if pointer is None:
        return None
    key = pointer["key"]
    if store.head(key) is None:
        raise FarmError(f"the reference data of {name} points at secret input "
                        f"sets {key}, which {store.url} lacks: run `farm reference` with this store (--store)")
    return _pairs(load_companion(store, key, pointer["sha256"]), store.describe(key))


def attach(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """The .pt dict with its secret input sets under "_secret_inputs" (never written anywhere)."""
    sets = load_sets(store, data)
    if sets is not None:
        data["_secret_inputs"] = sets
    return data
