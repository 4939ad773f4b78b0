"""How commands reach a candidate runner (farm.evaluate.runner): large tensor payloads as an
anonymous memory file whose descriptor travels with the frame (no path in the runner's folder),
small ones through the socket. Both carry unsigned pointer tables and their pointees."""

import pytest
import torch

from farm.evaluate import runner as runner_module
from farm.evaluate import sandbox, wire
from farm.evaluate.runner import Limits, Runner
from farm.runtime import pointers
from farm.targets import resolve_device

ECHO = '''
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x, table):
        return [x + 1, table.clone()]
'''


@pytest.fixture
def runner():
    sb = Runner(resolve_device("cpu"), Limits(start_s=60), sandbox.current())
    try:
        yield sb
    finally:
        sb.close()


def _inputs():
    x = torch.randn(64, 32)
    src = torch.arange(16, dtype=torch.int32)
    return pointers.encode([x, torch.tensor([src.data_ptr()], dtype=torch.uint64)], [src])


def _files_made(monkeypatch) -> list:
    made = []
    real = wire.memfile

    def spy(*args, **kwargs):
        made.append(args)
        return real(*args, **kwargs)

    monkeypatch.setattr(wire, "memfile", spy)
    return made


@pytest.mark.parametrize("threshold, through_file", [(1, True), (runner_module.FILE_MIN_BYTES, False)])
def test_an_input_set_arrives_whole_either_way_and_leaves_no_file(runner, monkeypatch, threshold, through_file):
    monkeypatch.setattr(runner_module, "FILE_MIN_BYTES", threshold)
    made = _files_made(monkeypatch)
    inputs = _inputs()
    assert runner.call("load_source", 60, source=ECHO, init_inputs=[]).get("ok")
    assert runner.call("put_inputs", 60, key="a", inputs=inputs).get("ok")
    reply = runner.call("run", 60, key="a")
    assert reply.get("ok"), reply
    assert torch.equal(reply["outputs"][0], inputs[0] + 1)
    # the runner resolved the token to the address of the pointee it received with the table
    table = reply["outputs"][1]
    assert table.dtype == torch.uint64 and (int(table[0]) >> 48) != pointers.TAG and int(table[0]) != 0
    assert bool(made) == through_file
