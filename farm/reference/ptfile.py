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
