"""Models: the GEM-like CTR/CVR model (`build_model`) and its ESMM loss (`esmm_loss`).

`validate_model_config(model_config)` resolves and checks a [model] table without building
anything; `MODEL_CONFIG_KEYS` lists the accepted keys and `PRESETS` the sizes ("tiny", "h200").
"""

from __future__ import annotations

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
from mxlab.models.losses import esmm_loss

__all__ = [
    "DEFAULT_MAX_HISTORY",
    "GEMModel",
    "MODEL_CONFIG_KEYS",
    "ModelConfig",
    "ModelOutput",
    "PRESETS",
    "build_model",
    "esmm_loss",
    "validate_model_config",
]
