"""The search's estimates side by side: fixed sets of changes, and lanes that each ask for the next.

A lane is a generator that yields the sets of changes whose estimates it needs next (a variant
family's narrowing: its last variant, then one guess at a time), then reads their rows from the
:class:`~memprofiler.advice.search.Estimator`'s cache. Every lane's estimates and the fixed sets
share one :func:`memprofiler.estimate.workers.prefetch`: a lane's next estimate starts as soon as
the ones it waited for are in, ahead of the sets still waiting, so no core idles while a lane
thinks. A lane asks for what it would have estimated one after another, in the same order: its
answer and every row it reads are those of the sequential search. Where nothing runs side by
side (one core, no ``fork``) or a child failed, the lane's rows are estimated here when read.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Sequence
from typing import Any, Protocol, TypeVar

from memprofiler.estimate import workers

T = TypeVar("T")
Wants = list[tuple[Any, ...]]
"""Sets of changes (the search's picks)."""
Lane = Generator[Wants, None, T]
"""Yields the sets it needs estimated next; returns its answer."""


class Estimates(Protocol):
    """What a run needs of the search's estimator: its cache, and a task per plan."""

    @property
    def jobs(self) -> int | None: ...

    @property
    def listener(self) -> Callable[[str, Any], None] | None: ...

    def pending(self, picks: tuple[Any, ...]) -> tuple[str, Any] | None: ...

    def task(self, plan: Any, here: bool = False) -> Callable[[], Any]: ...

    def store(self, key: str, found: Any) -> None: ...


def run(
    est: Estimates,
    lanes: Sequence[Lane[T]],
    sets: Sequence[tuple[Any, ...]] = (),
    here_first: bool = False,
    arrived: Callable[[tuple[Any, ...]], None] | None = None,
) -> list[T]:
    """Each lane's answer, in order, with ``sets`` estimated beside them (their rows are read later;
    ``arrived`` is called with each set whose estimate came in, as it does).

    ``here_first``: the first set a lane (or else ``sets``) asks for is estimated in this process.
    An error a lane raises (as the sequential search would have) is raised here.
    """
    done: dict[int, Any] = {}
    waits: list[set[str]] = [set() for _ in lanes]
    asked: list[str] = []  # the key of each task, in the order prefetch numbers them
    flying: set[str] = set()
    wanted: dict[str, tuple[Any, ...]] = {}  # the key of each of ``sets`` not estimated yet

    def tasks_for(wants: Sequence[tuple[Any, ...]]) -> tuple[set[str], list[Callable[[], Any]]]:
        missing, new = set(), []
        for picks in wants:
            found = est.pending(picks)
            if found is None:
                continue
            key, plan = found
            missing.add(key)
            if key not in flying:
                flying.add(key)
                asked.append(key)
                new.append(est.task(plan, here=here_first and len(asked) == 1))
        return missing, new

    def advance(i: int) -> list[Callable[[], Any]]:
        """Resume lane ``i`` until it waits for an estimate not yet in, or ends."""
        while True:
            try:
                wants = next(lanes[i])
            except StopIteration as stop:
                done[i] = stop.value
                return []
            waits[i], new = tasks_for(wants)
            if waits[i]:
                return new

    def then(index: int, result: Any) -> list[Callable[[], Any]]:
        key = asked[index]
        flying.discard(key)
        if result is not None:
            est.store(key, result)
            if arrived is not None and key in wanted and est.pending(wanted[key]) is None:  # kept
                arrived(wanted[key])
        new: list[Callable[[], Any]] = []
        for i, wait in enumerate(waits):
            if key in wait:
                wait.discard(key)
                if not wait and i not in done:
                    new += advance(i)
        return new

    first: list[Callable[[], Any]] = []
    for i in range(len(lanes)):
        first += advance(i)
    first += tasks_for(sets)[1]
    for picks in sets:
        found = est.pending(picks)
        if found is not None:
            wanted.setdefault(found[0], picks)
    if len(asked) > 1 and est.listener is not None:
        est.listener(f"{len(asked)} plans side by side", None)
    workers.prefetch(first, est.jobs, here_first=here_first, then=then)
    for i, lane in enumerate(lanes):  # what was not run ahead is estimated here, as each is read
        while i not in done:
            try:
                next(lane)
            except StopIteration as stop:
                done[i] = stop.value
    return [done[i] for i in range(len(lanes))]
