"""The mistakes a newcomer makes first (issue 12): each gets one line that names the file,
field or option, a non-zero exit, and no traceback; a command whose ops all failed never
exits 0."""

import json
import re

import pytest
import torch

from farm.search import ledger
from farm.storage import open_store
from tests.conftest import GOOD_TASK, write_task

BROKEN_IMPORT = "import farm_no_such_module_xyz\n" + GOOD_TASK
STRING_MODEL = GOOD_TASK.replace("        return y\n", "        return 'done'\n", 1)


def use_sources(tmp_path, monkeypatch, **sources) -> None:
    """A config whose corpus.sources are the given folders (the bundled tasks/ stay known)."""
    cfg = tmp_path / "sources.yaml"
    cfg.write_text("corpus:\n  sources:\n" + "".join(f"    {k}: {v}\n" for k, v in sources.items()))
    monkeypatch.setenv("FARM_CONFIG", str(cfg))


def one_line_error(result, code: int, *needles: str) -> str:
    """The result failed with `code`, no traceback, and an error line holding every needle."""
    text = result.stdout + result.stderr
    assert result.exit_code == code, text
    assert "Traceback" not in text, text
    flat = " ".join(text.replace("│", " ").split())  # a table may wrap a long reason over lines
    for needle in needles:
        assert needle in flat or squashed(needle) in squashed(text), f"{needle!r} not in: {text}"
    return flat


def squashed(text: str) -> str:
    """Text without spaces and table rules: a table wraps a long cell inside its words too."""
    return re.sub(r"[\s│]", "", text)


# ---------------------------------------------------------------- failures that looked like success


def test_farm_run_where_every_op_fails_the_same_way_exits_1_and_says_it_once(cli, tmp_path, monkeypatch):
    folder = tmp_path / "nomod"
    write_task(folder, "first", BROKEN_IMPORT)
    write_task(folder, "second", BROKEN_IMPORT)
    use_sources(tmp_path, monkeypatch, nomod=folder)
    result = cli("run", "--source", "nomod", "--target", "cpu", "--max-tasks", "1")
    flat = one_line_error(result, 1, "every op failed the same way",
                          "No module named 'farm_no_such_module_xyz' (install it: pip install farm_no_such_module_xyz)",
                          "2 of 2 op(s) ended in error", "refs/manifest.json")
    assert flat.count("every op failed the same way") == 1
    cells = " ".join(flat.replace("│", " ").split())  # the table may wrap a long reason over lines
    assert squashed("first.py: fails on import") in squashed(cells)  # the table says why each op failed
    doc = json.loads(cli("run", "--source", "nomod", "--target", "cpu", "--max-tasks", "1", "--json").stdout)
    assert doc["summary"]["failed"] == 2 and {r["status"] for r in doc["ops"]} == {"failed"}
    assert all("No module named" in r["error"] for r in doc["ops"])


def test_farm_run_on_a_task_with_a_syntax_error_exits_1(cli, tmp_path, monkeypatch):
    folder = tmp_path / "syntax"
    write_task(folder, "bad", "def broken(:\n")
    use_sources(tmp_path, monkeypatch, syntax=folder)
    one_line_error(cli("run", "--source", "syntax", "--target", "cpu", "--max-tasks", "1"), 1,
                   "bad.py: is not valid Python", "1 of 1 op(s) ended in error")


def test_a_model_that_returns_a_string_is_not_reference_data(cli, tmp_path, monkeypatch):
    folder = tmp_path / "strings"
    write_task(folder, "words", STRING_MODEL)
    use_sources(tmp_path, monkeypatch, strings=folder)
    one_line_error(cli("ops", "check", "--source", "strings", "--device", "cpu"), 1)
    check = cli("ops", "check", "--source", "strings", "--device", "cpu", "--json")
    assert "Model.forward must return tensors" in check.stdout and "is a str" in check.stdout
    one_line_error(cli("reference", "--source", "strings", "--device", "cpu"), 1, "1 of 1 ops failed")
    assert not list(tmp_path.glob("store/refs/strings/*.pt"))


@pytest.mark.skipif(torch.version.cuda is not None, reason="this torch has CUDA")
def test_target_cuda_with_a_cpu_only_torch_is_refused_up_front(cli):
    one_line_error(cli("run", "--target", "cuda"), 2, "target cuda (--target cuda)", "built without CUDA",
                   "--target cpu")


def test_cache_push_from_a_missing_folder_is_an_error(cli, tmp_path):
    one_line_error(cli("cache", "push", "--from", tmp_path / "nope"), 2, "nope (--from) does not exist")


# ---------------------------------------------------------------- accepted nonsense


