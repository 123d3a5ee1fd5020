"""The public MX casts of the Triton kernels: quantize, fake_quantize, both at once, and the fused random
Hadamard cast, bit-identical to mxlab.numerics.reference.

Each takes the numerics contract only (format, block, axis, scale mode, rounding, seed, pad); `_launch`, a
`CastLaunch`, is a private handle for tests and benchmarks and never changes the bits.
"""

from __future__ import annotations

import torch

from mxlab.kernels.cast.launch import BLOCK, DEFAULT_LAUNCH, DTYPE_KINDS, CastLaunch, _make_view, _View, launch_cast
from mxlab.numerics.formats import ElementFormat
from mxlab.numerics.vocab import Layout, Rounding, ScaleMode


def _check_call(x: torch.Tensor, scale_mode: str, rounding: str, seed: int | None) -> None:
    if x.dtype not in DTYPE_KINDS:
        raise ValueError(f"unsupported dtype {x.dtype}; accepted: float32, bfloat16, float16")
    Rounding.check(rounding)
    ScaleMode.check(scale_mode)
    if rounding == "stochastic" and not isinstance(seed, int):
        raise ValueError(f"rounding='stochastic' needs an integer seed, got seed={seed!r}")


def _prefix(view: _View) -> str:
    return "col" if view.layout == Layout.COLUMN else "row"


def quantize(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    block: int | tuple[int, int] = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) as mxlab.numerics.reference computes them: codes uint8 of the padded shape, scale bytes
    uint8 of the padded shape with the blocked dims divided by 32.

    Refuses (ValueError) an unsupported dtype, an unknown rounding or scale mode, stochastic rounding without
    an integer seed, and a blocked dim that is not a multiple of 32 unless pad=True.
    """
    _check_call(x, scale_mode, rounding, seed)
    view = _make_view(x, block, axis, pad)
    out = launch_cast(view, fmt, scale_mode, rounding, seed, want_codes=True, want_values=False, options=_launch)
    prefix = _prefix(view)
    return out[f"{prefix}_codes"].reshape(view.padded_shape), out[f"{prefix}_scales"].reshape(view.scale_shape)


def fake_quantize(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    block: int | tuple[int, int] = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
) -> torch.Tensor:
    """dequantize(quantize(x)) in x's dtype and shape, one read and one write. Refuses what `quantize` refuses."""
    _check_call(x, scale_mode, rounding, seed)
    view = _make_view(x, block, axis, pad)
    out = launch_cast(view, fmt, scale_mode, rounding, seed, want_codes=False, want_values=True, options=_launch)
    return out[f"{_prefix(view)}_values"].reshape(x.shape)


def _hadamard_launch(
    x: torch.Tensor,
    fmt: ElementFormat,
    axis: int,
    hadamard_seed: int,
    scale_mode: str,
    rounding: str,
    seed: int | None,
    pad: bool,
    want_codes: bool,
    options: CastLaunch,
) -> tuple[_View, dict]:
    _check_call(x, scale_mode, rounding, seed)
    if isinstance(hadamard_seed, bool) or not isinstance(hadamard_seed, int):
        raise ValueError(f"hadamard_seed must be an integer, got {hadamard_seed!r}")
    view = _make_view(x, BLOCK, axis, pad)
    out = launch_cast(
        view,
        fmt,
        scale_mode,
        rounding,
        seed,
        want_codes=want_codes,
        want_values=not want_codes,
        options=options,
        hadamard_seed=hadamard_seed,
    )
    return view, out


def hadamard_quantize(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    axis: int = -1,
    hadamard_seed: int,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(codes, scales) of mxlab.numerics.hadamard.random_hadamard(x zero-padded along `axis` to a multiple of 32,
    32, axis, hadamard_seed) quantized along `axis` with 1-D blocks of 32, from one read of x: shapes as
    `quantize`. Refuses what `quantize` refuses, and a hadamard_seed that is not an integer. Stochastic rounding
    counts elements of the transformed (padded) tensor."""
    view, out = _hadamard_launch(x, fmt, axis, hadamard_seed, scale_mode, rounding, seed, pad, True, _launch)
    prefix = _prefix(view)
    return out[f"{prefix}_codes"].reshape(view.padded_shape), out[f"{prefix}_scales"].reshape(view.scale_shape)


def hadamard_fake_quantize(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    axis: int = -1,
    hadamard_seed: int,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
) -> torch.Tensor:
    """float32 fake_quantize(random_hadamard(x.float() zero-padded along `axis` to a multiple of 32, 32, axis,
    hadamard_seed), fmt, axis=axis) in one read and one write; the shape is x's, padded along `axis` when
    pad=True. Refuses what `hadamard_quantize` refuses."""
    view, out = _hadamard_launch(x, fmt, axis, hadamard_seed, scale_mode, rounding, seed, pad, False, _launch)
    return out[f"{_prefix(view)}_values"].reshape(view.padded_shape)


def _rowcol(
    x: torch.Tensor,
    fmt: ElementFormat,
    scale_mode: str,
    rounding: str,
    seed: int | None,
    pad: bool,
    want_codes: bool,
    want_values: bool,
    options: CastLaunch,
    want_column_sums: bool = False,
) -> tuple[_View, dict]:
    _check_call(x, scale_mode, rounding, seed)
    if x.dim() != 2:
        raise ValueError(f"row-and-column quantization takes a 2-D tensor, got shape {tuple(x.shape)}")
    view = _make_view(x, 32, 0, pad, layout=Layout.BOTH)
    return view, launch_cast(
        view,
        fmt,
        scale_mode,
        rounding,
        seed,
        want_codes,
        want_values,
        options=options,
        want_column_sums=want_column_sums,
    )


def quantize_rowcol(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
):
    """((row codes, row scales), (column codes, column scales)) of a 2-D x from one read.

    The row-wise pair equals quantize(x, axis=-1), the column-wise pair quantize(x, axis=0), both
    from x itself (padded shapes as `quantize`). Refuses what `quantize` refuses and a tensor that is not 2-D.
    """
    view, out = _rowcol(x, fmt, scale_mode, rounding, seed, pad, True, False, _launch)
    rows, cols = x.shape
    row_pair = (out["row_codes"].reshape(rows, view.bp), out["row_scales"].reshape(rows, view.bp // BLOCK))
    col_pair = (out["col_codes"].reshape(view.lp, cols), out["col_scales"].reshape(view.lp // BLOCK, cols))
    return row_pair, col_pair


def fake_quantize_rowcol(
    x: torch.Tensor,
    fmt: ElementFormat,
    *,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
    column_sums: bool = False,
    _launch: CastLaunch = DEFAULT_LAUNCH,
) -> tuple[torch.Tensor, ...]:
    """(along_last, along_first): fake_quantize(x, axis=-1) and fake_quantize(x, axis=0) of a 2-D x, one read.
    column_sums=True adds a third: x.sum(0) in float32, from the same read (per-32-row sums, then their sum: it
    differs from other float32 sums only in the order of addition). Refuses what `quantize_rowcol` refuses."""
    _, out = _rowcol(x, fmt, scale_mode, rounding, seed, pad, False, True, _launch, want_column_sums=column_sums)
    values = (out["row_values"].reshape(x.shape), out["col_values"].reshape(x.shape))
    return (*values, out["column_sums"].sum(dim=(0, 1))) if column_sums else values
