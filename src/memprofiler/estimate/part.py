"""``Part``: one piece of a device model, entered around the steps and read after them."""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memprofiler.estimate.cuda.ops import OpHook


class Part:
    """A piece of the model of what the device does beyond the ops' outputs.

    The engine enters one dispatch mode that runs every part's :meth:`hook` around each op (in
    the parts' order: the first sees the op's outputs first), then every part's :meth:`mode`, in
    order (a dispatch mode entered later sees each op first), and after the steps asks each for
    its notes and stated margins.
    """

    def hook(self) -> OpHook | None:
        """What looks at each op (:class:`~memprofiler.estimate.cuda.ops.OpHook`); none by default."""
        return None

    def mode(self) -> contextlib.AbstractContextManager[Any]:
        """What runs around the steps (a dispatch mode); nothing by default."""
        return contextlib.nullcontext()

    def notes(self, notes: list[str]) -> list[str]:
        """``notes`` with this part's lines (it may replace a line it makes more precise)."""
        return notes

    def margins(self) -> list[tuple[str, int]]:
        """Allowances for what this part could not model: (reason, bytes)."""
        return []