@pytest.mark.parametrize("args, option", [
    (["run", "--max-tasks", "0"], "--max-tasks"),
    (["run", "--max-tasks", "-1"], "--max-tasks"),
    (["search", "--source", "demo", "--max-tasks", "0"], "--max-tasks"),
    (["search", "--source", "demo", "--chunk", "0"], "--chunk"),
    (["search", "--source", "demo", "--max-concurrent", "0"], "--max-concurrent"),
    (["reference", "--source", "demo", "--timeout", "-5"], "--timeout"),
    (["ops", "check", "--source", "demo", "--timeout", "0"], "--timeout"),
    (["search", "--source", "demo", "--target", "cpu", "--devices", "abc"], "--devices"),
    (["search", "--source", "demo", "--target", "cpu", "--devices", "0,1"], "--devices"),
    (["eval", "--candidate", "x.py", "--source", "demo", "--op", "row_sum", "--target", "cpu", "--device", "-1"],
     "--device"),
])
def test_nonsense_values_are_usage_errors(cli, args, option):
    one_line_error(cli(*args), 2, option)


@pytest.mark.parametrize("url, meant", [("http//host/x", "http://host/x"), ("s3//bucket/x", "s3://bucket/x")])
def test_store_urls_with_a_typo_are_not_taken_as_folders(cli, tmp_path, url, meant):
    one_line_error(cli("cache", "ls", "--store", url), 2, "(--store)", f"did you mean '{meant}'")
    assert not (tmp_path / url.split("/")[0]).exists()


def test_misnamed_task_files_are_listed_with_the_rule_they_break(cli, tmp_path, monkeypatch):
    folder = tmp_path / "names"
    write_task(folder, "good", GOOD_TASK)
    write_task(folder, "bad name", GOOD_TASK)
    write_task(folder, "-dash", GOOD_TASK)
    use_sources(tmp_path, monkeypatch, names=folder)
    result = cli("ops", "list", "--source", "names", "--json")
    assert result.exit_code == 1
    rows = {r["op"]: r for r in json.loads(result.stdout)}
    assert rows["good"]["status"] == "ok"
    for op in ("bad name", "-dash"):
        assert rows[op]["status"] == "invalid" and "the file name must be an op name" in rows[op]["error"]


def test_a_config_source_may_not_take_a_bundled_sources_name(cli, tmp_path, monkeypatch):
    folder = tmp_path / "mine"
    write_task(folder, "scale2", GOOD_TASK)
    use_sources(tmp_path, monkeypatch, demo=folder)
    one_line_error(cli("ops", "list"), 2, "corpus.sources.demo", "has the name of the source",
                   "give it a name of its own")


# ---------------------------------------------------------------- tracebacks for user mistakes


def test_eval_with_a_text_file_as_ref_pt(cli, tmp_path):
    (tmp_path / "notes.txt").write_text("hello world\n")
    (tmp_path / "cand.py").write_text("x = 1\n")
    one_line_error(cli("eval", "--candidate", tmp_path / "cand.py", "--source", "demo", "--op", "row_sum",
                       "--target", "cpu", "--ref-pt", tmp_path / "notes.txt"), 2,
                   "notes.txt: not a loadable reference .pt", "not a file written by torch.save")


def test_a_config_file_that_is_not_utf8(cli, tmp_path):
    (tmp_path / "latin1.yaml").write_bytes("store: file:///tmp/caf\xe9\n".encode("latin-1"))
    one_line_error(cli("--config", tmp_path / "latin1.yaml", "config", "show"), 2, "latin1.yaml: not UTF-8")


def test_a_store_that_cannot_be_written_is_a_storage_error(cli, tmp_path, task_dir):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder\n")
    one_line_error(cli("run", "--source", "mini", "--target", "cpu", "--max-tasks", "1", "--force",
                       "--store", f"file://{blocker}/store"), 3, "cannot write", "a-file")


def test_verbose_shows_the_traceback(cli, tmp_path):
    result = cli("--verbose", "cache", "push", "--from", tmp_path / "nope")
    assert result.exit_code == 2 and "Traceback" in result.stderr and "(--from)" in result.stderr


def kernel_store(tmp_path, run: str):
    """A store holding one promoted kernel of `run` and the ledger a local run leaves."""
    store = open_store(f"file://{tmp_path / 'store'}")
    meta = {"target": "cpu", "source": "mini", "op": "scale2", "run": run, "time_ms": 1.0, "speedup_vs_model": 2.0}
    store.put_bytes("kernels/cpu/mini/scale2/best.json", json.dumps(meta).encode())
    store.put_bytes("kernels/cpu/mini/scale2/best.py", b"class ModelNew:\n    pass\n")
    ledger.record(store, run, "mini/scale2", "done", {"status": "succeeded", "submitted": 3, "passed": 1,
                                                      "speedup_vs_model": 2.0})
    return store


def test_fetch_out_must_be_a_writable_folder(cli, tmp_path):
    kernel_store(tmp_path, "local-mini-cpu")
    (tmp_path / "taken").write_text("a file\n")
    one_line_error(cli("fetch", "--out", tmp_path / "taken"), 2, "taken (--out) is a file")
    one_line_error(cli("fetch", "--out", tmp_path / "taken" / "sub"), 2, "cannot write to", "(--out)")


# ---------------------------------------------------------------- wrong or mangled messages


