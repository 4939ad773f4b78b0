"""Reference data drawn on the device and kept compact: digests, the recipe, the compact .pt
(AKG's save_inputs False form), redraw on the target, and the memory guard (farm.reference.drawn)."""

from __future__ import annotations

import pytest
import torch

from farm.config import load_settings
from farm.corpus.tasks import load_task, ref_from_file
from farm.errors import ConfigError, FarmError, TaskError
from farm.reference import drawn
from farm.reference.generate import generate_reference_and_sets, generate_references, load_pt
from farm.storage import open_store
from farm.targets import resolve_device
from tests.conftest import write_task

CPU = resolve_device("cpu")

# KernelBench's style: module-level sizes, a pure PyTorch Model, torch.rand in get_inputs
KB_SOFTMAX = """
import torch
import torch.nn as nn

batch_size = 64
dim = 300


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        return torch.softmax(x, dim=1)


def get_inputs():
    return [torch.rand(batch_size, dim)]


def get_init_inputs():
    return []
"""

INPLACE = KB_SOFTMAX.replace("return torch.softmax(x, dim=1)", "return x.mul_(3.0)")
UNSEEDED = KB_SOFTMAX.replace("import torch\n", "import random\nimport torch\n", 1).replace(
    "return [torch.rand(batch_size, dim)]", "return [torch.full((batch_size, dim), random.random())]")


def _task(tmp_path, body=KB_SOFTMAX, name="softmax"):
    return load_task(ref_from_file(write_task(tmp_path / "t", name, body), "kb"), "bench")


def test_digest_sees_every_bit_and_every_position_whatever_the_layout():
    x = torch.randn(ROWS := (1 << 20) + 3)  # one full row of words and a padded tail
    assert drawn.digest(x) == drawn.digest(x.clone())
    flipped = x.clone()
    flipped.view(torch.int32)[ROWS - 1] ^= 1  # the last bit of the tail
    assert drawn.digest(flipped) != drawn.digest(x)
    swapped = x.clone()
    swapped[[0, 1]] = x[[1, 0]]
    assert drawn.digest(swapped) != drawn.digest(x)
    assert drawn.digest(x.view(torch.int32)) != drawn.digest(x)  # same bytes, other dtype
    assert drawn.digest(x[:12].reshape(3, 4)) != drawn.digest(x[:12].reshape(4, 3))
    t = torch.arange(12.0).reshape(3, 4)
    assert drawn.digest(t.t()) == drawn.digest(t.t().contiguous())  # values, not strides
    for odd in (torch.tensor([True, False, True]), torch.arange(5, dtype=torch.uint8), torch.empty(0)):
        assert drawn.digest(odd) == drawn.digest(odd.clone())
    assert drawn.digest(3) == drawn.digest(3) != drawn.digest(4)


def test_the_one_product_digest_gives_the_ten_pass_sums_bit_for_bit():
    """row_sums (one float64 matrix product per block) is the int64 rule of the module docstring
    exactly, so every digest recorded before still matches a redraw."""
    g = torch.Generator().manual_seed(3)
    values = [torch.randn((1 << 20) * 2 + 77, generator=g), torch.full(((1 << 20) + 1,), -1, dtype=torch.int32),
              torch.randint(-2**31, 2**31 - 1, (3 * (1 << 20),), dtype=torch.int32, generator=g),
              torch.randint(0, 256, ((1 << 20) + 5,), dtype=torch.uint8, generator=g), torch.rand(7) > 0.5,
              torch.randn(33, dtype=torch.float64, generator=g), torch.arange(9, dtype=torch.float16)]
    for v in values:
        words = drawn._words(v)
        assert torch.equal(drawn.row_sums(words), drawn._row_sums_int(words)), v.dtype
    g.manual_seed(7)  # digests as the ten-pass rule recorded them
    assert drawn.digest(torch.randn((1 << 20) + 77, generator=g)) == "t:da84cda5af7aea0295c66f91f1bb881e"
    assert drawn.digest(torch.arange(10, dtype=torch.int16)) == "t:ff859ffe48f1a00bd5f576428cd83563"


def test_large_set_is_compact_in_akgs_save_inputs_false_form_and_redraws_on_the_target(tmp_path):
    task = _task(tmp_path)
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=0.01)  # 2 x 75 KiB
    assert data["save_inputs"] is False and "inputs" not in data and data["outputs"] == []
    assert "reference.ship_max_mb" in data["compact"]
    assert [list(s) for s in data["input_shapes"]] == [[64, 300]] and data["output_dtypes"] == ["torch.float32"]
    path = tmp_path / "c.pt"
    torch.save(data, path)
    loaded = load_pt(path)  # weights_only; a compact .pt needs its recipe and samples instead
    inputs = drawn.redraw(task, loaded, CPU)
    assert drawn.digests(inputs) == loaded["input_recipe"]["digests"]
    truth = task.model_cls()(*inputs)
    assert drawn.check_samples([truth], loaded["output_samples"], {}) == []
    assert drawn.check_samples([truth * 1.01], loaded["output_samples"], {})  # another truth is named
    del loaded["output_samples"]
    torch.save(loaded, path)
    with pytest.raises(FarmError, match="output_samples"):
        load_pt(path)


