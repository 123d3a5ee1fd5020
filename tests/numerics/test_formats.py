import math

import pytest
import torch

from mxlab.numerics.formats import FORMATS, decode_code, decode_codes, decode_scales, format_table, get_format
from mxlab.numerics.reference import encode_elements

EXPECTED = {  # name: (max normal, min normal, min subnormal)
    "e4m3": (448.0, 2.0**-6, 2.0**-9),
    "e5m2": (57344.0, 2.0**-14, 2.0**-16),
    "e3m2": (28.0, 0.25, 0.0625),
    "e2m3": (7.5, 1.0, 0.125),
    "e2m1": (6.0, 1.0, 0.5),
    "int8": (127 / 64, 2.0**-6, 2.0**-6),
}


@pytest.mark.parametrize("name", FORMATS)
def test_format_ranges_match_ocp(name):
    fmt = get_format(name)
    assert (fmt.max_normal, fmt.min_normal, fmt.min_subnormal) == EXPECTED[name]


def test_fp8_codes_are_torch_float8_bit_patterns():
    codes = torch.arange(256, dtype=torch.uint8)
    for name, dtype in (("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2)):
        ours = decode_codes(codes, get_format(name))
        torch_values = codes.view(dtype).float()
        assert torch.equal(torch.isnan(ours), torch.isnan(torch_values))
        finite = ~torch.isnan(ours)
        assert torch.equal(ours[finite], torch_values[finite])


def _finite_codes(fmt):
    for code in range(1 << fmt.bits):
        if fmt.is_int and code == 0x80:
            continue  # MXINT8 never uses -128
        if math.isfinite(decode_code(fmt, code)):
            yield code


@pytest.mark.parametrize("name", FORMATS)
def test_every_code_decodes_and_reencodes_exhaustively(name):
    fmt = get_format(name)
    codes = torch.tensor(list(_finite_codes(fmt)), dtype=torch.int64)
    values = torch.tensor([decode_code(fmt, int(c)) for c in codes], dtype=torch.float32)
    for rounding in ("nearest_even", "nearest_away", "toward_zero"):
        assert torch.equal(encode_elements(values, 0, fmt, rounding).long(), codes)
    # the same values at another scale encode to the same codes
    assert torch.equal(encode_elements(values * 2.0**5, 5, fmt).long(), codes)


def test_special_codes():
    assert math.isnan(decode_code(get_format("e4m3"), 0x7F))
    assert decode_code(get_format("e5m2"), 0x7C) == math.inf
    assert decode_code(get_format("int8"), 0x81) == -127 / 64
    assert decode_code(get_format("e2m1"), 0xF) == -6.0


def test_e8m0_decoding():
    scales = torch.tensor([0, 127, 128, 254, 255], dtype=torch.uint8)
    values = decode_scales(scales)
    assert values[0].item() == 2.0**-127 and values[1].item() == 1.0 and values[2].item() == 2.0
    assert values[3].item() == 2.0**127 and math.isnan(values[4].item())


def test_unknown_format_names_accepted_ones():
    with pytest.raises(ValueError, match="accepted: e4m3, e5m2"):
        get_format("e4m4")


def test_format_table_lists_every_format():
    table = format_table()
    for name in list(FORMATS) + ["e8m0"]:
        assert name in table
    assert "57344" in table and "448" in table
