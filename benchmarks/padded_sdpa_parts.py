"""Where padded SDPA with a key mask spent its time at the bench shape (run at commit e432295, whose bench padded with `_padded(x, lengths, width)`: a gather whose padding positions all read token 0)."""

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from mxlab.bench import attention as A

dev = "cuda"
lengths = A.sample_lengths().to(dev)
offsets = A._offsets(lengths)
total = int(offsets[-1])
L = int(lengths.max())
q, k, v = [torch.randn(total, 4, 64, device=dev, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
mask = (torch.arange(L, device=dev)[None, :] < lengths[:, None])[:, None, None, :]
bias = torch.zeros(mask.shape, device=dev, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))


def t(name, fn, n=3):
    try:
        fn()
        torch.cuda.synchronize()
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(n):
            fn()
        e.record()
        torch.cuda.synchronize()
        print(f"{name:50s} {s.elapsed_time(e) / n:10.3f} ms", flush=True)
    except Exception as err:
        print(f"{name:50s} failed {type(err).__name__}: {str(err)[:150]}", flush=True)


qp, kp, vp = [A._padded(x, lengths, L).detach().requires_grad_() for x in (q, k, v)]
g = torch.randn_like(qp)
t("gather fwd", lambda: A._padded(q, lengths, L))
t("gather fwd+bwd", lambda: A._padded(q, lengths, L).backward(g))
t("sdpa fwd bool mask (default)", lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask))
t("sdpa fwd bias (default)", lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias))
t("sdpa fwd+bwd bias (default)", lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias).backward(g))
for be in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH):
    with sdpa_kernel(be):
        t(
            f"sdpa fwd+bwd bias {be.name}",
            lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias).backward(g),
        )
        t(
            f"sdpa fwd+bwd bool {be.name}",
            lambda: F.scaled_dot_product_attention(qp, kp, vp, attn_mask=mask).backward(g),
        )
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    t("sdpa fwd+bwd no mask FLASH (dense padded)", lambda: F.scaled_dot_product_attention(qp, kp, vp).backward(g))
with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
    F.scaled_dot_product_attention(qp, kp, vp, attn_mask=bias).backward(g)
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=60))
