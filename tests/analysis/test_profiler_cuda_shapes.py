"""Views of CUDA-shaped Kineto traces: the two hand-built fixtures (see tests/fixtures/README.md).

Rank 0's step runs 1000-2000 µs: sgemm kernel 1400-1650 (launched by aten::addmm inside
aten::linear), NCCL all-reduce kernel 1600-1800, memcpy 1660-1700 and memset 1700-1710
(hidden by kernels), cudaLaunchKernel 1200-1220, host operators 1100-1400 and 1500-1550.
Rank 1 is the same with a 450 µs sgemm and a 1200 µs step.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from memprofiler.analysis.traces.views import build_views, trace_view

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RANK0 = FIXTURES / "kineto_cuda_worker0.pt.trace.json"
RANK1 = FIXTURES / "kineto_cuda_worker1.pt.trace.json"


def test_step_breakdown_counts_each_microsecond_once_in_priority_order():
    (step,) = trace_view(RANK0).steps
    assert step.step == "ProfilerStep#1" and step.total_us == 1000
    # kernel: union of sgemm and NCCL, 1400-1800; memcpy and memset lie under kernels;
    # runtime 1200-1220; host compute: 1100-1400 less the runtime call (1500-1550 is under a kernel)
    assert step.parts == {
        "kernel": 400,
        "memcpy": 0,
        "memset": 0,
        "runtime": 20,
        "data loading": 0,
        "host compute": 280,
        "other": 300,
    }


def test_kernels_reach_their_operator_through_external_id():
    view = trace_view(RANK0)
    ops = {r.name: r for r in view.ops}
    assert view.has_device_time
    assert ops["aten::addmm"].device_self_us == 250
    # the memcpy carries aten::linear's External id; the sgemm comes from its child
    assert ops["aten::linear"].device_self_us == 40
    assert ops["aten::linear"].device_total_us == 290
    assert ops["c10d::allreduce_"].device_self_us == 200
    assert ops["aten::addmm"].shapes == [("[[256], [64, 256], [256, 256], [], []]", 1)]
    assert ops["aten::linear"].host_self_us == 100 and ops["aten::linear"].host_total_us == 300


def test_cuda_memory_events_make_a_gpu0_view():
    view = trace_view(RANK0)
    (gpu,) = view.devices
    assert gpu.memory.device == "GPU0"
    assert (gpu.memory.peak_allocated, gpu.memory.peak_ms, gpu.memory.peak_reserved) == (69632, 0.16, 2097152)
    (pair,) = gpu.pairs
    assert (pair.op, pair.size, pair.alloc_ms, pair.release_ms) == ("aten::addmm", 65536, 0.16, 0.9)
    assert pair.duration_ms == pytest.approx(0.74)
    stats = {s.name: s for s in gpu.stats}
    assert (stats["aten::addmm"].calls, stats["aten::addmm"].self_increase) == (1, 65536)
    assert (stats["aten::linear"].increase, stats["aten::linear"].self_increase) == (65536, 0)


def test_two_ranks_give_the_distributed_view_and_name_the_slowest():
    views = build_views([RANK0, RANK1])
    assert views is not None
    assert [t.rank for t in views.traces] == [0, 1]  # from the distributedInfo header
    r0, r1 = views.ranks
    assert (r0.source, r0.step_us, r0.computation_us, r0.overlap_us, r0.communication_us, r0.other_us) == (
        "device", 1000, 200, 50, 150, 600,
    )  # fmt: skip
    assert (r1.step_us, r1.computation_us, r1.overlap_us, r1.communication_us, r1.other_us) == (
        1200, 250, 200, 0, 750,
    )  # fmt: skip
    assert views.slowest is r1
