"""Synthetic CTR/CVR data with known true probabilities (source = "synthetic").

Generative process (all draws from numpy generators keyed by ``data_seed``; docs/data.md has
the same text with the measured ceilings):

World (fixed by ``data_seed``):

- ``n_topics`` topics (K). Item ``i`` (ids ``0..n_items-1``) has topic ``i mod K`` and a bias
  ``item_bias_i ~ N(0, 0.3^2)``. Every topic has a CTR effect ``topic_ctr_t ~ N(0, 0.5^2)``
  and a CVR effect ``topic_cvr_t ~ N(0, 0.5^2)``.
- ``n_users`` users. User ``u`` has topic preferences ``theta_u ~ Dirichlet(0.2, ..., 0.2)``
  (a few favourite topics; kept as 256 equally likely slots at its quantiles, i.e. rounded to
  multiples of 1/256, so that a draw is one gather) and a segment ``s_u`` uniform in ``n_segments``, with effects
  ``segment_ctr_s ~ N(0, 0.4^2)``, ``segment_cvr_s ~ N(0, 0.4^2)``.

One example:

- user ``u`` uniform; history length ``L = min(floor(exp(mu + sigma Z)), max_history)``,
  ``Z ~ N(0, 1)``, ``mu = history_length_mu`` (default ``log(max_history / 4)``: a median of a
  quarter of the cap), ``sigma = history_length_sigma`` (default 1); ``L`` can be 0.
- each history item: topic ``~ theta_u``, item uniform among that topic's items; action type
  ``a`` in {0 view, 1 click, 2 purchase} with probabilities (0.70, 0.25, 0.05).
- the candidate ad: with probability 1/2 its topic is drawn from ``theta_u``, else uniformly;
  the ad is uniform among that topic's items. Position ``p`` uniform in 0..7; four dense
  features ``x ~ N(0, I)``.
- relevance of the history to the ad: ``m = sum_j w(a_j) [topic_j == topic_ad]`` with
  ``w = (0.5, 1, 2)`` for (view, click, purchase), and ``n = sum_j [a_j = purchase][topic_j ==
  topic_ad]``. Finding ``m`` needs attention from the candidate to the history items of its
  topic.
- ``logit CTR = b_ctr + segment_ctr_s + topic_ctr_t + item_bias_ad + (0.5, -0.4, 0.3, 0) . x
  - 0.12 p + history_weight * log(1 + m)``
- ``logit CVR = b_cvr + segment_cvr_s + topic_cvr_t + (0, 0, 0.2, 0.5) . x
  + history_weight * (0.5 log(1 + m) + log(1 + n))``
- ``true_ctr = sigmoid(logit CTR)``, ``true_cvr = sigmoid(logit CVR)`` (conversion given a
  click); ``click ~ Bernoulli(true_ctr)``, ``conversion = click * Bernoulli(true_cvr)``.
- ``b_ctr`` and ``b_cvr`` are solved once per world (on 4096 to 32768 calibration examples,
  about 8 million history items) so that
  ``E[true_ctr] = base_ctr`` and ``E[true_ctr true_cvr] / E[true_ctr] = base_cvr``.

Features given to the model: dense = x (4 columns); sparse fields = (ad id [item space],
ad topic, user segment, position); the history (item ids, action types); user ids for gAUC.
The true probabilities are functions of exactly these features, so they are the best any
model can do; `truth_reference` measures what they reach on the eval set.

Streaming: examples are generated in chunks of 4096, chunk ``c`` of the train set from the
key ``(data_seed, 1, c)`` and of the eval set from ``(data_seed, 2, c)``; the train set is the
same for every seed and epoch, and its order (chunk order, then the order inside each chunk)
comes from ``(data_seed, 4, seed, epoch)``. Nothing is held in memory beyond a few chunks: a
background thread generates up to two chunks ahead of training.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from mxlab.data.batch import DataInfo, DataSource, JaggedBatch, check_batch_arguments, prefetched, rebatch

CHUNK_EXAMPLES = 4096
TOPIC_SLOTS = 256
CALIBRATION_EXAMPLES = 32768  # at most; fewer for long histories (CALIBRATION_TOKENS)
CALIBRATION_TOKENS = 8_000_000
N_DENSE = 4
N_POSITIONS = 8
N_ACTIONS = 3
ACTION_PROBABILITIES = (0.70, 0.25, 0.05)
ACTION_WEIGHTS = (0.5, 1.0, 2.0)
PREFERRED_AD_PROBABILITY = 0.5
DIRICHLET_ALPHA = 0.2
ITEM_BIAS_STD = 0.3
TOPIC_EFFECT_STD = 0.5
SEGMENT_EFFECT_STD = 0.4
DENSE_CTR_WEIGHTS = (0.5, -0.4, 0.3, 0.0)
DENSE_CVR_WEIGHTS = (0.0, 0.0, 0.2, 0.5)
POSITION_SLOPE = -0.12
FIELD_NAMES = ("ad_id", "ad_topic", "user_segment", "position")

_TRAIN, _EVAL, _CALIBRATION, _ORDER = 1, 2, 3, 4


def history_matches(
    lengths: np.ndarray, history_topics: np.ndarray, history_actions: np.ndarray, ad_topics: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """(m, n) per example (module docstring): m = sum_j w(a_j) [topic_j == topic_ad] over its history, n = the
    purchases of the ad's topic in it; `lengths` per example, the history columns flat in example order."""
    count = lengths.size
    example = np.repeat(np.arange(count), lengths)
    matches = history_topics == ad_topics[example]
    weighted = np.bincount(
        example[matches], weights=np.asarray(ACTION_WEIGHTS)[history_actions[matches]], minlength=count
    )
    purchases = np.bincount(example[matches & (history_actions == 2)], minlength=count)
    return weighted, purchases


