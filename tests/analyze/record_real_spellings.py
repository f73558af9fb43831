"""Records forward + backward of small modules spelled as real model code spells them (Hugging Face
Llama's RMSNorm and rotate_half, llama2.c's RMSNorm and real-arithmetic RoPE, Meta's complex RoPE,
GPT-J's rotate_every_two, RMSNorm as mean(x*x), pow(-0.5) and x / sqrt(…), minGPT's NewGELU and
attention with dropout, Hugging Face's eager attention, GPT-2's torch.where one, GPT-NeoX's baddbmm one and T5's,
SwiGLU three ways)
with torch's profiler, one Chrome trace per module: the fixtures under
tests/data/traces/real_spellings/ (gzipped). Debian's torch 1.13 has no Kineto, so these are the
legacy profiler's traces: whole µs, no shapes.

    python3 tests/analyze/record_real_spellings.py bfloat16 OUT_DIR
"""
import json, math, sys
import torch
from torch import nn
from torch.nn import functional as F

torch.manual_seed(0)
D, H, T, B = 16, 2, 4, 2
dt = getattr(torch, sys.argv[1]) if len(sys.argv) > 1 else torch.float32

class HFRMSNorm(nn.Module):  # transformers' LlamaRMSNorm
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D)); s.variance_epsilon = 1e-6
    def forward(s, hidden_states):
        input_dtype = hidden_states.dtype
        hidden_states = hidden_states.to(torch.float32)
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + s.variance_epsilon)
        return s.weight * hidden_states.to(input_dtype)

class L2CRMSNorm(nn.Module):  # llama2.c / Meta
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D)); s.eps = 1e-5
    def _norm(s, x): return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + s.eps)
    def forward(s, x): return s._norm(x.float()).type_as(x) * s.weight

class MeanSqRMSNorm(nn.Module):  # mean(x*x)
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D))
    def forward(s, x): return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + 1e-6) * s.weight

class PowHalfRMSNorm(nn.Module):  # pow(-0.5)
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D))
    def forward(s, x): return x * (x.pow(2).mean(-1, keepdim=True) + 1e-6).pow(-0.5) * s.weight

class PowHalfFloatRMSNorm(nn.Module):
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D))
    def forward(s, x):
        xf = x.float()
        return (xf * (xf.pow(2).mean(-1, keepdim=True) + 1e-6).pow(-0.5)).type_as(x) * s.weight

class DivRMSNorm(nn.Module):  # x / sqrt(mean(x²) + eps)
    def __init__(s): super().__init__(); s.weight = nn.Parameter(torch.ones(D))
    def forward(s, x): return x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6) * s.weight

def rotate_half(x):
    x1 = x[..., : x.shape[-1] // 2]; x2 = x[..., x.shape[-1] // 2 :]
    return torch.cat((-x2, x1), dim=-1)

class HFRope(nn.Module):
    def forward(s, q, k, cos, sin):
        return q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin

class L2CRope(nn.Module):
    def forward(s, xq, xk, cos, sin):
        xq_r, xq_i = xq.float().reshape(xq.shape[:-1] + (-1, 2)).unbind(-1)
        xk_r, xk_i = xk.float().reshape(xk.shape[:-1] + (-1, 2)).unbind(-1)
        xq_out_r = xq_r * cos - xq_i * sin
        xq_out_i = xq_r * sin + xq_i * cos
        xk_out_r = xk_r * cos - xk_i * sin
        xk_out_i = xk_r * sin + xk_i * cos
        xq_out = torch.stack([xq_out_r, xq_out_i], dim=-1).flatten(3)
        xk_out = torch.stack([xk_out_r, xk_out_i], dim=-1).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

class MetaRope(nn.Module):
    def forward(s, xq, xk, freqs_cis):
        xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
        xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
        xq_out = torch.view_as_real(xq_ * freqs_cis).flatten(3)
        xk_out = torch.view_as_real(xk_ * freqs_cis).flatten(3)
        return xq_out.type_as(xq), xk_out.type_as(xk)

def rotate_every_two(x):  # GPT-J's
    x1 = x[:, :, :, ::2]; x2 = x[:, :, :, 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)

class GptJRope(nn.Module):
    def forward(s, q, k, sin, cos):
        sin = torch.repeat_interleave(sin[:, :, None, :], 2, 3)
        cos = torch.repeat_interleave(cos[:, :, None, :], 2, 3)
        return q * cos + rotate_every_two(q) * sin, k * cos + rotate_every_two(k) * sin

class NewGELU(nn.Module):
    def forward(s, x): return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * torch.pow(x, 3.0))))

