"""A small GPT written as minGPT writes it (hand-written causal attention: q @ kᵀ scaled, a
registered tril mask sliced and compared with 0, softmax, attention dropout, @ v), on token
embeddings given as input; scripted and saved for `opfuse tune --model FILE --loss mse`.
With --tokens VOCAB, a language model instead: forward(token ids, a bool mask of the tokens to
keep) → logits, for a model with two inputs, neither of them float.

    python3 tiny_gpt.py OUT.pt [--tokens VOCAB]
"""
import math
import sys

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.n_head, self.n_embd = n_head, n_embd
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = self.attn_dropout(att)
        y = att @ v
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.fc = nn.Linear(n_embd, 4 * n_embd)
        self.proj = nn.Linear(4 * n_embd, n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class TinyGPT(nn.Module):
    def __init__(self, n_embd=64, n_head=4, block_size=64, n_layer=2, dropout=0.1):
        super().__init__()
        self.blocks = nn.Sequential(*[Block(n_embd, n_head, block_size, dropout) for _ in range(n_layer)])
        self.ln_f = nn.LayerNorm(n_embd)

    def forward(self, x):
        return self.ln_f(self.blocks(x))


class TinyLM(nn.Module):
    def __init__(self, vocab, n_embd=64):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.gpt = TinyGPT(n_embd)
        self.head = nn.Linear(n_embd, vocab, bias=False)

    def forward(self, idx, keep):
        x = self.wte(idx) * keep.unsqueeze(-1).to(self.wte.weight.dtype)
        return self.head(self.gpt(x))


if __name__ == "__main__":
    torch.manual_seed(0)
    model = TinyLM(int(sys.argv[3])) if sys.argv[2:3] == ["--tokens"] else TinyGPT()
    torch.jit.script(model).save(sys.argv[1])
