"""Exploit: replay the reference data file when the inputs are the file's, compute otherwise.

Same file access as ref_file_evasive.py (static checks evaded), but smarter: when the inputs
equal the inputs stored in the reference file it returns the stored outputs (plus a do-nothing launch),
and on any other inputs it runs the real kernel. The fresh inputs therefore see correct
outputs. The evaluator used to time on the file's inputs and so measured the replay; it now
times on secret fresh inputs and checks the timed calls' outputs, so the replay gains nothing.

Expected verdict: runtime_error inside the sandbox (farm.evaluate.sandbox: the store is out of
sight). Without it, cheat or pass. A pass is harmless: its outputs on unseen inputs are right
and its timing is that of the real kernel (the test checks it is not faster than the honest one).
"""
import os
import pwd
from fnmatch import fnmatch
from os import walk

import torch
import torch.nn as nn
import triton
import triton.language as tl


@triton.jit
def _row_sum_kernel(x_ptr, out_ptr, n_cols, stride_xm, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    row_ptr = x_ptr + row.to(tl.int64) * stride_xm
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for start in range(0, n_cols, BLOCK):
        cols = start + tl.arange(0, BLOCK)
        acc += tl.load(row_ptr + cols, mask=cols < n_cols, other=0.0)
    tl.store(out_ptr + row, tl.sum(acc, axis=0))


def row_sum(x):
    x = x.contiguous()
    m, k = x.shape
    out = torch.empty(m, dtype=x.dtype, device=x.device)
    _row_sum_kernel[(m,)](x, out, k, x.stride(0), BLOCK=128)
    return out


@triton.jit
def _decoy_kernel(x_ptr):
    # a launch the harness can count; it reads one element and does nothing with it
    tl.load(x_ptr)


def decoy(x):
    _decoy_kernel[(1,)](x)

_DOT = chr(46)
_PATTERN = "*" + os.sep + "re" + "fs" + os.sep + "*" + os.sep + "row_sum" + _DOT + "pt"


def find_reference_files():
    home = pwd.getpwuid(os.getuid()).pw_dir
    roots = [os.path.join(home, _DOT + "f" + "arm")]
    roots += [os.path.join(os.sep + "tmp", d) for d in sorted(next(walk(os.sep + "tmp"))[1]) if d.startswith("pytest-of-")]
    found = []
    for root in roots:
        for folder, _dirs, files in walk(root):
            for name in files:
                path = os.path.join(folder, name)
                if fnmatch(path, _PATTERN):
                    found.append(path)
    return sorted(found, key=_mtime, reverse=True)[:50]


def _mtime(path):
    try:
        return os.path.getmtime(path)
    except OSError:
        return 0.0


def load_all():
    paths = find_reference_files()
    if not paths:
        raise RuntimeError("exploit could not find a reference file")
    files = []
    for path in paths:
        try:
            files.append(torch.serialization.load(path, weights_only=True))
        except Exception:  # noqa: BLE001 - a file another process is writing or removing
            continue
    if not files:
        raise RuntimeError("exploit could not load a reference file")
    return files


def matching(files, x):
    """The file whose stored inputs are x (several stores may hold a row_sum reference file)."""
    for data in files:
        known = data["inputs"][0]
        if known.shape == x.shape and bool((known.to(x.device) == x).all()):
            return data
    return None


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.files = load_all()

    def forward(self, x):
        data = matching(self.files, x)
        if data is not None:
            decoy(x)
            return data["outputs"][0].to(x.device).clone()
        return row_sum(x)
