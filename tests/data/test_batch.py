import torch

from mxlab.data import JaggedBatch, rebatch


def _batch(lengths, first_item=0):
    n = len(lengths)
    offsets = torch.tensor([0] + torch.tensor(lengths).cumsum(0).tolist(), dtype=torch.int64)
    total = int(offsets[-1])
    return JaggedBatch(
        dense=torch.arange(n, dtype=torch.float32)[:, None] + first_item,
        sparse=torch.arange(n)[:, None] + first_item,
        history_items=torch.arange(total) + 100 * first_item,
        history_actions=torch.arange(total) % 3,
        history_offsets=offsets,
        click=torch.ones(n),
        conversion=torch.zeros(n),
        user_id=torch.arange(n) + first_item,
    )


def _histories(batch):
    offsets = batch.history_offsets.tolist()
    return [batch.history_items[a:b].tolist() for a, b in zip(offsets[:-1], offsets[1:])]


def test_take_keeps_each_example_with_its_own_history():
    batch = _batch([2, 0, 3, 1])
    taken = batch.take(torch.tensor([2, 1, 3, 2]))
    assert taken.user_id.tolist() == [2, 1, 3, 2]
    assert _histories(taken) == [[2, 3, 4], [], [5], [2, 3, 4]]
    assert taken.history_offsets.tolist() == [0, 3, 3, 4, 7]


def test_concat_and_rebatch_preserve_examples_and_order():
    first, second = _batch([1, 2, 0], first_item=0), _batch([3, 1], first_item=10)
    merged = JaggedBatch.concat([first, second])
    assert merged.user_id.tolist() == [0, 1, 2, 10, 11]
    assert _histories(merged) == _histories(first) + _histories(second)
    pieces = list(rebatch([first, second], 2))
    assert [piece.batch_size for piece in pieces] == [2, 2, 1]
    assert sum((_histories(piece) for piece in pieces), []) == _histories(merged)
    assert torch.cat([piece.user_id for piece in pieces]).tolist() == [0, 1, 2, 10, 11]


def test_prefetched_keeps_order_and_reraises_producer_errors():
    import pytest

    from mxlab.data.batch import prefetched

    assert list(prefetched(iter(range(7)), depth=2)) == list(range(7))

    def failing():
        yield 1
        raise ValueError("line 3 is malformed")

    consumer = prefetched(failing())
    assert next(consumer) == 1
    with pytest.raises(ValueError, match="line 3"):
        next(consumer)
    abandoned = prefetched(iter(range(1000)), depth=1)
    assert next(abandoned) == 0
    abandoned.close()  # stops the producer instead of leaving it blocked
