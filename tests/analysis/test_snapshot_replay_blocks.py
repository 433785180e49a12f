"""The replay a device at a time, its blocks first: the same replay and stack ids as at once."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memprofiler.analysis.snapshot.replay import StackTable, replay, replay_blocks
from memprofiler.analysis.snapshot.summary import load_snapshot

REAL = Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle"
FIELDS = ("start", "end", "size", "addr", "stream", "stack", "time_us")
FIELDS += ("seg_start", "seg_end", "seg_addr", "seg_size", "seg_stream")


def two_devices(seed: int) -> dict[str, Any]:
    """Two devices whose traces share frames (their stacks are interned into one table), each
    with frees of blocks older than the trace, and blocks alive at the end that it never saw."""
    rng = random.Random(seed)
    frames = [{"name": f"f{k}", "filename": "/home/u/train.py", "line": k} for k in range(12)]
    traces = []
    for _ in range(2):
        trace = []
        for i in range(400):
            action = rng.choice(("alloc", "alloc", "free_completed", "free_requested", "segment_alloc"))
            e: dict[str, Any] = {
                "action": action,
                "addr": rng.randrange(9) * 512,
                "size": rng.randrange(1, 900),
            }
            e.update(stream=rng.randrange(2), time_us=1000 + i)
            e["frames"] = [frames[rng.randrange(12)] for _ in range(rng.choice((0, 3, 5)))]
            trace.append(e)
        traces.append(trace)
    segments = [
        {
            "device": dev,
            "address": 1 << 30,
            "total_size": 1 << 20,
            "stream": 0,
            "blocks": [
                {"address": (1 << 30) + 512 * b, "size": 512, "requested_size": 500, "state": "active_allocated",
                 "frames": [frames[b]]}
                for b in range(3)
            ],
        }
        for dev in range(2)
    ]  # fmt: skip
    return {"segments": segments, "device_traces": traces}


def same(a, b) -> None:
    assert (a.device, a.entries, a.instants, a.ooms) == (b.device, b.entries, b.instants, b.ooms)
    for name in FIELDS:
        assert np.array_equal(getattr(a, name), getattr(b, name)), name


@pytest.mark.parametrize("seed", range(5))
def test_each_device_a_time_is_the_replay_at_once(seed):
    # GIVEN two devices' traces, replayed at once
    want_table = StackTable()
    want = replay(two_devices(seed), want_table)
    # WHEN they are replayed a device at a time, the blocks read before each device's stacks
    table = StackTable()
    got = []
    for blocks in replay_blocks(two_devices(seed), table):
        early = (blocks.start, blocks.end, blocks.size, blocks.addr)
        rep = blocks.replay()
        # THEN the blocks are the replay's, and the rest of it is the replay at once's
        assert all(x is y for x, y in zip(early, (rep.start, rep.end, rep.size, rep.addr), strict=True))
        assert blocks.replay() is rep
        got.append(rep)
    for a, b in zip(got, want, strict=True):
        same(a, b)
    # with the stacks interned into the same ids, in the same order
    assert (table.strings, table.frames, table.stacks) == (
        want_table.strings,
        want_table.frames,
        want_table.stacks,
    )


def test_a_device_left_unfinished_is_finished_before_the_next():
    # GIVEN the blocks of each device taken, and no device's replay asked for until the end
    table = StackTable()
    pending = list(replay_blocks(two_devices(7), table))
    want_table = StackTable()
    want = replay(two_devices(7), want_table)
    # WHEN they are asked for last device first
    got = [b.replay() for b in reversed(pending)][::-1]
    # THEN each is what the replay at once gives, its stack ids too
    for a, b in zip(got, want, strict=True):
        same(a, b)
    assert table.stacks == want_table.stacks


def test_the_real_capture_a_device_at_a_time():
    want = replay(load_snapshot(REAL), StackTable())
    got = [b.replay() for b in replay_blocks(load_snapshot(REAL), StackTable())]
    assert len(got) == len(want) == 1
    same(got[0], want[0])
    assert int(got[0].start.size) > 1000
