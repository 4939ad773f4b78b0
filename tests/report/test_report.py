"""farm report: the page of a real CPU run opened in headless Chromium (no console error, no
request outside the report's folder, every plot drawn), and runs with failed ops and with no
passing kernel rendered with words where there is nothing to plot."""

from __future__ import annotations

import json
import re
import shutil
import sys
from pathlib import Path

import pytest

from farm.config import load_settings
from farm.corpus.tasks import find_tasks
from farm.distributed import runs as dist_runs
from farm.errors import FarmError
from farm.export import fetch as fetching
from farm.generators import Generator, Proposal
from farm.reference.generate import generate_references
from farm.report import collect, figures, page, publish, write_report
from farm.search.batch import search_batch
from farm.search.context import SearchConfig, SearchContext
from farm.search.database import Database, Record
from farm.storage import open_store
from farm.storage.base import dump_json
from farm.targets import resolve_device
from tests.report.chromium import Browser
from tests.s3_server import s3_server  # noqa: F401
from tests.tools import require_tool

CPU = resolve_device("cpu")

# what the page shows a reader: its plots, its empty-chart texts, its sections and links
INSPECT = """JSON.stringify({
  plots: [...document.querySelectorAll('img.plot')].map(i => ({src: i.getAttribute('src'), ok: i.complete,
          w: i.naturalWidth, h: i.naturalHeight})),
  empty: [...document.querySelectorAll('.empty')].map(e => e.textContent),
  sections: [...document.querySelectorAll('h2')].map(h => h.id),
  text: document.body.innerText,
})"""


def open_page(page: Path, shot: Path | None = None, root: Path | None = None) -> tuple[dict, object]:
    """The page as Chromium shows it; fails on any error and on any request outside `root`."""
    require_tool("chromium")
    with Browser() as browser:
        load = browser.load(page.resolve().as_uri(), script=INSPECT, screenshot=shot)
    assert load.errors == [], load.errors
    outside = [u for u in load.requests if not u.startswith((root or page.parent).resolve().as_uri() + "/")]
    assert outside == [], f"the page fetched from outside its folder: {outside}"
    return json.loads(load.result), load


def local_links(page: Path) -> list[Path]:
    hrefs = re.findall(r'(?:href|src)="([^"#:]+)"', page.read_text())
    return [page.parent / h for h in hrefs]


def test_report_of_a_real_cpu_run_opens_in_chromium(cli, tmp_path):
    result = cli("run", "--max-tasks", "3")  # two seeds and a child per op
    assert result.exit_code == 0, result.output
    assert "report: reports/local-demo-cpu/index.html" in result.output
    assert (tmp_path / "reports/local-demo-cpu/index.html").is_file()

    result = cli("report", "--latest", "--out", tmp_path / "page")
    assert result.exit_code == 0, result.output
    page = tmp_path / "page/index.html"
    assert f"report of run local-demo-cpu: {page}" in result.output

    shot = tmp_path / "page.png"
    seen, _ = open_page(page, shot)
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
    # every plot is there and drawn: three run plots and one lineage per op, none replaced by words
    assert len(seen["plots"]) == 3 + 3 and seen["empty"] == []
    assert all(p["ok"] and p["w"] > 100 and p["h"] > 50 for p in seen["plots"]), seen["plots"]
    for svg in (tmp_path / "page/plots").glob("*.svg"):
        assert svg.read_text().count("<path") > 5, svg
    assert seen["sections"] == ["summary", "ops", "speedup", "progress", "verdicts", "failures", "lineage"]
    text = seen["text"]
    for op in ("demo/row_sum", "demo/swiglu", "demo/vector_add_scale"):
        assert op in text
    assert "not recorded" not in text.split("Ops")[0]  # the summary's figures all come from the store
    assert "flush write" in text and "host_clock" in text and "fresh input set" in text
    assert "vs torch.compile" in text and "not measured" in text  # no search here times torch.compile
    for link in local_links(page):
        assert link.is_file(), link
    diffs = list((tmp_path / "page/ops").glob("*/diff.html"))
    assert len(diffs) == 3
    for diff in diffs:
        open_page(diff, root=page.parent)
        assert "vs its parent" in diff.read_text() or "is a seed" in diff.read_text()


class Broken(Generator):
    """An initial candidate that launches no Triton kernel: the evaluator rejects it, nothing passes."""

    name = "broken"

    def initial_candidates(self, ctx):
        return [Proposal("import torch\nclass ModelNew(torch.nn.Module):\n    def forward(self, x):\n"
                         "        return x\n", self.name, "no kernel")]

    def propose(self, parent, inspirations, ctx, n=1):
        return []


