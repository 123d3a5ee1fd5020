"""Which part of GEM's history pathway flattens its response to the count of matching history items?

An exploration, not imported by the library. On the synthetic "learnable" preset the true CTR logit has the history
term log(1 + m), m the action-weighted count of history items whose topic is the ad's (mxlab/data/synthetic.py); a
trained GEM model's CTR logit rises only 0.3-0.5 per unit of it (reports/benchmarks/gap_anatomy.cpu.txt). This trains
the history pathway alone, on the CPU, to regress that term, in variants that differ in one component each:

- the pathway is mxlab.models.gem's own modules at a small ModelConfig: the item and action embeddings of the
  history tokens, `HistoryEncoder` (pre-norm blocks, QK-norm self-attention, final LayerNorm), `PooledAttention`,
  `TokenCrossAttention` of the candidate tokens (the ad item's embedding, the ad topic's embedding) onto the history,
  `Interaction` (flattened tokens, DCN cross layers, LayerNorm) and a `Tower` whose logit is the prediction;
- variants (`VARIANTS`): as is (SiLU attention, silu(S) / n_keys, the library's); softmax; SiLU divided by the
  constant max_history instead of each example's n_keys (HSTU's form; here the attention output times
  n_keys / max_history, which is exactly that); without QK-norm; without the history encoder's final LayerNorm; a
  topic embedding (the ad topic's table) added to every history token; log(1 + L) given as one more token (a
  linear projection of it); and combinations of these.

Every variant sees the same examples in the same order (generated from --data-seed by the source's own generator,
`SyntheticSource._features`, at the learnable preset's world and the given max_history), from the same initial
seed, for the same --steps (declared before running; nothing stops early). The loss is the MSE on the true term
(--loss mse) or the soft-label logistic loss of the true CTR against the true non-history logit plus the
prediction (--loss logistic, the CTR objective with the noise of the clicks taken out). On a fixed eval set it
reports the prediction's OLS slope on the true term (the truth: 1), its R^2, its mean error at m = 0 and at
m >= 32 (`M_HIGH`), and the excess expected CTR log loss over the Bayes predictor when the prediction replaces the
true term in the true logit (mean KL over mean Bayes log loss, the "expected (KL)" gap of gap_anatomy.py), with
the wall time. Two reference rows need no training: the truth, and the best length-blind predictor (the mean of
the true term within bins of m / L, what silu / n_keys attention sees of the count, fitted on the train examples).

    python3 benchmarks/history_pathway.py --steps 1500 --json history_pathway.json
    python3 benchmarks/history_pathway.py --steps 20 --eval-examples 1024 --variants as-is,silu-max  # smoke test
"""

from __future__ import annotations

import argparse
import json
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from mxlab.data.synthetic import (
    N_ACTIONS,
    SyntheticConfig,
    SyntheticSource,
    expit,
    history_matches,
    resolve_synthetic_table,
)
from mxlab.models.gem import (
    HistoryEncoder,
    Interaction,
    LayerNorm,
    ModelConfig,
    PooledAttention,
    TokenCrossAttention,
    Tower,
)

M_HIGH = 32.0  # the gap anatomy's highest m bins start here
BLIND_BINS = 64  # quantile bins of m / L for the length-blind reference


@dataclass(frozen=True)
class Variant:
    """One arm: the attention activation and its normalization, and which components are present."""

    activation: str = "silu"
    silu_divisor: str = "n_keys"  # "n_keys" (the library's) or "max_history" (a constant)
    qk_norm: bool = True
    final_norm: bool = True
    history_topic: bool = False
    length_token: bool = False


VARIANTS: dict[str, Variant] = {
    "as-is": Variant(),
    "softmax": Variant(activation="softmax"),
    "silu-max": Variant(silu_divisor="max_history"),
    "no-qk-norm": Variant(qk_norm=False),
    "no-final-norm": Variant(final_norm=False),
    "history-topic": Variant(history_topic=True),
    "length-token": Variant(length_token=True),
    "silu-max+history-topic": Variant(silu_divisor="max_history", history_topic=True),
    "softmax+length-token": Variant(activation="softmax", length_token=True),
}


