"""Reference-data mode end to end on the CPU: a Triton task whose comparison class needs vLLM.
`farm reference --output-dir` writes the existing tools' layout plus the secret input sets in the
folder's hidden .secrets/; search and fetch pass kernels verified on them; a candidate that
memorised the public outputs is caught, and where the secret input sets are missing the weaker check
says so."""

import json
import os
from pathlib import Path

import pytest
import torch

from farm.corpus.tasks import ref_from_file
from farm.evaluate.evaluator import Evaluator
from farm.evaluate.runner import Limits
from farm.reference import folder, secret_inputs
from farm.reference.generate import PT_KEYS, load_pt
from farm.storage import open_store
from farm.storage.base import sha256_file
from farm.targets import resolve_device
from tests.conftest import write_task
from tests.corpus import akg_style

CPU = resolve_device("cpu")
LIMITS = Limits(start_s=60, compile_s=30, run_s=20, time_s=60, host_memory_mb=4096, log_mb=16)

HONEST = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _k(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2.0 + 1.0, mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        y = torch.empty_like(x)
        _k[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), BLOCK=64)
        return y
'''

# Copies the outputs of the public .pt with a real Triton kernel: right on the .pt, wrong elsewhere.
MEMORISED = '''
import torch
import torch.nn as nn
import triton
import triton.language as tl

KNOWN = {known!r}


@triton.jit
def _copy(src_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(src_ptr + offs, mask=mask), mask=mask)


class ModelNew(nn.Module):
    def forward(self, x):
        src = torch.tensor(KNOWN, dtype=x.dtype, device=x.device)
        y = torch.empty_like(x)
        _copy[(triton.cdiv(x.numel(), 64),)](src, y, x.numel(), BLOCK=64)
        return y
