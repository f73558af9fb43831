"""GPT-2's model (gpt2.py) with GPT-NeoX's attention core, as Hugging Face's modeling_gpt_neox.py
(transformers 4.36, Pythia) writes `_attn` (written here for opfuse's tests): q and k viewed as
[B·H, T, D], the scores made by `torch.baddbmm` on a zeros tensor with alpha = head_dim ** -0.5,
viewed back, masked with `torch.where(bias[…], scores, finfo.min)`, the padding mask added,
softmax, `.to(value.dtype)`, the dropout module.

    python3 -m opfuse tune tests/python/models/gpt_neox.py:factory
"""
import torch
from torch import nn

import gpt2


class GPTNeoXAttention(gpt2.GPT2Attention):
    def _split_heads(self, tensor, num_heads, attn_head_size):
        return super()._split_heads(tensor, num_heads, attn_head_size).contiguous()  # as NeoX's rotary cat leaves q, k

    def _attn(self, query, key, value, attention_mask=None, head_mask=None):
        batch_size, num_attention_heads, query_length, attn_head_size = query.size()
        key_length = key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        query = query.view(batch_size * num_attention_heads, query_length, attn_head_size)
        key = key.view(batch_size * num_attention_heads, key_length, attn_head_size)
        attn_scores = torch.zeros(batch_size * num_attention_heads, query_length, key_length, dtype=query.dtype,
                                  device=key.device)
        attn_scores = torch.baddbmm(attn_scores, query, key.transpose(1, 2), beta=1.0, alpha=attn_head_size ** -0.5)
        attn_scores = attn_scores.view(batch_size, num_attention_heads, query_length, key_length)
        mask_value = torch.tensor(torch.finfo(attn_scores.dtype).min, dtype=attn_scores.dtype).to(attn_scores.device)
        attn_scores = torch.where(causal_mask, attn_scores, mask_value)
        if attention_mask is not None:
            attn_scores = attn_scores + attention_mask
        attn_weights = nn.functional.softmax(attn_scores, dim=-1)
        attn_weights = attn_weights.to(value.dtype)
        if head_mask is not None:
            attn_weights = attn_weights * head_mask
        attn_weights = self.attn_dropout(attn_weights)
        return torch.matmul(attn_weights, value), attn_weights


def factory(batch_size=8, seq_len=128, vocab_size=256, n_layer=2, n_head=4, n_embd=128, dropout=0.1, seed=0):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune gpt_neox.py:factory`: the loss the model
    computes from its labels."""
    torch.manual_seed(seed)
    model = gpt2.GPT2LMHeadModel(vocab_size, seq_len, n_embd, n_layer, n_head, dropout)
    for block in model.h:
        block.attn = GPTNeoXAttention(n_embd, n_head, seq_len, dropout)
    tokens = torch.randint(vocab_size, (batch_size, seq_len))
    return model, (tokens, tokens), lambda loss: loss