class ConstantSiluScale(nn.Module):
    """Wraps a JaggedAttention computing silu(S) / n_keys so that the result is silu(S) / max_keys: its output,
    per query, times n_keys / max_keys (exact: the divisor is a factor of every weight of that query)."""

    def __init__(self, inner: nn.Module, max_keys: int) -> None:
        super().__init__()
        self.inner, self.max_keys = inner, max_keys

    def forward(self, q, k, v, q_offsets, k_offsets, *, causal: bool = False, activation: str = "softmax"):
        out = self.inner(q, k, v, q_offsets, k_offsets, causal=causal, activation=activation)
        if activation != "silu":
            return out
        n_keys = (k_offsets[1:] - k_offsets[:-1]).to(out.dtype)
        per_query = torch.repeat_interleave(n_keys, q_offsets[1:] - q_offsets[:-1], output_size=q.shape[0])
        return out * (per_query / self.max_keys)[:, None, None]


class HistoryPathway(nn.Module):
    """GEM's history pathway (module docstring) with one scalar output per example."""

    def __init__(self, config: ModelConfig, variant: Variant, n_items: int, n_topics: int) -> None:
        super().__init__()
        dim, self.n_topics, self.variant = config.dim, n_topics, variant
        self.items = nn.Embedding(n_items, dim)
        self.actions = nn.Embedding(N_ACTIONS, dim)
        self.topics = nn.Embedding(n_topics, dim)
        for table in (self.items, self.actions, self.topics):
            nn.init.normal_(table.weight, std=0.05)  # as mxlab.models.gem.Embeddings
        self.token_norm = LayerNorm(dim)
        self.history = HistoryEncoder(config)
        if not variant.final_norm:
            self.history.norm = nn.Identity()
        self.pma = PooledAttention(config)
        self.cross = TokenCrossAttention(config)
        self.length_proj = nn.Linear(1, dim) if variant.length_token else None
        n_tokens = 2
        self.interaction = Interaction(2 * n_tokens + config.pma_seeds + (1 if variant.length_token else 0), config)
        self.tower = Tower(config.interaction_dim, config.tower_dims, 0.0, 0.5)
        with torch.no_grad():
            self.tower.out.bias.zero_()
        if variant.silu_divisor == "max_history":
            for module in list(self.modules()):
                for name, child in list(module.named_children()):
                    if name == "core":
                        setattr(module, name, ConstantSiluScale(child, config.max_history))

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        offsets, items = batch["offsets"], batch["history_items"]
        tokens = self.token_norm(
            torch.stack([self.items(batch["ad_items"]), self.topics(batch["ad_topics"])], dim=1)
        )  # (B, 2, dim): the candidate and its topic, as GEMModel.tokens
        history = self.items(items) + self.actions(batch["history_actions"])
        if self.variant.history_topic:
            history = history + self.topics(items % self.n_topics)
        history = self.history(history, offsets)
        pooled = self.pma(history, offsets)
        crossed = self.cross(tokens, history, offsets)
        parts = [tokens, pooled, crossed]
        if self.length_proj is not None:
            lengths = (offsets[1:] - offsets[:-1]).to(tokens.dtype)
            parts.append(self.length_proj(torch.log1p(lengths)[:, None])[:, None, :])
        return self.tower(self.interaction(torch.cat(parts, dim=1)))


def make_source(max_history: int, data_seed: int) -> SyntheticSource:
    """The learnable preset's world (items, topics, users, rates) at `max_history`; its train/eval sizes are unused."""
    table = resolve_synthetic_table({"preset": "learnable", "data_seed": data_seed})
    return SyntheticSource(SyntheticConfig(**table), max_history)


def examples(source: SyntheticSource, rng: np.random.Generator, n: int) -> dict[str, Any]:
    """n examples from the source's generator: the history and ad as tensors, the true terms as float64 arrays."""
    f = source._features(rng, n)
    m, _ = history_matches(f.lengths, f.history_items % source.world.n_topics, f.history_actions, f.ad_topics)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(f.lengths, out=offsets[1:])
    non_history = source.ctr_bias + f.ctr_score - f.ctr_history_term
    return {
        "offsets": torch.from_numpy(offsets),
        "history_items": torch.from_numpy(f.history_items.astype(np.int64)),
        "history_actions": torch.from_numpy(f.history_actions.astype(np.int64)),
        "ad_items": torch.from_numpy(f.ad_items.astype(np.int64)),
        "ad_topics": torch.from_numpy(f.ad_topics.astype(np.int64)),
        "target": torch.from_numpy(f.ctr_history_term.astype(np.float32)),
        "non_history": torch.from_numpy(non_history.astype(np.float32)),
        "true_ctr": torch.from_numpy(expit(non_history + f.ctr_history_term).astype(np.float32)),
        "m": m,
        "lengths": f.lengths,
        "term": f.ctr_history_term,
        "non_history_np": non_history,
    }


