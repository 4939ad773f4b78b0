"""Where the farm finds the task folders and the default config it ships: the source checkout
it runs from (an editable install or PYTHONPATH), else the copy an installed wheel carries
(farm/bundled/, filled by setup.py from the checkout's tasks/ and configs/farm.yaml)."""

from __future__ import annotations

from pathlib import Path

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
