"""The columns read once from a trace give the analysis and the replay what their entry-by-entry
loops gave: checked here against those loops, written out plainly, on random traces over a few
addresses (an address allocated twice without a free, freed twice, freed before any alloc)."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from memprofiler.analysis.snapshot.columns import BadEntry, read_columns
from memprofiler.analysis.snapshot.replay import StackTable, replay
from memprofiler.analysis.snapshot.summary import analyze
from memprofiler.errors import ArtifactError

_ACTIONS = ("alloc", "alloc", "free_completed", "free_completed", "free_requested", "segment_alloc")
_ACTIONS += ("segment_free", "segment_map", "segment_unmap", "oom", "snapshot")


def random_snapshot(seed: int, n: int) -> dict[str, Any]:
    """``n`` entries over 5 addresses; each alloc with a stack of its own (one frame naming it),
    so each block alive at the peak is a stack group of its own."""
    rng = random.Random(seed)
    trace = []
    for i in range(n):
        action = rng.choice(_ACTIONS)
        e: dict[str, Any] = {"action": action, "addr": rng.randrange(5) * 4096, "size": rng.randrange(1, 900)}
        e.update(stream=0, time_us=1000 + i)
        if action == "alloc":
            e["frames"] = [{"name": f"alloc_{i}", "filename": "/home/u/train.py", "line": i}]
        trace.append(e)
    blocks = [
        {"address": a * 4096, "size": 1024, "requested_size": 1000 + a, "state": "active_allocated"}
        for a in range(5)
        if rng.random() < 0.5
    ]
    segment = {"device": 0, "address": 0, "total_size": 1 << 20, "stream": 0, "blocks": blocks}
    return {"segments": [segment], "device_traces": [trace]}


def loop_analysis(entries: list[dict[str, Any]], points: int) -> dict[str, Any]:
    """The analysis's figures by one step per entry: a dict of the live blocks by address (a
    second alloc at an address replaces the first)."""
    cur = res = peak = res_peak = res_min = 0
    peak_i = res_peak_i = -1
    totals = []
    for i, e in enumerate(entries):
        a, size = e["action"], e["size"]
        if a == "alloc":
            cur += size
            if cur > peak:
                peak, peak_i = cur, i
        elif a == "free_completed":
            cur -= size
        elif a in ("segment_alloc", "segment_map"):
            res += size
            if res > res_peak:
                res_peak, res_peak_i = res, i
        elif a in ("segment_free", "segment_unmap"):
            res -= size
            res_min = min(res, res_min)
        totals.append((cur, res))
    oom = [i for i, e in enumerate(entries) if e["action"] == "oom"]
    live: dict[int, int] = {}
    at: dict[int, list[int]] = {}
    older: list[int] = []
    for i, e in enumerate(entries):
        if e["action"] == "alloc":
            live[e["addr"]] = i
        elif e["action"] == "free_completed" and live.pop(e["addr"], None) is None:
            older.append(i)
        if i in (peak_i, oom[-1] if oom else None):
            at[i] = sorted(live.values())
    n = len(entries)
    step = -(-n // points)
    timeline = [
        (
            min(k + step, n) - 1,
            max(c for c, _ in totals[k : k + step]),
            max(r for _, r in totals[k : k + step]),
        )
        for k in range(0, n, step)
    ]
    return {
        "peak": peak,
        "peak_i": peak_i,
        "res_peak": res_peak,
        "res_peak_i": res_peak_i,
        "res_min": res_min,
        "end": totals[-1],
        "older": older,
        "live_at_peak": at.get(peak_i, []),
        "live_at_oom": at.get(oom[-1], []) if oom else None,
        "alive_at_end": set(live),
        "timeline": timeline,
    }


def loop_replay_ends(entries: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """``(start, end)`` of each block the trace allocates, by the replay's rule: a free closes
    the block of the event just before it at its address when that is an alloc (a second alloc
    leaves the first alive to the end)."""
    last: dict[int, tuple[str, int]] = {}
    end = {}
    for i, e in enumerate(entries):
        a = e["action"]
        if a not in ("alloc", "free_completed"):
            continue
        before = last.get(e["addr"])
        if a == "alloc":
            end[i] = len(entries)
        elif before is not None and before[0] == "alloc":
            end[before[1]] = i
        last[e["addr"]] = (a, i)
    return sorted(end.items())


SEEDS = range(40)


@pytest.mark.parametrize("seed", SEEDS)
def test_columns_give_the_loops_figures_on_random_traces(seed):
    # GIVEN a random trace over 5 addresses (repeated allocs and frees at one address)
    data = random_snapshot(seed, 30 + seed * 7)
    entries = data["device_traces"][0]
    want = loop_analysis(entries, points=7)
    # WHEN its columns are read
    cols = read_columns(entries)
    active, reserved = cols.active(), cols.reserved()
    # THEN the running totals and both live-set rules are the loops'
    assert (int(active[-1]), int(reserved[-1])) == want["end"]
    assert int(np.argmax(active)) == want["peak_i"] or (want["peak_i"] == -1 and active.max() <= 0)
    assert cols.index[cols.older_frees()].tolist() == want["older"]
    assert cols.index[cols.live_at(want["peak_i"])].tolist() == want["live_at_peak"]
    assert cols.alive_at_end() == want["alive_at_end"]
    starts = cols.index[cols.alloc].tolist()
    assert list(zip(starts, cols.replay_ends(len(entries)).tolist(), strict=True)) == loop_replay_ends(
        entries
    )


@pytest.mark.parametrize("seed", SEEDS)
def test_the_analysis_states_the_loops_figures_on_random_traces(seed):
    # GIVEN a random trace and the end-state blocks at some of its addresses
    data = random_snapshot(seed, 30 + seed * 7)
    entries = data["device_traces"][0]
    want = loop_analysis(entries, points=7)
    blocks = data["segments"][0]["blocks"]
    # WHEN it is analysed, every stack group kept
    [dev] = analyze(data, top=10_000, points=7).devices
    # THEN the peaks, the timeline and the blocks alive at the peak are the loops'
    older = sum(entries[i]["size"] for i in want["older"])
    pre_alive = [b for b in blocks if b["address"] not in want["alive_at_end"]]
    baseline = older + sum(b["requested_size"] for b in pre_alive)
    res_baseline = max((1 << 20) - want["end"][1], -want["res_min"])
    assert dev.baseline_allocated == baseline
    assert (dev.peak_allocated, dev.peak_allocated_index) == (baseline + want["peak"], want["peak_i"])
    assert (dev.peak_reserved, dev.peak_reserved_index) == (
        res_baseline + want["res_peak"],
        want["res_peak_i"],
    )
    assert (dev.end_allocated, dev.end_reserved) == (baseline + want["end"][0], res_baseline + want["end"][1])
    assert dev.timeline == [(i, baseline + a, res_baseline + r) for i, a, r in want["timeline"]]
    named = {g.frames[0].split(" ")[0]: g.bytes for g in dev.top_stacks if g.frames[0].startswith("alloc_")}
    assert named == {f"alloc_{i}": entries[i]["size"] for i in want["live_at_peak"]}
    older_alive = [i for i in want["older"] if i > want["peak_i"]]
    rest = sum(g.bytes for g in dev.top_stacks if not g.frames[0].startswith("alloc_"))
    assert rest == sum(entries[i]["size"] for i in older_alive) + sum(b["requested_size"] for b in pre_alive)
    if want["live_at_oom"] is not None:
        oom_named = {g.frames[0].split(" ")[0] for g in dev.oom_stacks if g.frames[0].startswith("alloc_")}
        assert oom_named == {f"alloc_{i}" for i in want["live_at_oom"]}


@pytest.mark.parametrize("seed", SEEDS)
def test_the_replay_shares_the_analysis_columns(seed):
    # GIVEN a random trace replayed from the analysis's columns and from its own read
    data = random_snapshot(seed, 30 + seed * 7)
    entries = data["device_traces"][0]
    cols = {0: read_columns(entries)}
    [shared] = replay(data, StackTable(), columns=cols)
    [own] = replay(data, StackTable())
    # THEN both are the same (the columns handed over: taken out of the dict), and the trace's
    # blocks live as the replay's rule says
    assert cols == {}
    for name in ("start", "end", "size", "addr", "stream", "stack", "seg_start", "seg_end", "time_us"):
        assert getattr(shared, name).tolist() == getattr(own, name).tolist(), name
    traced = shared.start >= 0
    got = sorted(zip(shared.start[traced].tolist(), shared.end[traced].tolist(), strict=True))
    assert got == loop_replay_ends(entries)
    older = shared.start < 0
    freed_older = shared.end[older & (shared.end < shared.instants)].tolist()
    assert freed_older == loop_analysis(entries, 7)["older"]


def test_an_address_allocated_twice_is_one_block_to_the_analysis_and_two_to_the_replay():
    # GIVEN 100 bytes, then 30 at the same address with no free between, then one free there
    trace = [
        {
            "action": "alloc",
            "addr": 64,
            "size": 100,
            "frames": [{"name": "a", "filename": "x.py", "line": 1}],
        },
        {"action": "alloc", "addr": 64, "size": 30, "frames": [{"name": "b", "filename": "x.py", "line": 2}]},
        {"action": "free_completed", "addr": 64, "size": 30},
    ]
    cols = read_columns(trace)
    # THEN the analysis holds only the later block after entry 1, and none after the free
    assert cols.index[cols.live_at(0)].tolist() == [0]
    assert cols.index[cols.live_at(1)].tolist() == [1]
    assert cols.index[cols.live_at(2)].tolist() == []
    assert cols.alive_at_end() == set()
    # AND the replay keeps the first alive to the end, the free closing the second
    assert cols.replay_ends(3).tolist() == [3, 2]
    assert cols.index[cols.older_frees()].tolist() == []


def test_frees_without_an_alloc_before_them_free_older_blocks():
    trace = [
        {"action": "free_completed", "addr": 8, "size": 5},
        {"action": "alloc", "addr": 8, "size": 7},
        {"action": "free_completed", "addr": 8, "size": 7},
        {"action": "free_completed", "addr": 8, "size": 9},
    ]
    cols = read_columns(trace)
    assert cols.index[cols.older_frees()].tolist() == [0, 3]
    assert cols.active().tolist() == [-5, 2, -5, -14]
    assert cols.replay_ends(4).tolist() == [2]


@pytest.mark.parametrize(
    ("size", "message"),
    [
        (1.5, r"device_traces\[0\]\[1\] \(alloc\): size must be an integer, got 1\.5"),
        (True, r"device_traces\[0\]\[1\] \(alloc\): size must be an integer, got True"),
        (-3, r"device_traces\[0\]\[1\] \(alloc\): size must be >= 0 bytes, got -3"),
        (1 << 70, r"device_traces\[0\]\[1\] \(alloc\): size must be below 2\*\*62"),
        (1 << 62, r"device_traces\[0\]: its sizes add up to more than 2\*\*62 bytes"),
    ],
)
def test_a_size_no_allocator_writes_is_refused_naming_the_entry(size, message):
    # (numpy alone would read 1.5 as 1 and True as 1)
    trace = [{"action": "alloc", "addr": 0, "size": 4}, {"action": "alloc", "addr": 8, "size": size}]
    with pytest.raises(BadEntry, match=message):
        read_columns(trace)
    with pytest.raises(ArtifactError, match=r"snap\.pickle: malformed allocator snapshot"):
        analyze({"segments": [], "device_traces": [trace]}, "snap.pickle")


@pytest.mark.parametrize(("addr", "shown"), [("0x10", "'0x10'"), (None, "None"), (1 << 64, str(1 << 64))])
def test_an_address_that_is_no_integer_is_refused_naming_the_entry(addr, shown):
    trace = [{"action": "alloc", "addr": 0, "size": 4}, {"action": "free_completed", "addr": addr, "size": 4}]
    want = rf"device_traces\[0\]\[1\] \(free_completed\): addr must be an integer, got {re.escape(shown)}"
    with pytest.raises(BadEntry, match=want):
        read_columns(trace)


def test_an_empty_trace_has_empty_columns():
    cols = read_columns([])
    assert (cols.entries, cols.active().size, cols.index.size, cols.alive_at_end()) == (0, 0, 0, set())


def test_the_page_from_the_analysis_columns_is_the_page_the_replay_reads_itself():
    from memprofiler.analysis.snapshot.summary import analyze_columns, load_snapshot
    from memprofiler.reporters.explorer.page import build_explorer

    # GIVEN the real capture
    path = str(Path(__file__).parents[1] / "fixtures" / "gpu_transformer_forward_mixed.pickle")
    data = load_snapshot(path)
    # WHEN it is analysed, and the page is built from the analysis's columns and without them
    analysis, columns = analyze_columns(data, path)
    assert list(columns) == [0] and columns[0].entries == len(data["device_traces"][0])
    shared = build_explorer(data, path, analysis, columns=columns)
    # THEN the pages are the same, and the analysis is the one analyze() gives
    assert shared == build_explorer(data, path, analyze(data, path))


def sizes_read_one_by_one(sizes: list[Any]) -> list[int] | str:
    """Each size checked in turn, as read_columns refuses them: the first that is no ``int``
    (a ``bool`` neither); else the first outside an int64; else the first below 0."""
    for k, v in enumerate(sizes):
        if type(v) is not int:
            return f"[{k}] (alloc): size must be an integer, got {v!r}"
    for v in sizes:
        if not -(1 << 63) <= v < 1 << 63:
            first = next(j for j, w in enumerate(sizes) if not -(1 << 62) <= w < 1 << 62)
            return f"[{first}] (alloc): size must be below 2**62, got {sizes[first]}"
    for k, v in enumerate(sizes):
        if v < 0:
            return f"[{k}] (alloc): size must be >= 0 bytes, got {v}"
    return sizes


@pytest.mark.parametrize("seed", range(40))
def test_sizes_are_read_or_refused_as_one_by_one_checks_do(seed):
    # GIVEN sizes mostly valid, with now and then a value no allocator writes (a bool, a float,
    # a string, None, one past an int64, a negative one, 0 and 1 among them)
    rng = random.Random(seed)
    odd = [True, False, 1.5, 2.0, "3", None, 1 << 70, 1 << 63, -3, 0, 1, (1 << 62) - 1]
    sizes = [rng.choice(odd) if rng.random() < 0.02 else rng.randrange(2, 1 << 30) for _ in range(100)]
    trace = [{"action": "alloc", "addr": 8 * k, "size": s} for k, s in enumerate(sizes)]
    want = sizes_read_one_by_one(sizes)
    # WHEN the columns are read, THEN they hold the sizes, or the first fault is named as the checks name it
    try:
        got: list[int] | str = read_columns(trace).size.tolist()
    except BadEntry as err:
        got = str(err).removeprefix("device_traces[0]")
    if isinstance(want, list) and sum(want) >= 1 << 62:
        want = ": its sizes add up to more than 2**62 bytes"
    assert got == want
