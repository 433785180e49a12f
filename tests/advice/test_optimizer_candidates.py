"""The lighter optimizers ``advise`` tries in place of Adam / AdamW: Adafactor, estimated, its
figure the estimate of the step with it by hand and its state the bytes its parameters' shapes
give; an 8-bit AdamW only where a library that has one is installed, else one note line."""

from __future__ import annotations

import importlib.machinery
import math
import sys
import types
from typing import Any

import pytest
import torch
from advice_models import Stack, adamw, meta_stack, square_mean

from memprofiler import advise, estimate_memory
from memprofiler.advice import candidates as cands
from memprofiler.advice.optimizers import reading_scalars

pytestmark = pytest.mark.slow  # a few estimates each

BATCH = torch.randn(8, 64, 64, generator=torch.Generator().manual_seed(0))


def _adafactor(ps: Any) -> torch.optim.Optimizer:
    return reading_scalars(torch.optim.Adafactor(ps, lr=1e-2))


def _figures(opt: Any, **kw: Any) -> tuple[int, int]:
    e = estimate_memory(meta_stack(64, 4), BATCH, optimizer=opt, loss_fn=square_mean, **kw)
    return e.peak_bytes, e.reserved_peak_bytes


def _factored_state_bytes(model: torch.nn.Module) -> int:
    """Adafactor's state by the parameters' shapes: a row and a column of fp32 second moments per
    matrix, a vector's full second moment, and one fp32 step count per parameter."""
    total = 0
    for p in model.parameters():
        if p.dim() >= 2:
            total += 4 * (p.shape[-2] + p.shape[-1]) * math.prod(p.shape[:-2])
        else:
            total += 4 * p.numel()
        total += 4  # step
    return total


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_adafactor_is_the_estimate_of_the_step_with_it_by_hand(device):
    # GIVEN an AdamW plan WHEN advised with the Adafactor candidate
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        device=device,
        candidates=["adafactor"],
        progress=False,
    )
    (row,) = advice.rows
    # THEN its figures are the estimate of the step with Adafactor made by hand
    assert (row.peak_bytes, row.reserved_bytes) == _figures(_adafactor, device=device, device_memory=2**30)
    assert row.patch == ["optimizer = torch.optim.Adafactor(params, lr=0.01)"]
    assert row.yaml[:2] == ["optimizer:", "  class_path: torch.optim.Adafactor"]
    assert row.saved_bytes > 0


def test_adafactor_s_state_is_what_the_parameters_shapes_give_on_a_real_step_too():
    # GIVEN the tensors' bytes (device="cpu"): the stateless SGD step, and Adafactor's
    sgd = _figures(lambda ps: torch.optim.SGD(ps, lr=0.1), device="cpu")[0]
    factored = _figures(_adafactor, device="cpu")[0]
    # THEN Adafactor adds its state, as the parameters' shapes give it
    state = _factored_state_bytes(meta_stack(64, 4))
    assert factored - sgd == state
    # AND a real CPU step of torch's Adafactor keeps exactly that state
    torch.manual_seed(0)
    model = Stack(64, 4)
    opt = torch.optim.Adafactor(model.parameters(), lr=1e-2)
    square_mean(model, BATCH).backward()
    opt.step()
    held = sum(t.numel() * t.element_size() for s in opt.state.values() for t in s.values())
    assert held == state


def test_not_for_an_optimizer_that_is_not_adam():
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9),
        loss_fn=square_mean,
        budget="1GiB",
        candidates=["adafactor", "8bit-optimizer"],
        progress=False,
    )
    assert advice.rows == []
    assert advice.skipped == {
        "adafactor": "replaces Adam or AdamW; the plan's optimizer is SGD",
        "8bit-optimizer": "replaces Adam or AdamW; the plan's optimizer is SGD",
    }


def test_without_torchao_or_bitsandbytes_8bit_is_one_note_line(monkeypatch):
    monkeypatch.setattr(cands, "EIGHT_BIT", (("no_such_8bit_lib", "no_such_8bit_lib.optim", "AdamW8bit"),))
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        candidates=["8bit-optimizer"],
        progress=False,
    )
    assert advice.rows == []
    assert advice.skipped["8bit-optimizer"].startswith("neither torchao nor bitsandbytes is installed")


class _EightBit(torch.optim.AdamW):
    """Stands for an installed library's 8-bit AdamW: the wiring, not its quantisation, is tested."""


def test_with_a_library_installed_its_8bit_adamw_is_estimated(monkeypatch):
    # GIVEN a library with an 8-bit AdamW importable
    lib, optim = types.ModuleType("eightbit_lib"), types.ModuleType("eightbit_lib.optim")
    lib.__spec__ = importlib.machinery.ModuleSpec("eightbit_lib", None)
    optim.AdamW8bit = _EightBit  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "eightbit_lib", lib)
    monkeypatch.setitem(sys.modules, "eightbit_lib.optim", optim)
    monkeypatch.setattr(cands, "EIGHT_BIT", (("eightbit_lib", "eightbit_lib.optim", "AdamW8bit"),))
    # WHEN advised
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        candidates=["8bit-optimizer"],
        progress=False,
    )
    # THEN the row is the estimate of the step with that class by hand, and its patch names it
    (row,) = advice.rows
    assert (row.peak_bytes, row.reserved_bytes) == _figures(
        lambda ps: _EightBit(ps, lr=1e-3), device_memory=2**30
    )
    assert row.patch == [f"optimizer = {__name__}._EightBit(params, lr=0.001)"]


def test_the_table_says_what_was_not_tried_and_why_in_one_line_each(monkeypatch):
    from memprofiler.advice.table import render

    monkeypatch.setattr(cands, "EIGHT_BIT", (("no_such_8bit_lib", "no_such_8bit_lib.optim", "AdamW8bit"),))
    advice = advise(
        meta_stack(64, 4),
        BATCH,
        optimizer=adamw,
        loss_fn=square_mean,
        budget="1GiB",
        candidates=["8bit-optimizer", "cpu-offload"],
        progress=False,
    )
    # in the order the candidates are listed
    notes = [line for line in render(advice).splitlines() if line.startswith("not tried:")]
    assert notes == [
        "not tried: cpu-offload: FSDP2's CPUOffloadPolicy pins host memory (aten._pin_memory), which fake "
        "tensors cannot do",
        "not tried: 8bit-optimizer: neither torchao nor bitsandbytes is installed (either has an 8-bit "
        "AdamW: pip install torchao)",
    ]


def test_each_candidate_left_out_says_its_own_reason():
    from memprofiler.advice.candidates import Context, candidates
    from memprofiler.advice.flops import ForwardFlops
    from memprofiler.advice.plan import Plan

    # GIVEN a single-device AdamW plan WHEN the candidates are listed
    plan = Plan(model=meta_stack(64, 4), batch=BATCH, optimizer=adamw, loss_fn=square_mean)
    _, skipped = candidates(Context.of(plan, ForwardFlops()))
    # THEN the sharding ones say they need more ranks, not something of the optimizer
    assert skipped["hsdp"] == "applies to a DDP plan over 16 or more ranks, a multiple of 8"
    for name in ("fsdp-mixed-precision", "reshard-after-forward", "larger-shard-group"):
        assert skipped[name] == "applies to an FSDP plan over 2 or more ranks"
    assert not any("optimizer is" in why for why in skipped.values())
