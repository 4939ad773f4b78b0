"""Training ops: the task format's BACKWARD/GRAD_INPUTS and the gradients the .pt records."""

import torch

from farm.corpus import tasks as taskfiles
from farm.errors import TaskError
from farm.reference.generate import PT_KEYS, generate_reference
from farm.targets import resolve_device


def _task(tmp_path, body: str):
    path = tmp_path / "op.py"
    path.write_text(body)
    return taskfiles.load_task(taskfiles.ref_from_file(path), "small")


LAYER = '''
import torch, torch.nn as nn
BACKWARD = True
GRAD_INPUTS = {grad}
class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 3)
    def forward(self, x, mask):
        return self.lin(x) * mask
def get_inputs():
    return [torch.randn(2, 4), (torch.rand(2, 3) > 0.5).float()]
def get_init_inputs():
    return []
'''


def test_the_pt_keeps_its_keys_and_adds_the_gradients_of_inputs_and_parameters(tmp_path):
    task = _task(tmp_path, LAYER.format(grad="(0,)"))
    assert task.backward and task.grad_inputs == (0,)
    data = generate_reference(task, resolve_device("cpu"), seed=3)
    assert set(PT_KEYS) <= set(data)
    assert data["grad_input_indices"] == [0]
    x, mask = data["inputs"]
    torch.manual_seed(3)
    model = task.model_cls()
    xg = x.clone().requires_grad_(True)
    (model(xg, mask) * data["grad_outputs"][0]).sum().backward()
    torch.testing.assert_close(data["grad_inputs"][0], xg.grad)
    torch.testing.assert_close(data["grad_params"]["lin.weight"], model.lin.weight.grad)
    again = generate_reference(task, resolve_device("cpu"), seed=3)
    assert torch.equal(again["grad_outputs"][0], data["grad_outputs"][0])  # the upstream gradient is seeded


def test_forward_only_tasks_record_no_gradients(tmp_path):
    data = generate_reference(_task(tmp_path, LAYER.replace("BACKWARD = True\nGRAD_INPUTS = {grad}\n", "")),
                              resolve_device("cpu"), seed=0)
    assert "grad_inputs" not in data


def test_backward_metadata_is_checked(tmp_path):
    import pytest

    with pytest.raises(TaskError, match="BACKWARD must be True or False"):
        _task(tmp_path, LAYER.replace("BACKWARD = True", "BACKWARD = 'yes'").format(grad="(0,)"))
    with pytest.raises(TaskError, match="GRAD_INPUTS must be a tuple"):
        _task(tmp_path, LAYER.format(grad="'x'"))
    with pytest.raises(TaskError, match="GRAD_INPUTS needs BACKWARD"):
        _task(tmp_path, LAYER.replace("BACKWARD = True", "BACKWARD = False").format(grad="(0,)"))