@dataclass(frozen=True)
class SyntheticConfig:
    """Knobs of the synthetic source (the [data] table with source = "synthetic")."""

    source: str = "synthetic"
    train_examples: int = 50_000
    eval_examples: int = 10_000
    n_users: int = 1_000
    n_items: int = 2_000
    n_topics: int = 16
    n_segments: int = 32
    base_ctr: float = 0.04
    base_cvr: float = 0.10
    history_length_mu: float | None = None
    history_length_sigma: float = 1.0
    history_weight: float = 1.0
    data_seed: int = 0

    def __post_init__(self) -> None:
        for name in ("train_examples", "eval_examples", "n_users", "n_segments"):
            if getattr(self, name) < 1:
                raise ValueError(f"synthetic {name} must be >= 1; got {getattr(self, name)}")
        if self.n_topics < 2 or self.n_items < self.n_topics:
            raise ValueError(
                "synthetic needs n_topics >= 2 and n_items >= n_topics; "
                f"got n_topics={self.n_topics}, n_items={self.n_items}"
            )
        for name in ("base_ctr", "base_cvr"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"synthetic {name} must be in (0, 1); got {getattr(self, name)}")
        if self.history_length_sigma < 0 or self.history_weight < 0 or self.data_seed < 0:
            raise ValueError(
                "synthetic history_length_sigma, history_weight and data_seed must be >= 0; "
                f"got {self.history_length_sigma}, {self.history_weight}, {self.data_seed}"
            )


# Named settings of the [data] table (`preset = "NAME"`); keys written in the table win over them.
SYNTHETIC_PRESETS: dict[str, dict[str, object]] = {
    # Base rates near production ads (CTR 1%, CVR 5% given a click), a heavier long tail of
    # history lengths (sigma 1.5: about 18% of histories reach the model's max_history), and as
    # many users as give each about 200 eval impressions (about 2 eval clicks per user, so that
    # most users have both classes and gAUC means something).
    "production-like": {
        "base_ctr": 0.01,
        "base_cvr": 0.05,
        "history_length_sigma": 1.5,
        "eval_impressions_per_user": 200,
    },
    # production-like rates and history tail in a world a model can learn within a budget: 2048 items
    # in 16 topics (128 per topic, against the 1250 of gem-mxfp8's 20000 items, so each item embedding
    # sees about ten times the examples), 4M training examples (about 40000 clicks), 400k eval
    # impressions (about 4000 clicks). Its oracles (mxlab.data.oracles; docs/data.md) bound what a model
    # reaches: Bayes NE 0.788 (CTR) and 0.690 (CTCVR), no-history oracle CTR AUC 0.745.
    # Measured (experiments/learnable-plateau.toml, gem-mxfp8's model size, BF16 from scratch at a constant 1e-3
    # after the defaults' warm-up, 2 seeds under MPS on one H100: 40 ms/step, 383 s per run; reports/README.md,
    # "learnable-plateau"): both seeds learn the history by step 1800, but the best held-out NE stays 11.9% (CTR)
    # and 22-22.5% (CTCVR) above the Bayes NE of the same 100k impressions in 9216 steps: NOT within 5%. Not the
    # data's limit: the true feature form fitted on the 4M train examples comes within 1% of it; fitted on only
    # the share softmax attention sees, 7% / 13% above (benchmarks/fitted_oracle.py). SiLU attention with a rate
    # decay (experiments/learnable-silu.toml, 6144 steps, 42 ms/step, 276 s per run) ends 11.8-11.9% / 21-22% above,
    # reached sooner; the models' response to the history is too flat (reports/README.md, "learnable-silu").
    "learnable": {
        "base_ctr": 0.01,
        "base_cvr": 0.05,
        "history_length_sigma": 1.5,
        "n_items": 2048,
        "n_topics": 16,
        "train_examples": 4_000_000,
        "eval_examples": 400_000,
        "eval_impressions_per_user": 200,
    },
}


