"""The README's two commands for a fresh machine, read from README.md itself: the one place they
are written, so the README, `.ci/run` and the tests cannot drift apart.

    python .ci/readme_commands.py first   # pip install ... && farm run
    python .ci/readme_commands.py test    # scripts/install-test-tools && ... pytest

They are the indented command lines of the section "## Two commands for a fresh machine", in
order. Anything else there (zero or three commands) is an error, so an edit that breaks the
section breaks CI instead of silently running something else.
"""

from __future__ import annotations

import sys
from pathlib import Path

SECTION = "## Two commands for a fresh machine"
NAMES = ("first", "test")


def commands(readme: Path) -> list[str]:
    lines = readme.read_text(encoding="utf-8").splitlines()
    if SECTION not in lines:
        raise SystemExit(f"{readme}: no section {SECTION!r}")
    found = []
    for line in lines[lines.index(SECTION) + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("    ") and line.strip():
            found.append(line.strip())
    if len(found) != len(NAMES):
        raise SystemExit(f"{readme}: section {SECTION!r} holds {len(found)} indented commands, expected {len(NAMES)}")
    return found


def main(argv: list[str]) -> None:
    if len(argv) != 1 or argv[0] not in NAMES:
        raise SystemExit(f"usage: readme_commands.py {'|'.join(NAMES)}")
    readme = Path(__file__).resolve().parent.parent / "README.md"
    print(commands(readme)[NAMES.index(argv[0])])


if __name__ == "__main__":
    main(sys.argv[1:])
