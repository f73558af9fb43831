"""A small T5-style encoder written the way Hugging Face's modeling_t5.py (transformers 4.36)
writes its self-attention (written here for opfuse's tests): no scaling of the scores, a trained
relative position bias [1, H, T, S] (an embedding of bucketed distances) computed by the first
layer and handed to the others, the padding mask added to it, `scores += position_bias`, softmax
on `scores.float()` then `.type_as(scores)`, `F.dropout(p=self.dropout, training=self.training)`.

    python3 -m opfuse tune tests/python/models/t5.py:factory
"""
import torch
from torch import nn


class T5Attention(nn.Module):
    def __init__(self, d_model=32, n_heads=4, num_buckets=8, dropout=0.1, has_relative_attention_bias=True):
        super().__init__()
        self.n_heads, self.d_kv, self.num_buckets, self.dropout = n_heads, d_model // n_heads, num_buckets, dropout
        self.q, self.k, self.v = (nn.Linear(d_model, d_model, bias=False) for _ in range(3))
        self.o = nn.Linear(d_model, d_model, bias=False)
        if has_relative_attention_bias:
            self.relative_attention_bias = nn.Embedding(num_buckets, n_heads)

    def compute_bias(self, query_length, key_length):
        context = torch.arange(query_length, dtype=torch.long)[:, None]
        memory = torch.arange(key_length, dtype=torch.long)[None, :]
        half = self.num_buckets // 2  # bidirectional: one half of the buckets per direction
        distance = (memory - context).abs().clamp(max=half - 1)
        buckets = distance + (memory > context).to(torch.long) * half
        return self.relative_attention_bias(buckets).permute([2, 0, 1]).unsqueeze(0)

    def forward(self, hidden_states, mask=None, position_bias=None):
        """(output, position_bias): the bias (with the mask added) for the next layer."""
        batch_size, seq_length = hidden_states.shape[:2]

        def shape(states):
            return states.view(batch_size, -1, self.n_heads, self.d_kv).transpose(1, 2)

        query_states, key_states, value_states = (shape(f(hidden_states)) for f in (self.q, self.k, self.v))
        scores = torch.matmul(query_states, key_states.transpose(3, 2))
        if position_bias is None:
            position_bias = self.compute_bias(seq_length, seq_length)
            if mask is not None:
                position_bias = position_bias + mask
        scores += position_bias
        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous().view(batch_size, -1, self.n_heads * self.d_kv)
        return self.o(attn_output), position_bias


class T5Encoder(nn.Module):
    """Pre-norm blocks (LayerNorm standing in for T5's RMSNorm), a ReLU MLP, an LM head."""

    def __init__(self, vocab_size=256, d_model=128, n_heads=4, n_layer=4, dropout=0.1):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.attention_norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layer)])
        self.attentions = nn.ModuleList([T5Attention(d_model, n_heads, 32, dropout, i == 0) for i in range(n_layer)])
        self.mlp_norms = nn.ModuleList([nn.LayerNorm(d_model) for _ in range(n_layer)])
        self.mlps = nn.ModuleList([nn.Sequential(nn.Linear(d_model, 4 * d_model), nn.ReLU(), nn.Linear(4 * d_model, d_model))
                                   for _ in range(n_layer)])
        self.head = nn.Linear(d_model, vocab_size)

    def forward(self, tokens, mask=None):
        x, bias = self.embed(tokens), None
        for attention_norm, attention, mlp_norm, mlp in zip(self.attention_norms, self.attentions, self.mlp_norms,
                                                            self.mlps):
            out, bias = attention(attention_norm(x), mask, bias)
            x = x + out
            x = x + mlp(mlp_norm(x))
        return self.head(x)


def factory(batch_size=8, seq_len=128, vocab_size=256, n_layer=4, seed=0):
    """(model, inputs, loss_fn) for `python3 -m opfuse tune t5.py:factory`: next-token cross-entropy."""
    torch.manual_seed(seed)
    model = T5Encoder(vocab_size, n_layer=n_layer)
    tokens = torch.randint(vocab_size, (batch_size, seq_len))
    return model, (tokens,), lambda logits: nn.functional.cross_entropy(logits.reshape(-1, vocab_size),
                                                                         tokens.reshape(-1))
