"""AKG's task files unchanged: every file listed, the truth of each task decided (Reference or
reference-data mode), corpus.akg_root, and the existing tools' command forms."""

import json
from pathlib import Path

import pytest

from farm.cli.main import split_ops
from farm.config import load_settings
from farm.corpus import akg, modes, opcheck
from farm.corpus import tasks as taskfiles
from farm.errors import FarmError
from tests.conftest import write_task
from tests.corpus import akg_style


def akg_checkout(root):
    """A folder laid out as an AKG checkout, with one task file of each pattern."""
    base = root / "akg" / "akg_agents" / taskfiles.AKG_CORPUS
    write_task(base / "sglang", "twice_pure", akg_style.PURE_SGLANG)
    write_task(base / "sglang", "twice_hidden", akg_style.HIDDEN_SGLANG)
    write_task(base / "sglang", "_twice_private", akg_style.PURE_SGLANG)
    write_task(base / "sglang", "fmix_helper", akg_style.HELPER_ONLY)
    write_task(base / "sglang" / "class_method", "alloc_extend", akg_style.PURE_SGLANG)
    write_task(base / "vllm" / "triton_ops", "twice_vllm", akg_style.VLLM_CLASS)
    write_task(base / "vllm" / "triton_ops", "scale_into_empty", akg_style.EMPTY_BUFFER)
    write_task(base / "vllm" / "torch_ops", "twice_torch", akg_style.TRITON_HEAD.replace(
        "        y = torch.empty_like(x)\n        _twice_plus_one[(triton.cdiv(x.numel(), 64),)](x, y, x.numel(), "
        "BLOCK=64)\n        return y", "        return x * 2.0 + 1.0").replace("@triton.jit", "").replace(
        "def _twice_plus_one", "def _unused"))
    return root / "akg"


@pytest.fixture
def akg_config(tmp_path, monkeypatch):
    root = akg_checkout(tmp_path)
    cfg = tmp_path / "farm.yaml"
    cfg.write_text(f"corpus:\n  akg_root: {root}\n")
    monkeypatch.setenv("FARM_CONFIG", str(cfg))
    return root


def listed(cli, *args):
    result = cli("ops", "list", "--json", *args)
    return {r["op"]: r for r in json.loads(result.stdout)}, result.exit_code


def test_akg_root_maps_three_folders_lists_every_file_and_decides_each_truth(cli, akg_config):
    rows, code = listed(cli)
    ops = {(r["source"], op) for op, r in rows.items() if r["origin"] == "akg"}
    assert ops == {("sglang", "twice_pure"), ("sglang", "twice_hidden"), ("sglang", "_twice_private"),
                   ("sglang", "fmix_helper"), ("vllm_triton", "twice_vllm"), ("vllm_triton", "scale_into_empty"),
                   ("vllm_torch", "twice_torch")}  # class_method/ is not a source
    assert all(r["origin"] == "akg" for r in rows.values() if r["source"] in ("sglang", "vllm_triton", "vllm_torch"))
    assert rows["row_sum"]["origin"] == "bundled"  # sources AKG lacks stay
    # a pure-PyTorch ModelSglang is tried on the CPU and used as Reference
    assert rows["twice_pure"]["mode"] == "reference" and rows["twice_pure"]["reference_class"] == "ModelSglang"
    assert rows["_twice_private"]["status"] == "ok" and rows["_twice_private"]["mode"] == "reference"
    # ModelVLLM that imports vllm: reference-data mode, decided without running it
    assert rows["twice_vllm"]["mode"] == "reference-data" and "imports vllm" in rows["twice_vllm"]["mode_reason"]
    # the import hides in a helper: the trial finds it
    assert rows["twice_hidden"]["mode"] == "reference-data"
    assert "No module named 'sglang'" in rows["twice_hidden"]["mode_reason"]
    assert rows["scale_into_empty"]["mode"] == "reference-data"
    assert rows["twice_torch"]["mode"] == "model"
    # a helper-only file is listed as invalid with its reason, and the listing says so
    assert rows["fmix_helper"]["status"] == "invalid" and "No module named 'sglang'" in rows["fmix_helper"]["error"]
    assert code == 1
    table = cli("ops", "list").stdout
    assert "reference-data" in table and "akg" in table and "_twice_private" in table


