"""Each part of an estimate's peak named for what it is: autocast's cached weight copies apart
from activations, and optimizer state made in the first step as state, not temporaries."""

from __future__ import annotations

import torch

from memprofiler import estimate_memory

N = 1024 * 1024 + 1024  # Linear(1024, 1024): weight and bias


def _linear() -> torch.nn.Module:
    with torch.device("meta"):
        return torch.nn.Linear(1024, 1024)


def test_autocasts_weight_copy_is_its_own_part_not_activations():
    # GIVEN a Linear under bf16 autocast, whose forward peaks in the loss (a 16 MiB float32 repeat)
    est = estimate_memory(
        _linear(),
        torch.randn(8, 1024),
        optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
        precision="bf16-mixed",
        device="cpu",
        loss_fn=lambda m, b: m(b).float().repeat(1, 512).sum(),
    )
    assert est.peak_phase == "forward"
    # THEN the bf16 copies of the weight and bias autocast caches (2 B each) are their own part
    assert est.by_category["autocast_weight_cache"] == 2 * N == 2_099_200
    # AND the activations are the repeat's output (8 x 524,288 float32) and what forward keeps
    assert est.by_category["activations"] >= 8 * 1024 * 512 * 4
    assert any(
        "autocast's copies of the weights in bf16" in n and "FSDP2's mixed precision" in n for n in est.notes
    )


def test_adamw_state_made_in_step_one_is_state_at_a_peak_in_that_step():
    # GIVEN one AdamW step on a CUDA target (foreach: sqrt(exp_avg_sq) for every parameter at once)
    est = estimate_memory(
        _linear(), torch.randn(8, 1024), optimizer=lambda ps: torch.optim.AdamW(ps, lr=1e-4), steps=1
    )
    assert (est.peak_phase, est.peak_step) == ("optimizer", 1)
    # THEN at the peak the two moments (2 x 4 B a parameter) are optimizer state, and only the
    # foreach step's one parameter-sized set is a temporary (before: all three were temporaries)
    assert est.by_category["optimizer_state"] == 2 * 4 * N == 8_396_800
    assert est.by_category["optimizer_temporaries"] == 4 * N
