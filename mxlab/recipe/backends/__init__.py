"""Recipe backends: a backend is a converter, one object with one method.

```python
class Converter(Protocol):
    name: str                                   # the policy's `backend` ("mxlab" when a policy has none)
    def convert(self, model, targets: list[Target], *, seed: int = 0) -> list[PlanEntry]: ...
```

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

    def convert(self, model: nn.Module, targets: list[Target], *, seed: int = 0) -> list[Any]:
        """Apply each target's policy in place; returns one PlanEntry per target."""
        ...


__all__ = ["Converter", "Target"]