def test_a_leading_underscore_op_is_selected_by_name(akg_config):
    settings, _ = load_settings()
    [ref] = taskfiles.find_tasks(settings, ["sglang"], ["_twice_private"])
    assert ref.op == "_twice_private" and taskfiles.validate_name(ref.op, "op")


def test_config_sources_replace_an_akg_source_of_the_same_name(tmp_path, akg_config, monkeypatch):
    mine = tmp_path / "mine"
    write_task(mine, "only_mine", akg_style.PURE_SGLANG)
    cfg = tmp_path / "farm2.yaml"
    cfg.write_text(f"corpus:\n  akg_root: {akg_config}\n  sources:\n    sglang: {mine}\n")
    settings, _ = load_settings(str(cfg))
    refs = taskfiles.find_tasks(settings, ["sglang"])
    assert [(r.op, r.origin) for r in refs] == [("only_mine", "config")]


def test_every_task_folder_of_a_newer_akg_release_is_a_source(tmp_path):
    """AKG adds folders between releases (attention_kernels/, pytorch/group_N/): each folder of
    task files under thirdparty/ is a source named by its path, whatever the depth; the three
    original folders keep their names, and the thirdparty/ folder itself is a valid root."""
    root = akg_checkout(tmp_path)
    base = root / "akg_agents" / taskfiles.AKG_CORPUS
    write_task(base / "attention_kernels", "decode_twice", akg_style.PURE_TORCH)
    write_task(base / "pytorch" / "group_1", "01_Twice", akg_style.PURE_SGLANG)
    write_task(base / "pytorch" / "group_2", "01_Twice", akg_style.PURE_SGLANG)  # same op name, other source
    (base / "pytorch" / "group_2" / "__init__.py").write_text("")
    (base / "notes").mkdir()
    (base / "notes" / "README.md").write_text("no tasks here")
    expected = {"sglang", "vllm_triton", "vllm_torch", "attention_kernels", "pytorch_group_1", "pytorch_group_2"}
    for given in (root, root / "akg_agents", base):
        folders = akg.akg_folders(given)
        assert set(folders) == expected, given  # not sglang_class_method, not notes, not pytorch
        assert folders["pytorch_group_2"] == base / "pytorch" / "group_2"
    settings, _ = load_settings(overrides={"corpus.akg_root": str(root)})
    refs = taskfiles.find_tasks(settings, ["pytorch_group_1", "pytorch_group_2"])
    assert [(r.source, r.op) for r in refs] == [("pytorch_group_1", "01_Twice"), ("pytorch_group_2", "01_Twice")]
    [attention] = taskfiles.find_tasks(settings, ["attention_kernels"])
    decided = modes.resolve_ref(attention, "small", 120)
    assert (decided.mode, decided.reference) == ("reference", "ModelTorch")  # its PyTorch class is the truth


def test_a_comparison_class_is_tried_at_the_files_own_shapes_when_none_can_be_derived(tmp_path):
    """attention_kernels/ choose their sizes inside get_inputs: no small shapes can be derived,
    and the trial of ModelTorch then runs at the file's own shapes instead of failing."""
    body = akg_style.PURE_TORCH.replace("    return [torch.randn(N)]", "    n = 2 ** 21  # 8 MiB: over the small budget\n"
                                                                       "    return [torch.randn(n)]")
    path = write_task(tmp_path / "attention_kernels", "local_sizes", body)
    ref = taskfiles.ref_from_file(path, "attention_kernels")
    with pytest.raises(FarmError, match="has no small shapes"):
        taskfiles.load_task(ref, "small")
    decided = modes.resolve_ref(ref, "bench", 120)  # as on a GPU host, and as `farm ops list` decides
    assert (decided.mode, decided.reference) == ("reference", "ModelTorch"), decided