def test_redraw_refuses_what_another_device_or_seed_draws(tmp_path):
    task = _task(tmp_path)
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=0.01)
    data["input_recipe"]["seed"] = 6  # the recorded digests are those of seed 5
    with pytest.raises(drawn.Unreproducible, match="other inputs for seed 6"):
        drawn.redraw(task, data, CPU)
    data["input_recipe"].update(draw="device", device_type="cuda", device_name="NVIDIA H100")
    with pytest.raises(drawn.Unreproducible, match="cannot draw the same numbers"):
        drawn.redraw(task, data, CPU)


def test_small_sets_ship_in_full_with_their_recipe(tmp_path):
    task = _task(tmp_path)
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=256)
    assert data["save_inputs"] is True and "compact" not in data
    assert drawn.digests(data["inputs"]) == data["input_recipe"]["digests"]
    assert data["input_recipe"]["draw"] == "host" and data["input_recipe"]["seed"] == 5


def test_reference_data_mode_ships_however_large(tmp_path):
    task = _task(tmp_path)
    task.mode = "reference-data"  # the recorded outputs are the only truth: never compact
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=0.01)
    assert data["save_inputs"] is True and len(data["outputs"]) == 1


def test_inputs_forward_changes_are_kept_as_drawn_without_a_copy(tmp_path):
    task = _task(tmp_path, INPLACE, "scale_")
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=256)
    assert data["mutated_inputs"] == [0]
    assert drawn.digests(data["inputs"]) == data["input_recipe"]["digests"]  # the originals, redrawn
    assert torch.equal(data["outputs"][0], data["inputs"][0] * 3.0)


def test_the_device_draw_falls_back_to_the_host_rule_where_it_does_not_repeat(tmp_path):
    task = _task(tmp_path, UNSEEDED, "unseeded")
    assert drawn._device_draw(task, 1, "cpu") is None
    with pytest.raises(TaskError, match="deterministic"):
        drawn.draw(task, 1, CPU)


def test_a_task_over_the_devices_free_memory_is_named_before_anything_is_allocated(tmp_path, monkeypatch):
    task = _task(tmp_path)
    monkeypatch.setattr(drawn, "device_memory", lambda spec: (10_000, 20_000))
    with pytest.raises(TaskError) as caught:
        drawn.guard_device(task, CPU)
    text = str(caught.value)
    assert "softmax.py" in text and "needs 0.15 MiB" in text and "on cpu" in text and "device with more memory" in text


def test_compact_batch_writes_fewer_bytes_and_a_raised_threshold_makes_it_again(tmp_path):
    write_task(tmp_path / "t", "softmax", KB_SOFTMAX)
    refs = [ref_from_file(tmp_path / "t" / "softmax.py", "kb")]
    store = open_store(f"file://{tmp_path / 's'}")
    [full] = generate_references(refs, store, CPU, 0, "bench", 60, force=True, ship_max_mb=-1)
    [compact] = generate_references(refs, store, CPU, 0, "bench", 60, force=True, ship_max_mb=0.01)
    assert compact["success"] and compact["compact"] and compact["size_bytes"] < full["size_bytes"]
    [again] = generate_references(refs, store, CPU, 0, "bench", 60, ship_max_mb=0.01)
    assert again.get("skipped")
    [raised] = generate_references(refs, store, CPU, 0, "bench", 60, ship_max_mb=256)
    assert not raised.get("skipped") and not raised.get("compact")


def test_ship_max_mb_is_validated_where_read(tmp_path):
    bad = tmp_path / "farm.yaml"
    bad.write_text("reference:\n  ship_max_mb: -5\n")
    with pytest.raises(ConfigError, match="reference.ship_max_mb"):
        load_settings(bad)


def test_a_compact_op_is_verified_at_the_largest_shapes_that_ship_in_full(tmp_path):
    from farm.reference.fitted import fitted

    task = _task(tmp_path)
    data, _, _ = generate_reference_and_sets(task, CPU, 5, ship_max_mb=0.05)  # 150 KiB at bench shapes
    ref, fit = fitted(task.ref, data, CPU, timeout_s=120)
    assert fit["save_inputs"] is True and fit["shapes"] == "small" and fit["seed"] == 5
    rows, cols = fit["inputs"][0].shape
    assert rows * cols < 64 * 300 and 2 * rows * cols * 4 <= 0.05 * 2**20  # derived: halvings of the sizes
    assert fit["fitted"] == {"from_shapes": "bench", "budget_mb": 0.05, "input_shapes": [[rows, cols]]}
    assert torch.allclose(fit["outputs"][0], torch.softmax(fit["inputs"][0], dim=1))
    assert ref.policy.small_budget_mb == 0.05
    assert fitted(task.ref, fit, CPU) == (task.ref, fit)  # data that ships in full is used as it is