def resolve_synthetic_table(table: dict) -> dict:
    """The [data] table with its `preset` expanded and `eval_impressions_per_user` turned into n_users.

    Keys written in the table win over the preset's. Refuses (ValueError) an unknown preset
    (naming the accepted ones), an `eval_impressions_per_user` that is not a positive integer,
    and a table that sets both n_users and eval_impressions_per_user.
    """
    resolved = dict(table)
    preset = resolved.pop("preset", None)
    if preset is not None:
        if preset not in SYNTHETIC_PRESETS:
            raise ValueError(f"unknown synthetic preset {preset!r}; accepted: {', '.join(SYNTHETIC_PRESETS)}")
        if "n_users" in resolved and "eval_impressions_per_user" not in resolved:
            resolved = {
                **{k: v for k, v in SYNTHETIC_PRESETS[preset].items() if k != "eval_impressions_per_user"},
                **resolved,
            }
        else:
            resolved = {**SYNTHETIC_PRESETS[preset], **resolved}
    per_user = resolved.pop("eval_impressions_per_user", None)
    if per_user is not None:
        if not isinstance(per_user, int) or isinstance(per_user, bool) or per_user < 1:
            raise ValueError(f"synthetic eval_impressions_per_user must be a positive integer; got {per_user!r}")
        if "n_users" in resolved:
            raise ValueError(
                "synthetic: set n_users or eval_impressions_per_user, not both; "
                f"got n_users={resolved['n_users']!r}, eval_impressions_per_user={per_user}"
            )
        eval_examples = resolved.get("eval_examples", SyntheticConfig.eval_examples)
        if not isinstance(eval_examples, int) or isinstance(eval_examples, bool):
            raise ValueError(f"synthetic eval_examples must be an integer; got {eval_examples!r}")
        resolved["n_users"] = max(1, eval_examples // per_user)
    return resolved


@dataclass
class _Features:
    users: np.ndarray
    lengths: np.ndarray
    history_items: np.ndarray
    history_actions: np.ndarray
    ad_items: np.ndarray
    ad_topics: np.ndarray
    positions: np.ndarray
    dense: np.ndarray
    ctr_score: np.ndarray  # logit CTR without b_ctr
    ctr_history_term: np.ndarray
    cvr_score: np.ndarray  # logit CVR without b_cvr


def expit(x: np.ndarray) -> np.ndarray:
    """Return the logistic sigmoid of x (float64), stable for large |x|."""
    return 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x, dtype=np.float64)))


def _solve_increasing(function, low: float, high: float, iterations: int = 80) -> float:
    """Return the root of an increasing function on [low, high] by bisection."""
    for _ in range(iterations):
        middle = 0.5 * (low + high)
        if function(middle) < 0.0:
            low = middle
        else:
            high = middle
    return 0.5 * (low + high)


