"""StackTable.intern_all: the ids, strings, frames and stacks of one intern() per list, in order."""

from __future__ import annotations

import random
from typing import Any

import pytest

from memprofiler.analysis.snapshot.replay import StackTable


def _frame(name: str, line: int = 1) -> dict[str, Any]:
    return {"name": name, "filename": f"{name}.py", "line": line}


def _one_by_one(lists: list[Any]) -> tuple[list[int], StackTable]:
    table = StackTable()
    table.intern(None)
    return [table.intern(f) for f in lists], table


def _check(lists: list[Any]) -> None:
    expected, one = _one_by_one(lists)
    bulk = StackTable()
    ids = bulk.intern_all(lists).tolist()
    assert ids == expected
    assert (bulk.strings, bulk.frames, bulk.stacks, bulk.labels) == (
        one.strings,
        one.frames,
        one.stacks,
        one.labels,
    )


def test_shared_frames_with_stacks_that_differ_only_far_from_the_middle() -> None:
    # GIVEN 300 stacks of 40 shared frame dicts that differ only at position 3 or 37, as
    # torch writes them (one list per entry, the frame dicts shared), in a random order
    common = [_frame(f"f{k}") for k in range(40)]
    stacks = []
    for k in range(300):
        s = list(common)
        s[3 if k % 2 else 37] = _frame(f"op{k}")
        stacks.append(s)
    rng = random.Random(0)
    lists = [list(stacks[rng.randrange(300)]) for _ in range(20_000)]
    # WHEN interned in bulk THEN each id is the one a pass in order gives
    _check(lists)


def test_equal_frames_in_fresh_dicts_lengths_empty_and_missing() -> None:
    # GIVEN lists equal in content but not in identity, several lengths, empty and None
    rng = random.Random(1)
    lists: list[Any] = []
    for _ in range(5_000):
        n = rng.choice((0, 1, 2, 5, 9))
        kind = rng.randrange(4)
        lists.append(None if n == 0 and kind == 0 else [_frame(f"g{(j + kind) % 3}", j) for j in range(n)])
    _check(lists)


def test_a_list_of_one_frame_shared_by_every_stack_of_its_length() -> None:
    # GIVEN stacks that share every probed frame but one near the end
    base = [_frame(f"b{k}") for k in range(8)]
    lists = [[*base[:7], _frame(f"last{k % 500}")] for k in range(6_000)]
    _check(lists)


def test_a_malformed_frames_value_fails_as_one_intern_does() -> None:
    table = StackTable()
    with pytest.raises((KeyError, TypeError, AttributeError)):
        table.intern_all([[_frame("a")], {"name": "not a list"}])


def test_stacks_first_seen_after_the_sample_and_told_apart_elsewhere() -> None:
    # GIVEN 5,000 lists of 4 stacks that differ at position 3, then a few (fewer than one in
    # 64) of a stack that differs from one of them only at position 20, then many of another
    common = [_frame(f"c{k}") for k in range(30)]
    stacks = []
    for k in range(4):
        s = list(common)
        s[3] = _frame(f"op{k}")
        stacks.append(s)
    late = list(stacks[1])
    late[20] = _frame("late")
    many = list(stacks[2])
    many[25] = _frame("many")
    lists = [list(stacks[k % 4]) for k in range(5_000)]
    lists += [list(late) for _ in range(30)] + [list(stacks[0])]
    lists += [list(many) for _ in range(3_000)]
    _check(lists)
