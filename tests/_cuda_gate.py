"""The one CUDA gate of the suite: tests marked ``cuda`` skip, with a reason, where no GPU is.

Keyed on the marker alone. ``item.keywords`` also holds every node name and parametrize id, so
gating on ``"cuda" in item.keywords`` skipped a test whose id is ``cuda`` (a device
parametrization) silently on CPU machines; ``tests/test_cuda_gate.py`` holds it to that.
"""

from __future__ import annotations

from collections.abc import Iterable

import pytest

REASON = "needs a CUDA device (`cuda` marker: run `pytest -m cuda` on a GPU machine)"


def skip_cuda_tests(items: Iterable[pytest.Item], cuda_available: bool) -> None:
    """Mark every item carrying the ``cuda`` marker to skip with :data:`REASON`, unless a GPU is there."""
    if cuda_available:
        return
    skip = pytest.mark.skip(reason=REASON)
    for item in items:
        if item.get_closest_marker("cuda") is not None:
            item.add_marker(skip)
