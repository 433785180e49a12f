"""The search: every single change estimated, then sets of changes, smallest first, by estimate.

Savings are never added: a set's figure is the estimate of the step with the whole set applied.
When no single change fits, the pairs of the ``pool`` changes that came nearest the budget (of
different kinds) are each estimated, then sets of three grown from the nearest pairs, and so on.
A variant family in a fitting set (how many blocks, how small a micro-batch) is then narrowed to
its cheapest variant that still fits with the rest of the set, by bisection over estimates.
The narrowings are :mod:`.lanes`: each asks for its next estimate while the others' run.
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from memprofiler.advice import lanes
from memprofiler.advice import plan as plans
from memprofiler.advice.candidates import Candidate, Variant
from memprofiler.advice.costs import Cost, combined
from memprofiler.advice.flops import ForwardFlops
from memprofiler.advice.plan import Plan
from memprofiler.advice.result import Row
from memprofiler.errors import MemProfilerError
from memprofiler.estimate import MemoryEstimate

Listener = Callable[[str, "Row | None"], None]


@dataclass(frozen=True)
class Pick:
    """One candidate at one of its variants."""

    candidate: Candidate
    index: int

    @property
    def variant(self) -> Variant:
        return self.candidate.variants[self.index]


@dataclass(frozen=True)
class Refused:
    """An estimate refused in the process that ran it: the error's words, raised again when read.

    Only an error the search records (not raises) comes back so: the estimate's own refusal, or a
    ``RuntimeError`` from a child of a process that never started CUDA (a child of one that did
    cannot use CUDA at all: that error is not the plan's, and the plan is estimated here again).
    """

    message: str
    runtime: bool

    def error(self) -> Exception:
        return RuntimeError(self.message) if self.runtime else MemProfilerError(self.message)


class Estimator:
    """Runs the estimates, once per distinct plan, and turns each into a :class:`Row`."""

    def __init__(
        self,
        base: Plan,
        budget: int,
        reserve: int,
        listener: Listener | None = None,
        jobs: int | None = None,
        flops: ForwardFlops | None = None,
    ) -> None:
        self.base_plan = base
        self.jobs = jobs
        self.budget = budget
        self.reserve = reserve
        self.listener = listener
        self.flops = flops
        """Recorded by the base's forward in this process; a child never records its own."""
        self.runs = 0
        self._cache: dict[str, MemoryEstimate | Refused] = {}
        self.base_used = 0
        self.target = ""
        self.base_row: Row | None = None
        self.failed: dict[str, str] = {}
        """Candidates (or sets) whose step the estimate refused, with its reason."""

    def base(self) -> Row:
        """The plan as given: every other row's saving is counted against it (estimated once)."""
        if self.base_row is not None:
            return self.base_row
        row = self.row(())
        self.base_used = -row.saved_bytes
        row.saved_bytes = 0
        self.base_row = row
        return row

    def _key(self, plan: Plan) -> str:
        return repr(
            (
                plan.checkpoint,
                plan.precision,
                plan.strategy,
                plan.optimizer_spec,
                plan.set_to_none,
                plan.reshard_after_forward,
                plan.fsdp_mixed_precision,
                plan.offload,
                plan.mesh_shape,
                plan.micro_batch,
                plan.accumulation,
                plan.loss_fn is self.base_plan.loss_fn,
                sorted(plan.labels),
            )
        )

    def estimate(self, plan: Plan) -> MemoryEstimate:
        key = self._key(plan)
        if key not in self._cache:
            self.store(key, plans.estimate(plan))
        found = self._cache[key]
        if isinstance(found, Refused):
            raise found.error()
        return found

    def pending(self, picks: tuple[Pick, ...]) -> tuple[str, Plan] | None:
        """The key and plan of a set of changes not estimated yet; None when it is (or when a
        change does not apply: :meth:`row` raises that, and the search records it)."""
        plan = self.base_plan
        try:
            for p in picks:
                plan = p.variant.apply(plan)
        except (MemProfilerError, RuntimeError):
            return None
        key = self._key(plan)
        return None if key in self._cache else (key, plan)

    def task(self, plan: Plan, here: bool = False) -> Callable[[], MemoryEstimate | Refused]:
        """The plan's estimate as a task for :func:`memprofiler.estimate.workers.prefetch`
        (``here``: the one it runs in this process, where the base's FLOPs are recorded)."""
        return functools.partial(_attempt, plan, None if here else self.flops)

    def store(self, key: str, found: MemoryEstimate | Refused) -> None:
        """An estimate made (or refused) elsewhere, for :meth:`row` to read."""
        if isinstance(found, Refused):
            if found.runtime and _cuda_started():  # perhaps the child's error, not the plan's
                return
            self._cache[key] = found
            return
        self._cache[key] = found
        self.target = found.target
        self.runs += 1

    def prefetch(self, picks: list[tuple[Pick, ...]]) -> None:
        """Estimate the plans of these sets of changes side by side (one process each, as many at
        once as ``jobs``), ahead of :meth:`row` asking for them one by one; a plan whose estimate
        failed there is estimated again in process when asked for, and raises there."""
        lanes.run(self, [], picks)

    def row(self, picks: tuple[Pick, ...], base: Row | None = None) -> Row:
        plan = self.base_plan
        for p in picks:
            plan = p.variant.apply(plan)
        words = "; ".join(p.variant.change for p in picks) or "the plan as given"
        if self.listener is not None:
            self.listener(words, None)
        est = self.estimate(plan)
        used = max(est.reserved_peak_bytes, est.peak_bytes) + est.margin_bytes
        cost = combined([p.variant.cost(plan) for p in picks]) if picks else Cost("none")
        patch: list[str] = []
        yaml: list[str] = []
        for p in picks:
            patch += list(p.variant.python or p.variant.yaml)
            yaml += list(p.variant.yaml or p.variant.python)
        row = Row(
            names=tuple(p.candidate.name for p in picks),
            change=words,
            peak_bytes=est.peak_bytes,
            reserved_bytes=est.reserved_peak_bytes,
            saved_bytes=self.base_used - used,
            fits=est.fits(self.budget, self.reserve),
            headroom_bytes=est.headroom(self.budget, self.reserve),
            cost=cost,
            patch=patch,
            yaml=yaml,
        )
        if self.listener is not None:
            self.listener(words, row)
        return row


def _attempt(plan: Plan, flops: ForwardFlops | None) -> MemoryEstimate | Refused:
    if flops is not None:  # a child: the base's FLOPs are this process's parent's to record
        flops.recorded = True
    try:
        return plans.estimate(plan)
    except MemProfilerError as err:
        return Refused(str(err), runtime=False)
    except RuntimeError as err:
        return Refused(str(err), runtime=True)


def _cuda_started() -> bool:
    import torch

    return bool(torch.cuda.is_initialized())


def cheapest_fitting(est: Estimator, fixed: tuple[Pick, ...], family: Candidate) -> tuple[Pick, Row]:
    """The first variant of ``family`` that fits with ``fixed``, else its last variant (each
    estimate made when :func:`narrowing` asks for it, one after another)."""
    return lanes.run(est, [narrowing(est, fixed, family)])[0]


def narrowing(est: Estimator, fixed: tuple[Pick, ...], family: Candidate) -> lanes.Lane[tuple[Pick, Row]]:
    """The lane that finds the first variant of ``family`` that fits with ``fixed``, else its last.

    Memory falls along the variants, so the boundary is searched for: each next variant tried is
    where a straight line through the two nearest estimates crosses the budget (the figures are
    nearly linear in blocks or rows, so two or three estimates find it), and the answer is
    confirmed by estimating the variant before it. Every variant tried is estimated.
    """
    last = len(family.variants) - 1
    rows: dict[int, Row] = {}
    yield [(), (*fixed, Pick(family, last))] if not fixed else [(*fixed, Pick(family, last))]
    if not fixed and est.base_row is not None:
        rows[-1] = est.base_row
    rows[last] = est.row((*fixed, Pick(family, last)))
    if not rows[last].fits:
        return Pick(family, last), rows[last]
    lo, hi = -1, last  # hi fits; lo does not (-1: the family not applied)
    while hi - lo > 1:
        below, above = rows.get(lo), rows[hi]
        if below is None or above.headroom_bytes == below.headroom_bytes:
            guess = (lo + hi) // 2
        else:
            step = (hi - lo) * -below.headroom_bytes / (above.headroom_bytes - below.headroom_bytes)
            guess = min(max(lo + 1, lo + math.ceil(step)), hi - 1)
        yield [(*fixed, Pick(family, guess))]
        rows[guess] = est.row((*fixed, Pick(family, guess)))
        if rows[guess].fits:
            hi = guess
        else:
            lo = guess
    return Pick(family, hi), rows[hi]


def rank(rows: list[Row]) -> list[Row]:
    """Fitting rows by cost (then by headroom), then the others nearest the budget first."""
    fit = sorted((r for r in rows if r.fits), key=lambda r: (r.cost.score, -r.headroom_bytes))
    rest = sorted((r for r in rows if not r.fits), key=lambda r: -r.headroom_bytes)
    return fit + rest


def singles(
    est: Estimator, cands: list[Candidate], on_base: Callable[[Row], None] | None = None
) -> list[tuple[Pick, Row]]:
    """Each candidate estimated on its own (a family at its cheapest fitting variant); one whose
    step cannot be estimated goes to ``est.failed`` with the estimate's one-line reason.

    The base (:meth:`Estimator.base`, then ``on_base`` on its row, which may raise) is estimated
    in this process beside the first candidates, unless it was already; the families' narrowings
    run beside the other candidates, the longest steps (accumulation) among those first.
    """
    families = [i for i, c in enumerate(cands) if len(c.variants) > 1]
    runs = [_base_lane(est, on_base)] + [_guarded(narrowing(est, (), cands[i])) for i in families]
    ahead = sorted(((Pick(c, len(c.variants) - 1),) for c in cands), key=lambda s: -_steps(est, s))
    made: dict[tuple[Pick, ...], Row] = {}

    def arrived(picks: tuple[Pick, ...]) -> None:  # its row now, so progress counts it now
        if est.base_row is not None and len(picks[0].candidate.variants) == 1:
            with contextlib.suppress(MemProfilerError, RuntimeError):  # recorded when read below
                made[picks] = est.row(picks)

    answers = lanes.run(est, runs, ahead, here_first=est.base_row is None, arrived=arrived)
    narrowed = dict(zip(families, answers[1:], strict=True))
    out = []
    for i, c in enumerate(cands):
        try:
            if i in narrowed:
                found = narrowed[i]
                if isinstance(found, BaseException):
                    raise found
                out.append(found)
            else:
                pick = Pick(c, 0)
                out.append((pick, made.get((pick,)) or est.row((pick,))))
        except (MemProfilerError, RuntimeError) as err:
            est.failed[c.name] = "could not be estimated: " + " ".join(str(err).split())[:300]
    return out


def _steps(est: Estimator, picks: tuple[Pick, ...]) -> int:
    """Micro-batches the set's estimate runs per step (its length, nearly)."""
    found = est.pending(picks)
    return 1 if found is None else found[1].accumulation


def _base_lane(est: Estimator, on_base: Callable[[Row], None] | None) -> lanes.Lane[Row]:
    yield [()]
    row = est.base()
    if on_base is not None:
        on_base(row)
    return row


def _guarded(lane: lanes.Lane[Any]) -> lanes.Lane[Any]:
    """The lane's answer, or the error the search records rather than raises."""
    try:
        return (yield from lane)
    except (MemProfilerError, RuntimeError) as err:
        return err


def combinations(
    est: Estimator, singles_: list[tuple[Pick, Row]], pool: int = 6, beam: int = 4, max_size: int = 3
) -> list[Row]:
    """Sets of changes of different kinds, smallest first, until one fits (or ``max_size``)."""
    nearest = sorted(singles_, key=lambda pr: -pr[1].headroom_bytes)
    top: list[Pick] = []
    for pick, _ in nearest:
        last = Pick(pick.candidate, len(pick.candidate.variants) - 1)
        if last not in top:
            top.append(last)
        if len(top) == pool:
            break
    tried: dict[frozenset[str], tuple[tuple[Pick, ...], Row]] = {}
    frontier: list[tuple[Pick, ...]] = [(p,) for p in top]
    for _size in range(2, max_size + 1):
        grown: list[tuple[Pick, ...]] = []
        sets = [g for g in _grown(frontier, top) if frozenset(q.candidate.name for q in g) not in tried]
        est.prefetch(sets)
        for picks in sets:
            key = frozenset(q.candidate.name for q in picks)
            try:
                tried[key] = (picks, est.row(picks))
            except (MemProfilerError, RuntimeError) as err:
                est.failed[" + ".join(sorted(key))] = (
                    "could not be estimated: " + " ".join(str(err).split())[:300]
                )
                continue
            grown.append(picks)
        fitting = [
            (picks, row)
            for picks, row in (tried[frozenset(q.candidate.name for q in g)] for g in grown)
            if row.fits
        ]
        if fitting:
            return _narrowed(est, fitting) + [r for _, r in tried.values() if not r.fits]
        nearest_sets = sorted(
            grown, key=lambda g: -tried[frozenset(q.candidate.name for q in g)][1].headroom_bytes
        )
        frontier = nearest_sets[:beam]
        if not frontier:
            break
    return [r for _, r in tried.values()]


def _grown(frontier: list[tuple[Pick, ...]], top: list[Pick]) -> list[tuple[Pick, ...]]:
    """The sets of one more change grown from ``frontier`` (no two of a kind), each once, in order."""
    out: dict[frozenset[str], tuple[Pick, ...]] = {}
    for base in frontier:
        for p in top:
            if p.candidate.kind not in {q.candidate.kind for q in base}:
                picks = tuple(sorted((*base, p), key=lambda q: top.index(q)))
                out.setdefault(frozenset(q.candidate.name for q in picks), picks)
    return list(out.values())


def _narrowed(est: Estimator, fitting: list[tuple[tuple[Pick, ...], Row]]) -> list[Row]:
    """Each fitting set with its families narrowed to the cheapest variant that still fits (the
    sets side by side)."""
    return lanes.run(est, [_narrowed_set(est, picks, row) for picks, row in fitting])


def _narrowed_set(est: Estimator, picks: tuple[Pick, ...], row: Row) -> lanes.Lane[Row]:
    for i, p in enumerate(picks):
        if len(p.candidate.variants) > 1:
            rest = picks[:i] + picks[i + 1 :]
            chosen, row = yield from narrowing(est, rest, p.candidate)
            picks = (*rest[:i], chosen, *rest[i:])
    return row
