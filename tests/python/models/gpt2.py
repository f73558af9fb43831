"""A small GPT-2 written the way Hugging Face's modeling_gpt2.py (transformers 4.36, before its
SDPA path) writes it (written here for opfuse's tests): Conv1D projections (addmm with the weight
stored [in, out]), heads split with view + permute, `_attn` masking the scores with
`torch.where(bias[…], scores, finfo.min)` after dividing them by a `torch.full` scalar, softmax
then `.type(value.dtype)`, dropout modules, the GELU written out (NewGELUActivation), the LM head
tied to the token embedding and the loss computed in the forward on shifted labels.

    python3 -m opfuse tune tests/python/models/gpt2.py:factory
"""
import math

import torch
from torch import nn


class Conv1D(nn.Module):
    """A linear layer whose weight is stored [in, out], as GPT-2's checkpoint holds it."""

    def __init__(self, nf, nx):
        super().__init__()
        self.nf = nf
        self.weight = nn.Parameter(torch.randn(nx, nf) * 0.02)
        self.bias = nn.Parameter(torch.zeros(nf))

    def forward(self, x):
        out_shape = x.size()[:-1] + (self.nf,)
        x = torch.addmm(self.bias, x.view(-1, x.size(-1)), self.weight)
        return x.view(out_shape)


class NewGELUActivation(nn.Module):
    def forward(self, input):
        return 0.5 * input * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (input + 0.044715 * torch.pow(input, 3.0))))


class GPT2Attention(nn.Module):
    def __init__(self, n_embd, n_head, n_positions, dropout):
        super().__init__()
        self.register_buffer("bias", torch.tril(torch.ones((n_positions, n_positions), dtype=torch.bool))
                             .view(1, 1, n_positions, n_positions), persistent=False)
        self.num_heads, self.head_dim, self.split_size = n_head, n_embd // n_head, n_embd
        self.c_attn = Conv1D(3 * n_embd, n_embd)
        self.c_proj = Conv1D(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(dropout)
        self.resid_dropout = nn.Dropout(dropout)

    def _attn(self, query, key, value, attention_mask=None):
        attn_weights = torch.matmul(query, key.transpose(-1, -2))
        attn_weights = attn_weights / torch.full([], value.size(-1) ** 0.5, dtype=attn_weights.dtype,
                                                 device=attn_weights.device)
        query_length, key_length = query.size(-2), key.size(-2)
        causal_mask = self.bias[:, :, key_length - query_length: key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        if attention_mask is not None:
            attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(value.dtype)
        attn_weights = self.attn_dropout(attn_weights)
        attn_output = torch.matmul(attn_weights, value)
        return attn_output, attn_weights

    def _split_heads(self, tensor, num_heads, attn_head_size):
        new_shape = tensor.size()[:-1] + (num_heads, attn_head_size)
        return tensor.view(new_shape).permute(0, 2, 1, 3)

    def _merge_heads(self, tensor, num_heads, attn_head_size):
        tensor = tensor.permute(0, 2, 1, 3).contiguous()
        return tensor.view(tensor.size()[:-2] + (num_heads * attn_head_size,))

    def forward(self, hidden_states, attention_mask=None, use_cache=False, output_attentions=False):
        query, key, value = self.c_attn(hidden_states).split(self.split_size, dim=2)
        query = self._split_heads(query, self.num_heads, self.head_dim)
        key = self._split_heads(key, self.num_heads, self.head_dim)
        value = self._split_heads(value, self.num_heads, self.head_dim)
        present = (key, value) if use_cache else None
        attn_output, attn_weights = self._attn(query, key, value, attention_mask)
        attn_output = self._merge_heads(attn_output, self.num_heads, self.head_dim)
        attn_output = self.resid_dropout(self.c_proj(attn_output))
        outputs = (attn_output, present)
        if output_attentions:
            outputs += (attn_weights,)
        return outputs


class GPT2MLP(nn.Module):
    def __init__(self, intermediate_size, n_embd, dropout):
        super().__init__()
        self.c_fc = Conv1D(intermediate_size, n_embd)
        self.c_proj = Conv1D(n_embd, intermediate_size)
        self.act = NewGELUActivation()
        self.dropout = nn.Dropout(dropout)

    def forward(self, hidden_states):
        return self.dropout(self.c_proj(self.act(self.c_fc(hidden_states))))


class GPT2Block(nn.Module):
    def __init__(self, n_embd, n_head, n_positions, dropout):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd, eps=1e-5)
        self.attn = GPT2Attention(n_embd, n_head, n_positions, dropout)
        self.ln_2 = nn.LayerNorm(n_embd, eps=1e-5)
        self.mlp = GPT2MLP(4 * n_embd, n_embd, dropout)

    def forward(self, hidden_states, attention_mask=None):
        residual = hidden_states
        attn_outputs = self.attn(self.ln_1(hidden_states), attention_mask=attention_mask)
        hidden_states = attn_outputs[0] + residual
        residual = hidden_states
        return residual + self.mlp(self.ln_2(hidden_states))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, vocab_size=256, n_positions=64, n_embd=128, n_layer=2, n_head=4, dropout=0.1):
        super().__init__()
        self.wte = nn.Embedding(vocab_size, n_embd)
        self.wpe = nn.Embedding(n_positions, n_embd)
        self.drop = nn.Dropout(dropout)
        self.h = nn.ModuleList(GPT2Block(n_embd, n_head, n_positions, dropout) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(n_embd, eps=1e-5)
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, input_ids, labels=None):
        position_ids = torch.arange(0, input_ids.size(-1), dtype=torch.long, device=input_ids.device).unsqueeze(0)
        hidden_states = self.drop(self.wte(input_ids) + self.wpe(position_ids))
        for block in self.h:
            hidden_states = block(hidden_states)
        lm_logits = self.lm_head(self.ln_f(hidden_states))
        if labels is None:
            return lm_logits
        shift_logits = lm_logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss_fct = nn.CrossEntropyLoss()
        return loss_fct(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def factory(batch_size=8, seq_len=64, vocab_size=256, n_layer=2, n_head=4, n_embd=128, dropout=0.1, seed=0):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune gpt2.py:factory`: the loss the model
    computes from its labels."""
    torch.manual_seed(seed)
    model = GPT2LMHeadModel(vocab_size, seq_len, n_embd, n_layer, n_head, dropout)
    tokens = torch.randint(vocab_size, (batch_size, seq_len))
    return model, (tokens, tokens), lambda loss: loss
