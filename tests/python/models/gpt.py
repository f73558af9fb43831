"""A small GPT written the way minGPT's model.py writes it (written here for opfuse's tests):
causal self-attention by hand with a registered tril buffer sliced to T, attention and residual
dropout, the tanh GELU spelled out, token and position embeddings, next-token cross-entropy.

    python3 -m opfuse tune tests/python/models/gpt.py:factory
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class NewGELU(nn.Module):
    def forward(self, x):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        assert n_embd % n_head == 0
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))
        self.n_head, self.n_embd = n_head, n_embd

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
        y = y.transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class Block(nn.Module):
    def __init__(self, n_embd, n_head, block_size, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, block_size, dropout)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.ModuleDict(dict(c_fc=nn.Linear(n_embd, 4 * n_embd), c_proj=nn.Linear(4 * n_embd, n_embd),
                                      act=NewGELU(), dropout=nn.Dropout(dropout)))
        m = self.mlp
        self.mlpf = lambda x: m.dropout(m.c_proj(m.act(m.c_fc(x))))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlpf(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab_size=256, block_size=64, n_layer=2, n_head=4, n_embd=128, dropout=0.1):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd), drop=nn.Dropout(dropout),
            h=nn.ModuleList(Block(n_embd, n_head, block_size, dropout) for _ in range(n_layer)),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx):
        b, t = idx.size()
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device).unsqueeze(0)
        x = self.transformer.drop(self.transformer.wte(idx) + self.transformer.wpe(pos))
        for block in self.transformer.h:
            x = block(x)
        return self.lm_head(self.transformer.ln_f(x))


def factory(batch_size=8, seq_len=64, vocab_size=256, n_layer=2, n_head=4, n_embd=128, dropout=0.1, seed=0):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune gpt.py:factory`: next-token loss."""
    torch.manual_seed(seed)
    model = GPT(vocab_size, seq_len, n_layer, n_head, n_embd, dropout)
    tokens = torch.randint(vocab_size, (batch_size, seq_len + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    return model, (x,), lambda logits: F.cross_entropy(logits.view(-1, logits.size(-1)), y.view(-1))