class SwiGLU(nn.Module):  # llama2.c / HF LlamaMLP
    def __init__(s):
        super().__init__(); s.w1 = nn.Linear(D, 2 * D, bias=False); s.w2 = nn.Linear(2 * D, D, bias=False); s.w3 = nn.Linear(D, 2 * D, bias=False)
    def forward(s, x): return s.w2(F.silu(s.w1(x)) * s.w3(x))

class SiluMul(nn.Module):
    def forward(s, g, u): return F.silu(g) * u

class ChunkSwiGLU(nn.Module):
    def forward(s, x):
        a, b = x.chunk(2, dim=-1)
        return F.silu(a) * b

class MinGPTAttn(nn.Module):
    def __init__(s):
        super().__init__(); s.drop = nn.Dropout(0.1)
        s.register_buffer("bias", torch.tril(torch.ones(T + 2, T + 2)).view(1, 1, T + 2, T + 2))
    def forward(s, q, k, v):
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
        att = att.masked_fill(s.bias[:, :, :T, :T] == 0, float("-inf"))
        att = F.softmax(att, dim=-1)
        att = s.drop(att)
        return att @ v

class HFEagerAttn(nn.Module):  # transformers' LlamaAttention (4.36), eager
    def forward(s, q, k, v, mask):
        w = torch.matmul(q, k.transpose(2, 3)) / math.sqrt(q.shape[-1])
        w = nn.functional.softmax(w + mask, dim=-1, dtype=torch.float32).to(q.dtype)
        w = nn.functional.dropout(w, p=0.0, training=s.training)
        return torch.matmul(w, v)

class GPT2Attn(nn.Module):  # transformers' GPT2Attention._attn (4.36), no padding mask
    def __init__(s):
        super().__init__(); s.attn_dropout = nn.Dropout(0.1)
        s.register_buffer("bias", torch.tril(torch.ones(8, 8, dtype=torch.bool)).view(1, 1, 8, 8))
    def forward(s, q, k, v):
        w = torch.matmul(q, k.transpose(-1, -2))
        w = w / torch.full([], v.size(-1) ** 0.5, dtype=w.dtype, device=w.device)
        causal = s.bias[:, :, k.size(-2) - q.size(-2): k.size(-2), :k.size(-2)]
        fill = torch.full([], torch.finfo(w.dtype).min, dtype=w.dtype, device=w.device)
        w = torch.where(causal, w.to(w.dtype), fill)
        w = nn.functional.softmax(w, dim=-1).type(v.dtype)
        return torch.matmul(s.attn_dropout(w), v)

class GPTJAttn(GPT2Attn):  # transformers' GPTJAttention._attn (4.36): q, k upcast, / scale after the where
    def forward(s, q, k, v):
        q, k = q.to(torch.float32), k.to(torch.float32)
        w = torch.matmul(q, k.transpose(-1, -2))
        causal = s.bias[:, :, k.size(-2) - q.size(-2): k.size(-2), :k.size(-2)]
        fill = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype).to(w.device)
        w = torch.where(causal, w, fill) / math.sqrt(q.size(-1))
        w = nn.functional.softmax(w, dim=-1).to(v.dtype)
        return torch.matmul(s.attn_dropout(w), v)

class NeoXAttn(GPT2Attn):  # transformers' GPTNeoXAttention._attn (4.36): baddbmm on zeros, viewed back
    def forward(s, q, k, v):
        b, h, t, d = q.size()
        causal = s.bias[:, :, k.size(-2) - t: k.size(-2), :k.size(-2)]
        q, k = q.view(b * h, t, d), k.view(b * h, k.size(-2), d)
        w = torch.zeros(b * h, t, k.size(-2), dtype=q.dtype, device=k.device)
        w = torch.baddbmm(w, q, k.transpose(1, 2), beta=1.0, alpha=d ** -0.5).view(b, h, t, k.size(-2))
        fill = torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype).to(w.device)
        w = nn.functional.softmax(torch.where(causal, w, fill), dim=-1).to(v.dtype)
        return torch.matmul(s.attn_dropout(w), v)

