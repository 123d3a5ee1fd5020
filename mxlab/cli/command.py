"""How every mxlab command shows its help: the usage line as `mxlab run [OPTIONS] SPEC`.

typer writes a required argument as `{SPEC}` in the usage line; `Command` writes it plainly.
With the app's plain help (rich_markup_mode=None), boolean flags show as plain flags, not `<bool>`.
"""

from __future__ import annotations

from typing import Any

from typer.core import TyperCommand


class Command(TyperCommand):
    """A typer command whose usage line names required arguments without braces."""

    def collect_usage_pieces(self, ctx: Any) -> list[str]:
        """The usage pieces, `{SPEC}` written as `SPEC`."""
        return [
            piece[1:-1] if piece.startswith("{") and piece.endswith("}") else piece
            for piece in super().collect_usage_pieces(ctx)
        ]
