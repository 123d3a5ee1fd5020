"""Host side of the MX cast kernels: launch shapes, the (A, L, B) view of a call, and the launch.

`CastLaunch` holds the launch options a caller may set besides the numerics contract (for tests and
benchmarks: the exact integer path everywhere, the integer path where the hardware FP8 conversion would run,
another tile); every choice gives the same bits.
"""

from __future__ import annotations

import functools
import math
import os
from dataclasses import dataclass

import torch

from mxlab.kernels.cast.bits import KIND_BF16, KIND_FP16, KIND_FP32
from mxlab.kernels.cast.kernels import _mx_column_tile_kernel, _mx_kernel
from mxlab.numerics.formats import ElementFormat
from mxlab.numerics.seeding import seed_key as signed_seed_key
from mxlab.numerics.vocab import Layout, kernel_code

BLOCK = 32
DTYPE_KINDS = {torch.float32: KIND_FP32.value, torch.bfloat16: KIND_BF16.value, torch.float16: KIND_FP16.value}
_BITS_DTYPES = {torch.float32: torch.int32, torch.bfloat16: torch.int16, torch.float16: torch.int16}
_MAX_GRID_YZ = 65535
HARDWARE_FP8_FORMATS = ("e4m3", "e5m2")
# sm_89 is left out: Triton 3.6 lowers float32 -> FP8 there through an fp16 rounded toward zero (double rounding)
HARDWARE_FP8_MIN_CAPABILITY = (9, 0)


@dataclass(frozen=True)
class TileConfig:
    """Elements per program and warps: a tile is (rows, columns) of the (L, B) view (columns = col_blocks * 32;
    column-wise and both-at-once casts always take 32 rows). Refuses values that are not powers of two >= 1."""

    rows: int = 16
    col_blocks: int = 8
    num_warps: int = 4

    def __post_init__(self) -> None:
        for name in ("rows", "col_blocks", "num_warps"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"TileConfig.{name} = {value!r}; accepted: a power of two >= 1")


@dataclass(frozen=True)
class CastLaunch:
    """Launch options of a cast besides its numerics contract (private: tests and benchmarks set them).

    `fast=False` forces the exact integer path on every tile; `hw_fp8=False` keeps the integer fast path where
    the hardware FP8 conversion would run (`hardware_fp8_applies`); `tile` overrides the launch shape. Every
    choice gives the same bits.
    """

    fast: bool = True
    hw_fp8: bool = True
    tile: TileConfig | None = None

    def __post_init__(self) -> None:
        if self.tile is not None and not isinstance(self.tile, TileConfig):
            raise ValueError(f"CastLaunch.tile = {self.tile!r}; accepted: None or a TileConfig")


DEFAULT_LAUNCH = CastLaunch()


ROW_TILE = TileConfig(rows=16, col_blocks=8, num_warps=4)  # _mx_kernel, Layout.ROW
# _mx_kernel, Layout.ROW with stochastic rounding (more arithmetic per element; one warp, so the tile-wide path-3
# decision needs no CTA barrier): H200 `bench quant --sweep-tiles` at 7d3595b, 16384x8192 BF16 e4m3 fake-quantize,
# fraction of copy: 4x8x1 0.582, 4x4x1 0.583, 2x8x1 0.564, 8x8x2 0.511, 8x4x2 0.527, 16x8x4 (ROW_TILE) 0.404
STOCHASTIC_ROW_TILE = TileConfig(rows=4, col_blocks=8, num_warps=1)
# Column-wise and both-at-once casts on the hardware FP8 path: _mx_column_tile_kernel, 32 x 128 tiles, 1 warp (H200
# `bench quant --sweep-tiles` at 18afe49, e4m3 cast of 16384x8192 BF16, fraction of copy: column cast 0.810, both cast
# 0.701; 2 warps 0.601 / 0.550; 32 x 256 with 2 warps 0.631 / 0.668)
COL_TILE = TileConfig(rows=32, col_blocks=4, num_warps=1)
# On the integer paths (other formats and roundings, GPUs before sm_90, the interpreter): the same kernel with 4 warps
# on the 32 x 128 tile (a quarter of the elements per thread: the integer steps need more registers per element)
INTEGER_COL_TILE = TileConfig(rows=32, col_blocks=4, num_warps=4)
SQUARE_TILE = TileConfig(rows=32, col_blocks=4, num_warps=4)  # _mx_kernel, Layout.TILE
HADAMARD_COL_TILE = TileConfig(rows=32, col_blocks=4, num_warps=4)  # _mx_kernel, Layout.COLUMN with HADAMARD
HADAMARD_BLOCK = 32  # the transform's block: the MX block, so one tile holds whole Hadamard blocks
HADAMARD_COMPILE_OPTIONS = dict(enable_fp_fusion=False)  # no multiply-add contraction: float32 rounds as in PyTorch


