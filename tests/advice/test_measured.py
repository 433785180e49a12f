"""Applied to a real CPU training step, the top-ranked change lowers the measured peak (the
live-tensor census) by what ``advise`` predicted, within 5%."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from advice_models import EverySecondStep, Stack, adamw, meta_stack, square_mean, wrap_by_hand

from census import census_peak
from memprofiler import advise, estimate_memory

pytestmark = pytest.mark.slow  # real and estimated steps, a minute and more

BATCH = torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(0))


def _measured(model: torch.nn.Module, batch: Any, opt: Any, steps: int = 2) -> int:
    return census_peak(model, batch, opt(model.parameters()), square_mean, steps=steps)


def _real() -> torch.nn.Module:
    torch.manual_seed(0)
    return Stack(64, 4)


def _budget() -> int:
    base = estimate_memory(meta_stack(64, 4), BATCH, optimizer=adamw, loss_fn=square_mean, device="cpu")
    return int(base.peak_bytes * 0.85)


def _autocast_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    with torch.autocast("cpu", dtype=torch.bfloat16):
        return square_mean(model, batch)


def _after(best: Any) -> int:
    """The census of the real step with ``best``'s change made by hand."""
    name = best.names[0]
    if name == "bf16-mixed":
        model = _real()
        return census_peak(model, BATCH, adamw(model.parameters()), _autocast_loss)
    if name == "micro-batch":  # micro-batches of m, stepping every second one
        m = int(best.change.split("micro-batch ")[1].split(" ")[0])
        return _measured(_real(), BATCH[:m].clone(), lambda ps: EverySecondStep(ps, lr=1e-3), steps=4)
    raise AssertionError(f"no by-hand form for {name} in this test")


def test_the_top_ranked_change_saves_what_it_predicted_on_a_real_step():
    # GIVEN a CPU plan over budget, and the change advise ranks first
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        device="cpu",
        budget=_budget(),
        progress=False,
    )
    best = advice.best
    assert best is not None and len(best.names) == 1
    # WHEN that change is made to a real step
    before = _measured(_real(), BATCH, adamw)
    after = _after(best)
    # THEN the measured peak fell by the predicted saving
    assert best.saved_bytes > 0
    assert before - after == pytest.approx(best.saved_bytes, rel=0.05)


def test_checkpointing_the_fewest_blocks_saves_what_it_predicted_on_a_real_step():
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        device="cpu",
        budget=_budget(),
        candidates=["checkpoint-blocks", "checkpoint-full"],
        progress=False,
    )
    best = advice.best
    assert best is not None and best.names == ("checkpoint-blocks",), best
    n = int(best.change.split("first ")[1].split(" ")[0])
    before = _measured(_real(), BATCH, adamw)
    after = _measured(wrap_by_hand(_real(), "blocks", list(range(n))), BATCH, adamw)
    assert best.saved_bytes > 0
    assert before - after == pytest.approx(best.saved_bytes, rel=0.05)
