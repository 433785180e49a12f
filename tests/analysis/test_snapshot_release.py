"""Freeing a loaded snapshot a slice at a time: every trace emptied, every entry freed."""

from __future__ import annotations

from memprofiler.analysis.snapshot import release as release_module
from memprofiler.analysis.snapshot.release import release


class Entry(dict):
    """A trace entry that counts how many of its kind are alive (plain dicts cannot be watched)."""

    alive = 0

    def __init__(self, **fields):
        super().__init__(**fields)
        Entry.alive += 1

    def __del__(self):
        Entry.alive -= 1


def test_every_trace_is_emptied_and_its_entries_freed(monkeypatch):
    # GIVEN two traces of 10 and 7 entries (slices of 4), one empty trace, and segments
    monkeypatch.setattr(release_module, "SLICE", 4)
    Entry.alive = 0
    data = {
        "segments": [{"address": 0, "blocks": []}],
        "device_traces": [
            [Entry(action="alloc", addr=k, size=8) for k in range(10)],
            [],
            [Entry(action="free_completed", addr=k, size=8) for k in range(7)],
        ],
    }
    traces = list(data["device_traces"])
    assert Entry.alive == 17
    # WHEN it is released
    release(data)
    # THEN every trace is empty (the lists themselves kept) and all 17 entries are gone
    assert [len(t) for t in data["device_traces"]] == [0, 0, 0]
    assert all(a is b for a, b in zip(data["device_traces"], traces, strict=True))
    assert Entry.alive == 0
    assert data["segments"] == [{"address": 0, "blocks": []}]


def test_a_snapshot_with_no_traces_or_odd_ones_is_left_as_it_is():
    for data in ({}, {"device_traces": None}, {"device_traces": [None, (1, 2)]}):
        before = repr(data)
        release(data)
        assert repr(data) == before
