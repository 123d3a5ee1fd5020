"""A GEM-like CTR/CVR model over jagged user histories.

Architecture (qualified names in brackets; every GEMM is an ``nn.Linear`` or an attention
product inside a `JaggedAttention`, so a recipe can name it):

1. Embeddings (high precision, not GEMMs): one table per sparse field [``embeddings.fields``,
   offset per field], the history item table [``embeddings.items``], which the candidate field
   (when the source has one) shares so the candidate and its history live in one space, and
   the action types [``embeddings.actions``]. Dense features become one token
   [``dense_proj``]; with ``history_length_token`` the history length's bucket one more
   [``length_token.embedding``].
2. History encoder over the jagged histories [``history.blocks.{i}``]: pre-norm blocks of
   self-attention with QK-norm, optional rotary positions and optional causality, activation
   softmax or SiLU [``attn.qkv``, ``attn.core``, ``attn.out``], then an MLP [``mlp.fc1``,
   ``mlp.fc2``]; a final norm [``history.norm``].
3. Pooled multi-head attention [``pma``]: ``pma_seeds`` learned queries attend to the whole
   history (short queries, long keys) [``pma.attn.q``, ``pma.attn.kv``, ``pma.attn.core``,
   ``pma.attn.out``].
4. Cross-attention [``cross``]: the non-sequence tokens (candidate, other fields, dense) attend
   to the history [``cross.attn.q``, ``cross.attn.kv``, ``cross.attn.core``, ``cross.attn.out``].
5. Interaction [``interaction``]: the tokens, PMA outputs and cross-attention outputs are
   flattened and projected [``interaction.input``], then ``cross_layers`` DCNv2 low-rank cross
   layers ``x <- x0 * up(down(x)) + x`` [``interaction.layers.{i}.down``/``.up``].
6. Towers [``towers.ctr``, ``towers.cvr``]: MLPs [``fc{i}``] and a logit [``out``]. ESMM:
   ``p_ctcvr = p_ctr * p_cvr``; `esmm_loss` trains CTR on clicks and CTCVR on click-and-convert,
   over all impressions, in float32.

An empty history gives zero attention outputs; the other tokens still carry the example.

Precision: under autocast (train.precision "bf16") activations run in autocast's dtype from the
embedding lookups on, with no float32 copies in between: the residual streams, the norms
(`LayerNorm`, `RMSNorm` here: nn's parameters, one fused kernel, statistics in float32, output in
the input's dtype), the attention inputs and the interaction; only the two logits are float32.
Without autocast everything runs in the parameters' dtype. `mxlab.models.flops` counts the
model FLOPs of a batch.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from mxlab.data.batch import DataInfo, JaggedBatch
from mxlab.models.side_features import HistoryLengthToken, history_field_ids
from mxlab.nn.attention import ACTIVATIONS, JaggedAttention
from mxlab.nn.norms import LayerNorm, RMSNorm
from mxlab.nn.rotary import RotaryTable, rotary_embedding, rotary_table, segment_positions
from mxlab.tables import OMITTED_AT_DEFAULT, field_names, table_to_dataclass

PRESETS: dict[str, dict[str, Any]] = {
    "tiny": dict(
        dim=32,
        layers=1,
        heads=1,
        max_history=64,
        mlp_ratio=2,
        pma_seeds=2,
        cross_layers=1,
        cross_rank=16,
        interaction_dim=64,
        tower_dims=(32,),
    ),
    "h200": dict(
        dim=256,
        layers=3,
        heads=4,
        max_history=1024,
        mlp_ratio=4,
        pma_seeds=4,
        cross_layers=3,
        cross_rank=128,
        interaction_dim=1024,
        tower_dims=(512, 256),
    ),
}
DEFAULT_SIZE = "tiny"


@dataclass(frozen=True)
class ModelConfig:
    """The [model] table, resolved: ``size`` picks a preset, any other key overrides it.

    ``initial_ctr``/``initial_cvr`` set the initial bias of the two logits (a prior rate, so a
    short run starts calibrated). ``mlp_ratio`` is the hidden width of the history MLP over dim.
    ``history_item_fields`` names sparse fields whose value for each history item (the source's
    ``DataInfo.item_fields``, e.g. an item's topic) is added to that history token, from the same
    embedding rows as the candidate's field token. ``history_length_token`` adds a non-sequence token: the
    embedding of the history length's bucket (`mxlab.models.side_features`).
    """

    size: str = DEFAULT_SIZE
    dim: int = 32
    layers: int = 1
    heads: int = 1
    max_history: int = 64
    mlp_ratio: int = 2
    activation: str = "softmax"
    rotary: bool = True
    causal: bool = False
    qk_norm: bool = True
    pma_seeds: int = 2
    cross_layers: int = 1
    cross_rank: int = 16
    interaction_dim: int = 64
    tower_dims: tuple[int, ...] = (32,)
    dropout: float = 0.0
    initial_ctr: float = 0.04
    initial_cvr: float = 0.1
    history_item_fields: tuple[str, ...] = dataclasses.field(default=(), metadata=OMITTED_AT_DEFAULT)
    history_length_token: bool = dataclasses.field(default=False, metadata=OMITTED_AT_DEFAULT)

    def __post_init__(self) -> None:
        if self.size not in PRESETS:
            raise ValueError(f"unknown model size {self.size!r}; accepted: {', '.join(PRESETS)}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(f"unknown attention activation {self.activation!r}; accepted: {', '.join(ACTIVATIONS)}")
        positive = ("dim", "heads", "max_history", "mlp_ratio", "pma_seeds", "cross_rank", "interaction_dim")
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"[model] {name} must be >= 1; got {getattr(self, name)}")
        if self.layers < 0 or self.cross_layers < 0 or any(width < 1 for width in self.tower_dims):
            raise ValueError(
                "[model] layers and cross_layers must be >= 0 and tower_dims "
                f"positive; got {self.layers}, {self.cross_layers}, {self.tower_dims}"
            )
        if self.dim % self.heads:
            raise ValueError(f"[model] dim ({self.dim}) must be a multiple of heads ({self.heads})")
        if self.rotary and (self.dim // self.heads) % 2:
            raise ValueError(f"[model] rotary positions need an even head dim; dim / heads = {self.dim // self.heads}")
        if not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"[model] dropout must be in [0, 1); got {self.dropout}")
        for name in ("initial_ctr", "initial_cvr"):
            if not 0.0 < getattr(self, name) < 1.0:
                raise ValueError(f"[model] {name} must be in (0, 1); got {getattr(self, name)}")


MODEL_CONFIG_KEYS: tuple[str, ...] = field_names(ModelConfig)
DEFAULT_MAX_HISTORY = PRESETS[DEFAULT_SIZE]["max_history"]


def validate_model_config(model_config: dict) -> ModelConfig:
    """Return the resolved `ModelConfig` of a [model] table (the preset of `size`, then its keys).

    Refuses (ValueError) an unknown key (listing MODEL_CONFIG_KEYS), an unknown size, a value of
    the wrong type or out of range (e.g. dim not a multiple of heads).
    """
    if not isinstance(model_config, dict):
        raise ValueError(f"[model] must be a table (dict); got {type(model_config).__name__}")
    size = model_config.get("size", DEFAULT_SIZE)
    if size not in PRESETS:
        raise ValueError(f"unknown model size {size!r}; accepted: {', '.join(PRESETS)}")
    given = table_to_dataclass(ModelConfig, {**PRESETS[size], **model_config, "size": size}, "model")
    return given


class ModelOutput(NamedTuple):
    """The two logits, (B,) float32: p_ctr = sigmoid(ctr_logit), p_cvr = sigmoid(cvr_logit)."""

    ctr_logit: torch.Tensor
    cvr_logit: torch.Tensor


class FeedForward(nn.Module):
    """fc2(gelu(fc1(x)))."""

    def __init__(self, dim: int, hidden: int, dropout: float) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.fc2 = nn.Linear(hidden, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.dropout(F.gelu(self.fc1(x))))


def activation_dtype(device_type: str, default: torch.dtype) -> torch.dtype:
    """The dtype activations run in: autocast's dtype where autocast is on for `device_type`, else `default`."""
    return torch.get_autocast_dtype(device_type) if torch.is_autocast_enabled(device_type) else default


_QUERY_OFFSETS: dict[tuple[int, int, torch.device], torch.Tensor] = {}


def query_offsets(batch_size: int, per_example: int, device: torch.device) -> torch.Tensor:
    """Offsets (batch_size + 1,) int64 of `per_example` queries for every example, on `device`.

    One tensor per (batch_size, per_example, device), reused from call to call, so the attention
    kernel's offset check (a host read, cached on the tensor) runs once, not every step.
    """
    key = (batch_size, per_example, torch.device(device))
    offsets = _QUERY_OFFSETS.get(key)
    if offsets is None:
        with torch.inference_mode(False):
            offsets = torch.arange(batch_size + 1, device=device, dtype=torch.int64) * per_example
        if len(_QUERY_OFFSETS) >= 64:
            _QUERY_OFFSETS.clear()
        _QUERY_OFFSETS[key] = offsets
    return offsets


class SelfAttention(nn.Module):
    """Multi-head self-attention over packed jagged sequences with QK-norm and rotary positions."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim = config.heads, config.dim // config.heads
        self.causal, self.activation = config.causal, config.activation
        self.qkv = nn.Linear(config.dim, 3 * config.dim)
        self.q_norm = RMSNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.core = JaggedAttention()
        self.out = nn.Linear(config.dim, config.dim)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, rotary: RotaryTable | None) -> torch.Tensor:
        """`rotary`: the batch's RotaryTable (None when the model has no rotary positions)."""
        q, k, v = self.qkv(x).view(x.shape[0], 3, self.heads, self.head_dim).unbind(1)
        q, k = self.q_norm(q), self.k_norm(k)
        if rotary is not None:
            q, k = rotary_embedding(q, rotary), rotary_embedding(k, rotary)
        attended = self.core(q, k, v, offsets, offsets, causal=self.causal, activation=self.activation)
        return self.out(attended.reshape(x.shape[0], self.heads * self.head_dim))


class HistoryBlock(nn.Module):
    """Pre-norm block: x + attn(norm1(x)), then + mlp(norm2(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm1 = LayerNorm(config.dim)
        self.attn = SelfAttention(config)
        self.norm2 = LayerNorm(config.dim)
        self.mlp = FeedForward(config.dim, config.mlp_ratio * config.dim, config.dropout)

    def forward(self, x: torch.Tensor, offsets: torch.Tensor, rotary: RotaryTable | None) -> torch.Tensor:
        x = x + self.attn(self.norm1(x), offsets, rotary)
        return x + self.mlp(self.norm2(x))


class HistoryEncoder(nn.Module):
    """`layers` history blocks and a final norm over the packed history tokens."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(HistoryBlock(config) for _ in range(config.layers))
        self.norm = LayerNorm(config.dim)
        self.rotary_head_dim = config.dim // config.heads if config.rotary else 0

    def forward(self, x: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        rotary = None
        if self.rotary_head_dim:  # one table per batch, shared by every block
            rotary = rotary_table(segment_positions(offsets, total=x.shape[0]), self.rotary_head_dim)
        for block in self.blocks:
            x = block(x, offsets, rotary)
        return self.norm(x)


class CrossAttention(nn.Module):
    """Packed queries attend to the packed history of their own example: out(attn(q(x), kv(h)))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.heads, self.head_dim, self.activation = config.heads, config.dim // config.heads, config.activation
        self.q = nn.Linear(config.dim, config.dim)
        self.kv = nn.Linear(config.dim, 2 * config.dim)
        self.q_norm = RMSNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.k_norm = RMSNorm(self.head_dim) if config.qk_norm else nn.Identity()
        self.core = JaggedAttention()
        self.out = nn.Linear(config.dim, config.dim)

    def forward(
        self, queries: torch.Tensor, q_offsets: torch.Tensor, memory: torch.Tensor, k_offsets: torch.Tensor
    ) -> torch.Tensor:
        q = self.q_norm(self.q(queries).view(queries.shape[0], self.heads, self.head_dim))
        k, v = self.kv(memory).view(memory.shape[0], 2, self.heads, self.head_dim).unbind(1)
        attended = self.core(q, self.k_norm(k), v, q_offsets, k_offsets, activation=self.activation)
        return self.out(attended.reshape(queries.shape[0], self.heads * self.head_dim))


class PooledAttention(nn.Module):
    """PMA: `pma_seeds` learned queries per example attend to the history; (B, seeds, dim)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.seeds = nn.Parameter(torch.randn(config.pma_seeds, config.dim) * 0.02)
        self.attn = CrossAttention(config)

    def forward(self, memory: torch.Tensor, k_offsets: torch.Tensor) -> torch.Tensor:
        batch_size, n_seeds = k_offsets.numel() - 1, self.seeds.shape[0]
        queries = self.seeds.to(memory.dtype).repeat(batch_size, 1)
        q_offsets = query_offsets(batch_size, n_seeds, k_offsets.device)
        return (queries + self.attn(queries, q_offsets, memory, k_offsets)).view(batch_size, n_seeds, -1)


class TokenCrossAttention(nn.Module):
    """The non-sequence tokens (B, T, dim) attend to their example's history: x + attn(norm(x))."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.norm = LayerNorm(config.dim)
        self.attn = CrossAttention(config)

    def forward(self, tokens: torch.Tensor, memory: torch.Tensor, k_offsets: torch.Tensor) -> torch.Tensor:
        batch_size, n_tokens, dim = tokens.shape
        flat = tokens.reshape(batch_size * n_tokens, dim)
        q_offsets = query_offsets(batch_size, n_tokens, k_offsets.device)
        return (flat + self.attn(self.norm(flat), q_offsets, memory, k_offsets)).view(batch_size, n_tokens, dim)


class LowRankCross(nn.Module):
    """DCNv2 low-rank cross layer: x0 * up(down(x)) + x."""

    def __init__(self, width: int, rank: int) -> None:
        super().__init__()
        self.down = nn.Linear(width, rank, bias=False)
        self.up = nn.Linear(rank, width)

    def forward(self, x0: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        return x0 * self.up(self.down(x)) + x


class Interaction(nn.Module):
    """Flattened tokens -> input projection -> DCNv2 cross layers -> norm; (B, interaction_dim)."""

    def __init__(self, n_tokens: int, config: ModelConfig) -> None:
        super().__init__()
        self.input = nn.Linear(n_tokens * config.dim, config.interaction_dim)
        self.layers = nn.ModuleList(
            LowRankCross(config.interaction_dim, config.cross_rank) for _ in range(config.cross_layers)
        )
        self.norm = LayerNorm(config.interaction_dim)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x0 = self.input(tokens.flatten(1))
        x = x0
        for layer in self.layers:
            x = layer(x0, x)
        return self.norm(x)


class Tower(nn.Module):
    """MLP head: fc0, fc1, ... (GELU, dropout), then `out` (one logit)."""

    def __init__(self, width: int, hidden: tuple[int, ...], dropout: float, initial_rate: float) -> None:
        super().__init__()
        self.depth = len(hidden)
        for index, next_width in enumerate(hidden):
            self.add_module(f"fc{index}", nn.Linear(width, next_width))
            width = next_width
        self.dropout = nn.Dropout(dropout)
        self.out = nn.Linear(width, 1)
        with torch.no_grad():
            self.out.bias.fill_(math.log(initial_rate / (1.0 - initial_rate)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for index in range(self.depth):
            x = self.dropout(F.gelu(getattr(self, f"fc{index}")(x)))
        return self.out(x).squeeze(-1).float()


class Embeddings(nn.Module):
    """The embedding tables (high precision; lookups, not GEMMs): fields, items, actions."""

    def __init__(self, n_field_ids: int, n_items: int, n_actions: int, dim: int) -> None:
        super().__init__()
        self.fields = nn.Embedding(max(1, n_field_ids), dim)
        self.items = nn.Embedding(max(1, n_items), dim)
        self.actions = nn.Embedding(max(1, n_actions), dim)
        for table in (self.fields, self.items, self.actions):
            nn.init.normal_(table.weight, std=0.05)


def non_sequence_tokens(info: DataInfo, config: ModelConfig) -> int:
    """The tokens per example besides the history: one per sparse field, one for the dense features (if any),
    one for the history length (`history_length_token`)."""
    return len(info.field_cardinalities) + (1 if info.n_dense else 0) + (1 if config.history_length_token else 0)


class GEMModel(nn.Module):
    """The GEM-like model; `forward(batch: JaggedBatch) -> ModelOutput` (see the module docstring)."""

    def __init__(self, config: ModelConfig, info: DataInfo) -> None:
        super().__init__()
        self.config, self.info = config, info
        dim = config.dim
        cardinalities = list(info.field_cardinalities)
        self.candidate_field = info.candidate_field
        other_fields = [f for f in range(len(cardinalities)) if f != info.candidate_field]
        self.register_buffer("other_fields", torch.tensor(other_fields, dtype=torch.int64), persistent=False)
        offsets = [0]
        for field in other_fields[:-1]:
            offsets.append(offsets[-1] + cardinalities[field])
        self.register_buffer("field_offsets", torch.tensor(offsets, dtype=torch.int64), persistent=False)
        self.embeddings = Embeddings(sum(cardinalities[f] for f in other_fields), info.n_items, info.n_actions, dim)
        self.register_buffer(
            "history_field_ids",
            history_field_ids(config.history_item_fields, info, other_fields, offsets),
            persistent=False,
        )
        self.dense_proj = nn.Linear(info.n_dense, dim) if info.n_dense else None
        self.length_token = HistoryLengthToken(config.max_history, dim) if config.history_length_token else None
        n_tokens = non_sequence_tokens(info, config)
        if n_tokens == 0:
            raise ValueError("the data source has neither sparse fields nor dense features")
        self.token_norm = LayerNorm(dim)
        self.history = HistoryEncoder(config)
        self.pma = PooledAttention(config)
        self.cross = TokenCrossAttention(config)
        self.interaction = Interaction(2 * n_tokens + config.pma_seeds, config)
        self.towers = nn.ModuleDict(
            {
                "ctr": Tower(config.interaction_dim, config.tower_dims, config.dropout, config.initial_ctr),
                "cvr": Tower(config.interaction_dim, config.tower_dims, config.dropout, config.initial_cvr),
            }
        )

    def tokens(self, batch: JaggedBatch, dtype: torch.dtype) -> torch.Tensor:
        """Return the non-sequence tokens (B, T, dim) in `dtype`: candidate, other fields, dense, history length."""
        parts = []
        if self.candidate_field is not None:
            parts.append(self.embeddings.items(batch.sparse[:, self.candidate_field])[:, None, :])
        if self.other_fields.numel():
            ids = batch.sparse.index_select(1, self.other_fields) + self.field_offsets
            parts.append(self.embeddings.fields(ids))
        if self.dense_proj is not None:
            parts.append(self.dense_proj(batch.dense)[:, None, :])
        if self.length_token is not None:
            parts.append(self.length_token(batch.history_offsets)[:, None, :])
        return self.token_norm(torch.cat([part.to(dtype) for part in parts], dim=1))

    def forward(self, batch: JaggedBatch) -> ModelOutput:
        """Return the CTR and CVR logits of `batch`, (B,) float32 each."""
        # activations run in autocast's dtype from the embeddings on (residuals and norms included)
        dtype = activation_dtype(batch.history_items.device.type, self.embeddings.items.weight.dtype)
        tokens = self.tokens(batch, dtype)
        history = self.embeddings.items(batch.history_items) + self.embeddings.actions(batch.history_actions)
        if self.history_field_ids.shape[0]:  # the items' side features (history_item_fields)
            history = history + self.embeddings.fields(self.history_field_ids[:, batch.history_items]).sum(0)
        history = self.history(history.to(dtype), batch.history_offsets)
        pooled = self.pma(history, batch.history_offsets)
        crossed = self.cross(tokens, history, batch.history_offsets)
        dtype = crossed.dtype
        features = self.interaction(torch.cat([tokens.to(dtype), pooled.to(dtype), crossed], dim=1))
        return ModelOutput(self.towers["ctr"](features), self.towers["cvr"](features))


def build_model(model_config: dict, info: DataInfo) -> GEMModel:
    """Return a GEMModel for `info` built from a [model] table (see `validate_model_config`).

    Refuses what `validate_model_config` refuses.
    """
    config = validate_model_config(model_config) if not isinstance(model_config, ModelConfig) else model_config
    return GEMModel(config, info)


__all__ = [
    "DEFAULT_MAX_HISTORY",
    "GEMModel",
    "MODEL_CONFIG_KEYS",
    "ModelConfig",
    "ModelOutput",
    "PRESETS",
    "build_model",
    "non_sequence_tokens",
    "validate_model_config",
]
