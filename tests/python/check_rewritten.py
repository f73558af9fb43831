"""Loads a module opfuse rewrote, after torch.ops.load_library, and checks that its graph calls
the fused ops and that it computes what the original does (eval mode, float64 reference).

    python3 check_rewritten.py LIBRARY ORIGINAL.pt REWRITTEN.pt [same-parameters]
"""
import sys

import torch

library, original_path, rewritten_path = sys.argv[1:4]
same_parameters = len(sys.argv) > 4
torch.ops.load_library(library)
original = torch.jit.load(original_path).eval()
rewritten = torch.jit.load(rewritten_path).eval()
code = "".join(m.code for m in rewritten.modules() if hasattr(m, "code"))
assert "ops.opfuse.silu" in code, code
assert "ops.opfuse.se_gate" in code, code
assert "ops.opfuse.batch_norm_silu" in code, code
assert "ops.opfuse" not in "".join(m.code for m in original.modules() if hasattr(m, "code"))

x = torch.randn(3, 3, 32, 32)
out = rewritten(x)
assert out.shape == (3, 10)
if same_parameters:
    ref = original.double()(x.double())
    assert torch.allclose(out.double(), ref, rtol=1e-4, atol=1e-5), (out - ref).abs().max()
    # A training forward moves the BatchNorm running statistics alike (opfuse::batch_norm_silu
    # updates them in place where aten::batch_norm did).
    original.float().train()(x)
    rewritten.train()(x)
    for (name, a), (_, b) in zip(original.named_buffers(), rewritten.named_buffers()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-5, atol=1e-6), name
# It trains: the fused backward runs from Python too.
rewritten.train()
loss = rewritten(x).square().mean()
loss.backward()
assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in rewritten.parameters())
print("ok")
