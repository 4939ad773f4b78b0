"""Binary cross-entropy with logits, per-sample weights, reduction 'sum'; forward and backward.

    l_i = -w_i * (t_i * log(sigmoid(x_i)) + (1 - t_i) * log(1 - sigmoid(x_i)))   (stable form)
    out = sum(l) (a scalar)

as torch.nn.functional.binary_cross_entropy_with_logits(x, t, weight=w, reduction='sum'),
in float32. Gradient of the logits x (targets and weights are data). A multi-label head:
4096 samples x 1024 labels.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F

SAMPLES = 4096
LABELS = 1024
REDUCTION = "sum"

SMALL_SHAPES = {"SAMPLES": 6, "LABELS": 40}
BACKWARD = True
GRAD_INPUTS = (0,)  # logits only: targets and weights are data
TAGS = ("loss", "reduction", "training")


class Model(nn.Module):
    def __init__(self, reduction: str = "mean"):
        super().__init__()
        self.reduction = reduction

    def forward(self, logits: torch.Tensor, target: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return F.binary_cross_entropy_with_logits(logits, target, weight=weight, reduction=self.reduction)


def get_inputs():
    logits = 2.0 * torch.randn(SAMPLES, LABELS)
    target = (torch.rand(SAMPLES, LABELS) > 0.5).float()
    weight = 0.5 + torch.rand(SAMPLES, LABELS)
    return [logits, target, weight]


def get_init_inputs():
    return [REDUCTION]