def _default_tile(layout: Layout, hadamard: bool, stochastic: bool = False, hardware_fp8: bool = False) -> TileConfig:
    """The launch shape of a call (hardware_fp8: its fast path converts with the GPU's FP8 instructions)."""
    if layout == Layout.ROW:
        return STOCHASTIC_ROW_TILE if stochastic and not hadamard else ROW_TILE
    if layout == Layout.TILE:
        return SQUARE_TILE
    if hadamard:
        return HADAMARD_COL_TILE
    return COL_TILE if hardware_fp8 else INTEGER_COL_TILE


def _cdiv(size: int, step: int) -> int:
    """ceil(size / step) on the host (triton.cdiv is a JIT function: about 2 us per call there)."""
    return -(-size // step)


def _ceil_to_block(size: int) -> int:
    return _cdiv(size, BLOCK) * BLOCK


def _pow2_at_most(value: int, cap: int) -> int:
    return max(1, min(cap, 1 << max(0, math.ceil(math.log2(max(value, 1))))))


@dataclass(frozen=True)
class _View:
    """x as an (A, L, B) view whose blocks run along B (Layout.ROW) or L (the others)."""

    x3: torch.Tensor
    layout: Layout
    lp: int  # padded L (codes)
    bp: int  # padded B (codes)
    padded_shape: tuple[int, ...]
    scale_shape: tuple[int, ...]


@functools.lru_cache(maxsize=4096)
def _view_geometry(
    shape: tuple[int, ...], block: int | tuple[int, int], axis: int, pad: bool, layout: Layout | None
) -> tuple[tuple[int, int, int], Layout, int, int, tuple[int, ...], tuple[int, ...]]:
    """(the (A, L, B) shape, layout, lp, bp, padded shape, scale shape) of `_make_view` for a tensor of `shape`
    (cached: a function of the shape and the options alone). Refuses (ValueError) a blocked dim that is not a
    multiple of 32 without pad."""
    rank = len(shape)
    axis %= rank
    if block == (BLOCK, BLOCK):
        dims = (rank - 2, rank - 1)
        shape3 = (math.prod(shape[:-2]), shape[-2], shape[-1])
        layout = Layout.TILE
    elif axis == rank - 1 and layout != Layout.BOTH:
        dims = (axis,)
        shape3 = (1, math.prod(shape[:-1]), shape[-1])
        layout = Layout.ROW
    else:
        dims = (axis,) if layout != Layout.BOTH else (0, 1)
        shape3 = (math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1 :]))
        layout = Layout.COLUMN if layout is None else Layout(layout)
    for dim in dims:
        if shape[dim] % BLOCK and not pad:
            raise ValueError(
                f"dimension {dim} of x has size {shape[dim]}, not a multiple of the block size {BLOCK}; pass pad=True"
            )
    padded_shape = tuple(_ceil_to_block(size) if dim in dims else size for dim, size in enumerate(shape))
    scale_shape = tuple(size // BLOCK if dim in dims else size for dim, size in enumerate(padded_shape))
    _, length, width = shape3
    lp = _ceil_to_block(length) if layout != Layout.ROW else length
    bp = _ceil_to_block(width) if layout in (Layout.ROW, Layout.TILE, Layout.BOTH) else width
    return shape3, layout, lp, bp, padded_shape, scale_shape


def _make_view(
    x: torch.Tensor, block: int | tuple[int, int], axis: int, pad: bool, layout: Layout | None = None
) -> _View:
    shape3, layout, lp, bp, padded_shape, scale_shape = _view_geometry(tuple(x.shape), block, axis, pad, layout)
    return _View(x.reshape(shape3), layout, lp, bp, padded_shape, scale_shape)


def unsupported_reason(
    x: torch.Tensor, block: int | tuple[int, int], axis: int, hadamard: int | None = None
) -> str | None:
    """Why the Triton kernels cannot run this call (None when they can).

    They need a float32/bfloat16/float16 tensor on a CUDA device (or any device under
    TRITON_INTERPRET=1) with a grid that fits the launch limits. `hadamard`: the block of a random
    Hadamard transform applied first (None: none); the kernels fuse only block 32 with 1-D MX blocks.
    """
    if hadamard is not None and (hadamard != HADAMARD_BLOCK or block != BLOCK):
        return f"Hadamard block {hadamard} with MX block {block} (the kernels fuse Hadamard block 32 with MX block 32)"
    if x.dtype not in DTYPE_KINDS:
        return f"dtype {x.dtype} (the kernels take float32, bfloat16, float16)"
    if x.device.type != "cuda" and os.environ.get("TRITON_INTERPRET") != "1":
        return f"device {x.device} (the kernels run on CUDA, or anywhere under TRITON_INTERPRET=1)"
    if x.numel() == 0:
        return "an empty tensor"
    (count, _, _), layout, _, bp, _, _ = _view_geometry(tuple(x.shape), block, axis, True, None)
    tile = _default_tile(layout, hadamard is not None, hardware_fp8=True)  # the launch with the most programs
    if count > _MAX_GRID_YZ or _cdiv(bp, tile.col_blocks * BLOCK) > _MAX_GRID_YZ:
        return f"shape {tuple(x.shape)} needs a grid beyond the launch limit"
    return None


@functools.cache
def _cuda_capability(index: int) -> tuple[int, int]:
    major, minor = torch.cuda.get_device_capability(index)
    return int(major), int(minor)


def hardware_fp8_applies(device: torch.device | str, fmt: ElementFormat, rounding: str) -> bool:
    """Whether the fast path of a call on `device` converts elements with the GPU's FP8 instructions.

    True for e4m3/e5m2 with round to nearest even on a CUDA device of compute capability >= 9.0,
    unless TRITON_INTERPRET=1 (whose numpy FP8 emulation is not the hardware's). Every other call
    (other formats and roundings, older GPUs, the interpreter, CPU tensors) keeps the integer path.
    """
    device = torch.device(device)
    if device.type != "cuda" or os.environ.get("TRITON_INTERPRET") == "1":
        return False
    if fmt.name not in HARDWARE_FP8_FORMATS or rounding != "nearest_even":
        return False
    index = device.index if device.index is not None else torch.cuda.current_device()
    return _cuda_capability(index) >= HARDWARE_FP8_MIN_CAPABILITY


def launch_cast(
    view: _View,
    fmt: ElementFormat,
    scale_mode: str,
    rounding: str,
    seed: int | None,
    want_codes: bool,
    want_values: bool,
    options: CastLaunch = DEFAULT_LAUNCH,
    hadamard_seed: int | None = None,
    want_column_sums: bool = False,
) -> dict:
    """Run the kernel on a view; returns the output tensors by name, and under "kernel" what the launch
    returned (the compiled kernel on a GPU, whose .asm shows the instructions). `hadamard_seed` (Layout.ROW
    or Layout.COLUMN only): quantize the random Hadamard transform (block 32) of x along the blocked axis;
    the values are then float32 of the padded shape. `want_column_sums` (Layout.COLUMN or Layout.BOTH, no
    Hadamard): also "column_sums", x's float32 column sums over each 32-row block, shape (A, LP // 32, B)."""
    x3 = view.x3
    count, length, width = x3.shape
    layout = view.layout
    device = x3.device
    hadamard = hadamard_seed is not None
    if hadamard and layout not in (Layout.ROW, Layout.COLUMN):
        raise ValueError(f"the fused Hadamard transform runs with 1-D blocks along one axis, not layout {layout}")
    if want_column_sums and (hadamard or layout not in (Layout.COLUMN, Layout.BOTH)):
        raise ValueError(
            f"column sums come with column blocks and no Hadamard transform, not layout {layout}"
            f"{' with the transform' if hadamard else ''}"
        )
    fast = options.fast
    hardware_path = fast and options.hw_fp8 and hardware_fp8_applies(device, fmt, rounding)
    tile = options.tile or _default_tile(layout, hadamard, rounding == "stochastic", hardware_path)
    col_blocks = _pow2_at_most(_cdiv(view.bp, BLOCK), tile.col_blocks)
    if layout == Layout.ROW:
        rb, rs = _pow2_at_most(length, tile.rows), 1
    else:
        rb, rs = 1, BLOCK
    spans = [(size - 1) * abs(stride) for size, stride in zip(x3.shape, x3.stride())]
    wide = max(sum(spans) + 1, count * view.lp * view.bp) >= 2**31 - 1
    empty = torch.empty(0, dtype=torch.uint8, device=device)
    outputs: dict[str, object] = {}

    def codes_and_scales(codes_shape, scale_shape):
        codes = torch.empty(codes_shape, dtype=torch.uint8, device=device) if want_codes else empty
        return codes, torch.empty(scale_shape, dtype=torch.uint8, device=device)

    def values():
        if not want_values:
            return empty, empty
        if hadamard:  # the transformed tensor: float32, padded shape
            out = torch.empty((count, view.lp, view.bp), dtype=torch.float32, device=device)
        else:
            out = torch.empty((count, length, width), dtype=x3.dtype, device=device)
        return out, out.view(_BITS_DTYPES[out.dtype])

    row_codes = row_scales = row_values = row_bits = empty
    col_codes = col_scales = col_values = col_bits = empty
    if layout in (Layout.ROW, Layout.BOTH):
        row_codes, row_scales = codes_and_scales((count, length, view.bp), (count, length, view.bp // BLOCK))
        row_values, row_bits = values()
    if layout in (Layout.COLUMN, Layout.BOTH):
        col_codes, col_scales = codes_and_scales((count, view.lp, width), (count, view.lp // BLOCK, width))
        col_values, col_bits = values()
    if layout == Layout.TILE:
        row_codes, row_scales = codes_and_scales((count, view.lp, view.bp), (count, view.lp // BLOCK, view.bp // BLOCK))
        row_values, row_bits = values()
    grid = (_cdiv(view.lp, rb * rs), _cdiv(view.bp, col_blocks * BLOCK), count)
    # one int32 signature whatever the seed (the kernels do not specialize on it): no compile per seed value
    seed_key = signed_seed_key(seed) if rounding == "stochastic" else 0
    arguments = (
        x3.view(_BITS_DTYPES[x3.dtype]),
        row_codes,
        row_scales,
        row_bits,
        col_codes,
        col_scales,
        col_bits,
        length,
        width,
        view.lp,
        view.bp,
        x3.stride(0),
        x3.stride(1),
        x3.stride(2),
        seed_key,
    )
    constants = dict(
        IN_KIND=DTYPE_KINDS[x3.dtype],
        OUT_KIND=KIND_FP32.value if hadamard else DTYPE_KINDS[x3.dtype],
        LAYOUT=layout.kernel_id,
        WANT_CODES=want_codes,
        WANT_VALUES=want_values,
        CODE=kernel_code(fmt, scale_mode, rounding, hardware_path),
        FAST=fast,
        WIDE_INDEX=wide,
        CB=col_blocks,
        num_warps=tile.num_warps,
    )
    if layout in (Layout.COLUMN, Layout.BOTH) and not hadamard:
        if want_column_sums:
            outputs["column_sums"] = sums = torch.empty(
                (count, view.lp // BLOCK, width), dtype=torch.float32, device=device
            )
            constants.update(sums_ptr=sums, WANT_SUMS=True)
        kernel = _mx_column_tile_kernel[grid](*arguments, **constants)
    elif hadamard:
        hadamard_key = signed_seed_key(hadamard_seed)
        kernel = _mx_kernel[grid](
            *arguments, hadamard_key, RB=rb, RS=rs, HADAMARD=True, **HADAMARD_COMPILE_OPTIONS, **constants
        )
    else:
        kernel = _mx_kernel[grid](*arguments, 0, RB=rb, RS=rs, **constants)
    outputs.update(
        row_codes=row_codes,
        row_scales=row_scales,
        row_values=row_values,
        col_codes=col_codes,
        col_scales=col_scales,
        col_values=col_values,
        kernel=kernel,
    )
    return outputs