class _World:
    """Item topics and biases, user preferences and segments, fixed by data_seed."""

    def __init__(self, config: SyntheticConfig) -> None:
        rng = np.random.default_rng([config.data_seed, 0])
        k = config.n_topics
        self.n_topics = k
        self.n_items = config.n_items
        self.items_per_topic = (config.n_items - 1 - np.arange(k)) // k + 1
        self.item_bias = rng.normal(0.0, ITEM_BIAS_STD, config.n_items)
        self.topic_ctr = rng.normal(0.0, TOPIC_EFFECT_STD, k)
        self.topic_cvr = rng.normal(0.0, TOPIC_EFFECT_STD, k)
        theta = rng.dirichlet(np.full(k, DIRICHLET_ALPHA), size=config.n_users)
        # theta_u as TOPIC_SLOTS equally likely slots holding its quantiles: drawing a topic is
        # then one gather (the preferences are rounded to multiples of 1 / TOPIC_SLOTS).
        quantiles = (np.arange(TOPIC_SLOTS) + 0.5) / TOPIC_SLOTS
        shifted_cdf = (np.arange(config.n_users)[:, None] + np.cumsum(theta, axis=1)).ravel()
        queries = (np.arange(config.n_users)[:, None] + quantiles[None, :]).ravel()
        slots = np.searchsorted(shifted_cdf, queries, side="right") - np.repeat(
            np.arange(config.n_users) * k, TOPIC_SLOTS
        )
        self.topic_slots = np.clip(slots, 0, k - 1).astype(np.int16)
        self.segment = rng.integers(0, config.n_segments, config.n_users)
        self.segment_ctr = rng.normal(0.0, SEGMENT_EFFECT_STD, config.n_segments)
        self.segment_cvr = rng.normal(0.0, SEGMENT_EFFECT_STD, config.n_segments)

    def preferred_topics(self, rng: np.random.Generator, users: np.ndarray) -> np.ndarray:
        slot = rng.integers(0, TOPIC_SLOTS, users.shape[0])
        return self.topic_slots[users * TOPIC_SLOTS + slot].astype(np.int64)

    def topic_of(self, items: np.ndarray) -> np.ndarray:
        """Each item id's topic (item i has topic i mod K)."""
        return items % self.n_topics

    def item_of_topic(self, rng: np.random.Generator, topics: np.ndarray) -> np.ndarray:
        within = np.floor(rng.random(topics.shape[0]) * self.items_per_topic[topics]).astype(np.int64)
        return topics + self.n_topics * within


