"""The search: sets of changes are estimated together, never judged by adding single savings."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from advice_models import adamw, meta_stack, square_mean

from memprofiler import advise
from memprofiler.advice import search
from memprofiler.advice.candidates import Candidate, Variant
from memprofiler.advice.costs import THROUGHPUT, Cost
from memprofiler.advice.plan import Plan
from memprofiler.estimate import MemoryEstimate

MiB = 1 << 20
#: Reserved peak (MiB) of each set of changes. The best single change, `a`, is in no fitting pair:
#: adding single savings would pick a+b (100 - 30 - 20 = 50 <= 60); estimated together it is 65.
PLANTED = {
    frozenset(): 100,
    frozenset("a"): 70,
    frozenset("b"): 80,
    frozenset("c"): 80,
    frozenset("ab"): 65,
    frozenset("ac"): 65,
    frozenset("bc"): 55,
}


def _candidate(name: str) -> Candidate:
    variant = Variant(
        f"change {name}", lambda p: p.with_change(name), lambda p: Cost(f"cost of {name}", THROUGHPUT, 0.1)
    )
    return Candidate(name, f"kind {name}", (variant,))


def _planted(plan: Plan) -> MemoryEstimate:
    n = PLANTED[frozenset(plan.labels)] * MiB
    return MemoryEstimate(peak_bytes=n, tensor_peak_bytes=n, reserved_peak_bytes=n)


def test_the_smallest_fitting_set_is_found_where_the_best_single_change_is_in_no_fitting_pair(monkeypatch):
    # GIVEN three changes whose estimates together are not the sum of their savings
    monkeypatch.setattr(search.plans, "estimate", _planted)
    plan = Plan(model=torch.nn.Linear(1, 1), batch=torch.zeros(1, 1), optimizer=adamw)
    est = search.Estimator(plan, budget=60 * MiB, reserve=0)
    base = est.base()
    # WHEN the singles are estimated, then sets of them
    singles = search.singles(est, [_candidate(n) for n in "abc"])
    rows = search.rank(search.combinations(est, singles))
    # THEN the best single is a, yet the only fitting pair is b+c, and every pair was estimated
    assert not base.fits
    assert max(singles, key=lambda pr: pr[1].saved_bytes)[1].names == ("a",)
    assert rows[0].fits
    assert sorted(rows[0].names) == ["b", "c"]
    assert rows[0].reserved_bytes == 55 * MiB
    assert rows[0].saved_bytes == 45 * MiB
    assert {frozenset(r.names) for r in rows} == {frozenset("ab"), frozenset("ac"), frozenset("bc")}
    assert est.runs == 7


def test_nothing_fits_is_an_answer_with_the_closest_candidate():
    # GIVEN a budget below what any change reaches (the cuBLAS workspaces alone take 64 MiB)
    advice = advise(
        meta_stack(32, 2),
        torch.randn(2, 8, 32),
        optimizer=adamw,
        loss_fn=square_mean,
        budget="16MiB",
        candidates=["bf16-mixed", "checkpoint-full"],
        progress=False,
    )
    # THEN there is no answer, but the nearest row, and the pair was tried too
    assert advice.best is None
    assert advice.closest is not None
    every = advice.rows + advice.combinations
    assert advice.closest.headroom_bytes == max(r.headroom_bytes for r in every)
    assert any(set(r.names) == {"bf16-mixed", "checkpoint-full"} for r in advice.combinations)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 0}, r"`budget`: got 0; use the memory one device may take"),
        ({"budget": "200GiB", "gpu": "H100"}, r"`budget`: got 200.00 GiB, more than the 80 GiB of an H100"),
        ({"budget": "1GiB", "offload": True}, r"`offload`: FSDP2's CPUOffloadPolicy pins host memory"),
        (
            {"budget": "1GiB", "candidates": ["checkpoint-every-3"]},
            r"`candidates`: unknown candidate 'checkpoint-every-3'",
        ),
    ],
)
def test_bad_input_is_one_line_naming_it(kwargs: dict[str, Any], match: str):
    with pytest.raises(Exception, match=match) as err:
        advise(
            meta_stack(32, 2),
            torch.randn(2, 8, 32),
            optimizer=adamw,
            loss_fn=square_mean,
            progress=False,
            **kwargs,
        )
    assert "\n" not in str(err.value)


def test_checkpointing_a_model_with_no_blocks_is_one_line():
    with torch.device("meta"):
        net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    with pytest.raises(Exception, match=r"`candidates`: Sequential has no blocks to checkpoint") as err:
        advise(
            net,
            torch.randn(2, 8),
            optimizer=adamw,
            budget="1GiB",
            candidates=["checkpoint-full"],
            progress=False,
        )
    assert "\n" not in str(err.value)
