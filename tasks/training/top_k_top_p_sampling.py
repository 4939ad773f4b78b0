"""Top-k / top-p (nucleus) sampling of the next token, inference only (no backward).

The randomness is an input, so the chosen token is exact: `noise` holds uniform numbers in
(0, 1), one per vocabulary entry, and sampling from the renormalised distribution q is the
exponential race  token = argmax_j q_j / -log(noise_j)  (an exact sample of q for uniform
noise). q keeps the top_k most likely tokens of softmax(logits / temperature), then the
smallest prefix of them (by descending probability) whose mass reaches top_p.

Output: int64 token ids, one per row. A serving batch: 256 sequences x 128256 vocabulary
(LLaMA-3), float32 logits, top_k = 50, top_p = 0.9, temperature = 0.7.
"""
import torch
import torch.nn as nn

BATCH = 256
VOCAB = 128256
TOP_K = 50
TOP_P = 0.9
TEMPERATURE = 0.7

SMALL_SHAPES = {"BATCH": 4, "VOCAB": 300, "TOP_K": 20}
TAGS = ("sampling", "reduction", "inference")


class Model(nn.Module):
    def __init__(self, top_k: int, top_p: float, temperature: float):
        super().__init__()
        self.top_k, self.top_p, self.temperature = top_k, top_p, temperature

    def forward(self, logits: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(logits.float() / self.temperature, dim=-1)
        top, idx = probs.topk(self.top_k, dim=-1)  # sorted, descending
        before = top.cumsum(dim=-1) - top  # mass of the more likely tokens
        top = torch.where(before < self.top_p, top, torch.zeros((), dtype=top.dtype))
        race = top / -torch.log(noise.gather(-1, idx))
        return idx.gather(-1, race.argmax(dim=-1, keepdim=True)).squeeze(-1)


def get_inputs():
    logits = 3.0 * torch.randn(BATCH, VOCAB)
    noise = torch.rand(BATCH, VOCAB).clamp_min(1e-12)
    return [logits, noise]


def get_init_inputs():
    return [TOP_K, TOP_P, TEMPERATURE]
