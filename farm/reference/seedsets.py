"""Secret seed sets: the truth of a task in reference-data mode beyond the public .pt.

A task whose Model launches Triton kernels and that has no usable Reference cannot be run
on fresh seeds on the target: nothing there computes the right answer. So the reference
worker, which runs the original Model on the reference platform, records further sets of
inputs and outputs from seeds it draws at random and never publishes. They are stored
apart from the .pt (which keeps exactly the existing keys, plus a pointer to them), at

    secrets/<source>/<op>.pt   {"op_name", "source", "pt_seed", "task_sha256", "sets": [
                                 {"seed", "inputs", "outputs"}, ...]}

in the farm's store, never in an --output-dir folder (that folder is the existing tools'
layout and may be handed around). The evaluator holds them in its own process and only ever
sends a candidate the inputs, as it does with fresh Reference seeds: verification and timing
rotate through them, and a candidate that memorised the public outputs fails on them.
"""

from __future__ import annotations

import secrets as _secrets
from typing import Any

from farm.corpus.tasks import validate_name
from farm.errors import FarmError
from farm.reference.ptfile import load_companion
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


def load_sets(store: Store, data: dict[str, Any]) -> list[tuple[list, list]] | None:
    """The (inputs, outputs) seed sets the .pt points at, checked against its recorded sha256;
    None when the .pt records none (Reference mode, or data made by other tools)."""
    pointer = data.get(POINTER)
    if not pointer:
        return None
    key = pointer["key"]
    if store.head(key) is None:
        raise FarmError(f"the reference data of {data.get('source')}/{data.get('op_name')} points at secret seed "
                        f"sets {key}, which {store.url} lacks: run `farm reference` with this store (--store)")
    doc = load_companion(store, key, pointer.get("sha256"))
    sets = doc.get("sets") if isinstance(doc, dict) else None
    if not sets:
        raise FarmError(f"{store.url}/{key}: holds no seed sets")
    return [(list(s["inputs"]), list(s["outputs"])) for s in sets]


def attach(store: Store, data: dict[str, Any]) -> dict[str, Any]:
    """The .pt dict with its seed sets under "_seed_sets" (never written anywhere)."""
    sets = load_sets(store, data)
    if sets is not None:
        data["_seed_sets"] = sets
    return data