'''

@pytest.fixture(scope="module")
def made(tmp_path_factory):
    """One reference run for the module: task, --output-dir folder, store."""
    tmp = tmp_path_factory.mktemp("refdata")
    task = write_task(tmp / "tasks", "twice_vllm", akg_style.VLLM_CLASS)
    out, store_dir = tmp / "cache", tmp / "store"
    from typer.testing import CliRunner

    from farm.cli.main import app

    env = {"FARM_STORE": f"file://{store_dir}", "FARM_CACHE_DIR": str(tmp / "trials"),
           "FARM_CONFIG": str(_config(tmp, task.parent))}
    old = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        res = CliRunner().invoke(app, ["reference", "--device", "cpu", "--source", "akgish", "--ops", "twice_vllm",
                                       "--output-dir", str(out), "--json"], catch_exceptions=False)
    finally:
        for k, v in old.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)
    assert res.exit_code == 0, res.output
    return {"task": task, "out": out, "store": store_dir, "result": json.loads(res.stdout)["results"][0]}


def _config(tmp: Path, folder: Path) -> Path:
    cfg = tmp / "farm.yaml"
    cfg.write_text(f"corpus:\n  sources:\n    akgish: {folder}\n")
    return cfg


def test_output_dir_holds_the_tool_chains_layout_and_the_secrets_beside_it(made):
    files = sorted(p.relative_to(made["out"]).as_posix() for p in made["out"].rglob("*"))
    # the benchmark case's .pt as the tools read it; the cases of the space beside it, not a *.pt;
    # the secret input sets in a hidden folder
    assert files == [".kfarm-owned.json", ".secrets", ".secrets/akgish", ".secrets/akgish/twice_vllm.pt",
                     "akgish", "akgish/twice_vllm.cases", "akgish/twice_vllm.pt", "manifest.json"]
    # the existing tools' batch globs <dir>/<source>/*.pt for its own source names: the hidden folder is none
    assert sorted(p.as_posix() for p in made["out"].glob("*/*.pt")) == [(made["out"] / "akgish/twice_vllm.pt").as_posix()]
    data = torch.load(made["out"] / "akgish" / "twice_vllm.pt", weights_only=True)
    assert set(PT_KEYS) <= set(data) and data["mode"] == "reference-data" and data["reference_class"] is None
    assert "sets" not in data and data[secret_inputs.POINTER]["count"] == 4  # the secrets are not in the .pt
    assert made["result"]["mode"] == "reference-data" and made["result"]["seed_sets"] == 4
    entry = json.loads((made["out"] / "manifest.json").read_text())["entries"]["akgish/twice_vllm"]
    assert entry["seed_sets_key"] == "secrets/akgish/twice_vllm.pt"
    assert entry["seed_sets_sha256"] == sha256_file(made["out"] / ".secrets" / "akgish" / "twice_vllm.pt")
    assert not made["store"].exists()  # the folder holds everything: nothing went to the store


def test_secret_sets_live_in_the_folder_from_other_seeds(made):
    data = load_pt(made["out"] / "akgish" / "twice_vllm.pt")
    sets = folder.load(made["out"] / "akgish" / "twice_vllm.pt")["_secret_inputs"]
    assert len(sets) == 4
    for inputs, outputs in sets:
        assert not torch.equal(inputs[0], data["inputs"][0])
        torch.testing.assert_close(outputs[0], inputs[0] * 2.0 + 1.0)  # the Model's answer on them


def _evaluator(made, data=None):
    data = data or folder.load(made["out"] / "akgish" / "twice_vllm.pt")
    return Evaluator(ref_from_file(made["task"], "akgish"), data, CPU)


def test_honest_kernel_passes_verified_on_the_stored_secret_input_sets(made):
    with _evaluator(made) as ev:
        ev.settings.limits = LIMITS
        result = ev.evaluate(HONEST)
    assert result.passed, result.reason
    assert result.verified["by"] == "seed_sets" and result.verified["sets"] == 4 and result.verified["checked"] == 2
    assert result.baseline.get("reference_error", "").startswith("no Reference")


def test_memorised_public_outputs_are_caught(made):
    data = load_pt(made["out"] / "akgish" / "twice_vllm.pt")
    known = data["outputs"][0].tolist()
    with _evaluator(made) as ev:
        ev.settings.limits = LIMITS
        copied = ev.evaluate(MEMORISED.format(known=known))
        assert copied.verdict == "cheat" and "same outputs as for different inputs" in copied.reason


def test_memorised_outputs_that_never_compute_fail_on_the_first_secret_input_set(made):
    data = load_pt(made["out"] / "akgish" / "twice_vllm.pt")
    wrong = MEMORISED.replace("src = torch.tensor(KNOWN, dtype=x.dtype, device=x.device)",
                              "src = torch.tensor(KNOWN, dtype=x.dtype, device=x.device) + 0 * x.sum()")
    with _evaluator(made) as ev:
        ev.settings.limits = LIMITS
        result = ev.evaluate(wrong.format(known=data["outputs"][0].tolist()))
    assert not result.passed and result.verdict in ("cheat", "mismatch")


def test_reference_data_without_secret_sets_is_checked_on_the_pt_alone_and_says_so(made):
    """The existing tools' generator records no secret input sets: nothing can then tell a kernel that
    memorised the .pt from one that computes, which is why such a pass is labelled (and never
    outranks one checked on unseen inputs: tests/reference/test_two_hosts.py)."""
    data = load_pt(made["out"] / "akgish" / "twice_vllm.pt")
    del data[secret_inputs.POINTER]
    with _evaluator(made, data) as ev:
        ev.settings.limits = LIMITS
        result = ev.evaluate(HONEST)
    assert result.passed, result.reason
    assert result.verified["by"] == "pt_only" and result.verified["unseen_inputs"] is False
    assert "no unseen inputs were checked" in result.verified["note"] and result.seeds_checked == 0
    assert result.timing["median_ms"] > 0  # timed on the .pt's own inputs


def test_search_and_fetch_with_the_tool_chains_file_options(made, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_STORE", f"file://{made['store']}")
    res = cli("search", "--ref-pt", made["out"] / "akgish" / "twice_vllm.pt", "--benchmark-file", made["task"],
              "--source", "akgish", "--target", "cpu", "--max-tasks", "2", "--generators", "tune", "--run", "rd",
              "--json")
    assert res.exit_code == 0, res.output
    [row] = json.loads(res.stdout)["ops"]
    assert row["status"] == "succeeded"
    report = json.loads((made["store"] / "runs" / "rd" / "akgish" / "twice_vllm" / "report.json").read_text())
    assert report["verified"]["by"] == "seed_sets" and report["verified"]["sets"] == 4
    best = json.loads((made["store"] / "kernels" / "cpu" / "akgish" / "twice_vllm" / "best.json").read_text())
    assert best["verified"]["by"] == "seed_sets"
    fetched = cli("fetch", "--out", tmp_path / "k", "--json")
    assert fetched.exit_code == 0, fetched.output
    text = (tmp_path / "k" / "cpu" / "akgish" / "twice_vllm.py").read_text()
    assert "secret input sets of the original Model" in text


def test_cache_copies_carry_the_secret_sets_between_folders_and_stores(made, tmp_path):
    from farm.reference.refcache import copy_refs
    from farm.storage import open_folder

    store = open_store(f"file://{tmp_path / 'store'}")
    [row] = copy_refs(open_folder(made["out"]), store)  # farm cache push
    assert (row["status"], row["seed_sets"]) == ("copied", "copied")
    assert store.head("secrets/akgish/twice_vllm.pt") is not None
    assert store.read_json("refs/manifest.json")["entries"]["akgish/twice_vllm"]["seed_sets_sha256"]
    [row] = copy_refs(open_folder(made["out"]), store)
    assert (row["status"], row["seed_sets"]) == ("up to date", "up to date")
    [row] = copy_refs(store, open_folder(tmp_path / "folder"))  # farm cache pull
    assert (row["status"], row["seed_sets"]) == ("copied", "copied")
    pulled = tmp_path / "folder" / ".secrets" / "akgish" / "twice_vllm.pt"
    assert pulled.read_bytes() == (made["out"] / ".secrets" / "akgish" / "twice_vllm.pt").read_bytes()
    assert len(folder.load(tmp_path / "folder" / "akgish" / "twice_vllm.pt")["_secret_inputs"]) == 4


def test_cache_push_refuses_a_pt_whose_secret_sets_are_missing_or_of_another_version(made, tmp_path):
    """The .pt is never copied without the sets it points at (a search on it could only fail),
    and the destination keeps what it had."""
    import shutil

    from farm.reference.refcache import copy_refs
    from farm.storage import open_folder

    lost = tmp_path / "lost"
    shutil.copytree(made["out"], lost)
    shutil.rmtree(lost / ".secrets")
    store = open_store(f"file://{tmp_path / 'store'}")
    [row] = copy_refs(open_folder(lost), store)
    assert row["status"] == "corrupt" and ".secrets/akgish/twice_vllm.pt" in row["error"]
    assert store.head("refs/akgish/twice_vllm.pt") is None
    other = tmp_path / "other"
    shutil.copytree(made["out"], other)
    secret = other / ".secrets" / "akgish" / "twice_vllm.pt"
    secret.write_bytes(secret.read_bytes()[:-10])  # truncated on the way
    [row] = copy_refs(open_folder(other), store)
    assert row["status"] == "corrupt" and "does not match" in row["error"]
    assert store.head("refs/akgish/twice_vllm.pt") is None and store.head("secrets/akgish/twice_vllm.pt") is None


def test_farm_eval_says_how_it_verified(made, cli, tmp_path, monkeypatch):
    monkeypatch.setenv("FARM_STORE", f"file://{made['store']}")
    candidate = tmp_path / "honest.py"
    candidate.write_text(HONEST)
    res = cli("eval", "--candidate", candidate, "--benchmark-file", made["task"],
              "--ref-pt", made["out"] / "akgish" / "twice_vllm.pt", "--target", "cpu", "--json")
    assert res.exit_code == 0, res.output
    verified = json.loads(res.stdout)["verified"]
    assert verified["by"] == "seed_sets" and verified["sets"] == 4
    text = cli("eval", "--candidate", candidate, "--task", made["task"],
               "--ref-pt", made["out"] / "akgish" / "twice_vllm.pt", "--target", "cpu").stdout
    assert "secret input sets of the original Model" in text


def test_cache_push_keeps_the_newer_pt_of_the_destination_unless_forced(made, tmp_path, cli):
    """A stale folder pushed over a store (or pulled over a newer folder) replaces nothing newer."""
    import shutil

    store_url = f"file://{tmp_path / 'store'}"
    assert cli("cache", "push", "--from", made["out"], "--store", store_url).exit_code == 0
    stale = tmp_path / "stale"
    shutil.copytree(made["out"], stale)
    doc = json.loads((stale / "manifest.json").read_text())
    entry = doc["entries"]["akgish/twice_vllm"]
    data = torch.load(stale / "akgish" / "twice_vllm.pt", weights_only=True)
    data["reference_time_s"] = 9.0  # another generation of it, made earlier than the store's
    torch.save(data, stale / "akgish" / "twice_vllm.pt")
    entry.update(created_at="2000-01-01T00:00:00+00:00", sha256=sha256_file(stale / "akgish" / "twice_vllm.pt"))
    (stale / "manifest.json").write_text(json.dumps(doc))
    kept = (tmp_path / "store" / "refs" / "akgish" / "twice_vllm.pt").read_bytes()
    res = cli("cache", "push", "--from", stale, "--store", store_url, "--json")
    [row] = json.loads(res.stdout)
    assert res.exit_code == 1 and row["status"] == "refused" and "later than" in row["error"] and "--force" in row["error"]
    assert (tmp_path / "store" / "refs" / "akgish" / "twice_vllm.pt").read_bytes() == kept
    forced = cli("cache", "push", "--from", stale, "--store", store_url, "--force", "--json")
    assert forced.exit_code == 0 and json.loads(forced.stdout)[0]["status"] == "copied"
