"""Recipe backends: a backend is a converter, one object with two methods.

```python
class Converter(Protocol):
    name: str                                   # the policy's `backend` ("mxlab" when a policy has none)
    def unavailable_reason(self, recipe, device=None) -> str | None: ...
    def convert(self, model, targets: list[Target], *, seed: int = 0) -> list[PlanEntry]: ...
```

`unavailable_reason` answers the capability question before any model is built: None when this
backend can run its share of `recipe` here (on `device` when given), else why not (a missing
library, no CUDA device, a GPU too old). mxlab.recipe.unavailable_reason asks every backend, so
callers (the experiment runner) never import a backend module.

`convert` gives each target module (in `model`, in place) the precision of its policy and returns
one `PlanEntry` per target, in the order given. It refuses, before it changes any module, whatever
it cannot do (a missing library, an unsupported shape). mxlab.recipe.apply_recipe resolves every
reachable module's policy and hands each converter the targets of its backend:

- `mxlab` (mxlab.recipe.backends.mxlab): mxlab's own emulation (QLinear, JaggedAttention policies);
- `te` (mxlab.recipe.backends.te): Transformer Engine's te.Linear under its FP8 / MXFP8 recipes.

This module holds the interface only, so that the backends and the recipe schema can import it
without importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

from torch import nn


@dataclass(frozen=True)
class Target:
    """One reachable module handed to a converter: its qualified name, the module, its kind
    (linear | attention), the policy it resolved to and the rule that chose it ('default' if none)."""

    name: str
    module: nn.Module
    kind: str
    policy: Any
    rule: str


class Converter(Protocol):
    """A recipe backend (see the module docstring)."""

    name: str

    def unavailable_reason(self, recipe: Any, device: Any = None) -> str | None:
        """None when this backend can run its policies of `recipe` here (on `device` when given); else the reason."""
        ...

    def convert(self, model: nn.Module, targets: list[Target], *, seed: int = 0) -> list[Any]:
        """Apply each target's policy in place; returns one PlanEntry per target."""
        ...


__all__ = ["Converter", "Target"]
