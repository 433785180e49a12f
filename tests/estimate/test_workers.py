"""Estimates side by side in forked processes: the same figures as in process, and a child that
cannot finish its work leaves it to the parent."""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from memprofiler.estimate import estimate_memory, workers


def _real_parallel_kernel() -> int:
    """A CPU kernel that runs an OpenMP parallel region when torch has more than one thread."""
    x = torch.ones(2048, 2048)
    return int(x.tril().sum().item())


def test_the_first_task_runs_here_until_this_process_has_run_an_estimate(monkeypatch):
    # GIVEN a process that has not run an estimate: its torch caches are cold
    monkeypatch.setattr(workers, "_warm", False)
    here = os.getpid()
    # WHEN two tasks are run side by side
    pids = workers.prefetch([os.getpid, os.getpid], jobs=2)
    # THEN the first ran here (to fill the caches the child then inherits), the second in a child
    assert pids[0] == here and pids[1] not in (None, here)
    # AND once an estimate has run here, every task goes to a child
    monkeypatch.setattr(workers, "_warm", True)
    assert here not in workers.prefetch([os.getpid, os.getpid], jobs=2)


def test_children_run_parallel_kernels_after_the_parent_did(monkeypatch):
    monkeypatch.setattr(workers, "_warm", True)
    # GIVEN a parent that ran an OpenMP parallel region (its thread team exists)
    torch.set_num_threads(max(2, torch.get_num_threads()))
    expected = _real_parallel_kernel()
    # WHEN two children run the same kernel
    got = workers.prefetch([_real_parallel_kernel, _real_parallel_kernel], jobs=2)
    # THEN both finish with the parent's answer (GNU OpenMP's team does not survive the fork:
    # without one thread in the child this waits forever at the team's barrier)
    assert got == [expected, expected] == [2048 * 2049 // 2] * 2


def test_a_failing_task_leaves_it_to_the_caller_here_or_in_a_child(monkeypatch):
    monkeypatch.setattr(workers, "_warm", False)

    def boom() -> int:
        raise RuntimeError("refused")

    assert workers.prefetch([boom, lambda: 7], jobs=2) == [None, 7]
    monkeypatch.setattr(workers, "_warm", True)
    assert workers.prefetch([boom, lambda: 7], jobs=2) == [None, 7]


def test_one_job_or_one_task_runs_nothing_ahead(monkeypatch):
    assert workers.prefetch([lambda: 1, lambda: 2], jobs=1) == [None, None]
    assert workers.prefetch([lambda: 1], jobs=4) == [None]
    monkeypatch.setenv(workers.ENV, "1")
    assert workers.default_jobs() == 1


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork only")
def test_an_estimate_made_in_a_child_equals_the_same_estimate_in_process():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 256))
    opt = {"optimizer": lambda ps: torch.optim.AdamW(ps, lr=1e-3), "gpu": "H100"}

    def one(rows: int):
        return estimate_memory(net, torch.randn(rows, 256), **opt)

    ahead = workers.prefetch([lambda: one(8), lambda: one(16)], jobs=2)
    for est, rows in zip(ahead, (8, 16), strict=True):
        here = one(rows)
        assert est is not None
        assert (est.peak_bytes, est.reserved_peak_bytes, est.by_category, est.notes) == (
            here.peak_bytes,
            here.reserved_peak_bytes,
            here.by_category,
            here.notes,
        )


def test_tasks_a_finished_one_asks_for_start_before_those_waiting(monkeypatch):
    # GIVEN three tasks on two cores, the first run here, the second holding its core a while
    monkeypatch.setattr(workers, "_warm", True)
    here = os.getpid()

    def then(index: int, result: object) -> list:
        return [time_started] if index == 0 else []

    # WHEN the first one's end asks for one more task
    got = workers.prefetch(
        [os.getpid, _held, time_started],
        jobs=2,
        here_first=True,
        then=then,  # type: ignore[list-item]
    )
    # THEN the first ran here although this process is warm, the one asked for ran next, and its
    # result follows the others
    assert got[0] == here and len(got) == 4
    assert got[3] is not None and got[2] is not None and got[3] < got[2]


def _held() -> float:
    import time

    time.sleep(0.5)
    return time.monotonic()


def time_started() -> float:
    import time

    return time.monotonic()
