"""The generated references (docs/reference/cli.md, settings.md) say what the code says: a
command, option or setting changed without `scripts/gen-reference` fails here."""

import pytest

from farm import config
from farm.cli import docgen
from farm.cli.main import COMMANDS
from tests.conftest import REPO


@pytest.fixture(scope="module")
def pages():
    return docgen.render()


def test_the_committed_pages_are_what_the_code_makes(pages):
    for path, text in pages.items():
        assert (REPO / path).read_text(encoding="utf-8") == text, f"{path} is stale: run scripts/gen-reference"


def test_a_page_edited_by_hand_is_stale(tmp_path, pages):
    for path, text in pages.items():
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / path).write_text(text, encoding="utf-8")
    assert docgen.stale(tmp_path) == []
    cli = tmp_path / docgen.PAGES["cli"]
    cli.write_text(cli.read_text().replace("| `--max-tasks` |", "| `--max-candidates` |", 1))
    (tmp_path / docgen.PAGES["settings"]).unlink()
    assert docgen.stale(tmp_path) == [docgen.PAGES["cli"], docgen.PAGES["settings"]]


def test_every_command_option_and_setting_is_on_its_page(pages):
    cli, settings = pages[docgen.PAGES["cli"]], pages[docgen.PAGES["settings"]]
    for name in COMMANDS:
        assert f"## `farm {name}`" in cli, name
    for sub in ("ops list", "ops check", "cache repair", "config show", "ascend setup-frontend"):
        assert f"## `farm {sub}`" in cli, sub
    run = cli.split("## `farm run`")[1].split("\n## ")[0]
    for option in ("`--source`, `-s`", "`--max-tasks` | int (≥ 1) | `12`", "`--report`, `--no-report`", "`--json`"):
        assert option in run, option
    for leaf in config.leaves():
        row = next(line for line in settings.splitlines() if line.startswith(f"| `{leaf.key}` |"))
        assert f"`{leaf.env}`" in row and leaf.help.split("(")[0].strip()[:30] in row, row
    assert "| `queue.chunk_candidates` | int | `8` |" in settings
