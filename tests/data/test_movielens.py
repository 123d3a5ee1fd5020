import zipfile

import pytest
import torch

from mxlab.data import make_source
from mxlab.data.movielens import EXPECTED_ROWS, extract_movielens, verify_movielens

# (user, item, rating, timestamp): user 1 rates at t=10, 20, 20, 30, 50; user 2 at 15, 40
RATINGS = [(1, 1, 5, 10), (2, 2, 3, 15), (1, 2, 4, 20), (1, 3, 2, 20), (1, 1, 1, 30), (2, 3, 5, 40), (1, 2, 5, 50)]


def write_fixture(folder, ratings=RATINGS, inter_header="user_id:token\titem_id:token\trating:float\ttimestamp:float"):
    """Write the three RecBole atomic files in the exact format of the recbole 1.2.1 wheel."""
    folder.mkdir(parents=True, exist_ok=True)
    lines = [inter_header] + [f"{u}\t{i}\t{r}\t{t}" for u, i, r, t in ratings]
    (folder / "ml-100k.inter").write_text("\n".join(lines) + "\n")
    (folder / "ml-100k.user").write_text(
        "user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
        "1\t24\tM\ttechnician\t85711\n2\t53\tF\tother\t94043\n"
    )
    (folder / "ml-100k.item").write_text(
        "item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "1\tToy Story\t1995\tAnimation Children's Comedy\n2\tGoldenEye\t1995\tAction Adventure Thriller\n"
        "3\tSomething\tunkonwn\t\n"
    )
    return folder


def _histories(batch):
    offsets = batch.history_offsets.tolist()
    return [
        list(zip(batch.history_items[a:b].tolist(), batch.history_actions[a:b].tolist()))
        for a, b in zip(offsets[:-1], offsets[1:])
    ]


def test_examples_labels_and_histories_without_future(tmp_path):
    write_fixture(tmp_path / "ml")
    source = make_source(
        {"source": "movielens-100k", "cache_dir": str(tmp_path / "ml"), "eval_fraction": 0.3}, max_history=2
    )
    assert (source.n_train, source.n_eval) == (5, 2)
    train = next(source.train_batches(100, seed=0, epoch=0))
    assert train.batch_size == 5
    evaluation = next(source.eval_batches(100))
    # eval period = the two latest ratings: (2, 3, 5, 40) and (1, 2, 5, 50)
    assert evaluation.user_id.tolist() == [2, 1]
    assert evaluation.click.tolist() == [1.0, 1.0] and evaluation.conversion.tolist() == [1.0, 1.0]
    # user 2 at t=40 saw item 2 (rating 3); user 1 at t=50: latest 2 earlier ratings, oldest first
    assert _histories(evaluation) == [[(2, 3)], [(3, 2), (1, 1)]]
    # a training example at t=20 must not see the other rating of the same second
    by_item = {}
    for sparse, history, click, conversion in zip(
        train.sparse.tolist(), _histories(train), train.click.tolist(), train.conversion.tolist()
    ):
        by_item.setdefault((sparse[0], click, conversion), []).append(history)
    assert by_item[(3, 0.0, 0.0)] == [[(1, 5)]]  # (1, 3, 2, 20): only the t=10 rating
    assert by_item[(2, 1.0, 0.0)] == [[(1, 5)]]  # (1, 2, 4, 20): same
    assert by_item[(1, 1.0, 1.0)] == [[]]  # the first rating has no history
    assert source.info.candidate_field == 0 and source.info.n_actions == 6
    assert evaluation.sparse[:, 0].tolist() == [3, 2]


def test_training_order_depends_on_seed_only(tmp_path):
    write_fixture(tmp_path / "ml")
    config = {"source": "movielens-100k", "cache_dir": str(tmp_path / "ml"), "eval_fraction": 0.3}
    source = make_source(config, max_history=4)
    order = lambda seed: torch.cat(
        [b.dense[:, 2] * 1000 + b.sparse[:, 0] for b in source.train_batches(2, seed, 0)]
    ).tolist()
    assert order(5) == order(5)
    assert order(5) != order(6) and sorted(order(5)) == sorted(order(6))


def test_fetch_extracts_verifies_and_records_checksums(tmp_path):
    fixture = write_fixture(tmp_path / "raw")
    wheel = tmp_path / "recbole-1.2.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for name in ("ml-100k.inter", "ml-100k.user", "ml-100k.item"):
            archive.write(fixture / name, f"recbole/dataset_example/ml-100k/{name}")
    counts = {"ml-100k.inter": len(RATINGS), "ml-100k.user": 2, "ml-100k.item": 3}
    summary = extract_movielens(wheel, tmp_path / "cache", expected_rows=counts)
    assert summary["ml-100k.inter"]["rows"] == 7 and len(summary["ml-100k.user"]["sha256"]) == 64
    assert (tmp_path / "cache" / "manifest.json").exists()
    with pytest.raises(ValueError, match="7 rows, expected 100000"):
        verify_movielens(tmp_path / "cache")
    assert EXPECTED_ROWS == {"ml-100k.inter": 100_000, "ml-100k.user": 943, "ml-100k.item": 1682}


def test_missing_or_malformed_files_are_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="mxlab data fetch movielens-100k"):
        make_source({"source": "movielens-100k", "cache_dir": str(tmp_path / "nowhere")}, 8)
    write_fixture(tmp_path / "bad", inter_header="user\titem\trating\ttime")
    with pytest.raises(ValueError, match="header"):
        make_source({"source": "movielens-100k", "cache_dir": str(tmp_path / "bad")}, 8)
    broken = write_fixture(tmp_path / "broken")
    with open(broken / "ml-100k.inter", "a") as handle:
        handle.write("3\t1\t4\n")
    with pytest.raises(ValueError, match="line 9"):
        make_source({"source": "movielens-100k", "cache_dir": str(broken)}, 8)


_REAL = __import__("mxlab.data.movielens", fromlist=["default_cache_dir"]).default_cache_dir()


@pytest.mark.skipif(
    not (_REAL / "ml-100k.inter").exists(), reason="MovieLens-100K not fetched (mxlab data fetch movielens-100k)"
)
def test_real_dataset_when_fetched():
    assert verify_movielens(_REAL)["ml-100k.inter"]["rows"] == 100_000
    source = make_source({"source": "movielens-100k"}, max_history=16)
    assert (source.n_train, source.n_eval) == (80_000, 20_000)
    batch = next(source.eval_batches(4096))
    assert 0.45 < batch.click.mean() < 0.65 and int(batch.history_lengths().max()) <= 16
