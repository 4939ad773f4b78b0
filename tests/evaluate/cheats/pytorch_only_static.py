"""Exploit: a PyTorch-only forward, no Triton at all.

Expected verdict: cheat, from the static checks (not a Triton kernel: no @triton.jit function).
"""
import torch.nn as nn


class ModelNew(nn.Module):
    def forward(self, x):
        return x.sum(dim=-1)