class SyntheticSource(DataSource):
    """Streamed synthetic examples with known true CTR and CVR (module docstring has the process)."""

    config_class = SyntheticConfig
    table_only_keys = ("preset", "eval_impressions_per_user")
    knows_truth = True

    @classmethod
    def resolve_table(cls, table: dict) -> dict:
        """The [data] table with its preset expanded (`resolve_synthetic_table`)."""
        return resolve_synthetic_table(table)

    def __init__(self, config: SyntheticConfig, max_history: int) -> None:
        if max_history < 1:
            raise ValueError(f"max_history must be >= 1; got {max_history}")
        self.config = config
        self.max_history = int(max_history)
        mu = config.history_length_mu  # default: a median length of a quarter of max_history
        self.history_length_mu = mu if mu is not None else (math.log(max_history / 4.0) if max_history >= 4 else 0.0)
        self.world = _World(config)
        self.n_train = config.train_examples
        self.n_eval = config.eval_examples
        self.info = DataInfo(
            n_dense=N_DENSE,
            field_cardinalities=(config.n_items, config.n_topics, config.n_segments, N_POSITIONS),
            n_items=config.n_items,
            n_actions=N_ACTIONS,
            has_truth=True,
            name="synthetic",
            candidate_field=0,
            field_names=FIELD_NAMES,
            base_rates=(config.base_ctr, config.base_cvr),
            item_fields=(("ad_topic", tuple(self.world.topic_of(np.arange(config.n_items)).tolist())),),
        )
        self.ctr_bias, self.cvr_bias = self._calibrate()

    # -- generation -------------------------------------------------------------------------

    def _features(self, rng: np.random.Generator, n: int) -> _Features:
        world, config = self.world, self.config
        users = rng.integers(0, config.n_users, n)
        raw_lengths = np.floor(np.exp(self.history_length_mu + config.history_length_sigma * rng.standard_normal(n)))
        lengths = np.minimum(raw_lengths, self.max_history).astype(np.int64)
        token_users = np.repeat(users, lengths)
        history_topics = world.preferred_topics(rng, token_users)
        history_items = world.item_of_topic(rng, history_topics)
        action_cdf = np.cumsum(ACTION_PROBABILITIES)[:-1]
        history_actions = np.searchsorted(action_cdf, rng.random(token_users.shape[0]), side="right")
        preferred = rng.random(n) < PREFERRED_AD_PROBABILITY
        ad_topics = np.where(preferred, world.preferred_topics(rng, users), rng.integers(0, world.n_topics, n))
        ad_items = world.item_of_topic(rng, ad_topics)
        positions = rng.integers(0, N_POSITIONS, n)
        dense = rng.standard_normal((n, N_DENSE))

        weighted_matches, purchase_matches = history_matches(lengths, history_topics, history_actions, ad_topics)
        segments = world.segment[users]
        history_term = config.history_weight * np.log1p(weighted_matches)
        ctr_score = (
            world.segment_ctr[segments]
            + world.topic_ctr[ad_topics]
            + world.item_bias[ad_items]
            + dense @ np.asarray(DENSE_CTR_WEIGHTS)
            + POSITION_SLOPE * positions
            + history_term
        )
        cvr_score = (
            world.segment_cvr[segments]
            + world.topic_cvr[ad_topics]
            + dense @ np.asarray(DENSE_CVR_WEIGHTS)
            + config.history_weight * (0.5 * np.log1p(weighted_matches) + np.log1p(purchase_matches))
        )
        return _Features(
            users,
            lengths,
            history_items,
            history_actions,
            ad_items,
            ad_topics,
            positions,
            dense,
            ctr_score,
            history_term,
            cvr_score,
        )

    def _calibrate(self) -> tuple[float, float]:
        mean_length = (
            min(math.exp(self.history_length_mu + self.config.history_length_sigma**2 / 2), self.max_history) + 1.0
        )
        n = int(min(CALIBRATION_EXAMPLES, max(4096, CALIBRATION_TOKENS / mean_length)))
        features = self._features(np.random.default_rng([self.config.data_seed, _CALIBRATION]), n)
        base_ctr, base_cvr = self.config.base_ctr, self.config.base_cvr
        ctr_bias = _solve_increasing(lambda b: expit(b + features.ctr_score).mean() - base_ctr, -60.0, 60.0)
        ctr = expit(ctr_bias + features.ctr_score)
        cvr_bias = _solve_increasing(
            lambda b: (ctr * expit(b + features.cvr_score)).sum() / ctr.sum() - base_cvr, -60.0, 60.0
        )
        return float(ctr_bias), float(cvr_bias)

    def _chunk(self, split: int, index: int, n: int) -> tuple[JaggedBatch, np.ndarray]:
        rng = np.random.default_rng([self.config.data_seed, split, index])
        features = self._features(rng, n)
        true_ctr = expit(self.ctr_bias + features.ctr_score)
        true_cvr = expit(self.cvr_bias + features.cvr_score)
        click = rng.random(n) < true_ctr
        conversion = click & (rng.random(n) < true_cvr)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(features.lengths, out=offsets[1:])
        sparse = np.stack(
            [features.ad_items, features.ad_topics, self.world.segment[features.users], features.positions], axis=1
        )
        batch = JaggedBatch(
            dense=torch.from_numpy(features.dense.astype(np.float32)),
            sparse=torch.from_numpy(sparse.astype(np.int64)),
            history_items=torch.from_numpy(features.history_items.astype(np.int64)),
            history_actions=torch.from_numpy(features.history_actions.astype(np.int64)),
            history_offsets=torch.from_numpy(offsets),
            click=torch.from_numpy(click.astype(np.float32)),
            conversion=torch.from_numpy(conversion.astype(np.float32)),
            user_id=torch.from_numpy(features.users.astype(np.int64)),
            true_ctr=torch.from_numpy(true_ctr.astype(np.float32)),
            true_cvr=torch.from_numpy(true_cvr.astype(np.float32)),
        )
        return batch, features.ctr_history_term

    def _chunk_sizes(self, n: int) -> list[int]:
        return [min(CHUNK_EXAMPLES, n - start) for start in range(0, n, CHUNK_EXAMPLES)]

    # -- the DataSource interface ---------------------------------------------------------------

    def train_batches(self, batch_size: int, seed: int, epoch: int) -> Iterator[JaggedBatch]:
        """Yield the n_train training examples in the order fixed by (data_seed, seed, epoch).

        Refuses a non-positive batch size or a negative seed/epoch.
        """
        check_batch_arguments(batch_size, seed, epoch)
        sizes = self._chunk_sizes(self.n_train)
        order_rng = np.random.default_rng([self.config.data_seed, _ORDER, seed, epoch])
        chunk_order = order_rng.permutation(len(sizes))

        def chunks() -> Iterator[JaggedBatch]:
            for chunk_index in chunk_order:
                chunk, _ = self._chunk(_TRAIN, int(chunk_index), sizes[chunk_index])
                yield chunk.take(torch.from_numpy(order_rng.permutation(chunk.batch_size)))

        return rebatch(prefetched(chunks()), batch_size)

    def eval_batches(self, batch_size: int) -> Iterator[JaggedBatch]:
        """Yield the n_eval evaluation examples, always the same ones in the same order."""
        check_batch_arguments(batch_size)
        return rebatch(prefetched(self._eval_chunks()), batch_size)

    def _eval_chunks(self, with_history_term: bool = False) -> Iterator:
        for index, size in enumerate(self._chunk_sizes(self.n_eval)):
            chunk, history_term = self._chunk(_EVAL, index, size)
            yield (chunk, history_term) if with_history_term else chunk

    def truth_reference(self) -> dict[str, float]:
        """Return the metrics the true probabilities reach on the eval set (see `truth_reference`)."""
        clicks, conversions, ctrs, cvrs, logits_without_history = [], [], [], [], []
        for chunk, history_term in self._eval_chunks(with_history_term=True):
            clicks.append(chunk.click.numpy())
            conversions.append(chunk.conversion.numpy())
            ctrs.append(chunk.true_ctr.numpy().astype(np.float64))
            cvrs.append(chunk.true_cvr.numpy().astype(np.float64))
            ctr = ctrs[-1]
            logits_without_history.append(np.log(ctr) - np.log1p(-ctr) - history_term)
        click, conversion = np.concatenate(clicks), np.concatenate(conversions)
        ctr, cvr = np.concatenate(ctrs), np.concatenate(cvrs)
        result = probability_metrics(click, conversion, ctr, cvr)
        result["ctr_auc_without_history_term"] = rank_auc(click, np.concatenate(logits_without_history))
        result["true_mean_ctr"] = float(ctr.mean())
        result["true_mean_cvr_given_click"] = float((ctr * cvr).sum() / ctr.sum())
        return result


