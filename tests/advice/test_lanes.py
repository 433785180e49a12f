"""The search side by side: a family's narrowing asks for its next estimate while the other
changes are estimated, and finds what the search finds one estimate after another; a change a
child could not estimate is reported with the child's reason, not estimated again."""

from __future__ import annotations

import os

import pytest
import torch
from advice_models import adamw, meta_stack, square_mean

from memprofiler import advise
from memprofiler.advice import search
from memprofiler.advice.candidates import Candidate, Variant
from memprofiler.advice.costs import THROUGHPUT, Cost
from memprofiler.advice.plan import Plan
from memprofiler.errors import ConfigError
from memprofiler.estimate import MemoryEstimate, workers

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="side by side needs fork")

MiB = 1 << 20
#: Reserved MiB of the base and of each single change; ``k3`` .. ``k8``: the family's variants.
PLANTED = {"": 100, "a": 90, "b": 95, **{f"k{k}": 100 - 5 * k for k in range(1, 9)}}
BUDGET = 72 * MiB  # the family fits from k6 (70 MiB) on; k5 (75 MiB) does not


def _variant(label: str) -> Variant:
    return Variant(
        f"change {label}", lambda p: p.with_change(label), lambda p: Cost(f"cost of {label}", THROUGHPUT, 0.1)
    )


def _candidates() -> list[Candidate]:
    family = Candidate("k", "kind k", tuple(_variant(f"k{k}") for k in range(1, 9)))
    return [family, Candidate("a", "kind a", (_variant("a"),)), Candidate("b", "kind b", (_variant("b"),))]


def _planted(plan: Plan) -> MemoryEstimate:
    if "x" in plan.labels:
        raise RuntimeError("aten.mul.Tensor: no valid strategy preserves this placement")
    n = PLANTED["".join(plan.labels)] * MiB
    return MemoryEstimate(peak_bytes=n, tensor_peak_bytes=n, reserved_peak_bytes=n)


def _singles(
    monkeypatch: pytest.MonkeyPatch, jobs: int, cands: list[Candidate], estimate=None, listener=None
) -> tuple[search.Estimator, list]:
    monkeypatch.setattr(search.plans, "estimate", estimate or _planted)
    plan = Plan(model=torch.nn.Linear(1, 1), batch=torch.zeros(1, 1), optimizer=adamw)
    est = search.Estimator(plan, budget=BUDGET, reserve=0, listener=listener, jobs=jobs)
    return est, search.singles(est, cands)


def test_the_narrowing_side_by_side_finds_what_it_finds_one_estimate_after_another(monkeypatch):
    # GIVEN a family whose memory falls 5 MiB a variant, beside two single changes
    # WHEN the singles are estimated side by side, then one after another in this process
    monkeypatch.setattr(workers, "_warm", True)
    shown: list[str] = []
    side, side_rows = _singles(
        monkeypatch, 2, _candidates(), listener=lambda words, row: row is not None and shown.append(words)
    )
    alone, alone_rows = _singles(monkeypatch, 1, _candidates())
    # THEN the family's answer is its first fitting variant, k6, by the same estimates, and every
    # row is the same
    assert side_rows[0][1].change == "change k6" and side_rows[0][1].reserved_bytes == 70 * MiB
    assert [(p.index, r) for p, r in side_rows] == [(p.index, r) for p, r in alone_rows]
    assert side.base_row == alone.base_row and side.base_row is not None
    assert side.base_row.reserved_bytes == 100 * MiB
    # base, a, b, k8, then the secant's k6 (fits) and its confirmation k5 (does not)
    assert side.runs == alone.runs == 6
    # AND the progress counted each row once, as its estimate came in
    assert sorted(shown) == sorted(
        ["the plan as given", *(f"change {c}" for c in ("a", "b", "k8", "k6", "k5"))]
    )


CALLS: list[tuple[str, ...]] = []


def _counted(plan: Plan) -> MemoryEstimate:
    CALLS.append(plan.labels)
    return _planted(plan)


@pytest.mark.parametrize("cuda_started", [False, True])
def test_a_change_a_child_could_not_estimate_is_reported_with_its_reason(monkeypatch, cuda_started):
    # GIVEN a change whose estimate raises, estimated in a child of a warm process
    monkeypatch.setattr(workers, "_warm", True)
    monkeypatch.setattr(search, "_cuda_started", lambda: cuda_started)
    CALLS.clear()
    broken = Candidate("x", "kind x", (_variant("x"),))
    # WHEN the singles are estimated side by side (only this process's estimates are counted)
    est, rows = _singles(monkeypatch, 2, [broken, *_candidates()[1:]], _counted)
    # THEN its reason is the estimate's own line
    assert [p.candidate.name for p, _ in rows] == ["a", "b"]
    assert est.failed["x"] == (
        "could not be estimated: aten.mul.Tensor: no valid strategy preserves this placement"
    )
    # AND it was estimated here again only where the child's error may have been the child's own
    # (this process had started CUDA, which a forked child cannot use)
    assert CALLS.count(("x",)) == (1 if cuda_started else 0)


def test_a_budget_above_the_default_target_is_refused_once_the_base_is_in(monkeypatch):
    # GIVEN no GPU named: the default target's memory is known once the base has been estimated,
    # while the single changes are being estimated beside it
    monkeypatch.setattr(workers, "_warm", True)
    with pytest.raises(
        ConfigError, match=r"`budget`: got 200.00 GiB, more than the 80 GiB of an H100"
    ) as err:
        advise(
            meta_stack(32, 2),
            torch.randn(2, 8, 32),
            optimizer=adamw,
            loss_fn=square_mean,
            budget="200GiB",
            progress=False,
            jobs=2,
        )
    # THEN it is one line
    assert "\n" not in str(err.value)
