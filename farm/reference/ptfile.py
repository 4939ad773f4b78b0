"""Reading a .pt that came from elsewhere: tensors and plain values only (weights_only)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from farm.errors import FarmError


def load_pt_file(path: str | Path) -> Any:
    """torch.load, weights_only: tensors and plain values only."""
    import pickle

    import torch

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError, OSError, KeyError, ValueError, TypeError) as exc:
        # KeyError/ValueError: what torch's legacy unpickler raises on a file that is not a .pt at all
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if isinstance(exc, KeyError):
            first = "not a file written by torch.save"
        raise FarmError(f"{path}: not a loadable reference .pt (weights_only): {first}") from None


def load_companion(store, key: str, sha256: str | None) -> Any:
    """An object a .pt points at (its secret input sets, its cases) from `store`, checked against
    the sha256 the .pt records, then loaded weights_only."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="farm-companion-") as tmp:
        info = store.get_file(key, Path(tmp) / "object.pt")
        if sha256 and info.sha256 != sha256:
            raise FarmError(f"{store.url}/{key}: sha256 does not match the one the reference data records")
        return load_pt_file(Path(tmp) / "object.pt")