def rank_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """Return the ROC AUC of `scores` for binary `labels` (ties count one half); NaN with one class."""
    labels = np.asarray(labels) > 0.5
    positives = int(labels.sum())
    negatives = labels.size - positives
    if positives == 0 or negatives == 0:
        return float("nan")
    from scipy.stats import rankdata

    ranks = rankdata(scores)
    return float((ranks[labels].sum() - positives * (positives + 1) / 2.0) / (positives * negatives))


def log_loss(labels: np.ndarray, probabilities: np.ndarray) -> float:
    """Return the mean binary cross-entropy (natural log) of `probabilities` (clipped to [1e-7, 1-1e-7])."""
    p = np.clip(np.asarray(probabilities, dtype=np.float64), 1e-7, 1 - 1e-7)
    y = np.asarray(labels, dtype=np.float64)
    return float(-(y * np.log(p) + (1.0 - y) * np.log1p(-p)).mean())


def probability_metrics(
    click: np.ndarray, conversion: np.ndarray, p_ctr: np.ndarray, p_cvr: np.ndarray
) -> dict[str, float]:
    """Return AUC, log loss and NE (log loss / entropy of the label rate) for CTR, CVR (clicked
    examples) and CTCVR, plus the observed label rates."""
    result: dict[str, float] = {}
    click, conversion = np.asarray(click, dtype=np.float64), np.asarray(conversion, dtype=np.float64)
    p_ctr, p_cvr = np.asarray(p_ctr, dtype=np.float64), np.asarray(p_cvr, dtype=np.float64)
    clicked = click > 0.5
    tasks = {
        "ctr": (click, p_ctr),
        "cvr": (conversion[clicked], p_cvr[clicked]),
        "ctcvr": (click * conversion, p_ctr * p_cvr),
    }
    for task, (labels, probabilities) in tasks.items():
        rate = float(np.mean(labels)) if labels.size else float("nan")
        loss = log_loss(labels, probabilities) if labels.size else float("nan")
        entropy = log_loss(labels, np.full(labels.shape, rate)) if labels.size else float("nan")
        result[f"{task}_auc"] = rank_auc(labels, probabilities)
        result[f"{task}_log_loss"] = loss
        result[f"{task}_ne"] = loss / entropy if entropy > 0 else float("nan")
        result[f"{task}_label_rate"] = rate
    result["n_examples"] = float(click.size)
    return result
