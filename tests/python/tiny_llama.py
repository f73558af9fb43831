"""A small Llama-style stack on token embeddings given as input: residual blocks whose RMSNorms are
written three ways (llama2.c's `self._norm(x.float()).type_as(x) * self.weight`, Hugging Face's
LlamaRMSNorm, and without casts), each after a residual add but the first; scripted and saved for
`opfuse rewrite` / `opfuse tune --model FILE --loss mse`.

    python3 tiny_llama.py OUT.pt
"""
import sys

import torch
from torch import nn
from torch.nn import functional as F


class Llama2cRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


class HFRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.variance_epsilon = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states.to(input_dtype)


class PlainRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)

    def forward(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


class Block(nn.Module):
    """The attention is a projection here: the norms and residual adds are what is tested."""

    def __init__(self, dim, norm):
        super().__init__()
        self.attention_norm, self.ffn_norm = norm(dim), norm(dim)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.w1 = nn.Linear(dim, 2 * dim, bias=False)
        self.w2 = nn.Linear(2 * dim, dim, bias=False)

    def forward(self, x):
        h = x + self.wo(self.attention_norm(x))
        return h + self.w2(F.gelu(self.w1(self.ffn_norm(h))))


class TinyLlama(nn.Module):
    def __init__(self, dim=32):
        super().__init__()
        self.layers = nn.Sequential(Block(dim, Llama2cRMSNorm), Block(dim, HFRMSNorm))
        self.norm = PlainRMSNorm(dim)

    def forward(self, x):
        return self.norm(self.layers(x))


if __name__ == "__main__":
    torch.manual_seed(0)
    torch.jit.script(TinyLlama()).save(sys.argv[1])
