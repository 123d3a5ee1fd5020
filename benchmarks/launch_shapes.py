"""Launch-shape exploration: more one-warp shapes for the both cast and the stochastic row casts; bits vs default."""

import torch

from mxlab import kernels
from mxlab.bench.quant import _time_graph
from mxlab.formats import get_format
from mxlab.kernels.mx_quant import TileConfig

fmt = get_format("e4m3")
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(16384, 8192, device="cuda", generator=g).to(torch.bfloat16)
n = x.numel()
dst = torch.empty_like(x)
copy = 4 * n / _time_graph(lambda: dst.copy_(x)) / 1e6
print(f"copy {copy:.0f} GB/s")


def same(a, b):
    if isinstance(a, (tuple, list)):
        return all(same(p, q) for p, q in zip(a, b))
    return torch.equal(
        a.view(torch.uint8) if a.dtype != torch.uint8 else a, b.view(torch.uint8) if b.dtype != torch.uint8 else b
    )


def run(name, fn, moved, tiles):
    base = fn(None)
    for t in tiles:
        ms = _time_graph(lambda: fn(t))
        ok = same(fn(t), base)
        print(
            f"{name:34s} {t.rows}x{t.col_blocks}x{t.num_warps} p{t.column_passes}  {ms:.4f} ms  {moved / ms / 1e6 / copy:.3f} x copy  bits {'same' if ok else 'DIFFERENT'}",
            flush=True,
        )


for _rep in range(2):
    run(
        "default row fake-quantize",
        lambda t: kernels.fake_quantize(x, fmt, tile=t),
        4 * n,
        [
            TileConfig(16, 8, 4),
            TileConfig(8, 16, 2),
            TileConfig(16, 8, 2),
            TileConfig(4, 8, 1),
            TileConfig(8, 8, 1),
            TileConfig(4, 16, 1),
        ],
    )
sr = [TileConfig(r, c, 1) for r, c in [(4, 8), (2, 16), (4, 16), (8, 8), (8, 4), (1, 8), (1, 16), (2, 4), (16, 4)]]
run(
    "row stochastic fake-quantize",
    lambda t: kernels.fake_quantize(x, fmt, rounding="stochastic", seed=1, tile=t),
    4 * n,
    sr,
)
run(
    "row stochastic cast",
    lambda t: kernels.quantize(x, fmt, rounding="stochastic", seed=1, tile=t),
    3 * n + n // 32,
    sr,
)
col = [TileConfig(32, c, 1, column_passes=1) for c in (4, 2, 8, 1)]
run("both cast (one read)", lambda t: kernels.quantize_rowcol(x, fmt, tile=t), 4 * n + n // 16, col)
run("column cast", lambda t: kernels.quantize(x, fmt, axis=0, tile=t), 3 * n + n // 32, col)
run("both fake-quantize", lambda t: kernels.fake_quantize_rowcol(x, fmt, tile=t), 6 * n, col)
