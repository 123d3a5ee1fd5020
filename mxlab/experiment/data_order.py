"""The order a run takes its training data in: the seed's order, and the placebo's own order of the same data.

The placebo arm (the A/A control) trains the baseline's recipe in another order: from scratch on
its own data-order seed; in the fork design on the baseline's stream with the batches from the
fork on swapped in pairs, since another seed would continue on a different subset of the epoch
than the one the warm-up left (docs/statistics.md, "Controls").
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator
from typing import Any

PLACEBO_ARM = "placebo"  # the A/A control: the baseline's recipe, its own order of the same data
PLACEBO_DATA_SEED_OFFSET = 1_000_003


def data_order_seed(job: Any) -> int:
    """The seed of the run's training data order: the run's seed, offset for the placebo arm trained
    from scratch. In the fork design the placebo keeps the seed (and swaps batches in pairs,
    `training_batches`): another order would continue on a different subset of the epoch than the
    one the warm-up left, partly examples the warm-up already took, which is not an A/A."""
    return job.seed + PLACEBO_DATA_SEED_OFFSET if job.arm == PLACEBO_ARM and job.fork_dir is None else job.seed


def swapped_pairs(batches: Iterable[Any], start: int) -> Iterator[Any]:
    """The stream with its first `start` items as they are, then each following pair in swapped order
    (items start+1, start, start+3, start+2, ...; an odd last one in place)."""
    iterator = iter(batches)
    yield from itertools.islice(iterator, start)
    for first in iterator:
        second = next(iterator, None)
        if second is not None:
            yield second
        yield first


def training_batches(
    job: Any, source: Any, epoch: int, skip: int, fork_position: tuple[int, int] | None
) -> Iterator[Any]:
    """The run's training batches of `epoch` past the first `skip` (those a resumed run or a fork's
    warm-up already took). A placebo in the fork design (`fork_position` = the warm-up's (epoch,
    batches taken in it)) takes the baseline's stream with the batches from there on swapped in
    pairs: the same examples at nearly the same time, in another order."""
    batches = source.train_batches(job.spec.train.batch_size, data_order_seed(job), epoch)
    if job.arm == PLACEBO_ARM and fork_position is not None:
        fork_epoch, taken = fork_position
        batches = swapped_pairs(batches, taken if epoch == fork_epoch else 0)
    return itertools.islice(batches, skip, None)
