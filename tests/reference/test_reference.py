"""`farm reference`: the .pt format, a failing op kept to its child process, skipping, the merged manifest."""

import json
import multiprocessing as mp
from pathlib import Path

import torch

from farm.corpus.tasks import load_task, ref_from_file
from farm.reference import manifest
from farm.reference.generate import PT_KEYS, generate_references, load_pt
from farm.runtime.tolerance import all_ok, compare_outputs
from farm.storage import open_store
from farm.targets import resolve_device
from tests.conftest import GOOD_TASK, write_task
from tests.reference.manifest_writer import record_one

CPU = resolve_device("cpu")

INPLACE_TASK = GOOD_TASK.replace("""    def forward(self, x):
        y = torch.empty_like(x)
        _scale[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y""", """    def forward(self, x):
        _scale[(triton.cdiv(x.numel(), 64),)](x, x, x.numel(), BLOCK=64)
        return x""").replace("""    def forward(self, x):
        return x * 2.0""", """    def forward(self, x):
        return x.mul_(2.0)""") + "\nINPLACE_ARGS = (0,)\n"

MIXED_OUTPUTS_TASK = GOOD_TASK.replace("        return y\n", "        return y, x.numel(), 2.5, True, None\n").replace(
    "        return x * 2.0\n", "        return x * 2.0, x.numel(), 2.5, True, None\n")


def run(tmp_path, folder, **kw):
    refs = [ref_from_file(p, "mini") for p in sorted(Path(folder).glob("*.py"))]
    store = open_store(f"file://{tmp_path / 'store'}")
    return store, generate_references(refs, store, CPU, kw.pop("seed", 0), "small", kw.pop("timeout", 60), **kw)


def test_pt_has_the_tool_chain_keys_and_loads_weights_only(tmp_path):
    write_task(tmp_path / "t", "scale2", GOOD_TASK)
    store, [result] = run(tmp_path, tmp_path / "t")
    assert result["success"] and result["key"] == "refs/mini/scale2.pt"
    store.get_file(result["key"], tmp_path / "x.pt")
    data = torch.load(tmp_path / "x.pt", weights_only=True)
    assert set(PT_KEYS) <= set(data)
    assert data["op_name"] == "scale2" and data["seed"] == 0 and data["save_inputs"] is True
    assert isinstance(data["outputs"], list) and data["outputs"][0].device.type == "cpu"
    assert data["input_dtypes"] == ["torch.float32"] and data["output_dtypes"] == ["torch.float32"]
    assert list(data["input_shapes"][0]) == [37]
    assert data["source"] == "mini" and len(data["task_sha256"]) == 64 and data["device"] == "cpu"
    assert {"torch_version", "triton_version", "reference_time_s", "device_name"} <= set(data)


def test_pt_is_consumed_like_the_ascend_tool_chain(tmp_path):
    """Plain torch.load, ModelNew(*init_inputs)(*inputs), compared with outputs."""
    path = write_task(tmp_path / "t", "mixed", MIXED_OUTPUTS_TASK)
    store, [result] = run(tmp_path, tmp_path / "t")
    store.get_file(result["key"], tmp_path / "m.pt")
    data = torch.load(tmp_path / "m.pt", weights_only=True)
    ModelNew = load_task(ref_from_file(path)).reference_cls  # a correct candidate
    got = ModelNew(*data["init_inputs"])(*data["inputs"])
    checks = compare_outputs(list(got), data["outputs"])
    assert all_ok(checks)
    assert data["outputs"][1:] == [37, 2.5, True, None]
    assert data["output_shapes"][1:] == [None] * 4
    wrong = list(got)
    wrong[1] = 36
    assert not all_ok(compare_outputs(wrong, data["outputs"]))