def test_square_brackets_survive_in_messages(cli, tmp_path, monkeypatch):
    import farm.storage.s3

    monkeypatch.setattr(farm.storage.s3, "boto3", None)
    one_line_error(cli("cache", "ls", "--store", "s3://bucket/x"), 2, "pip install 'kernel-farm[s3]'")
    one_line_error(cli("cache", "push", "--from", tmp_path / "run[1]"), 2, "run[1] (--from)")


def test_each_message_names_the_option_it_is_about(cli, tmp_path):
    one_line_error(cli("run", "--target", "tpu"), 2, "(--target)")
    (tmp_path / "cand.py").write_text("x = 1\n")
    one_line_error(cli("eval", "--candidate", tmp_path / "cand.py", "--source", "demo", "--op", "../x"), 2,
                   "invalid op name '../x' (--op)")
    (tmp_path / "five.yaml").write_text("reference: 5\n")
    one_line_error(cli("--config", tmp_path / "five.yaml", "config", "show"), 2,
                   "five.yaml: 'reference' must be a mapping of settings, not 5")
    one_line_error(cli("search", "--source", "demo", "--op", "row_sum", "--run", "../up"), 2,
                   "invalid run name '../up' (--run)")


# ---------------------------------------------------------------- inconsistencies


def test_status_and_fetch_know_the_runs_farm_run_makes(cli, tmp_path):
    kernel_store(tmp_path, "local-mini-cpu")
    status = cli("status", "local-mini-cpu", "--json")
    assert status.exit_code == 0, status.output
    view = json.loads(status.stdout)
    assert [(r["op"], r["phase"], r["tried"]) for r in view["ops"]] == [("scale2", "done", 3)]
    fetched = cli("fetch", "local-mini-cpu", "--out", tmp_path / "kernels", "--json")
    assert fetched.exit_code == 0, fetched.output
    assert [k["op"] for k in json.loads(fetched.stdout)["kernels"]] == ["scale2"]
    assert (tmp_path / "kernels" / "cpu" / "mini" / "scale2.py").is_file()


def test_worker_for_a_device_this_host_lacks_does_not_start(cli):
    """A worker on the ascend queue of a host without an NPU would take tasks only to fail them
    (or time the CPU stand-in under the NPU's name): it refuses, naming the device and the way out."""
    pytest.importorskip("celery")
    from farm.targets import get_target, has_device

    if has_device(get_target("ascend")):
        pytest.skip("this host has an NPU")
    flat = one_line_error(cli("worker", "--pool", "search", "--target", "ascend"), 2, "has no ascend device")
    assert "farm run --target ascend" in flat


def test_worker_with_an_unreachable_broker_fails_fast(cli, monkeypatch):
    pytest.importorskip("kombu")
    from tests.s3_server import free_port

    monkeypatch.setenv("FARM_QUEUE_BROKER_URL", f"redis://:secret@127.0.0.1:{free_port()}/0")
    flat = one_line_error(cli("worker", "--pool", "search", "--target", "cpu"), 2, "(queue.broker_url) does not answer")
    assert "secret" not in flat


def test_farm_run_ops_picks_ops_of_the_source_and_names_an_unknown_one(cli, tmp_path, monkeypatch):
    folder = tmp_path / "two"
    write_task(folder, "first", GOOD_TASK)
    write_task(folder, "second", GOOD_TASK)
    use_sources(tmp_path, monkeypatch, two=folder)
    one_line_error(cli("run", "--source", "two", "--ops", "third", "--target", "cpu"), 2,
                   "unknown op(s) third (--ops) in source(s) two")
    result = cli("run", "--source", "two", "--ops", "first", "--target", "cpu", "--max-tasks", "1", "--json",
                 "--no-report")
    assert result.exit_code == 0, result.stdout + result.stderr
    assert [r["op"] for r in json.loads(result.stdout)["ops"]] == ["first"]


def test_farm_run_takes_several_sources_and_ops_across_them(cli, tmp_path, monkeypatch):
    """As `farm reference` and `farm search` do: --source repeats, --ops source/op picks across
    them (ops that fail on import keep it cheap: nothing is searched)."""
    for name in ("left", "right"):
        write_task(tmp_path / name, "same_name", BROKEN_IMPORT)
        write_task(tmp_path / name, f"only_{name}", BROKEN_IMPORT)
    use_sources(tmp_path, monkeypatch, left=tmp_path / "left", right=tmp_path / "right")
    res = cli("run", "--source", "left", "--source", "right", "--ops", "right/same_name", "--ops", "only_left",
              "--target", "cpu", "--json", "--no-report")
    doc = json.loads(res.stdout)
    assert sorted((r["source"], r["op"]) for r in doc["ops"]) == [("left", "only_left"), ("right", "same_name")]
    assert doc["run"] == "local-left-right-cpu"
    # without --source, the sources its --ops name
    doc = json.loads(cli("run", "--ops", "right/only_right", "--target", "cpu", "--json", "--no-report").stdout)
    assert [(r["source"], r["op"]) for r in doc["ops"]] == [("right", "only_right")] and doc["run"] == "local-right-cpu"
