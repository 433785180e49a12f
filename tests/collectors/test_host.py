"""Host RSS: the in-call peak is real, not a sample at the two ends."""

from __future__ import annotations

import time

import pytest
import torch

from memprofiler import MemProfiler
from memprofiler.collectors.host import HostCollector, clear_refs_supported

MiB = 2**20


def _alloc_and_free(hold_s: float = 0.0) -> None:
    t = torch.ones(256 * MiB // 4, dtype=torch.float32)  # touches every page: 256 MiB resident
    if hold_s:
        time.sleep(hold_s)
    del t


METHODS = [
    pytest.param(
        "clear_refs", marks=pytest.mark.skipif(not clear_refs_supported(), reason="no /proc/self/clear_refs")
    ),
    "sampler",
]


@pytest.mark.parametrize("method", METHODS)
def test_rss_peak_sees_a_freed_256_mib_tensor(tmp_path, method):
    # GIVEN a step that allocates and frees 256 MiB
    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1}, "rss_peak_method": method}, save_dir=tmp_path, rank=0
    ).setup()
    # WHEN it is collected (the sampler can only see a peak that lasts longer than its interval)
    with prof.profile("training_step"):
        _alloc_and_free(hold_s=0.05 if method == "sampler" else 0.0)
    start, end = prof.snapshots["0.training_step.1.start"], prof.snapshots["0.training_step.1.end"]
    # THEN the peak shows it while the end-to-end difference stays small
    assert end["rss_peak"] - start["rss"] >= 240 * MiB
    assert abs(end["rss"] - start["rss"]) < 32 * MiB
    assert end["rss_peak"] >= max(start["rss"], end["rss"])
    assert {"rss", "vms"} <= start.keys() and "rss_peak" not in start


def test_auto_prefers_clear_refs_where_it_works():
    assert HostCollector("auto").method == ("clear_refs" if clear_refs_supported() else "sampler")


def test_sampler_thread_exists_only_during_collected_calls(tmp_path):
    import threading

    prof = MemProfiler(
        {"schedule": {"warmup": 0, "active": 1}, "rss_peak_method": "sampler"}, save_dir=tmp_path, rank=0
    ).setup()

    def samplers() -> int:
        return sum(t.name == "memprofiler-rss-sampler" for t in threading.enumerate())

    with prof.profile("training_step"):
        assert samplers() == 1
    assert samplers() == 0
    with prof.profile("training_step"):  # outside the window
        assert samplers() == 0