def loss_of(prediction: torch.Tensor, batch: dict[str, Any], loss: str) -> torch.Tensor:
    if loss == "mse":
        return F.mse_loss(prediction, batch["target"])
    return F.binary_cross_entropy_with_logits(batch["non_history"] + prediction, batch["true_ctr"])


def bernoulli_kl(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    q = np.clip(q, 1e-12, 1 - 1e-12)
    p = np.clip(p, 1e-12, 1 - 1e-12)
    return p * np.log(p / q) + (1 - p) * np.log((1 - p) / (1 - q))


def scores(prediction: np.ndarray, data: dict[str, Any]) -> dict[str, float]:
    """Slope and R^2 of `prediction` on the true term, mean errors at m = 0 and m >= M_HIGH, and the CTR excess."""
    term, m = data["term"], data["m"]
    error = prediction - term
    slope = float(np.cov(prediction, term)[0, 1] / np.var(term, ddof=1))
    r2 = float(1.0 - np.mean(error**2) / np.var(term))
    p = expit(data["non_history_np"] + term)
    q = expit(data["non_history_np"] + prediction)
    bayes = -(p * np.log(np.clip(p, 1e-12, 1)) + (1 - p) * np.log(np.clip(1 - p, 1e-12, 1)))
    return {
        "slope": slope,
        "r2": r2,
        "mse": float(np.mean(error**2)),
        "error_m0": float(error[m == 0].mean()),
        "error_m_high": float(error[m >= M_HIGH].mean()) if np.any(m >= M_HIGH) else float("nan"),
        "ctr_excess": float(bernoulli_kl(p, q).mean() / bayes.mean()),
    }


def length_blind(train: list[dict[str, Any]], evaluation: dict[str, Any]) -> np.ndarray:
    """The mean true term within quantile bins of m / L (a bin of its own for L = 0), fitted on `train`."""
    m = np.concatenate([b["m"] for b in train])
    lengths = np.concatenate([b["lengths"] for b in train])
    term = np.concatenate([b["term"] for b in train])
    mean = np.where(lengths > 0, m / np.maximum(lengths, 1), -1.0)
    edges = np.unique(np.quantile(mean[lengths > 0], np.linspace(0, 1, BLIND_BINS + 1)[1:-1]))

    def bins(values: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        return np.where(lengths > 0, 1 + np.searchsorted(edges, values, side="right"), 0)

    train_bins = bins(mean, lengths)
    sums = np.bincount(train_bins, weights=term, minlength=len(edges) + 2)
    counts = np.bincount(train_bins, minlength=len(edges) + 2)
    table = sums / np.maximum(counts, 1)
    e_lengths = evaluation["lengths"]
    e_mean = np.where(e_lengths > 0, evaluation["m"] / np.maximum(e_lengths, 1), -1.0)
    return table[bins(e_mean, e_lengths)]


def predict(model: nn.Module, data: dict[str, Any], batch_size: int) -> np.ndarray:
    out = []
    n = data["ad_items"].shape[0]
    with torch.no_grad():
        for start in range(0, n, batch_size):
            out.append(model(slice_batch(data, start, min(n, start + batch_size))).double().numpy())
    return np.concatenate(out)


def slice_batch(data: dict[str, Any], start: int, stop: int) -> dict[str, torch.Tensor]:
    offsets = data["offsets"]
    begin, end = int(offsets[start]), int(offsets[stop])
    return {
        "offsets": offsets[start : stop + 1] - begin,
        "history_items": data["history_items"][begin:end],
        "history_actions": data["history_actions"][begin:end],
        **{key: data[key][start:stop] for key in ("ad_items", "ad_topics", "target", "non_history", "true_ctr")},
    }


def train_variant(
    name: str, variant: Variant, config: ModelConfig, source: SyntheticSource, train, evaluation, args
) -> dict[str, Any]:
    torch.manual_seed(args.seed)
    config = replace(config, activation=variant.activation, qk_norm=variant.qk_norm)
    model = HistoryPathway(config, variant, source.config.n_items, source.world.n_topics)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    warmup = max(1, args.steps // 20)
    started = time.perf_counter()
    losses: list[float] = []
    curve: list[dict[str, Any]] = []
    for step, batch in enumerate(train):
        for group in optimizer.param_groups:
            group["lr"] = args.lr * min(1.0, (step + 1) / warmup)
        loss = loss_of(model(batch), batch, args.loss)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(float(loss.detach()))
        if args.log_every and (step + 1) % args.log_every == 0 and step + 1 < len(train):
            model.eval()
            partial = scores(predict(model, evaluation, args.batch_size), evaluation)
            model.train()
            curve.append({"step": step + 1, **partial})
            print(
                f"  {name} step {step + 1}: slope {partial['slope']:.3f}, R^2 {partial['r2']:.3f}, "
                f"CTR excess {partial['ctr_excess']:.2%}",
                flush=True,
            )
    train_s = time.perf_counter() - started
    model.eval()
    result = scores(predict(model, evaluation, args.batch_size), evaluation)
    tail = max(1, len(losses) // 10)
    result.update(
        name=name,
        variant=asdict(variant),
        train_s=train_s,
        final_train_loss=float(np.mean(losses[-tail:])),
        curve=curve,
    )
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=1500, help="training steps of every variant (the budget)")
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--eval-examples", type=int, default=8192)
    parser.add_argument("--max-history", type=int, default=128, help="the model's max_history and the source's cap")
    parser.add_argument("--dim", type=int, default=32)
    parser.add_argument("--heads", type=int, default=2)
    parser.add_argument("--layers", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-3, help="AdamW rate after a linear warm-up of steps / 20")
    parser.add_argument("--loss", choices=("mse", "logistic"), default="mse")
    parser.add_argument("--seed", type=int, default=0, help="the initial weights' seed (the same for every variant)")
    parser.add_argument("--data-seed", type=int, default=0)
    parser.add_argument("--log-every", type=int, default=0, help="print eval scores every N steps (0: only at the end)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    names = [name for name in args.variants.split(",") if name]
    unknown = [name for name in names if name not in VARIANTS]
    if unknown:
        parser.error(f"unknown variants {unknown}; accepted: {', '.join(VARIANTS)}")
    torch.set_num_threads(args.threads)

    started = time.perf_counter()
    source = make_source(args.max_history, args.data_seed)
    rng = np.random.default_rng([args.data_seed, 7])
    train_data = [examples(source, rng, args.batch_size) for _ in range(args.steps)]
    train = [slice_batch(b, 0, args.batch_size) for b in train_data]
    evaluation = examples(source, np.random.default_rng([args.data_seed, 8]), args.eval_examples)
    generate_s = time.perf_counter() - started
    config = ModelConfig(
        dim=args.dim,
        heads=args.heads,
        layers=args.layers,
        max_history=args.max_history,
        pma_seeds=2,
        cross_layers=1,
        cross_rank=args.dim // 2,
        interaction_dim=2 * args.dim,
        tower_dims=(args.dim,),
    )
    lengths = evaluation["lengths"]
    print(
        f"learnable world (data_seed {args.data_seed}), max_history {args.max_history}: {args.steps} steps x "
        f"{args.batch_size} train examples, {args.eval_examples} eval (mean L {lengths.mean():.1f}, "
        f"{np.mean(lengths == args.max_history):.0%} at the cap, {np.mean(evaluation['m'] == 0):.0%} with m = 0); "
        f"generated in {generate_s:.0f} s"
    )
    print(
        f"ModelConfig dim {config.dim}, heads {config.heads}, layers {config.layers}, pma_seeds {config.pma_seeds}, "
        f"interaction_dim {config.interaction_dim}, tower {config.tower_dims}; AdamW lr {args.lr}, loss {args.loss}, "
        f"seed {args.seed}; {torch.get_num_threads()} thread(s)"
    )
    rows: list[dict[str, Any]] = [
        {"name": "truth", **scores(evaluation["term"], evaluation), "train_s": 0.0},
        {"name": "length-blind E[term | m/L]", **scores(length_blind(train_data, evaluation), evaluation)},
    ]
    rows[1]["train_s"] = 0.0
    columns = ("slope", "R^2", "MSE", "err m=0", "err m>=32", "CTR excess", "s")
    widths = (6, 6, 7, 8, 9, 10, 6)
    print(f"{'variant':<28} " + " ".join(f"{c:>{w}}" for c, w in zip(columns, widths, strict=True)))

    def show(row: dict[str, Any]) -> None:
        print(
            f"{row['name']:<28} {row['slope']:6.3f} {row['r2']:6.3f} {row['mse']:7.4f} {row['error_m0']:+8.3f} "
            f"{row['error_m_high']:+9.3f} {row['ctr_excess']:10.2%} {row['train_s']:6.0f}",
            flush=True,
        )

    for row in rows:
        show(row)
    for name in names:
        row = train_variant(name, VARIANTS[name], config, source, train, evaluation, args)
        rows.append(row)
        show(row)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump({"arguments": vars(args), "config": asdict(config), "rows": rows}, handle, indent=2)


if __name__ == "__main__":
    main()
