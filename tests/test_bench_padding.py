"""The padded-SDPA baseline of `mxlab bench attention` pads and unpads jagged tokens exactly."""
import torch

from mxlab.bench.attention import _offsets, _padded, _padding_slots


def test_padding_slots_place_every_token_and_unpad_back_with_unit_gradients():
    lengths = torch.tensor([3, 0, 5, 1])
    width = 5
    x = torch.randn(int(lengths.sum()), 2, 4, requires_grad=True)
    slots = _padding_slots(lengths, width)
    padded = _padded(x, slots, len(lengths), width)
    offsets = _offsets(lengths)
    for b, length in enumerate(lengths.tolist()):
        assert torch.equal(padded[b, :, :length].transpose(0, 1), x[offsets[b]:offsets[b] + length])
        assert not padded[b, :, length:].any()
    unpadded = padded.transpose(1, 2).reshape(len(lengths) * width, 2, 4).index_select(0, slots)
    assert torch.equal(unpadded, x)
    unpadded.sum().backward()
    assert torch.equal(x.grad, torch.ones_like(x))
