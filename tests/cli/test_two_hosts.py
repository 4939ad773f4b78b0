"""The existing tools' two-step flow through a copied folder, for every mode of op: the reference
host writes a folder, only the folder travels (shutil.copytree, as `scp -r` would), and the
target host, with its own HOME, store and clone of the task files, searches one op by path and
the whole folder in batch, read in place. A folder made by the existing tools' generator (no
secret input sets) is searched too, its weaker check labelled; a damaged or mixed-up folder is
named with its repair."""

import io
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from typer.testing import CliRunner

from farm.cli.main import app
from farm.corpus import tasks as taskfiles
from farm.reference import secret_inputs
from tests.conftest import write_task
from tests.corpus import akg_style

AKG = Path("akg_agents") / taskfiles.AKG_CORPUS
TASKS = {  # source -> (AKG folder, op, task file, mode)
    "sglang": ("sglang", "twice_pure", akg_style.PURE_SGLANG, "reference"),
    "vllm_triton": ("vllm/triton_ops", "twice_vllm", akg_style.VLLM_CLASS, "reference-data"),
    "vllm_torch": ("vllm/torch_ops", "twice_torch", akg_style.TORCH_MODEL, "model"),
}
# two candidates: on a loaded machine (CI's 2 cores, two test processes) one may miss its time limit
SEARCH = ["--target", "cpu", "--max-tasks", "2", "--generators", "tune>inductor", "--json"]


