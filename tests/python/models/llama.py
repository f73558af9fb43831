"""A small Llama-style language model written as llama2.c's model.py writes it (written here for
opfuse's tests): RMSNorm in float32 arithmetic, rotary embedding in real arithmetic, SwiGLU
feed-forward, manual causal attention with a registered mask (or, as model.py does where torch
has it, F.scaled_dot_product_attention: attention="sdpa"), token-id inputs.

    python3 -m opfuse tune tests/python/models/llama.py:factory
"""
import math

import torch
from torch import nn
from torch.nn import functional as F


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-5):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def _norm(self, x):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)

    def forward(self, x):
        return self._norm(x.float()).type_as(x) * self.weight


def precompute_freqs(dim, end, theta=10000.0):
    freqs = 1.0 / (theta ** (torch.arange(0, dim, 2)[: dim // 2].float() / dim))
    t = torch.arange(end).float()
    freqs = torch.outer(t, freqs)
    return torch.cos(freqs), torch.sin(freqs)


def apply_rotary_emb(xq, xk, cos, sin):
    xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
    xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)
    cos = cos.view(1, cos.shape[0], 1, cos.shape[1])
    sin = sin.view(1, sin.shape[0], 1, sin.shape[1])
    xq_out_r = xq_r * cos - xq_i * sin
    xq_out_i = xq_r * sin + xq_i * cos
    xk_out_r = xk_r * cos - xk_i * sin
    xk_out_i = xk_r * sin + xk_i * cos
    xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
    xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


class Attention(nn.Module):
    def __init__(self, dim, n_heads, max_seq_len, dropout, sdpa=False):
        super().__init__()
        self.n_heads, self.head_dim, self.sdpa, self.dropout = n_heads, dim // n_heads, sdpa, dropout
        self.wq = nn.Linear(dim, dim, bias=False)
        self.wk = nn.Linear(dim, dim, bias=False)
        self.wv = nn.Linear(dim, dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)
        mask = torch.full((1, 1, max_seq_len, max_seq_len), float("-inf"))
        self.register_buffer("mask", torch.triu(mask, diagonal=1))

    def forward(self, x, cos, sin):
        bsz, seqlen, _ = x.shape
        xq = self.wq(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xk = self.wk(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xv = self.wv(x).view(bsz, seqlen, self.n_heads, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, cos, sin)
        xq, xk, xv = xq.transpose(1, 2), xk.transpose(1, 2), xv.transpose(1, 2)
        if self.sdpa:
            output = F.scaled_dot_product_attention(xq, xk, xv, dropout_p=self.dropout if self.training else 0.0,
                                                    is_causal=True)
            output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
            return self.resid_dropout(self.wo(output))
        scores = torch.matmul(xq, xk.transpose(2, 3)) / math.sqrt(self.head_dim)
        scores = scores + self.mask[:, :, :seqlen, :seqlen]
        scores = F.softmax(scores.float(), dim=-1).type_as(xq)
        scores = self.attn_dropout(scores)
        output = torch.matmul(scores, xv)
        output = output.transpose(1, 2).contiguous().view(bsz, seqlen, -1)
        return self.resid_dropout(self.wo(output))


class FeedForward(nn.Module):
    def __init__(self, dim, hidden_dim, dropout):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        return self.dropout(self.w2(F.silu(self.w1(x)) * self.w3(x)))


class TransformerBlock(nn.Module):
    def __init__(self, dim, n_heads, max_seq_len, dropout, sdpa=False):
        super().__init__()
        self.attention = Attention(dim, n_heads, max_seq_len, dropout, sdpa)
        self.feed_forward = FeedForward(dim, 4 * dim * 2 // 3 // 32 * 32, dropout)
        self.attention_norm = RMSNorm(dim)
        self.ffn_norm = RMSNorm(dim)

    def forward(self, x, cos, sin):
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    def __init__(self, vocab_size=512, dim=128, n_layers=2, n_heads=4, max_seq_len=64, dropout=0.0, sdpa=False):
        super().__init__()
        self.tok_embeddings = nn.Embedding(vocab_size, dim)
        self.layers = nn.ModuleList(TransformerBlock(dim, n_heads, max_seq_len, dropout, sdpa) for _ in range(n_layers))
        self.norm = RMSNorm(dim)
        self.output = nn.Linear(dim, vocab_size, bias=False)
        cos, sin = precompute_freqs(dim // n_heads, max_seq_len)
        self.register_buffer("freqs_cos", cos, persistent=False)
        self.register_buffer("freqs_sin", sin, persistent=False)

    def forward(self, tokens, targets=None):
        seqlen = tokens.shape[1]
        h = self.tok_embeddings(tokens)
        cos, sin = self.freqs_cos[:seqlen], self.freqs_sin[:seqlen]
        for layer in self.layers:
            h = layer(h, cos, sin)
        logits = self.output(self.norm(h))
        if targets is None:
            return logits
        # llama2.c keeps this loss on the model (self.last_loss), where a loss function given the
        # forward's output cannot reach it; this one returns it beside the logits, as nanoGPT's does
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


def factory(batch_size=8, seq_len=64, vocab_size=512, seed=0, attention="manual", loss_inside=False):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune llama.py:factory`: next-token loss.
    attention: "manual" (matmul, mask, softmax, matmul) or "sdpa" (torch's fused op). loss_inside:
    the targets go into the forward, which computes the loss, as llama2.c's train.py trains it
    (`model(X, Y)`); else the loss is computed from the logits outside the model."""
    if attention not in ("manual", "sdpa"):
        raise ValueError(f"attention must be 'manual' or 'sdpa', not {attention!r}")
    torch.manual_seed(seed)
    model = Transformer(vocab_size=vocab_size, max_seq_len=seq_len, sdpa=attention == "sdpa")
    tokens = torch.randint(vocab_size, (batch_size, seq_len + 1))
    x, y = tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
    if loss_inside:
        return model, (x, y), lambda out: out[1]
    return model, (x,), lambda logits: F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))
