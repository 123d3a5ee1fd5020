"""train_run's seams: the model factory and the loss are parameters, defaulting to the spec's builder and loss."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from mxlab.experiment import load_spec
from mxlab.experiment.study_jobs import study_jobs
from mxlab.experiment.train import train_run
from mxlab.experiment.worker import make_data_source
from mxlab.models import build, esmm_loss
from tests.experiment import standins
from tests.experiment.test_runner_logic import spec_path  # noqa: F401  (fixture)


def _job(path: Path, runs: Path):
    (job,) = [job for job in study_jobs(load_spec(path, ["seeds=[0]"]), runs) if job.arm == "base"]
    return job


def test_a_given_model_factory_and_loss_train_the_run(spec_path, tmp_path):  # noqa: F811
    source = make_data_source(load_spec(spec_path))
    default = train_run(_job(spec_path, tmp_path / "default"), source, "cpu")
    built, losses = [], []
    job = _job(spec_path, tmp_path / "given")

    def factory(model_config, info):
        built.append(dict(model_config))
        return build(model_config, info, job.spec.tasks)

    def loss(output, batch):
        losses.append(1)
        return esmm_loss(output, batch)

    given = train_run(job, source, "cpu", model_factory=factory, loss=loss)
    assert built == [{"builder": standins.BUILDER, "dim": 8, "max_history": 4}]
    assert len(losses) == given.steps == default.steps > 0
    eval_bytes = (job.run_dir / "eval.npz").read_bytes()
    assert eval_bytes == (tmp_path / "default/base/seed0/eval.npz").read_bytes()  # the same as the defaults

    def doubled(output, batch):
        terms = esmm_loss(output, batch)
        return {**terms, "loss": 2 * terms["loss"]}

    other = dataclasses.replace(job, run_dir=tmp_path / "doubled/base/seed0")
    train_run(other, source, "cpu", model_factory=factory, loss=doubled)
    assert (other.run_dir / "eval.npz").read_bytes() != eval_bytes  # the loss given is the one trained on
