import math

import pytest
import torch

from mxlab.data import make_source
from mxlab.data.criteo import N_CATEGORICAL, parse_line


def _row(label, integers, categoricals):
    return "\t".join([str(label)] + [str(x) for x in integers] + categoricals)


def write_file(path, n_rows, broken_line=None):
    lines = []
    for row in range(n_rows):
        integers = [row, "", -2, 5] + [1] * 9
        categoricals = [f"{(row * 7919 + field) & 0xFFFFFFFF:08x}" for field in range(N_CATEGORICAL)]
        categoricals[3] = ""
        lines.append(_row(row % 2, integers, categoricals))
    if broken_line is not None:
        lines[broken_line - 1] = lines[broken_line - 1].rsplit("\t", 1)[0]  # 39 columns
    path.write_text("\n".join(lines) + "\n")
    return path


def test_parsing_transforms_and_hashing(tmp_path):
    sizes = (11,) * N_CATEGORICAL
    label, dense, ids = parse_line(_row(1, [0, "", -2, 1000] + [3] * 9, ["68fd1e64"] + [""] * 25), sizes, "here")
    assert label == 1
    assert dense[:4] == pytest.approx([0.0, 0.0, -math.log1p(2.0), math.log1p(1000.0)], rel=1e-15)
    assert 1 <= ids[0] <= 10 and ids[1:] == [0] * 25
    with pytest.raises(ValueError, match="here: categorical feature C1 = 'xyz'"):
        parse_line(_row(0, [1] * 13, ["xyz"] + [""] * 25), sizes, "here")
    with pytest.raises(ValueError, match="label '2'"):
        parse_line(_row(2, [1] * 13, [""] * 26), sizes, "here")


def test_source_batches_split_and_shuffle(tmp_path):
    path = write_file(tmp_path / "train.txt", 50)
    source = make_source(
        {
            "source": "criteo",
            "path": str(path),
            "train_examples": 40,
            "eval_examples": 10,
            "hash_size": 101,
            "shuffle_buffer": 8,
        },
        max_history=16,
    )
    assert (source.n_train, source.n_eval) == (40, 10) and not source.info.has_conversion
    batch = next(source.eval_batches(16))
    assert batch.batch_size == 10 and batch.user_id.tolist() == list(range(41, 51))  # line numbers
    assert batch.dense.shape == (10, 13) and batch.sparse.shape == (10, 26)
    assert batch.history_items.numel() == 0 and batch.history_offsets.tolist() == [0] * 11
    assert (batch.sparse[:, 3] == 0).all() and (batch.sparse[:, 0] > 0).all() and (batch.sparse < 101).all()
    assert batch.conversion.sum() == 0 and batch.has_conversion is False
    lines = lambda seed: torch.cat([b.user_id for b in source.train_batches(7, seed, 0)]).tolist()
    assert lines(0) == lines(0) and sorted(lines(0)) == list(range(1, 41))
    assert lines(0) != lines(1) and lines(0) != list(range(1, 41))


def test_malformed_row_is_reported_with_its_line_number(tmp_path):
    path = write_file(tmp_path / "broken.txt", 20, broken_line=13)
    source = make_source({"source": "criteo", "path": str(path), "eval_examples": 5}, max_history=4)
    with pytest.raises(ValueError, match=r"broken.txt, line 13: expected 40 tab-separated columns"):
        list(source.train_batches(4, 0, 0))
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        make_source({"source": "criteo", "path": str(tmp_path / "missing.txt")}, 4)
    with pytest.raises(ValueError, match="too few"):
        make_source({"source": "criteo", "path": str(path), "train_examples": 19, "eval_examples": 5}, 4)
