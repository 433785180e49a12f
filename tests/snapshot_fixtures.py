"""Hand-built allocator snapshots in torch's ``_snapshot()`` layout, with answers worked out by hand.

``known_snapshot()`` (device 0), in bytes (KiB = 1024); every block is requested at its
rounded size here (``rounded_snapshot()`` below is where they differ):

segments at snapshot time
  A @1_000_000  2 MiB: P1 512 KiB live (pre-trace, stack `init_weights`), 512 KiB free, B3 1 MiB live
  B @5_000_000  1 MiB: all free (allocated by the trace)
  C @8_000_000  1 MiB: 256 KiB free, P2 256 KiB live (pre-trace, no stack), 512 KiB free

trace                                         allocated (relative)   reserved (relative)
  0 segment_alloc B 1 MiB                       0                      +1 MiB
  1 alloc B1 256 KiB (stack s1)                 256 KiB
  2 alloc B2 256 KiB (stack s2)                 512 KiB
  3 free_requested PF 128 KiB (pre-trace)
  4 free_completed PF 128 KiB                   384 KiB
  5 alloc B3 1 MiB (stack s1)                   1408 KiB  <- peak
  6 free_requested B1
  7 free_completed B1                           1152 KiB
  8 free_completed B2                           896 KiB
  9 oom 8 GiB requested, 1000 B free
 10 segment_alloc D 2 MiB                                              +3 MiB  <- peak
 11 segment_free D 2 MiB                                               +1 MiB

baseline (alive before the trace) = P1 + P2 + PF = 512 + 256 + 128 KiB = 896 KiB
peak allocated = 896 + 1408 KiB = 2304 KiB = 2_359_296 at entry 5
live at the peak: s1 = B1 + B3 = 1280 KiB (2 blocks), init_weights = 512 KiB, s2 = 256 KiB,
                  no stack = 256 KiB; sum = 2304 KiB
end allocated = 896 + 896 KiB = 1792 KiB = P1 + B3 + P2
reserved now = 4 MiB; before the trace = 4 - 1 = 3 MiB; peak = 3 + 3 = 6 MiB at entry 10
segment C fragmentation = 1 - 512 / 768 = 1/3
"""

from __future__ import annotations

from typing import Any

KiB = 1024
MiB = 1024 * KiB


def _frames(*names: str) -> list[dict[str, Any]]:
    # torch puts C++ frames around the Python ones; the analysis keeps the Python ones.
    py = [{"filename": f"/src/train/{n}.py", "line": 10 + i, "name": n} for i, n in enumerate(names)]
    return [{"filename": "CUDACachingAllocator.cpp", "line": 0, "name": "malloc"}, *py]


S1 = _frames("linear_forward", "model_forward", "training_step")
S2 = _frames("attention_forward", "model_forward", "training_step")
INIT = _frames("init_weights", "build_model")


def _block(
    addr: int, size: int, state: str, frames: list[dict[str, Any]] | None = None, requested: int | None = None
) -> dict[str, Any]:
    return {
        "address": addr,
        "size": size,
        "requested_size": size if requested is None else requested,
        "state": state,
        "frames": frames or [],
    }


def _seg(addr: int, blocks: list[dict[str, Any]], device: int = 0) -> dict[str, Any]:
    total = sum(b["size"] for b in blocks)
    live = [b for b in blocks if b["state"] != "inactive"]
    return {
        "device": device,
        "address": addr,
        "total_size": total,
        "allocated_size": sum(b["size"] for b in live),
        "active_size": sum(b["size"] for b in live),
        "requested_size": sum(b["requested_size"] for b in live),
        "stream": 0,
        "segment_type": "large",
        "segment_pool_id": (0, 0),
        "is_expandable": False,
        "frames": [],
        "blocks": blocks,
    }


def _e(
    action: str, addr: int, size: int, t: int, frames: list[dict[str, Any]] | None = None, **extra: Any
) -> dict[str, Any]:
    return {
        "action": action,
        "addr": addr,
        "size": size,
        "stream": 0,
        "time_us": t,
        "frames": frames or [],
        **extra,
    }


