"""Every advised figure is a fresh ``estimate_memory`` of the step with the change applied by hand."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from advice_models import EverySecondStep, adamw, meta_stack, square_mean, wrap_by_hand

from memprofiler import advise, estimate_memory
from memprofiler.advice.checkpointing import selective_context

pytestmark = pytest.mark.slow  # about thirty estimates

BATCH = torch.randn(8, 128, 128, generator=torch.Generator().manual_seed(0))


def _est(model: Any = None, batch: Any = BATCH, **kw: Any) -> tuple[int, int]:
    kw.setdefault("optimizer", adamw)
    e = estimate_memory(model if model is not None else meta_stack(), batch, loss_fn=square_mean, **kw)
    return e.peak_bytes, e.reserved_peak_bytes


def _row(advice: Any, name: str) -> Any:
    return next(r for r in advice.rows if r.names == (name,))


@pytest.fixture(scope="module")
def advice() -> Any:
    # GIVEN a four-block model whose step does not fit a budget of 90% of its reserved peak
    _, reserved = _est()
    # WHEN every candidate is estimated
    return advise(
        meta_stack(), BATCH, optimizer=adamw, loss_fn=square_mean, budget=int(reserved * 0.9), progress=False
    )


def test_the_base_row_is_the_plain_estimate(advice):
    assert (advice.base.peak_bytes, advice.base.reserved_bytes) == _est(device_memory=advice.budget)
    assert not advice.base.fits


@pytest.mark.parametrize(
    ("name", "blocks", "kwargs"),
    [
        ("checkpoint-full", [0, 1, 2, 3], {}),
        ("checkpoint-every-2", [0, 2], {}),
        ("checkpoint-selective", [0, 1, 2, 3], {"context_fn": selective_context}),
    ],
)
def test_checkpointing_equals_the_wrapped_model_estimated(advice, name, blocks, kwargs):
    row = _row(advice, name)
    model = wrap_by_hand(meta_stack(), "blocks", blocks, **kwargs)
    assert (row.peak_bytes, row.reserved_bytes) == _est(model, device_memory=advice.budget)
    assert row.cost.recompute_flops > 0


def test_checkpoint_blocks_are_the_fewest_that_fit_and_each_is_estimated(advice):
    row = _row(advice, "checkpoint-blocks")
    n = int(row.change.split("first ")[1].split(" ")[0])
    assert (row.peak_bytes, row.reserved_bytes) == _est(
        wrap_by_hand(meta_stack(), "blocks", list(range(n))), device_memory=advice.budget
    )
    if row.fits and n > 1:  # one block fewer does not fit
        fewer = estimate_memory(
            wrap_by_hand(meta_stack(), "blocks", list(range(n - 1))),
            BATCH,
            optimizer=adamw,
            loss_fn=square_mean,
            device_memory=advice.budget,
        )
        assert not fewer.fits(advice.budget)


@pytest.mark.parametrize("precision", ["bf16-mixed", "bf16-true"])
def test_precision_equals_the_estimate_at_that_precision(advice, precision):
    row = _row(advice, precision)
    assert (row.peak_bytes, row.reserved_bytes) == _est(precision=precision, device_memory=advice.budget)


@pytest.mark.parametrize(
    ("name", "factory"),
    [
        ("fused-step", lambda ps: torch.optim.AdamW(ps, lr=1e-3, fused=True)),
        ("for-loop-step", lambda ps: torch.optim.AdamW(ps, lr=1e-3, foreach=False)),
        ("sgd-momentum", lambda ps: torch.optim.SGD(ps, lr=1e-3, momentum=0.9)),
    ],
)
def test_optimizer_changes_equal_the_estimate_with_that_optimizer(advice, name, factory):
    row = _row(advice, name)
    assert (row.peak_bytes, row.reserved_bytes) == _est(optimizer=factory, device_memory=advice.budget)


def test_micro_batch_with_accumulation_equals_accumulating_by_hand(advice):
    row = _row(advice, "micro-batch")
    m = int(row.change.split("micro-batch ")[1].split(" ")[0])
    k = 8 // m
    assert row.cost.effective_batch == 8
    micro = BATCH[:m].clone()
    # two micro-batches per optimizer step, over two optimizer steps
    by_hand = estimate_memory(
        meta_stack(),
        micro,
        optimizer=lambda ps: EverySecondStep(ps, lr=1e-3),
        loss_fn=square_mean,
        steps=4 if k > 1 else 2,
        device_memory=advice.budget,
    )
    assert (row.peak_bytes, row.reserved_bytes) == (by_hand.peak_bytes, by_hand.reserved_peak_bytes)


def test_set_to_none_against_a_loop_that_keeps_zeroed_gradients():
    # GIVEN a loop calling zero_grad(set_to_none=False)
    def keeping(ps: Any) -> torch.optim.Optimizer:
        opt = adamw(ps)
        opt.zero_grad = lambda set_to_none=False: torch.optim.AdamW.zero_grad(opt, set_to_none=False)  # type: ignore[method-assign]
        return opt

    advice = advise(
        meta_stack(),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        set_to_none=False,
        candidates=["set-to-none"],
        progress=False,
    )
    # THEN the base is the estimate of that loop, and the change is the plain estimate
    assert (advice.base.peak_bytes, advice.base.reserved_bytes) == _est(optimizer=keeping)
    row = _row(advice, "set-to-none")
    assert (row.peak_bytes, row.reserved_bytes) == _est()
    assert row.saved_bytes >= 0


def test_the_caller_s_model_is_not_changed(advice):
    model = meta_stack()
    before = copy.deepcopy([type(m).__name__ for m in model.modules()])
    advise(
        model,
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        candidates=["checkpoint-full"],
        progress=False,
    )
    assert [type(m).__name__ for m in model.modules()] == before


def test_the_answer_is_the_cheapest_fitting_row(advice):
    fitting = [r for r in advice.rows if r.fits]
    assert fitting, "some single change fits 90% of the base"
    assert advice.best is fitting[0]
    assert all(advice.best.cost.score <= r.cost.score for r in fitting)
    assert advice.best.patch
