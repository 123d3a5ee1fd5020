"""train_run's seams: the model factory and the loss are parameters, defaulting to mxlab.models' own."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mxlab.experiment import load_spec
from mxlab.experiment.runner import study_jobs
from mxlab.experiment.train import train_run
from tests.experiment import standins
from tests.experiment.test_runner_logic import source, spec_path  # noqa: F401  (fixtures)


def _job(path: Path, runs: Path):
    (job,) = [job for job in study_jobs(load_spec(path, ["seeds=[0]"]), runs) if job.arm == "noisy"]
    return job


def test_a_given_model_factory_and_loss_train_the_run(source, spec_path, tmp_path):  # noqa: F811
    default = train_run(_job(spec_path, tmp_path / "default"), source, "cpu")
    built, losses = [], []

    def factory(model_config, info):
        built.append(dict(model_config))
        return standins.build_model(model_config, info)

    def loss(output, batch):
        losses.append(1)
        return standins.esmm_loss(output, batch)

    job = _job(spec_path, tmp_path / "given")
    given = train_run(job, source, "cpu", model_factory=factory, loss=loss)
    assert built == [{"dim": 8, "max_history": 4}] and len(losses) == given.steps == default.steps > 0
    eval_bytes = (job.run_dir / "eval.npz").read_bytes()
    assert eval_bytes == (tmp_path / "default/noisy/seed0/eval.npz").read_bytes()  # the same as the defaults

    def doubled(output, batch):
        terms = standins.esmm_loss(output, batch)
        return {**terms, "loss": 2 * terms["loss"]}

    other = dataclasses.replace(job, run_dir=tmp_path / "doubled/noisy/seed0")
    train_run(other, source, "cpu", model_factory=factory, loss=doubled)
    assert (other.run_dir / "eval.npz").read_bytes() != eval_bytes  # the loss given is the one trained on