def test_akg_root_that_is_not_a_checkout_is_a_clear_error(tmp_path):
    write_task(tmp_path / "my_scripts", "scale2", akg_style.PURE_SGLANG)  # .py files, but not AKG's layout
    settings, _ = load_settings(overrides={"corpus.akg_root": str(tmp_path)})
    with pytest.raises(FarmError, match="corpus.akg_root: .* is not an AKG checkout"):
        taskfiles.find_tasks(settings)


def test_torch_empty_buffers_are_drawn_deterministically(tmp_path):
    path = write_task(tmp_path / "t", "scale_into_empty", akg_style.EMPTY_BUFFER)
    task = taskfiles.load_task(taskfiles.ref_from_file(path), "small")
    a, b = opcheck.draw_inputs(task, 3), opcheck.draw_inputs(task, 3)
    assert a[1].isnan().all() and (b[2] == 2**31 - 1).all()  # the deterministic fill, the same each time
    import torch

    assert not torch.are_deterministic_algorithms_enabled()  # the setting is restored afterwards


DRAW_ALONE = """
import sys
from farm.corpus import opcheck, tasks as taskfiles
task = taskfiles.load_task(taskfiles.ref_from_file(sys.argv[1]), "small")
a = opcheck.draw_inputs(task, 3)
print(bool(a[1].isnan().all()), "torch._inductor.config" in sys.modules)
"""


def test_drawing_inputs_does_not_load_inductor(tmp_path):
    """torch.use_deterministic_algorithms imports Inductor's config (and torch._dynamo and
    Triton with it) to set a flag of Inductor's: about 2 CPU-seconds of every process that
    draws inputs, for nothing that compiles."""
    import os
    import subprocess
    import sys

    path = write_task(tmp_path / "t", "scale_into_empty", akg_style.EMPTY_BUFFER)
    done = subprocess.run([sys.executable, "-c", DRAW_ALONE, str(path)], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
                          check=True)
    assert done.stdout.split() == ["True", "False"], done.stderr[-2000:]


def test_trial_verdicts_are_remembered_per_file_content(tmp_path):
    path = write_task(tmp_path / "t", "twice_pure", akg_style.PURE_SGLANG)
    task = taskfiles.load_task(taskfiles.ref_from_file(path))
    assert modes.resolve(task).reference == "ModelSglang"
    assert "ModelSglang" in modes.cache_path().read_text()
    path.write_text(path.read_text().replace("return x * 2.0 + 1.0", "raise RuntimeError('broken on purpose')"))
    changed = modes.resolve(taskfiles.load_task(taskfiles.ref_from_file(path)))
    assert changed.mode == "reference-data" and "broken on purpose" in changed.reason


def test_space_separated_ops_become_repeated_options():
    assert split_ops(["reference", "--ops", "a", "_b", "c", "--device", "cpu"]) == [
        "reference", "--ops", "a", "--ops", "_b", "--ops", "c", "--device", "cpu"]
    assert split_ops(["ops", "check", "--ops", "a"]) == ["ops", "check", "--ops", "a"]


def test_space_separated_ops_through_the_real_entry_point(tmp_path, akg_config):
    import os
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "farm", "reference", "--device", "cpu", "--source", "sglang",
                          "--ops", "twice_pure", "_twice_private", "--output-dir", str(tmp_path / "cache"), "--json"],
                         capture_output=True, text=True, env=os.environ, timeout=300)
    assert out.returncode == 0, out.stderr
    assert {r["op_name"] for r in json.loads(out.stdout)["results"]} == {"twice_pure", "_twice_private"}
