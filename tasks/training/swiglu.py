"""Fused SwiGLU: gate, SiLU and value product in one op, forward and backward.

    y = silu(gate) * up = gate * sigmoid(gate) * up      (float32 inside, input dtype out)

Gradients of gate and up. An MLP's activation at training shapes: 8192 tokens x 11008
intermediate (LLaMA-7B), bf16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
INTERMEDIATE = 11008
DTYPE = torch.bfloat16

SMALL_SHAPES = {"TOKENS": 5, "INTERMEDIATE": 72}
BACKWARD = True
TAGS = ("elementwise", "training", "memory-bound")


class Model(nn.Module):
    def forward(self, gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
        return (F.silu(gate.float()) * up.float()).to(gate.dtype)


def get_inputs():
    return [torch.randn(TOKENS, INTERMEDIATE).to(DTYPE), torch.randn(TOKENS, INTERMEDIATE).to(DTYPE)]


def get_init_inputs():
    return []