class T5Attn(nn.Module):  # transformers' T5Attention (4.36) in a layer given the position bias (all but the first)
    def forward(s, q, k, v, position_bias):
        scores = torch.matmul(q, k.transpose(3, 2))
        scores += position_bias
        w = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        w = nn.functional.dropout(w, p=0.1, training=s.training)
        return torch.matmul(w, v)

def x(*shape): return torch.randn(*shape, dtype=dt, requires_grad=True)

freqs = torch.outer(torch.arange(T).float(), 1.0 / (10000.0 ** (torch.arange(0, D, 2).float() / D)))
cases = {
    "hf_rms_norm": (HFRMSNorm(), lambda: (x(B, T, D),)),
    "l2c_rms_norm": (L2CRMSNorm(), lambda: (x(B, T, D),)),
    "meansq_rms_norm": (MeanSqRMSNorm(), lambda: (x(B, T, D),)),
    "powhalf_rms_norm": (PowHalfRMSNorm(), lambda: (x(B, T, D),)),
    "powhalf_float_rms_norm": (PowHalfFloatRMSNorm(), lambda: (x(B, T, D),)),
    "div_rms_norm": (DivRMSNorm(), lambda: (x(B, T, D),)),
    "hf_rope": (HFRope(), lambda: (x(B, H, T, D), x(B, H, T, D), torch.cat((freqs, freqs), -1).cos().to(dt), torch.cat((freqs, freqs), -1).sin().to(dt))),
    "l2c_rope": (L2CRope(), lambda: (x(B, T, H, D), x(B, T, H, D), freqs.cos().view(1, T, 1, D // 2), freqs.sin().view(1, T, 1, D // 2))),
    "meta_rope": (MetaRope(), lambda: (x(B, T, H, D), x(B, T, H, D), torch.polar(torch.ones_like(freqs), freqs).view(1, T, 1, D // 2))),
    "gptj_rope": (GptJRope(), lambda: (x(B, T, H, D), x(B, T, H, D), freqs.sin().to(dt)[None], freqs.cos().to(dt)[None])),
    "new_gelu": (NewGELU(), lambda: (x(B, T, D),)),
    "swiglu_mlp": (SwiGLU(), lambda: (x(B, T, D),)),
    "silu_mul": (SiluMul(), lambda: (x(B, T, D), x(B, T, D))),
    "chunk_swiglu": (ChunkSwiGLU(), lambda: (x(B, T, 2 * D),)),
    "mingpt_attention": (MinGPTAttn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D))),
    "hf_eager_attention": (HFEagerAttn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D),
                                                   torch.full((T, T), torch.finfo(dt).min, dtype=dt).triu(1))),
    "gpt2_attention": (GPT2Attn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D))),
    "gptj_attention": (GPTJAttn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D))),
    "neox_attention": (NeoXAttn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D))),
    "t5_attention": (T5Attn(), lambda: (x(B, H, T, D), x(B, H, T, D), x(B, H, T, D), x(1, H, T, T))),
}
out = sys.argv[2] if len(sys.argv) > 2 else "."
for name, (mod, make) in cases.items():
    mod = mod.to(dt) if dt != torch.float32 else mod
    mod.train()
    args = make()
    try:
        r = mod(*args)  # warm
    except Exception as e:
        print(name, "fails:", e); continue
    args = make()
    with torch.autograd.profiler.profile(use_kineto=False, record_shapes=True) as p:
        r = mod(*args)
        r = r if isinstance(r, tuple) else (r,)
        loss = sum(t.float().sum() for t in r)
        loss.backward()
    p.export_chrome_trace(f"{out}/{name}.{sys.argv[1] if len(sys.argv) > 1 else 'float32'}.legacy.json")