@pytest.fixture(scope="module")
def broken_store(tmp_path_factory) -> Path:
    """A real batch search where one op has no passing kernel and one has no reference data."""
    root = tmp_path_factory.mktemp("broken") / "store"
    store = open_store(f"file://{root}")
    settings, _ = load_settings(overrides={"corpus.tasks_dir": ""})
    refs = find_tasks(settings, ["demo"], ["row_sum", "swiglu"])
    assert generate_references(refs[:1], store, CPU, 0, "small", 120)[0]["success"]
    rows = search_batch(refs, SearchContext(store, "broken", "cpu", [CPU], [Broken()],
                                            SearchConfig(max_tasks=3, max_concurrent=1)))
    assert [r["status"] for r in rows] == ["zero_pass", "failed"]
    return root


@pytest.fixture
def broken_run(broken_store, tmp_path):
    """A copy of that store, for this test alone to change."""
    shutil.copytree(broken_store, tmp_path / "broken-store")
    return open_store(f"file://{tmp_path / 'broken-store'}")


def test_failed_and_zero_pass_ops_render_with_words_not_empty_charts(broken_run, tmp_path):
    page = write_report(broken_run, "broken", tmp_path / "page")
    seen, _ = open_page(page, tmp_path / "page.png")
    assert [p["src"] for p in seen["plots"]] == ["plots/verdicts.svg", "plots/lineage-0.svg"]
    empty = " | ".join(seen["empty"])
    assert "No op has a passing kernel" in empty and "made no measurable progress" in empty
    assert "could not run: no reference data" in empty and "No candidate passed" in empty
    text = seen["text"]
    assert "zero_pass" in text and "failed" in text and "cheat" in text
    assert re.search(r"op failed\s+demo/swiglu\s+no reference data", text)  # the failures table, with its reason


def test_a_distributed_run_in_the_store_reports_status_and_travels_with_fetch(broken_run, cli, tmp_path):
    spec = dist_runs.RunSpec(run="broken", source="demo", ops=["row_sum", "swiglu"], target="cpu",
                             reference_target="cpu", shapes="small", generators=["broken"], max_tasks=3,
                             chunk_candidates=3, max_concurrent=1)
    dist_runs.save_run(broken_run, spec)
    dist_runs.update_op(broken_run, "broken", "demo", "row_sum", phase="done")
    dist_runs.update_op(broken_run, "broken", "demo", "swiglu", phase="failed", error="reference data: boom")
    store_url = broken_run.url
    result = cli("status", "broken", "--store", store_url)
    assert result.exit_code == 0, result.output
    assert "report: reports/broken/index.html" in result.output and (tmp_path / "reports/broken/index.html").is_file()
    result = cli("report", "broken", "--publish", "--store", store_url, "--out", tmp_path / "pub")
    assert result.exit_code == 0 and "runs/broken/report/index.html" in result.output
    assert "reference data: boom" in (tmp_path / "pub/index.html").read_text()
    got = fetching.fetch_report(broken_run, "broken", tmp_path / "home" / "report")
    assert got == "report/index.html"
    assert sorted(p.name for p in (tmp_path / "home/report/plots").iterdir()) == ["lineage-0.svg", "verdicts.svg"]


def test_run_figures_never_divide_by_zero_or_invent_numbers():
    empty = collect.RunView("r", "file:///x", "batch", [collect.OpView("s", "a", "failed", error="boom 12 MiB")])
    t = collect.totals(empty)
    assert t["device_s"] is None and t["per_device_minute"] is None and t["duration_s"] is None
    assert figures.speedup_chart(empty) is None and figures.progress_chart(empty) is None
    assert figures.verdict_chart(empty) is None and figures.lineage_chart(empty.ops[0]) is None
    op = collect.OpView("s", "b", "succeeded", summary={"baseline": {"model_ms": 4.0, "compile_ms": 2.0}},
                        candidates=[
                            {"id": "c0001", "verdict": "mismatch", "error": "output 0: max abs 3.5 at 17"},
                            {"id": "c0002", "verdict": "pass", "time_ms": 2.0, "speedup_vs_model": 2.0},
                            {"id": "c0003", "verdict": "mismatch", "error": "output 0: max abs 0.25 at 4"},
                            {"id": "c0004", "verdict": "pass", "time_ms": 1.0, "speedup_vs_model": 4.0,
                             "parent": "c0002"}])
    assert op.speedup("model") == 4.0 and op.speedup("compile") == 2.0 and op.speedup("reference") is None
    assert collect.best_so_far(op) == ("model", [None, 2.0, 2.0, 4.0])
    assert collect.ancestry(op, "c0004") == ["c0002", "c0004"]
    [group] = collect.failure_groups(collect.RunView("r", "u", "batch", [op]))
    assert group["count"] == 2 and group["key"] == "mismatch: output N: max abs N at N"
    # the end-of-search re-timing (what promotion used) wins over the search's own figure
    op.summary["confirmation"] = {"time_ms": 1.1, "model": {"ratio": 3.5}}
    assert op.speedup("model") == 3.5 and op.speedup("compile") == 2.0
    # a serving mix (issue 32): its geomean is the op's speedup, its cases a table on the op's page
    rows = [{"label": "bench", "shape": [[7, 300]], "time_ms": 1.1, "model_ms": 3.9, "speedup": 3.5},
            {"label": "low", "shape": [[1, 300]], "time_ms": 0.2, "model_ms": 0.1, "speedup": 0.5}]
    op.summary["confirmation"] = {"time_ms": 1.1, "model": {"ratio": 3.5}, "mix": {"ratio": 1.32},
                                  "timing": {"cases": rows}}
    assert op.speedup("model") == 1.32
    table = page.cases_table(op, op.best)
    assert "<td>low</td><td>[[1, 300]]</td><td>0.2</td><td>0.1</td><td>0.5x</td>" in table
    op.summary["confirmation"] = {"error": "timed out", "time_ms": None}
    assert op.speedup("model") == 4.0 and page.cases_table(op, op.best) == ""


