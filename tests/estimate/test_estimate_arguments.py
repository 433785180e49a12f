"""The estimate's arguments: a bool is no count, although Python takes it for an int."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate.api import estimate_memory
from memprofiler.estimate.parallel.strategies import check


@pytest.mark.parametrize(
    ("key", "kwargs"), [("world_size", {"world_size": True}), ("steps", {"steps": True})]
)
def test_a_bool_count_is_refused_in_one_line(key, kwargs):
    args = {"strategy": "ddp", "world_size": 2, "precision": "32-true", "steps": 2, **kwargs}
    with pytest.raises(ConfigError, match=rf"^`{key}`: got True; use an integer >= 1"):
        check(**args)


def test_estimate_memory_refuses_world_size_true_before_running():
    model = nn.Linear(4, 4)
    with pytest.raises(ConfigError, match=r"`world_size`: got True"):
        estimate_memory(
            model,
            torch.randn(2, 4),
            optimizer=lambda p: torch.optim.SGD(p, lr=0.1),
            world_size=True,  # type: ignore[arg-type]
            strategy="ddp",
            device="cpu",
        )