def test_inputs_are_saved_before_an_in_place_forward(tmp_path):
    write_task(tmp_path / "t", "inplace", INPLACE_TASK)
    store, [result] = run(tmp_path, tmp_path / "t")
    store.get_file(result["key"], tmp_path / "i.pt")
    data = load_pt(tmp_path / "i.pt")
    torch.manual_seed(0)
    original = torch.randn(37)
    assert torch.equal(data["inputs"][0], original)
    assert torch.equal(data["outputs"][0], original * 2)


def test_same_task_seed_and_device_give_identical_tensors(tmp_path):
    write_task(tmp_path / "t", "scale2", GOOD_TASK)
    store, _ = run(tmp_path, tmp_path / "t")
    store.get_file("refs/mini/scale2.pt", tmp_path / "a.pt")
    store, _ = run(tmp_path, tmp_path / "t", force=True)
    store.get_file("refs/mini/scale2.pt", tmp_path / "b.pt")
    a, b = load_pt(tmp_path / "a.pt"), load_pt(tmp_path / "b.pt")
    assert torch.equal(a["inputs"][0], b["inputs"][0]) and torch.equal(a["outputs"][0], b["outputs"][0])
    store, _ = run(tmp_path, tmp_path / "t", force=True, seed=1)
    store.get_file("refs/mini/scale2.pt", tmp_path / "c.pt")
    assert not torch.equal(load_pt(tmp_path / "c.pt")["inputs"][0], a["inputs"][0])


FAILING = {
    "bad_import": ("import", "import no_such_module_abc\n" + GOOD_TASK, "ModuleNotFoundError"),
    "bad_init": ("init", GOOD_TASK.replace("class Model(nn.Module):\n",
                                           "class Model(nn.Module):\n    def __init__(self):\n        raise RuntimeError('no init')\n"),
                 "no init"),
    "bad_inputs": ("get_inputs", GOOD_TASK.replace("return [torch.randn(N)]", "raise ValueError('no inputs')"), "no inputs"),
    "bad_forward": ("forward", GOOD_TASK.replace("y = torch.empty_like(x)",
                                                 "raise torch.OutOfMemoryError('CUDA out of memory. Tried to allocate 80 GiB')"),
                    "out of memory"),
    # the memory guard runs forward on the meta device first: a forward that hangs or crashes does so there
    "hangs": ("size_check", GOOD_TASK.replace("y = torch.empty_like(x)", "import time; time.sleep(120)"), "no result after"),
    "segfaults": ("size_check", GOOD_TASK.replace("y = torch.empty_like(x)", "import os, signal; os.kill(os.getpid(), signal.SIGSEGV)"),
                  "SIGSEGV"),
}


def test_each_failure_is_recorded_with_its_stage_and_the_batch_goes_on(tmp_path):
    for name, (_stage, body, _text) in FAILING.items():
        write_task(tmp_path / "t", name, body)
    write_task(tmp_path / "t", "zz_good", GOOD_TASK)
    store, results = run(tmp_path, tmp_path / "t", timeout=10)
    by_op = {r["op_name"]: r for r in results}
    for name, (stage, _body, text) in FAILING.items():
        assert by_op[name]["success"] is False, name
        assert by_op[name]["stage"] == stage, (name, by_op[name])
        assert text in by_op[name]["error"], (name, by_op[name]["error"])
        assert store.head(f"refs/mini/{name}.pt") is None
    assert by_op["zz_good"]["success"]
    entries = manifest.entries(store)
    assert entries["mini/bad_forward"]["stage"] == "forward" and entries["mini/zz_good"]["success"]


def test_current_ops_are_skipped_unless_forced_or_changed(tmp_path):
    path = write_task(tmp_path / "t", "scale2", GOOD_TASK)
    store, [first] = run(tmp_path, tmp_path / "t")
    _, [again] = run(tmp_path, tmp_path / "t")
    assert again.get("skipped") and again["created_at"] == first["created_at"]
    _, [forced] = run(tmp_path, tmp_path / "t", force=True)
    assert not forced.get("skipped")
    path.write_text(GOOD_TASK.replace("x * 2.0", "x * 2.0 + 0.0"))
    _, [changed] = run(tmp_path, tmp_path / "t")
    assert not changed.get("skipped") and changed["task_sha256"] != first["task_sha256"]
    _, [reseeded] = run(tmp_path, tmp_path / "t", seed=7)
    assert not reseeded.get("skipped")


