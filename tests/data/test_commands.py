import json

from typer.testing import CliRunner

from mxlab.cli import app


def test_describe_synthetic_prints_sizes_rates_and_truth():
    result = CliRunner().invoke(
        app,
        [
            "data",
            "describe",
            "synthetic",
            "--max-history",
            "16",
            "--set",
            "train_examples=100",
            "--set",
            "eval_examples=3000",
            "--set",
            "base_ctr=0.1",
        ],
    )
    assert result.exit_code == 0, result.output
    description = json.loads(result.output)
    assert description["n_train"] == 100 and description["n_eval"] == 3000
    assert 0.07 < description["eval"]["click_rate"] < 0.13
    assert description["eval"]["mean_history_length"] < 16
    assert description["truth_reference"]["ctr_auc"] > 0.7


def test_bad_names_exit_with_status_2_and_a_message():
    runner = CliRunner()
    result = runner.invoke(app, ["data", "fetch", "movielens-1m"])
    assert result.exit_code == 2 and "accepted: movielens-100k" in result.output
    result = runner.invoke(app, ["data", "describe", "synthetic", "--set", "n_ads=5"])
    assert result.exit_code == 2 and "unknown key 'data.n_ads'" in result.output
