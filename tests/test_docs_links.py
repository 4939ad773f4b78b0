"""Every relative link of the README and docs/ leads somewhere: the file exists and, where the
link names a section (`page.md#anchor`), the page has a heading with that anchor. Pages move
and sections are renamed; a link left behind fails here."""

import re
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO

LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def pages() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, spaces to '-', punctuation but '-' and '_' dropped."""
    text = re.sub(r"[`*]", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    out, fenced = set(), False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            out.add(anchor(line.lstrip("#")))
    return out


def links(page: Path) -> list[str]:
    out, fenced = [], False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            fenced = not fenced
        elif not fenced:
            out += LINK.findall(line)
    return [t for t in out if not re.match(r"[a-z]+:", t)]  # http:, https:, mailto:


def test_every_relative_link_resolves():
    broken = []
    for page in pages():
        for target in links(page):
            path, _, section = target.partition("#")
            dest = (page.parent / path).resolve() if path else page
            if not dest.exists():
                broken.append(f"{page.relative_to(REPO)}: {target} (no such file)")
            elif section and dest.suffix == ".md" and section not in anchors(dest):
                broken.append(f"{page.relative_to(REPO)}: {target} (no such section)")
    assert not broken, "\n".join(broken)


def test_a_link_to_a_missing_section_is_caught(tmp_path):
    page = tmp_path / "a.md"
    page.write_text("# A page\n\n## The `dispatch` rule (v2)\n\n```\n# not a heading\n```\n")
    assert anchors(page) == {"a-page", "the-dispatch-rule-v2"}


RESULTS = REPO / "docs" / "results.md"
RAW = re.compile(r"`([\w./*-]+(?:/|\.json|\.md|\.txt))`")
COMMIT = re.compile(r"\| (?:after )?([0-9a-f]{7,40}) \(\d{4}-\d\d-\d\d\) \|")


def figure_rows() -> list[str]:
    """The rows of results.md's provenance tables: those with a hardware column."""
    return [line for line in RESULTS.read_text(encoding="utf-8").splitlines()
            if line.startswith("|") and re.search(r"\| (H100|2-core CPU|H100 grid, CPU replay)[^|]*\|", line)]


def test_every_figure_names_its_hardware_commit_command_and_raw_file():
    rows = figure_rows()
    assert len(rows) >= 15
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        if "not measured yet" in row:
            continue
        assert COMMIT.search(row), f"no commit in: {row}"
        assert "`" in cells[-2], f"no command in: {row}"
        raws = RAW.findall(cells[-1])
        assert raws, f"no raw file in: {row}"
        for raw in raws:
            assert list((REPO / "bench" / "results").glob(raw.rstrip("/"))), f"{raw} is not under bench/results/"


def test_the_commits_of_the_results_are_in_the_history():
    shallow = subprocess.run(["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True)
    if shallow.returncode != 0 or shallow.stdout.strip() != "false":
        pytest.skip("not a full git clone: commits cannot be looked up")
    for commit in {m for row in figure_rows() for m in COMMIT.findall(row)}:
        found = subprocess.run(["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True)
        assert found.returncode == 0, f"docs/results.md names commit {commit}, which this history does not have"
