"""``Part``: one piece of a device model, entered around the steps and read after them."""

from __future__ import annotations

import contextlib
from typing import Any


class Part:
    """A piece of the model of what the device does beyond the ops' outputs.

    The engine enters every part's :meth:`mode` around the steps, in order (a dispatch mode
    entered later sees each op first), then asks each for its notes and stated margins.
    """

    def mode(self) -> contextlib.AbstractContextManager[Any]:
        """What runs around the steps (a dispatch mode); nothing by default."""
        return contextlib.nullcontext()

    def notes(self, notes: list[str]) -> list[str]:
        """``notes`` with this part's lines (it may replace a line it makes more precise)."""
        return notes

    def margins(self) -> list[tuple[str, int]]:
        """Allowances for what this part could not model: (reason, bytes)."""
        return []
