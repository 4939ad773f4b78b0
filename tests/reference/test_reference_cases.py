"""Reference data over the cases of a task's shape space: recorded beside the .pt (whose keys
stay the existing tools'), each with its case and seed, gradients for a training op; a case
that makes the original fail is an error naming the task and the case; the companion goes
through push, verify, repair and the is-current check with its .pt."""

from __future__ import annotations

import torch

from farm.corpus.tasks import ref_from_file
from farm.reference import cases as ref_cases
from farm.reference import manifest, refcache
from farm.reference.generate import PT_KEYS, generate_references, is_current, load_pt
from farm.storage import open_folder, open_store
from farm.targets import resolve_device
from tests.conftest import write_task

CPU = resolve_device("cpu")

TASK = '''
import torch
import torch.nn as nn

TOKENS = 5
HIDDEN = 8
DTYPE = torch.float32
SHAPE_SPACE = {"TOKENS": (1, 40), "DTYPE": ("float32", "float64")}
BACKWARD = True


class Model(nn.Module):
    def forward(self, x, w):
        FAIL
        return torch.tanh(x) * w


def get_inputs():
    return [torch.randn(TOKENS, HIDDEN).to(DTYPE), torch.randn(HIDDEN).to(DTYPE)]


def get_init_inputs():
    return []
'''


def _make(tmp_path, body=TASK.replace("        FAIL\n", ""), count=5):
    store = open_store(f"file://{tmp_path / 'store'}")
    ref = ref_from_file(write_task(tmp_path / "src", "tanh_scale", body), "src")
    [entry] = generate_references([ref], store, CPU, 0, "small", 120, cases=count)
    return store, ref, entry


def test_cases_are_recorded_beside_the_pt_and_travel_with_it(tmp_path):
    store, ref, entry = _make(tmp_path)
    assert entry["success"], entry.get("error")
    assert entry["cases"] == 5 and entry["cases_key"] == "refs/src/tanh_scale.cases"
    data = load_pt(tmp_path / "store" / "refs" / "src" / "tanh_scale.pt")
    assert all(k in data for k in PT_KEYS) and data["inputs"][0].shape == (5, 8)  # the benchmark case, as before
    cases = ref_cases.load(store, data)
    labels = [c["case"]["label"] for c in cases]
    assert labels[:4] == ["low", "prime", "pow2+1", "high"] and len(cases) == 5
    for c in cases:
        tokens, dtype = c["case"]["values"]["TOKENS"], c["case"]["dtype"]
        x, w = c["inputs"]
        assert x.shape == (tokens, 8) and str(x.dtype) == f"torch.{dtype}" and c["case"]["seed"] > 0
        torch.testing.assert_close(c["outputs"][0], torch.tanh(x) * w)
        # the training op's gradients for the case's own upstream gradient
        assert c["grad_input_indices"] == [0, 1]
        up = c["grad_outputs"][0]
        torch.testing.assert_close(c["grad_inputs"][0], up * w * (1 - torch.tanh(x) ** 2))
        torch.testing.assert_close(c["grad_inputs"][1], (up * torch.tanh(x)).sum(0))
    assert [c["case"]["values"]["TOKENS"] for c in cases][:4] == [1, 7, 33, 40]
    assert len({c["case"]["seed"] for c in cases}) == 5
    _travel_and_checks(tmp_path, store, ref, entry)


def test_a_case_the_original_fails_at_is_named(tmp_path):
    body = TASK.replace("        FAIL\n", "        assert x.shape[0] != 33, 'no tail'\n")
    _, _, entry = _make(tmp_path, body)
    assert not entry["success"] and entry["stage"] == "case pow2+1"
    assert "tanh_scale.py: the original Model fails at the pow2+1 case (TOKENS=33" in entry["error"]
    assert "AssertionError: no tail" in entry["error"]


def _travel_and_checks(tmp_path, store, ref, entry):
    folder = open_folder(tmp_path / "folder")
    [row] = refcache.copy_refs(store, folder)
    assert row["status"] == "copied" and row["cases"] == "copied"
    assert (tmp_path / "folder" / "src" / "tanh_scale.cases").is_file()  # beside the .pt, not a *.pt
    assert sorted(p.name for p in (tmp_path / "folder" / "src").glob("*.pt")) == ["tanh_scale.pt"]
    back = open_store(f"file://{tmp_path / 'back'}")
    [row] = refcache.copy_refs(folder, back)
    assert row["cases"] == "copied" and len(ref_cases.load(back, load_pt(tmp_path / "back" / "refs" / "src" /
                                                                          "tanh_scale.pt"))) == 5
    assert [r["status"] for r in refcache.verify(store)] == ["ok"]
    companion = tmp_path / "store" / "refs" / "src" / "tanh_scale.cases"
    companion.write_bytes(companion.read_bytes()[:-7] + b"garbage")
    [bad] = refcache.verify(store)
    assert bad["status"] == "corrupt"
    companion.unlink()
    [gone] = refcache.verify(store)
    assert gone["status"] == "missing" and "farm reference --force" in gone["error"]
    # made again because its cases are gone; an entry made before cases existed is made again too
    current = manifest.entries(store)["src/tanh_scale"]
    assert not is_current(current, ref.sha256(), 0, "small", store, cases=5)
    old = {k: v for k, v in current.items() if not k.startswith("cases")}
    assert not is_current(old, ref.sha256(), 0, "small", store, cases=5)
    assert is_current(old, ref.sha256(), 0, "small", store, cases=0)
    # repair rebuilds the manifest's record of the cases from the .pt
    (tmp_path / "store" / "refs" / "manifest.json").write_text("{not json")
    refcache.repair(store)
    assert manifest.entries(store)["src/tanh_scale"]["cases_key"] == "refs/src/tanh_scale.cases"