def _host(root: Path) -> dict[str, str]:
    """One host: its HOME, its store, its clone of AKG's task files (corpus.akg_root)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "farm.yaml").write_text(f"corpus:\n  akg_root: {root / 'akg'}\n")
    return {"HOME": str(root / "home"), "FARM_STORE": f"file://{root / 'store'}",
            "FARM_CONFIG": str(root / "farm.yaml"), "FARM_CACHE_DIR": str(root / "home" / "cache")}


@pytest.fixture(scope="module")
def reference_host(tmp_path_factory):
    """Host A (the CUDA host of the flow; the CPU here) writes the folder, once for the module."""
    root = tmp_path_factory.mktemp("hostA")
    for folder, op, text, _mode in TASKS.values():
        write_task(root / "akg" / AKG / folder, op, text)
    env = _host(root)
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        args = ["reference", "--device", "cpu", "--output-dir", str(root / "refs"), "--jobs", "3", "--json"]
        for source in TASKS:
            args += ["--source", source]
        res = CliRunner().invoke(app, args, catch_exceptions=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.exit_code == 0, res.output
    assert {r["mode"] for r in json.loads(res.stdout)["results"]} == {"reference", "reference-data", "model"}
    return root


@pytest.fixture
def target_host(reference_host, tmp_path, monkeypatch):
    """Host B: only the folder is copied to it (and it has its own clone of the task files)."""
    root = tmp_path / "hostB"
    shutil.copytree(reference_host / "akg", root / "akg")
    shutil.copytree(reference_host / "refs", root / "refs")  # scp -r refs hostB:
    for key, value in _host(root).items():
        monkeypatch.setenv(key, value)
    return root


def _ops(res) -> dict[str, dict]:
    return {f"{r['source']}/{r['op']}": r for r in json.loads(res.stdout)["ops"]}


def test_one_op_by_path_then_the_folder_in_batch_then_a_folder_without_secrets(target_host, reference_host, cli):
    refs, akg = target_host / "refs", target_host / "akg" / AKG
    # as run_adaptive_search_with_cache.py --ref-pt ... --benchmark-file ...: a reference-data-mode op
    res = cli("search", "--ref-pt", refs / "vllm_triton" / "twice_vllm.pt",
              "--benchmark-file", akg / "vllm" / "triton_ops" / "twice_vllm.py", *SEARCH)
    assert res.exit_code == 0, res.output
    first = _ops(res)["vllm_triton/twice_vllm"]
    assert first["status"] == "succeeded" and first["unseen_inputs"] is True
    assert first["verified"] == "4 secret input sets"
    # the whole folder: the op above goes on from its finished checkpoint, the other two are searched
    res = cli("search", "--ref-dir", refs, "--ops-per-device", "2", *SEARCH)
    assert res.exit_code == 0, res.output
    rows = _ops(res)
    assert set(rows) == {f"{s}/{op}" for s, (_f, op, _t, _m) in TASKS.items()}
    assert all(r["status"] == "succeeded" and r["unseen_inputs"] is True for r in rows.values()), \
        {k: {f: r.get(f) for f in ("status", "unseen_inputs", "verified", "reason", "best_id")} for k, r in rows.items()}
    done = rows["vllm_triton/twice_vllm"]
    assert done["submitted"] == first["submitted"] and done["promoted"] is True  # not searched twice, said as it was
    # resumable: the same command again finds every op finished in its ledger
    again = _ops(cli("search", "--ref-dir", refs, *SEARCH))
    assert {r["status"] for r in again.values()} == {"skipped"}
    store = target_host / "store"
    assert not (store / "refs").exists()  # read in place: no push step
    assert not (reference_host / "store").exists()
    best = json.loads((store / "kernels/cpu/vllm_triton/twice_vllm/best.json").read_text())
    assert best["unseen_inputs"] is True and best["verified"]["by"] == "seed_sets"
    # the cases of its shape space beside the .pt in the folder were verified too (issue 32)
    assert best["verified"]["cases"] == 2 and len(best["verified"]["case_labels"]) == 2
    # the PyTorch Model's inductor seed: compiled at each of those cases too, it passes at every one
    seed = json.loads((store / "kernels/cpu/vllm_torch/twice_torch/best.json").read_text())
    assert seed["verified"]["cases"] == 2, seed
    tried = json.loads((store / "runs/refs-cpu/vllm_torch/twice_torch/report.json").read_text())["candidates"]
    assert any(c["generator"] == "inductor" and c["verdict"] == "pass" for c in tried), \
        [(c["generator"], c["verdict"], c["error"]) for c in tried]

    # a folder the existing tools' generator made: no secret input sets, their own manifest
    plain = target_host / "akg_refs"
    data = torch.load(refs / "vllm_triton" / "twice_vllm.pt", weights_only=True)
    del data[secret_inputs.POINTER]
    (plain / "vllm_triton").mkdir(parents=True)
    torch.save(data, plain / "vllm_triton" / "twice_vllm.pt")
    (plain / "manifest.json").write_text(json.dumps({"total": 1, "ops": [{"op_name": "twice_vllm", "success": True}]}))
    res = cli("search", "--ref-dir", plain, "--run", "akg-made", *SEARCH[:-1])
    assert res.exit_code == 0, res.output
    flat = " ".join(res.output.split())
    assert "NO unseen inputs" in flat and "no unseen inputs checked" in flat.lower()
    res = cli("search", "--ref-dir", plain, "--run", "akg-made", *SEARCH)
    [row] = _ops(res).values()
    assert row["unseen_inputs"] is False and json.loads(res.stdout)["summary"]["no_unseen_inputs"] == 1
    report = json.loads((store / "runs/akg-made/vllm_triton/twice_vllm/report.json").read_text())
    assert report["verified"]["by"] == "pt_only"
    # never promoted over the kernel that was checked on unseen inputs, however fast
    assert json.loads((store / "kernels/cpu/vllm_triton/twice_vllm/best.json").read_text()) == best


def _bad(res, *words):
    text = " ".join(res.output.split())
    assert res.exit_code == 3 and "Traceback" not in res.output, res.output
    for word in words:
        assert word in text, text
    return text


def test_a_damaged_or_mixed_up_folder_is_named_with_its_repair(target_host, cli):
    refs, akg = target_host / "refs", target_host / "akg" / AKG
    task = akg / "vllm" / "triton_ops" / "twice_vllm.py"
    pt, secret = refs / "vllm_triton" / "twice_vllm.pt", refs / ".secrets" / "vllm_triton" / "twice_vllm.pt"
    good = secret.read_bytes()
    search = ["search", "--ref-pt", pt, "--benchmark-file", task, *SEARCH]

    secret.write_bytes(good[:-100])  # truncated on the way
    _bad(cli(*search), str(secret), "does not match", "copy the .pt and .secrets/ together again")
    other = torch.load(io.BytesIO(good), weights_only=True)
    other["sets"] = other["sets"][:2]  # another version: a whole file, from another run
    torch.save(other, secret)
    _bad(cli(*search), str(secret), "different `farm reference` runs")
    secret.unlink()  # copied with `cp -r refs/*`: the hidden folder stayed behind
    _bad(cli(*search), str(secret), "missing", "scp -r")
    secret.write_bytes(good)
    # the public cases beside it (farm.reference.cases), from another run
    companion = pt.with_suffix(".cases")
    kept = companion.read_bytes()
    companion.write_bytes(kept[:-10])
    _bad(cli(*search), str(companion), "does not match")
    companion.write_bytes(kept)
    # a .pt of another version than the manifest lists
    data = torch.load(pt, weights_only=True)
    data["reference_time_s"] = 1.0
    torch.save(data, pt)
    _bad(cli(*search), str(pt), str(refs / "manifest.json"), f"farm cache repair --dir {refs}")
    # a .pt and a task file of two different ops
    mixed = cli("search", "--ref-pt", refs / "sglang" / "twice_pure.pt", "--benchmark-file", task, *SEARCH)
    assert mixed.exit_code == 2 and "holds the reference data of op 'twice_pure'" in " ".join(mixed.output.split())
    # nothing was searched and nothing stored
    assert not (target_host / "store" / "runs").exists()


def test_ops_the_manifest_lists_but_the_folder_lacks_fail_with_the_reason(target_host, cli):
    refs = target_host / "refs"
    for source in ("sglang", "vllm_torch"):
        shutil.rmtree(refs / source)  # lost on the way; the manifest still lists them
    (refs / "vllm_triton" / "twice_vllm.pt").unlink()
    doc = json.loads((refs / "manifest.json").read_text())  # and one op failed on the reference host
    doc["entries"]["sglang/kaput"] = {"source": "sglang", "op_name": "kaput", "success": False, "stage": "forward",
                                      "error": "Traceback ...\nfarm.errors.TaskError: kaput.py: out of memory"}
    (refs / "manifest.json").write_text(json.dumps(doc))
    res = cli("search", "--ref-dir", refs, *SEARCH)
    assert res.exit_code == 1, res.output
    rows = _ops(res)
    assert len(rows) == 4 and {r["status"] for r in rows.values()} == {"failed"}
    assert "listed in" in rows["sglang/twice_pure"]["error"] and "missing" in rows["sglang/twice_pure"]["error"]
    assert str(refs / "sglang" / "twice_pure.pt") in rows["sglang/twice_pure"]["error"]
    assert rows["sglang/kaput"]["error"] == "no reference data: it failed on the reference host (forward): kaput.py: out of memory"


def test_a_newer_pt_than_the_run_searched_is_not_skipped_and_not_mixed(target_host, cli):
    """The folder copied again with a newer .pt: the finished op is not skipped as done, and its
    checkpoint (judged against the old data) is not continued: it is retired, searched again
    from scratch on the new data, and the run says so (farm.search.provenance)."""
    refs, store = target_host / "refs", target_host / "store"
    run, state = store / "runs" / "refs-cpu", store / "runs" / "refs-cpu" / "sglang" / "twice_pure" / "state.json"
    state.parent.mkdir(parents=True)
    state.write_text(json.dumps({"status": "done", "ref_sha256": "0" * 64}))
    (run / "ledger.json").write_text(json.dumps({"ops": {"sglang/twice_pure": {
        "status": "done", "result": {"source": "sglang", "op": "twice_pure", "status": "succeeded",
                                     "ref_sha256": "0" * 64}}}}))
    shutil.rmtree(refs / "vllm_triton"), shutil.rmtree(refs / "vllm_torch"), shutil.rmtree(refs / ".secrets")
    res = cli("search", "--ref-dir", refs, *SEARCH)
    row = _ops(res)["sglang/twice_pure"]
    assert row["status"] not in ("skipped", "failed"), res.output
    assert "the reference data changed (sha256 000000000000..." in row["retired"]
    assert "searched again, not skipped" in " ".join(res.stderr.split())
    # the checkpoint and the ledger are of the new data now
    new = json.loads(state.read_text())
    assert new["ref_sha256"] != "0" * 64 and new["provenance"]["ref_sha256"] == new["ref_sha256"]
    assert json.loads((run / "ledger.json").read_text())["ops"]["sglang/twice_pure"]["result"]["ref_sha256"] == new["ref_sha256"]