def test_failed_regeneration_keeps_the_last_good_object(tmp_path):
    path = write_task(tmp_path / "t", "scale2", GOOD_TASK)
    store, [good] = run(tmp_path, tmp_path / "t")
    path.write_text(GOOD_TASK.replace("y = torch.empty_like(x)", "raise RuntimeError('broken now')"))
    run(tmp_path, tmp_path / "t")
    entry = manifest.entries(store)["mini/scale2"]
    assert entry["success"] is False and entry["last_success"]["sha256"] == good["sha256"]
    assert store.head("refs/mini/scale2.pt").sha256 == good["sha256"]


def test_concurrent_writers_all_land_in_the_manifest(tmp_path):
    ctx = mp.get_context("spawn")
    procs = [ctx.Process(target=record_one, args=(str(tmp_path / "s"), i)) for i in range(8)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    doc = open_store(f"file://{tmp_path / 's'}").read_json(manifest.MANIFEST_KEY)
    assert sorted(doc["entries"]) == sorted(f"src{i % 2}/op{i}" for i in range(8))
    assert doc["total"] == 8 and doc["success"] == 8


def _slow_task(stamp_dir: Path, name: str) -> str:
    """GOOD_TASK whose get_inputs waits 2 s and writes when it ran (in the reference child)."""
    return GOOD_TASK.replace("def get_inputs():\n", f"""def get_inputs():
    import time, os
    start = time.time()
    time.sleep(2.0)
    with open(os.path.join({str(stamp_dir)!r}, "{name}-" + str(os.getpid())), "a") as f:
        f.write(f"{{start}} {{time.time()}}\\n")
""")


def test_jobs_run_ops_at_once_and_every_result_lands_in_the_manifest(tmp_path):
    stamps = tmp_path / "stamps"
    stamps.mkdir()
    folder = tmp_path / "tasks"
    for i in range(4):
        write_task(folder, f"slow{i}", _slow_task(stamps, f"slow{i}"))
    store, results = run(tmp_path, folder, jobs=4, seed_sets=0)
    assert [r["op_name"] for r in results] == ["slow0", "slow1", "slow2", "slow3"]  # asked-for order
    assert all(r["success"] for r in results), [r["error"] for r in results]
    assert set(manifest.entries(store)) == {f"mini/slow{i}" for i in range(4)}  # no lost update
    spans = [(f.name.split("-")[0], *map(float, line.split()))
             for f in stamps.iterdir() for line in f.read_text().splitlines()]
    overlapping = {(a[0], b[0]) for a in spans for b in spans if a[0] < b[0] and a[1] < b[2] and b[1] < a[2]}
    assert overlapping, "with 4 jobs, get_inputs of different ops should run at the same time"


def test_reference_jobs_option_is_checked(cli, task_dir):
    result = cli("reference", "--device", "cpu", "--jobs", "-1")
    assert result.exit_code != 0 and "reference.jobs" in result.output


def test_runs_over_different_sources_merge(tmp_path, cli, task_dir):
    write_task(task_dir / "other", "scale3", GOOD_TASK)
    out = tmp_path / "refs_out"
    assert cli("reference", "--device", "cpu", "--source", "mini", "--output-dir", out).exit_code == 0
    assert cli("reference", "--device", "cpu", "--source", "other", "--output-dir", out).exit_code == 0
    assert (out / "mini" / "scale2.pt").is_file() and (out / "other" / "scale3.pt").is_file()
    doc = json.loads((out / "manifest.json").read_text())
    assert set(doc["entries"]) == {"mini/scale2", "other/scale3"}
    fields = {"op_name", "source", "success", "key", "sha256", "size_bytes", "elapsed_s", "error", "device", "created_at"}
    assert fields <= set(doc["entries"]["mini/scale2"])


def test_cli_exit_code_and_summary_after_all_ops_tried(cli, task_dir):
    write_task(task_dir / "mini", "broken", GOOD_TASK.replace("y = torch.empty_like(x)", "raise RuntimeError('kaput')"))
    result = cli("reference", "--device", "cpu", "--json")
    assert result.exit_code == 1
    rows = {r["op_name"]: r for r in json.loads(result.stdout)["results"]}
    assert rows["scale2"]["success"] and not rows["broken"]["success"]
    table = cli("reference", "--device", "cpu")
    assert "failed (forward)" in table.stdout and "skipped (current)" in table.stdout
    # the folder holds everything the target needs: a store beside it would be a second home for half of it
    both = cli("reference", "--device", "cpu", "--output-dir", "x", "--store", "file://y")
    assert both.exit_code == 2 and "--output-dir" in both.output and "--store" in both.output
    assert not Path("x").exists() and not Path("y").exists()


def test_cache_ls_verify_push_pull(cli, tmp_path, task_dir):
    folder = tmp_path / "cache"
    assert cli("reference", "--device", "cpu", "--output-dir", folder).exit_code == 0
    store_url = f"file://{tmp_path / 'central'}"
    pushed = cli("cache", "push", "--from", folder, "--store", store_url, "--json")
    assert pushed.exit_code == 0 and json.loads(pushed.stdout)[0]["status"] == "copied"
    assert json.loads(cli("cache", "push", "--from", folder, "--store", store_url, "--json").stdout)[0]["status"] == "up to date"
    listed = json.loads(cli("cache", "ls", "--store", store_url, "--json").stdout)
    assert [(r["op"], r["status"]) for r in listed] == [("scale2", "ok")]
    assert cli("cache", "verify", "--store", store_url).exit_code == 0
    back = tmp_path / "back"
    assert cli("cache", "pull", "--to", back, "--store", store_url).exit_code == 0
    assert (back / "mini" / "scale2.pt").read_bytes() == (folder / "mini" / "scale2.pt").read_bytes()
    assert "mini/scale2" in json.loads((back / "manifest.json").read_text())["entries"]
    # corruption is detected, named, and the bad object is never copied on
    target = tmp_path / "central" / "refs" / "mini" / "scale2.pt"
    target.write_bytes(target.read_bytes()[:-10] + b"0123456789")
    bad = cli("cache", "verify", "--store", store_url)
    assert bad.exit_code == 1 and "corrupt" in bad.stdout
    again = cli("cache", "pull", "--to", tmp_path / "back2", "--store", store_url)
    assert again.exit_code == 1 and not (tmp_path / "back2" / "mini" / "scale2.pt").exists()


def test_folder_from_other_tools_without_manifest_is_pushed(cli, tmp_path):
    folder = tmp_path / "legacy"
    (folder / "sglang").mkdir(parents=True)
    # the existing tools' .pt: every key of the format, none of the farm's extras
    x = torch.ones(2)
    torch.save({"op_name": "x", "seed": 0, "save_inputs": True, "inputs": [x], "input_shapes": [x.shape],
                "input_dtypes": [str(x.dtype)], "outputs": [x * 2], "output_shapes": [x.shape],
                "output_dtypes": [str(x.dtype)], "init_inputs": []}, folder / "sglang" / "x.pt")
    torch.save({"op_name": "y", "outputs": [x]}, folder / "sglang" / "y.pt")  # not reference data: refused
    store_url = f"file://{tmp_path / 'central'}"
    result = cli("cache", "push", "--from", folder, "--store", store_url, "--json")
    assert result.exit_code == 1
    assert {r["op"]: r["status"] for r in json.loads(result.stdout)} == {"x": "copied", "y": "refused"}
    listed = json.loads(cli("cache", "ls", "--store", store_url, "--json").stdout)
    assert [(r["source"], r["op"], r["status"]) for r in listed] == [("sglang", "x", "ok")]
