"""Where the farm finds the task folders and the default config it ships: the source checkout
it runs from (an editable install or PYTHONPATH), else the copy an installed wheel carries
(farm/bundled/, filled by setup.py from the checkout's tasks/ and configs/farm.yaml)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

PACKAGE_ROOT = Path(__file__).resolve().parent.parent
BUNDLED = Path(__file__).resolve().parent / "bundled"


def checkout_root() -> Path | None:
    """The checkout, recognised by its pyproject.toml: an installed package's parent is
    site-packages, where a folder named tasks/ or configs/ could belong to any distribution."""
    return PACKAGE_ROOT if (PACKAGE_ROOT / "pyproject.toml").is_file() else None


def shipped_tasks() -> Path | None:
    checkout = checkout_root()
    for folder in ([checkout / "tasks"] if checkout else []) + [BUNDLED / "tasks"]:
        if folder.is_dir():
            return folder
    return None


def default_config_files() -> list[Path]:
    """Where farm.yaml is looked for when neither --config nor FARM_CONFIG names one, in order."""
    checkout = checkout_root()
    return [Path.cwd() / "configs" / "farm.yaml"] + ([checkout / "configs" / "farm.yaml"] if checkout else []) + [
        BUNDLED / "farm.yaml"]


def cache_file(name: str) -> Path:
    """A file of the farm's per-user cache: FARM_CACHE_DIR, else $XDG_CACHE_HOME/farm or ~/.cache/farm."""
    base = os.environ.get("FARM_CACHE_DIR") or os.path.join(os.environ.get("XDG_CACHE_HOME") or
                                                           os.path.expanduser("~/.cache"), "farm")
    return Path(base) / name


def read_cache(path: Path) -> dict[str, Any]:
    """A cache file's JSON object; {} where it is missing or damaged (a cache only saves work)."""
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}


def write_cache(path: Path, key: str, value: Any) -> None:
    """One entry into a cache file, replaced whole. Best effort: a cache that cannot be written
    only costs the work again next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = read_cache(path)
        doc[key] = value
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError:
        pass