def test_lineage_layout_centres_parents_and_keeps_islands_apart():
    cands = [{"id": "c1", "lineage": 0, "generation": 0}, {"id": "c2", "lineage": 1, "generation": 0},
             {"id": "c3", "lineage": 0, "generation": 1, "parent": "c1"},
             {"id": "c4", "lineage": 0, "generation": 1, "parent": "c1"}]
    pos = figures.tree_layout(cands)
    assert pos["c1"] == ((pos["c3"][0] + pos["c4"][0]) / 2, 0) and pos["c3"][1] == -1
    assert pos["c2"][0] > max(pos["c3"][0], pos["c4"][0]) + 1  # island 1 after island 0 and a gap


def test_latest_and_unknown_runs(broken_run, cli):
    assert collect.latest_run(broken_run) == "broken"
    with pytest.raises(FarmError, match="no run 'nope'.*broken"):
        collect.load_run(broken_run, "nope")
    result = cli("report", "--store", broken_run.url)
    assert result.exit_code == 2 and "name a run, or give --latest" in result.output


def test_without_matplotlib_report_says_how_to_install(cli, broken_run, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib now raises ImportError
    result = cli("report", "broken", "--store", broken_run.url)
    assert result.exit_code == 2 and "pip install 'kernel-farm[report]'" in result.output


def test_publish_to_s3_and_fetch_home(broken_run, s3_server, tmp_path):  # noqa: F811
    page = write_report(broken_run, "broken", tmp_path / "page")
    s3 = s3_server.store("farm")
    key = publish(s3, "broken", page.parent)
    assert key == "runs/broken/report/index.html" and s3.exists(key)
    written = sorted(p.relative_to(page.parent).as_posix() for p in page.parent.rglob("*")
                     if p.is_file() and p.name != ".kfarm-owned.json")  # the folder's own marker stays home
    assert sorted(i.key[len("runs/broken/report/"):] for i in s3.list("runs/broken/report/")) == written
    assert fetching.fetch_report(s3, "broken", tmp_path / "home" / "report") == "report/index.html"
    assert (tmp_path / "home/report/index.html").read_bytes() == page.read_bytes()
    assert fetching.fetch_report(s3, "other", tmp_path / "none") is None


def test_a_search_in_progress_reports_its_checkpoint(tmp_path):
    store = open_store(f"file://{tmp_path / 'store'}")
    db = Database()
    db.add(Record(id="c0001", source="x = 1", generator="tune", note="seed", lineage=0, generation=0, parent=None,
                  source_hash="h1", verdict="pass", time_ms=2.0, speedup_vs_model=1.5))
    db.add(Record(id="c0002", source="x = 2", generator="tune", note="", lineage=0, generation=1, parent="c0001",
                  source_hash="h2"))  # in flight: not a result yet
    state = {"status": "running", "target": "cpu", "config": {"flush": "write"}, "db": db.to_dict()}
    store.put_bytes("runs/live/demo/row_sum/state.json", dump_json(state))
    [op] = collect.load_run(store, "live").ops
    assert op.status == "running" and [c["id"] for c in op.candidates] == ["c0001"] and op.best["id"] == "c0001"
    store.put_bytes("runs/live/demo/row_sum/state.json", dump_json({**state, "status": "done"}))
    assert collect.load_run(store, "live").ops[0].status == "succeeded"
