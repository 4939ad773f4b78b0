"""Task discovery, isolated loading and the rules of docs/task-format.md."""

import json
import re
import sys

import pytest

from farm.config import load_settings
from farm.corpus import tasks as taskfiles
from farm.errors import FarmError, InvalidName, TaskError
from tests.conftest import GOOD_TASK, write_task


def load(path):
    return taskfiles.load_task(taskfiles.ref_from_file(path))


def test_good_task_loads_with_metadata(tmp_path):
    task = load(write_task(tmp_path, "scale2", GOOD_TASK))
    assert task.reference_cls is not None and task.model_cls.__name__ == "Model"
    assert task.doc.startswith("Scale a vector")


def test_small_shapes_override_module_constants(tmp_path):
    path = write_task(tmp_path, "scale2", GOOD_TASK)
    assert len(taskfiles.load_task(taskfiles.ref_from_file(path), "small").inputs()[0]) == 37
    assert len(taskfiles.load_task(taskfiles.ref_from_file(path), "bench").inputs()[0]) == 1000


def test_loading_leaves_nothing_in_sys_modules(tmp_path):
    helper = tmp_path / "task_helper_mod.py"
    helper.write_text("VALUE = 1\n")
    body = "import sys\nsys.path.insert(0, %r)\nimport task_helper_mod\n" % str(tmp_path) + GOOD_TASK
    path = write_task(tmp_path, "uses_helper", body)
    before = set(sys.modules)
    load(path)
    leaked = {m for m in set(sys.modules) - before if "farm_task" in m or m == "task_helper_mod"}
    assert leaked == set()
    assert str(tmp_path) not in sys.path


def test_two_loads_do_not_share_state(tmp_path):
    path = write_task(tmp_path, "counter", GOOD_TASK + "\nCALLS = []\n")
    a, b = load(path), load(path)
    a.module.CALLS.append(1)
    assert b.module.CALLS == [] and a.module is not b.module


@pytest.mark.parametrize(
    "body, rule",
    [
        (GOOD_TASK.replace("def get_inputs", "def _no_inputs"), "must define get_inputs()"),
        (GOOD_TASK.replace("def get_init_inputs", "def _no_init"), "must define get_init_inputs()"),
        (GOOD_TASK + "\ndef broken(:\n", "is not valid Python"),
        ("import not_a_real_module_xyz\n" + GOOD_TASK, "fails on import"),
        (GOOD_TASK.replace("class Model(nn.Module)", "class Model"), "Model must be a subclass of torch.nn.Module"),
        (GOOD_TASK.replace("class Model(nn.Module):", "class Other(nn.Module):"), "must define class Model"),
        (GOOD_TASK.replace("class Reference(nn.Module):\n    def forward(self, x):",
                           "class Reference(nn.Module):\n    def forward(self, x, y):"),
         "Reference.forward must take the same arguments as Model.forward"),
        (GOOD_TASK.replace('SMALL_SHAPES = {"N": 37}', 'SMALL_SHAPES = {"M": 37}'), "SMALL_SHAPES may only override"),
        (GOOD_TASK + "\nTOLERANCE = {'float16': 0.1}\n", "TOLERANCE values must be (atol, rtol)"),
        (GOOD_TASK + "\nTOLERANCE = {'half': (1, 1)}\n", "TOLERANCE keys must be float dtype names"),
        (GOOD_TASK + "\nINPLACE_ARGS = ('x',)\n", "INPLACE_ARGS must be a tuple of argument indices"),
    ],
)
def test_malformed_task_is_rejected_naming_file_and_rule(tmp_path, body, rule):
    path = write_task(tmp_path, "bad", body)
    with pytest.raises(TaskError) as info:
        taskfiles.load_task(taskfiles.ref_from_file(path), "small")
    assert str(path) in str(info.value)
    assert rule in str(info.value)


def test_forward_that_cannot_take_the_inputs_is_rejected(tmp_path):
    body = GOOD_TASK.replace("def forward(self, x):", "def forward(self, x, y):")
    task = load(write_task(tmp_path, "arity", body))
    with pytest.raises(TaskError, match="Model.forward must accept the inputs of get_inputs"):
        task.inputs()


def test_get_inputs_that_raises_names_the_file(tmp_path):
    task = load(write_task(tmp_path, "raises", GOOD_TASK.replace("return [torch.randn(N)]", "return [1 / 0]")))
    with pytest.raises(TaskError, match=r"raises.py: get_inputs\(\) raised: ZeroDivisionError"):
        task.inputs()


def test_discovery_includes_config_sources(tmp_path, task_dir):
    extra = tmp_path / "akg_style"
    write_task(extra, "foreign_op", GOOD_TASK)
    settings, _ = load_settings(overrides={"corpus.sources": {"team": str(extra)}})
    sources = taskfiles.discover_sources(settings)
    assert set(sources) == {"mini", "team"}
    refs = taskfiles.find_tasks(settings, ["team"])
    assert [r.key for r in refs] == ["team/foreign_op"]


def test_unknown_source_and_op_are_clear_errors(task_dir):
    settings, _ = load_settings()
    with pytest.raises(FarmError, match="unknown source 'nope'.*known: mini"):
        taskfiles.find_tasks(settings, ["nope"])
    with pytest.raises(FarmError, match="unknown op"):
        taskfiles.find_tasks(settings, ["mini"], ["missing"])
    with pytest.raises(FarmError, match="corpus.sources.ghost"):
        taskfiles.discover_sources(load_settings(overrides={"corpus.sources": {"ghost": "/no/such/dir"}})[0])


@pytest.mark.parametrize("name", ["../etc", "/abs", "a/b", "..", "", "x\x00y", "é"])
def test_names_that_could_escape_a_prefix_are_refused(name):
    with pytest.raises(InvalidName):
        taskfiles.validate_name(name, "op")


def test_bundled_corpus_has_the_first_tasks():
    settings, _ = load_settings()
    keys = {r.key for r in taskfiles.find_tasks(settings)}
    expected = {
        "sglang/" + n for n in ["triton_tanh", "merge_state_triton", "fused_rmsnorm_kernel",
                                "fused_dual_residual_rmsnorm_kernel", "fused_softcap_kernel", "moe_sum_reduce_triton",
                                "l2norm_fwd_kernel", "create_flashinfer_kv_indices_triton", "experts_combine_kernel",
                                "compute_position"]
    } | {
        "vllm_triton/" + n for n in ["rms_norm_kernel", "merge_attn_states", "log_softmax_kernel",
                                     "reshape_and_cache_flash", "triton_mrope", "layernorm_fn"]
    } | {
        "vllm_torch/" + n for n in ["silu_and_mul", "gelu_and_mul", "fused_add_rms_norm", "rms_norm",
                                    "rotary_embedding", "gemma_rms_norm"]
    }
    assert expected <= keys
    assert len([k for k in keys if k.startswith("demo/")]) == 3
    for ref in taskfiles.find_tasks(settings):
        taskfiles.load_task(ref, "small")  # every bundled file obeys the static rules


def test_ops_list_json_and_invalid_exit_code(cli, task_dir):
    result = cli("ops", "list", "--json")
    assert result.exit_code == 0
    rows = json.loads(result.stdout)
    assert rows[0]["op"] == "scale2" and rows[0]["status"] == "ok"
    write_task(task_dir / "mini", "broken", "def oops(:\n")
    result = cli("ops", "list")
    assert result.exit_code == 1
    # the table wraps the reason at the terminal's width, which a deep tmp path changes
    assert "isnotvalidPython" in re.sub(r"[^A-Za-z]", "", result.stdout)
