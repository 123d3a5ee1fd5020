"""Models: the GEM-like CTR/CVR model (`build_model`) and its ESMM loss (`esmm_loss`); plug-in builders by name
or import path (`MODEL_BUILDERS`, `build`), the heads a model returns (`head_logits`) and the loss of the
declared tasks (`loss_for`); the contracts are mxlab.models.protocols.

`validate_model_config(model_config)` resolves and checks a [model] table without building
anything; `MODEL_CONFIG_KEYS` lists the accepted keys and `PRESETS` the sizes ("tiny", "h200").
"""

from __future__ import annotations

from typing import Any

import torch

from mxlab.data.batch import DataInfo
from mxlab.models.gem import (
    DEFAULT_MAX_HISTORY,
    MODEL_CONFIG_KEYS,
    PRESETS,
    GEMModel,
    ModelConfig,
    ModelOutput,
    build_model,
    validate_model_config,
)
from mxlab.models.heads import check_outputs, head_label, head_logits
from mxlab.models.losses import esmm_loss, independent_loss
from mxlab.models.plugins import (
    DEFAULT_BUILDER,
    MODEL_BUILDERS,
    build,
    builder_name,
    loss_components,
    loss_for,
    validate_model_table,
)
from mxlab.tasks import ESMM_HEADS


def build_gem(info: DataInfo, outputs: tuple[str, ...], /, **keywords: Any) -> torch.nn.Module:
    """The GEM-like ESMM model from its [model] keys (`build_model`, looked up here when called); refuses output
    heads other than ctr, cvr, naming them."""
    if tuple(outputs) != ESMM_HEADS:
        raise ValueError(f"model builder 'gem' has the heads {list(ESMM_HEADS)}; the [tasks] declare {list(outputs)}")
    return build_model(dict(keywords), info)


__all__ = [
    "DEFAULT_BUILDER",
    "DEFAULT_MAX_HISTORY",
    "MODEL_BUILDERS",
    "build",
    "build_gem",
    "builder_name",
    "check_outputs",
    "head_label",
    "head_logits",
    "independent_loss",
    "loss_components",
    "loss_for",
    "validate_model_table",
    "GEMModel",
    "MODEL_CONFIG_KEYS",
    "ModelConfig",
    "ModelOutput",
    "PRESETS",
    "build_model",
    "esmm_loss",
    "validate_model_config",
]
