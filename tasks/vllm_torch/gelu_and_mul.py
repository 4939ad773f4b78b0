"""GeluAndMul: GeGLU activation (vLLM ``GeluAndMul.forward_native``).

The input's last dimension holds two halves of width d = x.shape[-1] // 2:

    out[..., j] = gelu(x[..., j]) * x[..., d + j],   0 <= j < d

with the exact (erf) GELU when ``approximate == "none"``:

    gelu(a) = 0.5 * a * (1 + erf(a / sqrt(2)))

and the tanh approximation when ``approximate == "tanh"``:

    gelu(a) = 0.5 * a * (1 + tanh(sqrt(2/pi) * (a + 0.044715 a^3)))

``approximate`` is the constructor argument (this task uses "none"). Output shape is
x.shape[:-1] + (d,), dtype of x; computed in the input dtype like the native forward.

Typical shapes: vLLM's activation tests/benchmarks use num_tokens x 2*d, d in
{512, 1024, ...}, fp16/bf16; here 83 x 2*1024, fp16.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

NUM_TOKENS = 83
D = 1024
DTYPE = torch.float16
APPROXIMATE = "none"

SMALL_SHAPES = {"NUM_TOKENS": 5, "D": 67}

TAGS = ("elementwise", "activation", "memory-bound")


class Model(nn.Module):
    def __init__(self, approximate: str = "none"):
        super().__init__()
        assert approximate in ("none", "tanh")
        self.approximate = approximate

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        d = x.shape[-1] // 2
        return F.gelu(x[..., :d], approximate=self.approximate) * x[..., d:]


def get_inputs():
    x = torch.randn(NUM_TOKENS, 2 * D).to(DTYPE)
    return [x]


def get_init_inputs():
    return [APPROXIMATE]
