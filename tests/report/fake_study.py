"""Small fake study folders (docs/INTERFACES.md layout) with planted effects, for the analysis and report tests.

Every arm's predictions are built from the true probabilities in logit space:

- ``baseline``-like arms ("bf16", kind "same"): logit(truth) + seed noise of sd ``noise_sd``
  (a different draw per arm and seed, as reseeding a training run would give);
- kind "regress": the baseline's own logits (same seed) + extra noise + a positive bias, so it
  over-predicts and its NE gets worse;
- kind "improve": logit(truth) + seed noise of a smaller sd;
- kind "diverged": the run of ``diverged_seed`` is recorded as diverged (no eval.npz); other seeds as "same".
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np


def _logit(p):
    return np.log(p) - np.log1p(-p)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def make_fake_study(
    directory: Path,
    arms: dict[str, str] | None = None,
    seeds: tuple[int, ...] = (0, 1, 2),
    n_examples: int = 20_000,
    n_users: int = 2_000,
    noise_sd: float = 0.3,
    bias: float = 0.15,
    diverged_seed: int = 1,
    with_numerics: bool = True,
    report: dict | None = None,
    rng_seed: int = 0,
) -> Path:
    arms = arms or {"bf16": "same", "mx-same": "same", "mx-regress": "regress"}
    baseline = next(iter(arms))
    rng = np.random.default_rng(rng_seed)
    directory = Path(directory)
    users = rng.integers(0, n_users, n_examples)
    user_effect = rng.normal(0, 0.7, n_users)[users]
    true_ctr = _sigmoid(-2.2 + user_effect + rng.normal(0, 0.8, n_examples))
    true_cvr = _sigmoid(-1.5 + 0.5 * user_effect + rng.normal(0, 0.8, n_examples))
    click = (rng.uniform(size=n_examples) < true_ctr).astype(np.float32)
    conversion = (click * (rng.uniform(size=n_examples) < true_cvr)).astype(np.float32)
    spec = {
        "name": directory.name,
        "baseline": baseline,
        "arms": list(arms),
        "seeds": list(seeds),
        "data": {"source": "synthetic", "train_examples": 100_000, "eval_examples": n_examples},
        "model": {"dim": 16, "layers": 1, "heads": 2, "max_history": 32},
        "train": {"batch_size": 256, "lr": 1e-3, "epochs": 1},
        "report": report if report is not None else {},
        "command": f"mxlab run experiments/{directory.name}.toml --device cpu --out {directory}",
        "environment": {"device": "cpu (fake)", "versions": {"python": "3.12", "torch": "2.13.0"}, "commit": "0123abc"},
    }
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "study.json").write_text(json.dumps(spec, indent=2))
    base_logits: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for arm_number, (arm, kind) in enumerate(arms.items()):
        for seed in seeds:
            run_rng = np.random.default_rng([rng_seed, arm_number, seed])
            run = directory / "runs" / arm / f"seed{seed}"
            run.mkdir(parents=True, exist_ok=True)
            (run / "plan.txt").write_text(
                f"module            fwd    dgrad  wgrad\n"
                f"towers.ctr.fc1    {'bf16' if arm == baseline else 'e4m3'} "
                f"  {'bf16' if arm == baseline else 'e4m3'}   bf16\n"
                f"towers.cvr.fc1    {'bf16' if arm == baseline else 'e4m3'}   bf16   bf16\n"
            )
            (run / "plan.json").write_text(json.dumps({"towers.ctr.fc1": "mx" if arm != baseline else "hp"}))
            _write_metrics(run / "metrics.jsonl", run_rng, arm_number, dynamic_scale=arm != baseline)
            if with_numerics and arm != baseline:
                _write_numerics(run / "numerics.jsonl", run_rng, degrade=kind == "regress")
            if kind == "diverged" and seed == diverged_seed:
                (run / "done.json").write_text(
                    json.dumps({"status": "diverged", "diverged_at_step": 37, "steps": 37, "wall_s": 1.0})
                )
                continue
            if kind == "regress":
                ctr_logit, cvr_logit = base_logits[seed]
                ctr_logit = ctr_logit + run_rng.normal(0, noise_sd, n_examples) + bias
                cvr_logit = cvr_logit + run_rng.normal(0, noise_sd, n_examples) + bias
            else:
                sd = noise_sd / 2 if kind == "improve" else noise_sd
                ctr_logit = _logit(true_ctr) + run_rng.normal(0, sd, n_examples)
                cvr_logit = _logit(true_cvr) + run_rng.normal(0, sd, n_examples)
            if arm == baseline:
                base_logits[seed] = (ctr_logit, cvr_logit)
            p_ctr, p_cvr = _sigmoid(ctr_logit).astype(np.float32), _sigmoid(cvr_logit).astype(np.float32)
            np.savez(
                run / "eval.npz",
                click=click,
                conversion=conversion,
                p_ctr=p_ctr,
                p_cvr=p_cvr,
                p_ctcvr=p_ctr * p_cvr,
                user_id=users,
                true_ctr=true_ctr.astype(np.float32),
                true_cvr=true_cvr.astype(np.float32),
            )
            (run / "done.json").write_text(
                json.dumps({"status": "finished", "diverged_at_step": None, "steps": 100, "wall_s": 2.5})
            )
    return directory


def _write_metrics(
    path: Path, rng: np.random.Generator, arm_number: int, dynamic_scale: bool, steps: int = 100
) -> None:
    scale = 65536.0
    lines = []
    for step in range(0, steps, 5):
        loss = 0.45 + 0.3 * np.exp(-step / 25) + 0.004 * arm_number + rng.normal(0, 0.01)
        skipped = bool(dynamic_scale and step in (20, 60))
        if skipped:
            scale /= 2
        lines.append(
            json.dumps(
                {
                    "step": step,
                    "epoch": 0,
                    "loss": loss,
                    "loss_ctr": 0.7 * loss,
                    "loss_ctcvr": 0.3 * loss,
                    "loss_scale": scale if dynamic_scale else 1.0,
                    "skipped": skipped,
                    "examples_per_s": 5000.0,
                    "time_s": step * 0.05,
                }
            )
        )
    path.write_text("\n".join(lines) + "\n")


def _write_numerics(path: Path, rng: np.random.Generator, degrade: bool) -> None:
    lines = []
    modules = ["history.attn.qkv", "history.attn", "towers.ctr.fc1", "towers.cvr.fc1"]
    for step in (0, 50):
        for module in modules:
            gemms = ("qk", "pv") if module == "history.attn" else ("fwd", "dgrad", "wgrad")
            for gemm in gemms:
                sqnr = 31.0 - (6.0 if degrade and gemm == "dgrad" else 0.0) + rng.normal(0, 0.5)
                lines.append(
                    json.dumps(
                        {
                            "step": step,
                            "module": module,
                            "gemm": gemm,
                            "sqnr_db": sqnr,
                            "saturated_frac": 1e-4 if degrade else 0.0,
                            "flushed_frac": 2e-3 if gemm == "wgrad" else 1e-4,
                            "subnormal_frac": 1e-3,
                            "scale_exp_hist": {"-3": 10, "-2": 5},
                        }
                    )
                )
    path.write_text("\n".join(lines) + "\n")
