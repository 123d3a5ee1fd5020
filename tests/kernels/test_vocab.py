"""The closed vocabularies (mxlab.numerics.vocab): one source of the kernel ids that the cast kernels and the
attention's register tiles read, and the ValueError an unknown value raises."""

import pytest
import torch

from mxlab.numerics.formats import FORMATS
from mxlab.numerics.quant import quantize
from mxlab.numerics.vocab import CODE_FIELDS, Element, Layout, Rounding, ScaleMode, code_field, kernel_code

pytest.importorskip("triton")


def test_device_constants_are_the_enums_kernel_ids():
    from mxlab.kernels.cast import bits

    named = [  # (device constant, member)
        (bits.LAYOUT_ROW, Layout.ROW),
        (bits.LAYOUT_COL, Layout.COLUMN),
        (bits.LAYOUT_BOTH, Layout.BOTH),
        (bits.LAYOUT_TILE, Layout.TILE),
        (bits.SCALE_FLOOR, ScaleMode.FLOOR),
        (bits.SCALE_CEIL, ScaleMode.CEIL),
        (bits.SCALE_RCEIL, ScaleMode.RCEIL),
        (bits.SCALE_EVEN, ScaleMode.EVEN),
        (bits.ROUND_NEAREST_EVEN, Rounding.NEAREST_EVEN),
        (bits.ROUND_NEAREST_AWAY, Rounding.NEAREST_AWAY),
        (bits.ROUND_TOWARD_ZERO, Rounding.TOWARD_ZERO),
        (bits.ROUND_STOCHASTIC, Rounding.STOCHASTIC),
    ]
    assert all(constant.value == member.kernel_id for constant, member in named)
    for vocabulary in (Layout, ScaleMode, Rounding):  # distinct ids, each one a named device constant
        assert sorted(member.kernel_id for member in vocabulary) == list(range(len(vocabulary)))
        assert {member for _, member in named if isinstance(member, vocabulary)} == set(vocabulary)


@pytest.mark.parametrize("element", list(Element))
def test_kernel_code_fields_are_the_format_and_modes(element):
    fmt = element.format
    assert element.kernel_id == kernel_code(fmt, "floor", "nearest_even")  # mode ids 0, hw_fp8 off
    for scale_mode in ScaleMode:
        for rounding in Rounding:
            code = kernel_code(fmt, scale_mode.value, rounding.value)
            assert code_field(code, "scale_mode") == scale_mode.kernel_id
            assert code_field(code, "rounding") == rounding.kernel_id
    code = element.kernel_id
    fields = {name: code_field(code, name) for name in ("mbits", "emin", "emax", "is_int", "bits", "max_code")}
    assert fields == dict(
        mbits=fmt.mbits, emin=fmt.emin, emax=fmt.emax, is_int=fmt.is_int, bits=fmt.bits, max_code=fmt.max_code
    )
    assert code_field(code, "nmax") == fmt.max_normal / 2.0 ** (fmt.emax - fmt.mbits)
    assert 2 ** CODE_FIELDS["scale_mode"][1] >= 16  # room for more scale modes


def test_both_kernel_families_read_the_same_code():
    """The cast launch passes `kernel_code` and the layout's id; the attention's operand code is the same int."""
    from mxlab.bench.cast_kernels import cast_kernels_replaced
    from mxlab.kernels import cast
    from mxlab.kernels._mx_device import operand_code

    launches = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **constants: launches.append(constants)

    x = torch.zeros(64, 64)
    fmt = FORMATS["e2m3"]
    with cast_kernels_replaced(lambda kernel: Recorder()):
        cast.quantize(x, fmt, scale_mode="even", rounding="toward_zero")
        cast.quantize(x, fmt, axis=0, scale_mode=ScaleMode.RCEIL, rounding=Rounding.STOCHASTIC, seed=1)
    (row, column) = launches
    assert row["CODE"] == kernel_code(fmt, "even", "toward_zero") == operand_code("e2m3", "even", "toward_zero")
    assert column["CODE"] == kernel_code(fmt, "rceil", "stochastic") == operand_code("e2m3", "rceil", "stochastic")
    assert (row["LAYOUT"], column["LAYOUT"]) == (Layout.ROW.kernel_id, Layout.COLUMN.kernel_id)


@pytest.mark.parametrize(
    "vocabulary, what, accepted",
    [
        (ScaleMode, "scale_mode", "floor, ceil, rceil, even"),
        (Rounding, "rounding", "nearest_even, nearest_away, toward_zero, stochastic"),
        (Layout, "layout", "row, column, both, tile"),
        (Element, "MX element format", "e4m3, e5m2, e3m2, e2m3, e2m1, int8"),
    ],
)
def test_unknown_value_raises_naming_it_and_the_accepted_ones(vocabulary, what, accepted):
    for value in ("bogus", None, ["floor"]):
        with pytest.raises(ValueError, match=f"^unknown {what} {value!r}; accepted: {accepted}$".replace("[", r"\[")):
            vocabulary(value)
        with pytest.raises(ValueError, match="accepted"):
            vocabulary.check(value)
    first = next(iter(vocabulary))
    assert vocabulary(first.value) is first and first == first.value and f"{first}" == first.value


def test_strings_and_members_are_interchangeable_at_the_api():
    x = torch.randn(4, 64)
    by_name = quantize(x, "e4m3", scale_mode="rceil", rounding="nearest_even")
    by_member = quantize(x, Element.E4M3, scale_mode=ScaleMode.RCEIL, rounding=Rounding.NEAREST_EVEN)
    assert torch.equal(by_name.codes, by_member.codes) and torch.equal(by_name.scales, by_member.scales)
    with pytest.raises(ValueError, match="unknown scale_mode 'ceiling'; accepted: floor, ceil, rceil, even"):
        quantize(x, "e4m3", scale_mode="ceiling")
