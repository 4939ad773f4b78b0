"""One task file cannot take `farm ops list` down (farm.corpus.listing): whatever a file does
at import (exit, os._exit, segfault, hang, print to stdout or stderr) is that file's row, and
the other files list as they would without it; a forward with no tensor fails `ops check`."""

import json

from farm.corpus import listing
from farm.corpus.tasks import ref_from_file
from tests.conftest import GOOD_TASK, write_task

AT_IMPORT = {
    "exits": "import sys\nsys.exit(0)\n",
    "os_exits": "import os\nos._exit(3)\n",  # not sys.exit: no exception, the process just ends
    "segfaults": "import ctypes\nctypes.string_at(0)\n",
    "prints": "print('hello')\n",
    # a C-level write to stdout and a note on stderr: Python's print is not the only way out
    "writes": "import os, sys\nsys.stderr.write('a warning\\n')\nos.write(1, b'raw')\n",
    "notes": "import sys\nsys.stderr.write('only a warning\\n')\n",
}


def test_what_a_file_does_at_import_is_its_own_row(cli, task_dir):
    for name, top in AT_IMPORT.items():
        write_task(task_dir / "mini", name, top + GOOD_TASK)
    result = cli("ops", "list", "--json")
    assert result.exit_code == 1  # invalid files are listed, and fail the listing
    rows = {r["op"]: r for r in json.loads(result.stdout)}  # valid JSON: nothing a task wrote is in it
    assert rows["scale2"]["status"] == "ok" and rows["notes"]["status"] == "ok"
    assert "only a warning" in rows["notes"]["import_stderr"]
    assert "exits at import" in rows["exits"]["error"]
    assert "exited with code 3" in rows["os_exits"]["error"]
    assert "SIGSEGV" in rows["segfaults"]["error"]
    assert "prints at import" in rows["prints"]["error"] and "prints at import" in rows["writes"]["error"]
    assert all(rows[name]["status"] == "invalid" for name in AT_IMPORT if name != "notes")


def test_a_file_that_hangs_at_import_costs_its_own_timeout(task_dir):
    hang = write_task(task_dir / "mini", "hangs", "import time\ntime.sleep(600)\n" + GOOD_TASK)
    refs = [ref_from_file(hang, "mini"), ref_from_file(task_dir / "mini" / "scale2.py", "mini")]
    rows = listing.load_rows(refs, per_file_s=10)  # the first file pays for importing triton
    assert "hangs at import" in rows["mini/hangs"]["error"]
    assert rows["mini/scale2"]["status"] == "ok", rows["mini/scale2"]


def test_any_file_name_is_listed_with_the_rule_it_breaks(cli, task_dir):
    write_task(task_dir / "mini", "my op", GOOD_TASK)
    result = cli("ops", "list", "--json")
    rows = {r["op"]: r for r in json.loads(result.stdout)}
    assert rows["my op"]["status"] == "invalid" and "must be an op name" in rows["my op"]["error"]
    assert rows["scale2"]["status"] == "ok"


def test_a_forward_with_no_tensor_fails_ops_check(cli, task_dir):
    write_task(task_dir / "mini", "returns_none", GOOD_TASK.replace("        return y\n", "        return None\n", 1))
    # unnamed variant: a Python list of ints holds no tensor either
    write_task(task_dir / "mini", "returns_ints", GOOD_TASK.replace("        return y\n", "        return [1, 2]\n", 1))
    result = cli("ops", "check", "--device", "cpu", "--ops", "returns_none", "--ops", "returns_ints", "--json")
    assert result.exit_code == 1
    rows = {r["op"]: r for r in json.loads(result.stdout)["results"]}
    assert "it returned None, no tensor" in rows["returns_none"]["error"]
    assert "a list of int, no tensor" in rows["returns_ints"]["error"]


def test_a_source_of_misnamed_files_is_an_error_not_an_empty_run(cli, task_dir):
    write_task(task_dir / "odd", "my op", GOOD_TASK)
    result = cli("reference", "--source", "odd", "--device", "cpu")
    assert result.exit_code == 2
    assert "no usable task in source(s) odd" in " ".join(result.stderr.split())


BAD_METADATA = {
    "inplace_past_forward": ("N = 1000\n", "N = 1000\nINPLACE_ARGS = (3,)\n", "INPLACE_ARGS must index forward"),
    "small_shapes_string": ('SMALL_SHAPES = {"N": 37}', 'SMALL_SHAPES = {"N": "37"}', "of the kind of the global"),
    # unnamed variants: a negative size, and GRAD_INPUTS given as a bool
    "small_shapes_negative": ('SMALL_SHAPES = {"N": 37}', 'SMALL_SHAPES = {"N": -1}', "of the kind of the global"),
    "grad_inputs_bool": ("N = 1000\n", "N = 1000\nBACKWARD = True\nGRAD_INPUTS = (True,)\n",
                         "GRAD_INPUTS must be a tuple of argument indices"),
}


def test_bad_metadata_is_not_listed_ok(cli, task_dir):
    for name, (old, new, _) in BAD_METADATA.items():
        write_task(task_dir / "mini", name, GOOD_TASK.replace(old, new, 1))
    rows = {r["op"]: r for r in json.loads(cli("ops", "list", "--json").stdout)}
    for name, (_, _, rule) in BAD_METADATA.items():
        assert rows[name]["status"] == "invalid" and rule in rows[name]["error"], rows[name]
    assert rows["scale2"]["status"] == "ok"


def test_a_model_whose_two_runs_differ_is_flagged_by_ops_check(cli, task_dir):
    write_task(task_dir / "mini", "noisy", GOOD_TASK.replace(
        "        return y\n", "        return y + torch.rand_like(y)\n", 1))
    result = cli("ops", "check", "--device", "cpu", "--ops", "noisy", "--json")
    assert result.exit_code == 1
    [row] = json.loads(result.stdout)["results"]
    assert row["status"] == "nondeterministic" and "two runs on the same inputs differ" in row["error"]


def test_a_large_corpus_is_loaded_by_children_at_once_each_file_its_own_row(task_dir, tmp_path, monkeypatch):
    """On a host of several cores the files are shared among children that load at once; a file
    that ends its child is still only its own row, and every row comes back once."""
    monkeypatch.setattr(listing.os, "cpu_count", lambda: 8)
    monkeypatch.setattr(listing, "SHARD_FILES", 2)
    pids = tmp_path / "pids"
    note = f"import os\nopen({str(pids)!r}, 'a').write(f'{{os.getpid()}}\\n')\n"
    paths = [write_task(task_dir / "mini", f"op{i}", note + GOOD_TASK) for i in range(6)]
    paths.append(write_task(task_dir / "mini", "os_exits", "import os\nos._exit(3)\n" + GOOD_TASK))
    refs = [ref_from_file(p, "mini") for p in paths]
    seen: list[str] = []
    rows = listing.load_rows(refs, per_file_s=20, on_row=lambda row: seen.append(row["op"]))
    assert sorted(seen) == sorted(r.op for r in refs) and sorted(rows) == sorted(r.key for r in refs)
    assert all(rows[f"mini/op{i}"]["status"] == "ok" for i in range(6)), rows
    assert "exited with code 3" in rows["mini/os_exits"]["error"]
    assert len(set(pids.read_text().split())) >= 3  # 7 files, 2 per shard: three children at least