def known_snapshot() -> dict[str, Any]:
    a, b, c, d = 1_000_000, 5_000_000, 8_000_000, 12_000_000
    segments = [
        _seg(
            a,
            [
                _block(a, 512 * KiB, "active_allocated", INIT),
                _block(a + 512 * KiB, 512 * KiB, "inactive"),
                _block(a + MiB, MiB, "active_allocated", S1),
            ],
        ),
        _seg(b, [_block(b, MiB, "inactive")]),
        _seg(
            c,
            [
                _block(c, 256 * KiB, "inactive"),
                _block(c + 256 * KiB, 256 * KiB, "active_allocated"),
                _block(c + 512 * KiB, 512 * KiB, "inactive"),
            ],
        ),
    ]
    pf = a + 512 * KiB  # freed pre-trace block, since merged into A's free block
    trace = [
        _e("segment_alloc", b, MiB, 100),
        _e("alloc", b, 256 * KiB, 110, S1),
        _e("alloc", b + 256 * KiB, 256 * KiB, 120, S2),
        _e("free_requested", pf, 128 * KiB, 130, INIT),
        _e("free_completed", pf, 128 * KiB, 131, INIT),
        _e("alloc", a + MiB, MiB, 140, S1),
        _e("free_requested", b, 256 * KiB, 150, S1),
        _e("free_completed", b, 256 * KiB, 151, S1),
        _e("free_completed", b + 256 * KiB, 256 * KiB, 160, S2),
        _e("oom", 0, 8 * 1024 * MiB, 170, S2, device_free=1000),
        _e("segment_alloc", d, 2 * MiB, 180),
        _e("segment_free", d, 2 * MiB, 190),
    ]
    return {"segments": segments, "device_traces": [trace], "allocator_settings": {"max_split_size": -1}}


#: The answers above, for assertions.
KNOWN = {
    "baseline": 896 * KiB,
    "peak_allocated": 2_359_296,
    "peak_index": 5,
    "peak_time_us": 140,
    "end_allocated": 1792 * KiB,
    "peak_reserved": 6 * MiB,
    "peak_reserved_index": 10,
    "end_reserved": 4 * MiB,
    "total_reserved": 4 * MiB,
    "stacks": [(1280 * KiB, 2), (512 * KiB, 1), (256 * KiB, 1), (256 * KiB, 1)],
}


def trace_only_snapshot() -> dict[str, Any]:
    """No segments (e.g. history captured with segments dropped): everything is in the trace.

    allocs 100, 200, free 100, alloc 50 -> peak 300 at entry 1, end 250.
    """
    t = [
        _e("alloc", 1, 100, 1, S1),
        _e("alloc", 2, 200, 2, S2),
        _e("free_completed", 1, 100, 3, S1),
        _e("alloc", 3, 50, 4, S1),
    ]
    return {"segments": [], "device_traces": [[], t]}


ROUND_BASE = 0x100000


def rounded_snapshot() -> dict[str, Any]:
    """Requested sizes differ from the rounded block sizes, as on a real GPU.

    One 2 MiB segment at ``ROUND_BASE`` (offsets in bytes):

    block  offset  rounded  requested  state at the end       origin
      A        0    1024       1000    active_allocated       pre-trace (stack INIT)
      P     1024    1024        700    inactive               pre-trace, freed in the trace
      B     2048     512          4    active_allocated       trace (S2)
      C     2560    3072       3000    inactive               trace (S1), freed
      D     5632    2048       2000    active_pending_free    trace (S1), free requested only
      rest  7680    2 MiB - 7680       inactive

    torch writes requested sizes into trace entries:

      0 alloc B 4                 rel 4
      1 free_requested P 700
      2 free_completed P 700      rel -696
      3 alloc C 3000              rel 2304
      4 alloc D 2000              rel 4304   <- peak
      5 free_requested C 3000
      6 free_completed C 3000     rel 1304
      7 free_requested D 2000     rel 1304   (D is still active until free_completed)

    baseline = A + P = 1000 + 700 = 1700 requested bytes
    peak = 1700 + 4304 = 6004 at entry 4: A 1000 (INIT) + B 4 (S2) + C 3000 + D 2000 (S1 5000)
    end = 1700 + 1304 = 3004 = A + B + D requested; the segment's rounded allocated bytes are
    1024 + 512 + 2048 = 3584. (Mixing rounded pre-trace blocks with requested trace sizes
    gives baseline 1724, peak 6028, end 3028: neither figure.)
    """
    o = ROUND_BASE
    rest = 2 * MiB - 7680
    segments = [
        _seg(
            o,
            [
                _block(o, 1024, "active_allocated", INIT, requested=1000),
                _block(o + 1024, 1024, "inactive", requested=0),
                _block(o + 2048, 512, "active_allocated", S2, requested=4),
                _block(o + 2560, 3072, "inactive", requested=0),
                _block(o + 5632, 2048, "active_pending_free", S1, requested=2000),
                _block(o + 7680, rest, "inactive", requested=0),
            ],
        )
    ]
    trace = [
        _e("alloc", o + 2048, 4, 10, S2),
        _e("free_requested", o + 1024, 700, 20, INIT),
        _e("free_completed", o + 1024, 700, 21, INIT),
        _e("alloc", o + 2560, 3000, 30, S1),
        _e("alloc", o + 5632, 2000, 40, S1),
        _e("free_requested", o + 2560, 3000, 50, S1),
        _e("free_completed", o + 2560, 3000, 51, S1),
        _e("free_requested", o + 5632, 2000, 60, S1),
    ]
    return {"segments": segments, "device_traces": [trace]}
