"""Exploit: a PyTorch-only forward, no Triton at all.

Expected verdict: cheat, from the static checks (no @triton.jit kernel in the source).
"""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.sum(dim=-1)

