"""The quantization API: the one door to the MX numerics.

`quantize`, `dequantize` and `fake_quantize` validate their arguments once, pad when asked,
then run a backend: the PyTorch reference (mxlab.numerics.reference, the definition) or, where it is
available and supported, the Triton kernels (mxlab.kernels), which match it bit for bit.

Choices where the OCP MX v1.0 specification leaves freedom (see docs/numerics.md):
- scale exponents are clamped to [-127, 127]; an all-zero block has scale byte 0x00;
- a block holding a NaN or an Inf has scale byte 0xFF and element codes 0, and dequantizes to NaN;
- finite values beyond the format's max normal saturate to it with their sign;
- FP element formats keep the sign of zero (-0.0 is code 0x80 in e4m3); INT8 has no -0;
- stochastic rounding draws 24 counter-based bits per element from (seed, linear index of the
  element in x's row-major order), so the same seed gives the same codes on every backend and
  in every blocking orientation.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from mxlab.numerics import reference
from mxlab.numerics.formats import FORMATS, ElementFormat, decode_codes, decode_scales, get_format
from mxlab.numerics.per_tensor import PER_TENSOR_FP8, fake_quantize_per_tensor_fp8
from mxlab.numerics.reference import BLOCK_SIZE
from mxlab.numerics.vocab import Rounding, ScaleMode

HIGH_PRECISION = ("bf16", "fp32")
PRECISIONS = tuple(FORMATS) + HIGH_PRECISION + tuple(PER_TENSOR_FP8)
INPUT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SQUARE_BLOCK = (BLOCK_SIZE, BLOCK_SIZE)


@dataclass
class MXTensor:
    """An MX-quantized tensor.

    `codes`: uint8 element codes of the (padded) input shape. `scales`: uint8 E8M0 bytes, the
    padded shape with the blocked dimension(s) divided by 32. `shape`: the original shape,
    which `dequantize` restores.
    """

    codes: torch.Tensor
    scales: torch.Tensor
    fmt: str
    block: int | tuple[int, int]
    axis: int
    shape: tuple[int, ...]
    scale_mode: str = "floor"
    rounding: str = "nearest_even"

    @property
    def format(self) -> ElementFormat:
        return get_format(self.fmt)


@dataclass(frozen=True)
class _Layout:
    """How a validated input is blocked: the padded float32 tensor reshaped so that blocks span `reduce_dims`."""

    blocked: torch.Tensor
    reduce_dims: tuple[int, ...]
    padded_shape: tuple[int, ...]
    index: torch.Tensor | None  # linear element indices in the original tensor (stochastic rounding only)


# ----------------------------------------------------------------------------- validation
def _normalize_block(block: object) -> int | tuple[int, int]:
    if isinstance(block, bool):
        block = None
    if isinstance(block, (int, torch.SymInt)) and block == BLOCK_SIZE:
        return BLOCK_SIZE
    if isinstance(block, (tuple, list)) and tuple(block) == SQUARE_BLOCK:
        return SQUARE_BLOCK
    raise ValueError(
        f"unsupported block {block!r}; accepted: 32 (1-D blocks along "
        "axis) or (32, 32) (square tiles of the last two dims)"
    )


def _check_options(
    x: object, block: object, axis: int, scale_mode: str, rounding: str, seed: int | None
) -> tuple[int | tuple[int, int], int]:
    """Validate the common options; return the normalized block and a non-negative axis."""
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in INPUT_DTYPES:
        raise ValueError(f"unsupported input dtype {x.dtype}; accepted: float32, bfloat16, float16")
    block = _normalize_block(block)
    ScaleMode.check(scale_mode)
    Rounding.check(rounding)
    if rounding == "stochastic" and (seed is None or isinstance(seed, bool) or not isinstance(seed, int)):
        raise ValueError(f"rounding='stochastic' needs an integer seed, got seed={seed!r}")
    if x.dim() == 0:
        raise ValueError("cannot quantize a 0-d tensor: MX blocks need at least one dimension")
    if block == SQUARE_BLOCK:
        if x.dim() < 2:
            raise ValueError(f"block=(32, 32) tiles the last two dims; x has shape {tuple(x.shape)}")
        if int(axis) not in (-1, x.dim() - 1):
            raise ValueError(f"block=(32, 32) always tiles the last two dims; axis must be -1, got {axis}")
        return block, x.dim() - 1
    if isinstance(axis, bool) or not isinstance(axis, (int, torch.SymInt)) or not -x.dim() <= axis < x.dim():
        raise ValueError(f"axis {axis!r} out of range for a tensor of {x.dim()} dims")
    return block, _static_axis(axis, x.dim())


def _static_axis(axis: int, ndim: int) -> int:
    """axis % ndim as a Python int, also where torch.compile made axis a symbolic int (whose comparisons
    with constants specialize it): block layouts are Python structure, never traced values."""
    return next(dim for dim in range(ndim) if axis % ndim == dim)


def _blocked_dims(x: torch.Tensor, block: int | tuple[int, int], axis: int) -> tuple[int, ...]:
    return (x.dim() - 2, x.dim() - 1) if block == SQUARE_BLOCK else (axis,)


def _layout(
    x: torch.Tensor,
    block: int | tuple[int, int],
    axis: int,
    pad: bool,
    need_index: bool,
    counter: torch.Tensor | None = None,
    short: bool = False,
) -> _Layout:
    """Pad (if allowed) and reshape x so each block spans the returned reduce dims; `short`: a blocked dim below 32
    is one unpadded block (padding zeros change no amax and round to +0: the same values once cropped off). With
    need_index, the layout carries each element's stochastic-rounding counter: `counter` broadcast, else its index."""
    dims = _blocked_dims(x, block, axis)
    for dim in dims:
        if x.shape[dim] % BLOCK_SIZE and not pad:
            raise ValueError(
                f"dimension {dim} of x has size {x.shape[dim]}, not a multiple of the block size {BLOCK_SIZE}; "
                f"pass pad=True to pad it with zeros (dequantize returns the original shape)"
            )
    values = x.float()
    index = None
    if need_index:
        index = (
            counter.expand(x.shape) if counter is not None else torch.arange(x.numel(), device=x.device).view(x.shape)
        )
    for dim in dims:
        missing = -x.shape[dim] % BLOCK_SIZE
        if missing and not (short and x.shape[dim] < BLOCK_SIZE):
            padding = [0, 0] * (x.dim() - 1 - dim) + [0, missing]
            values = F.pad(values, padding)
            index = F.pad(index, padding) if index is not None else None
    padded_shape = tuple(values.shape)
    split_shape: list[int] = []
    reduce_dims: list[int] = []
    for dim, size in enumerate(padded_shape):
        if dim in dims:
            split_shape += [size // BLOCK_SIZE, BLOCK_SIZE] if size % BLOCK_SIZE == 0 else [1, size]
            reduce_dims.append(len(split_shape) - 1)
        else:
            split_shape.append(size)
    reshape = lambda t: t.reshape(split_shape) if t is not None else None  # noqa: E731
    return _Layout(reshape(values), tuple(reduce_dims), padded_shape, reshape(index))


def _scale_shape(padded_shape: tuple[int, ...], dims: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(size // BLOCK_SIZE if dim in dims else size for dim, size in enumerate(padded_shape))


def _crop(t: torch.Tensor, shape: tuple[int, ...]) -> torch.Tensor:
    return t[tuple(slice(0, size) for size in shape)]


# ----------------------------------------------------------------------------- backends
def _random_bits(layout: _Layout, rounding: str, seed: int | None) -> torch.Tensor | None:
    if rounding != "stochastic":
        return None
    return reference.random_bits24(layout.index, seed)


def _reference_quantize(x, fmt, block, axis, scale_mode, rounding, seed, pad):
    layout = _layout(x, block, axis, pad, need_index=rounding == "stochastic")
    codes, scales = reference.quantize_blocks(
        layout.blocked, layout.reduce_dims, fmt, scale_mode, rounding, _random_bits(layout, rounding, seed)
    )
    dims = _blocked_dims(x, block, axis)
    return codes.reshape(layout.padded_shape), scales.reshape(_scale_shape(layout.padded_shape, dims))


def _reference_fake_quantize(x, fmt, block, axis, scale_mode, rounding, seed, pad):
    layout = _layout(x, block, axis, pad, need_index=rounding == "stochastic", short=True)
    values = reference.fake_quantize_blocks(
        layout.blocked, layout.reduce_dims, fmt, scale_mode, rounding, _random_bits(layout, rounding, seed)
    )
    return _crop(values.reshape(layout.padded_shape), tuple(x.shape))


# ----------------------------------------------------------------------------- backend dispatch
# CUDA tensors take the Triton kernels (mxlab.kernels) where they support the call, everything
# else the reference. MXLAB_BACKEND=reference|triton forces one; a forced "triton" also runs on
# CPU tensors under TRITON_INTERPRET=1 (how CI checks the kernels). `last_backend()` says which ran.
BACKENDS = ("reference", "triton")
_last_backend: str | None = None


def last_backend() -> str | None:
    """The backend ("reference" or "triton") of the latest quantize/fake_quantize call; None before any."""
    return _last_backend


_KERNEL_MODULES: dict[str, object] = {}


def kernel_module(name: str):
    """mxlab.kernels.NAME (a Triton kernel module, imported on first use and then looked up), or None when
    Triton is not installed; other import errors propagate."""
    module = _KERNEL_MODULES.get(name)
    if module is not None:
        return module
    import importlib

    try:
        module = _KERNEL_MODULES[name] = importlib.import_module(f"mxlab.kernels.{name}")
    except ModuleNotFoundError as error:
        if error.name and error.name.split(".")[0] == "triton":
            return None
        raise
    return module


def _import_kernels():
    """mxlab.kernels.cast (the MX cast kernels), or None when Triton is not installed."""
    return kernel_module("cast")


def _choose_backend(x: torch.Tensor, block: int | tuple[int, int], axis: int, hadamard: int | None = None):
    """("triton", kernels module) or ("reference", None) for this call (`hadamard`: the block of a random
    Hadamard transform fused in front, None for none); refuses an unknown or impossible MXLAB_BACKEND."""
    import os

    forced = os.environ.get("MXLAB_BACKEND", "")
    if forced not in ("", *BACKENDS):
        raise ValueError(f"unknown MXLAB_BACKEND {forced!r}; accepted: {', '.join(BACKENDS)} (or unset for automatic)")
    if forced == "reference" or (not forced and x.device.type != "cuda") or torch.compiler.is_compiling():
        # torch.compile traces the reference (bit-identical to the kernels), which Inductor compiles itself
        return "reference", None
    kernels = _import_kernels()
    reason = (
        "Triton is not installed" if kernels is None else kernels.unsupported_reason(x, block, axis, hadamard=hadamard)
    )
    if reason is None:
        return "triton", kernels
    if forced == "triton":
        raise ValueError(f"MXLAB_BACKEND=triton cannot run this call: {reason}")
    return "reference", None


def _dispatch(kind: str, x, fmt: ElementFormat, block, axis, scale_mode, rounding, seed, pad):
    """Run `kind` ("quantize" or "fake_quantize") on the chosen backend; records it for last_backend()."""
    global _last_backend
    backend, kernels = _choose_backend(x, block, axis)
    if not torch.compiler.is_compiling():  # no side effect in a traced graph (an autograd.Function refuses one)
        _last_backend = backend
    if backend == "triton":
        run = kernels.quantize if kind == "quantize" else kernels.fake_quantize
        return run(x, fmt, block=block, axis=axis, scale_mode=scale_mode, rounding=rounding, seed=seed, pad=pad)
    run = _reference_quantize if kind == "quantize" else _reference_fake_quantize
    return run(x, fmt, block, axis, scale_mode, rounding, seed, pad)


def _fused_rowcol(x: torch.Tensor, fmt: str, options: dict, column_sums: bool) -> tuple[torch.Tensor, ...] | None:
    """The outputs of fake_quantize_rowcol from one kernel read, or None where the Triton backend does not run it."""
    global _last_backend
    if fmt not in FORMATS or options.get("block", BLOCK_SIZE) != BLOCK_SIZE:
        return None
    unknown = set(options) - {"block", "scale_mode", "rounding", "seed", "pad"}
    if unknown:
        return None  # fake_quantize reports the unexpected keyword
    scale_mode = options.get("scale_mode", "floor")
    rounding = options.get("rounding", "nearest_even")
    seed = options.get("seed")
    _check_options(x, BLOCK_SIZE, 0, scale_mode, rounding, seed)
    backend, kernels = _choose_backend(x, BLOCK_SIZE, 0)
    if backend != "triton":
        return None
    _last_backend = backend
    return kernels.fake_quantize_rowcol(
        x,
        FORMATS[fmt],
        scale_mode=scale_mode,
        rounding=rounding,
        seed=seed,
        pad=options.get("pad", False),
        column_sums=column_sums,
    )


# ----------------------------------------------------------------------------- public API
def quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    block: int | tuple[int, int] = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
) -> MXTensor:
    """Quantize x to an MX format; returns an MXTensor (uint8 codes and E8M0 scale bytes).

    Refuses (ValueError): an unknown format, block, scale mode or rounding; stochastic rounding
    without an integer seed; an input dtype other than float32/bfloat16/float16; a blocked
    dimension that is not a multiple of 32 unless pad=True.
    """
    element_format = get_format(fmt)
    block, axis = _check_options(x, block, axis, scale_mode, rounding, seed)
    codes, scales = _dispatch("quantize", x, element_format, block, axis, scale_mode, rounding, seed, pad)
    return MXTensor(codes, scales, fmt, block, axis, tuple(x.shape), scale_mode, rounding)


def dequantize(mxt: MXTensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Values of an MXTensor in `dtype` (original, unpadded shape); scale byte 0xFF gives NaN."""
    if not isinstance(mxt, MXTensor):
        raise ValueError(f"dequantize takes an MXTensor, got {type(mxt).__name__}")
    if dtype not in INPUT_DTYPES:
        raise ValueError(f"unsupported output dtype {dtype}; accepted: float32, bfloat16, float16")
    dims = _blocked_dims(mxt.codes, mxt.block, mxt.axis)
    scales = decode_scales(mxt.scales)
    for dim in dims:
        scales = scales.repeat_interleave(BLOCK_SIZE, dim=dim)
    values = decode_codes(mxt.codes, mxt.format) * scales
    return _crop(values, mxt.shape).to(dtype)


def fake_quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    block: int | tuple[int, int] = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
) -> torch.Tensor:
    """dequantize(quantize(x, ...), x.dtype) in one pass; same shape and dtype as x.

    `fmt` may also be "bf16" or "fp32" (a cast to that precision and back) or
    "fp8_tensor_e4m3"/"fp8_tensor_e5m2" (per-tensor FP8 with current scaling, see
    `fake_quantize_per_tensor_fp8`); MX options are ignored for those. Refuses what
    `quantize` refuses.
    """
    if fmt in HIGH_PRECISION or fmt in PER_TENSOR_FP8:
        if not isinstance(x, torch.Tensor) or x.dtype not in INPUT_DTYPES:
            raise ValueError(
                f"x must be a float32/bfloat16/float16 tensor, got {getattr(x, 'dtype', type(x).__name__)}"
            )
        if fmt == "bf16":
            return x.to(torch.bfloat16).to(x.dtype)
        if fmt == "fp32":
            return x.float().to(x.dtype)
        return fake_quantize_per_tensor_fp8(x, fmt)
    if fmt not in FORMATS:
        raise ValueError(f"unknown precision {fmt!r}; accepted: {', '.join(PRECISIONS)}")
    element_format = FORMATS[fmt]
    block, axis = _check_options(x, block, axis, scale_mode, rounding, seed)
    values = _dispatch("fake_quantize", x, element_format, block, axis, scale_mode, rounding, seed, pad)
    return values.to(x.dtype)


def fake_quantize_counted(
    x: torch.Tensor,
    fmt: str,
    *,
    counter: torch.Tensor,
    seed: int,
    block: int | tuple[int, int] = 32,
    axis: int = -1,
    scale_mode: str = "floor",
    pad: bool = False,
) -> torch.Tensor:
    """fake_quantize(x, fmt, rounding="stochastic", seed=seed, ...) whose random bits are
    `reference.random_bits24(counter, seed)` element by element (counter: int64, broadcastable to x)
    instead of each element's linear index: for elements whose place is defined beyond the tensor's
    layout (jagged attention, where padding and bucketing must not change the bits). Runs the PyTorch
    reference on every device; same shape and dtype as x. Refuses what `fake_quantize` refuses for an
    MX format, and a counter that is not an int64 tensor broadcastable to x.
    """
    if fmt not in FORMATS:
        raise ValueError(f"unknown MX format {fmt!r}; accepted: {', '.join(FORMATS)}")
    block, axis = _check_options(x, block, axis, scale_mode, "stochastic", seed)
    if not isinstance(counter, torch.Tensor) or counter.dtype != torch.int64:
        raise ValueError(f"counter must be an int64 tensor, got {getattr(counter, 'dtype', type(counter).__name__)}")
    try:
        torch.broadcast_shapes(counter.shape, x.shape)
    except RuntimeError:
        raise ValueError(
            f"counter of shape {tuple(counter.shape)} does not broadcast to x of shape {tuple(x.shape)}"
        ) from None
    layout = _layout(x, block, axis, pad, need_index=True, counter=counter, short=True)
    values = reference.fake_quantize_blocks(
        layout.blocked,
        layout.reduce_dims,
        FORMATS[fmt],
        scale_mode,
        "stochastic",
        reference.random_bits24(layout.index, seed),
    )
    return _crop(values.reshape(layout.padded_shape), tuple(x.shape)).to(x.dtype)


def fake_quantize_rowcol(
    x: torch.Tensor, fmt: str, *, column_sums: bool = False, **options
) -> tuple[torch.Tensor, ...]:
    """Fake-quantize a 2-D tensor along its last dim and along its first dim, both from x itself.

    Returns (along_last, along_first), and with column_sums=True a third: x.sum(0) accumulated in float32
    (returned in float32; the fused kernel adds per-32-row partial sums, so it differs from another float32
    sum only in the order of addition). Options as for `fake_quantize` (block must be 32; axis is set here).
    Refuses a tensor that is not 2-D.
    """
    if not isinstance(x, torch.Tensor) or x.dim() != 2:
        raise ValueError(f"fake_quantize_rowcol takes a 2-D tensor, got shape {getattr(x, 'shape', None)}")
    if "axis" in options:
        raise ValueError("fake_quantize_rowcol sets axis itself; do not pass axis")
    fused = _fused_rowcol(x, fmt, options, column_sums)
    if fused is not None:
        return fused
    values = fake_quantize(x, fmt, axis=-1, **options), fake_quantize(x, fmt, axis=0, **options)
    return (*values, x.sum(0, dtype=torch.float32)) if column_sums else values


def rowcol_in_one_read(x: torch.Tensor, fmt: str, rounding: str = "nearest_even") -> bool:
    """Whether `fake_quantize_rowcol(x, fmt, rounding=rounding)` runs as one fused launch that converts with the
    GPU's FP8 instructions: there one read beats two casts (0.756 against 0.849 and 0.909 of a copy on the H200,
    reports/benchmarks/bench_quant.h200.txt); on the integer path it does not (0.419 against 0.643 and 0.530)."""
    if fmt not in FORMATS or _choose_backend(x, BLOCK_SIZE, 0)[0] != "triton":
        return False
    return bool(_import_kernels().hardware_fp8_applies(x.device, FORMATS[fmt], rounding))


def hadamard_fake_quantize(
    x: torch.Tensor,
    fmt: str,
    *,
    block: int = 32,
    axis: int = -1,
    hadamard_seed: int,
    scale_mode: str = "floor",
    rounding: str = "nearest_even",
    seed: int | None = None,
    pad: bool = False,
) -> torch.Tensor:
    """fake_quantize(random_hadamard(x.float(), block, axis, hadamard_seed), fmt, axis=axis, ...) as float32.

    `block` is the Hadamard block (mxlab.numerics.hadamard.HADAMARD_BLOCKS); MX blocks are 32 along `axis`.
    pad=True first zero-pads `axis` to a multiple of `block` (the output keeps that padded size; a
    transformed tensor cropped back would lose what the padding received) and then pads the MX blocks
    as fake_quantize(pad=True) does. Stochastic rounding (`seed`) counts elements of the transformed
    tensor. With an MX format and block 32, CUDA tensors (or MXLAB_BACKEND=triton) run the fused kernel,
    one read of x; other blocks run the transform in PyTorch, then `fake_quantize`. `fmt` may also be a
    non-MX precision of `fake_quantize`. last_backend() says which backend quantized.

    Refuses (ValueError): an unknown precision, Hadamard block, scale mode or rounding; an axis out of
    range; a non-integer hadamard_seed; stochastic rounding without an integer seed; an input dtype other
    than float32/bfloat16/float16; an axis whose size is not a multiple of `block` unless pad=True.
    """
    global _last_backend
    from mxlab.numerics.hadamard import HADAMARD_BLOCKS, random_hadamard

    if fmt not in PRECISIONS:
        raise ValueError(f"unknown precision {fmt!r}; accepted: {', '.join(PRECISIONS)}")
    if isinstance(block, bool) or block not in HADAMARD_BLOCKS:
        raise ValueError(f"unsupported Hadamard block {block!r}; accepted: {', '.join(map(str, HADAMARD_BLOCKS))}")
    if isinstance(hadamard_seed, bool) or not isinstance(hadamard_seed, int):
        raise ValueError(f"hadamard_seed must be an integer, got {hadamard_seed!r}")
    _, axis = _check_options(x, BLOCK_SIZE, axis, scale_mode, rounding, seed)
    missing = -x.shape[axis] % block
    if missing and not pad:
        raise ValueError(
            f"dimension {axis} of x has size {x.shape[axis]}, not a multiple of the Hadamard block {block}; "
            f"pass pad=True to pad it with zeros (the output keeps the padded size)"
        )
    if fmt in FORMATS and block == BLOCK_SIZE:
        backend, kernels = _choose_backend(x, BLOCK_SIZE, axis, hadamard=block)
        if backend == "triton":
            _last_backend = backend
            return kernels.hadamard_fake_quantize(
                x,
                FORMATS[fmt],
                axis=axis,
                hadamard_seed=hadamard_seed,
                scale_mode=scale_mode,
                rounding=rounding,
                seed=seed,
                pad=pad,
            )
    values = x.float()
    if missing:
        values = F.pad(values, [0, 0] * (x.dim() - 1 - axis) + [0, missing])
    transformed = random_hadamard(values, block, axis, hadamard_seed)
    return fake_quantize(transformed, fmt, axis=axis, scale_mode=scale_mode, rounding=rounding, seed=seed, pad=pad)
