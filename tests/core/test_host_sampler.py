"""HostSampler: values against psutil, rates from counter deltas, clean stop, a failing group dropped."""

from __future__ import annotations

import threading
import time

import psutil
import pytest

from memprofiler.config.timeline import TimelineConfig
from memprofiler.core.host_sampler import TRACKS, HostSampler
from memprofiler.errors import ConfigError


def _alive() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "memprofiler-host-sampler"]


def test_samples_every_track_on_the_epoch_clock_and_stops_cleanly():
    # GIVEN a fast sampler of every group
    t0 = time.time_ns()
    with HostSampler(0.01) as sampler:
        time.sleep(0.1)
        ballast = bytearray(64 << 20)  # 64 MiB the RSS track must see
        ballast[::4096] = b"\1" * len(ballast[::4096])
        time.sleep(0.1)
    t1 = time.time_ns()
    # THEN the thread is gone, and samples lie inside the block, in time order
    assert not _alive()
    times = [t for t, _ in sampler.samples]
    assert len(times) >= 5 and times == sorted(times) and t0 <= times[0] and times[-1] <= t1
    # AND every track appears (rates from the second sample on), with sane values
    seen = {k for _, values in sampler.samples for k in values}
    assert seen == {track for group in TRACKS.values() for track in group}
    rss = [v["process.rss"] for _, v in sampler.samples]
    assert max(rss) - min(rss) >= 60 << 20
    assert abs(rss[-1] - psutil.Process().memory_info().rss) < 16 << 20
    assert all(v >= 0 for _, values in sampler.samples for v in values.values())
    del ballast


def test_rates_are_counter_deltas_over_time(monkeypatch):
    # GIVEN network counters that grow 1000 bytes between two samples 0.5 s apart
    counters = iter([(0, 0), (1000, 4000)])
    clock = iter([10_000_000_000, 10_500_000_000])

    class Net:
        def __init__(self, sent: int, recv: int) -> None:
            self.bytes_sent, self.bytes_recv = sent, recv

    monkeypatch.setattr(psutil, "net_io_counters", lambda: Net(*next(counters)))
    monkeypatch.setattr(time, "time_ns", lambda: next(clock))
    sampler = HostSampler(0.5, ["network"])
    # WHEN sampled twice THEN the first has no rate and the second is bytes per second
    assert sampler.sample() is None
    assert sampler.sample() == (10_500_000_000, {"host.net_sent": 2000.0, "host.net_recv": 8000.0})


def test_a_failing_group_is_dropped_with_one_message_and_the_rest_go_on(monkeypatch):
    messages: list[str] = []

    def broken() -> None:
        raise PermissionError("no /proc/diskstats")

    monkeypatch.setattr(psutil, "disk_io_counters", broken)
    sampler = HostSampler(0.5, ["disk", "rss"], on_error=messages.append)
    sampler.sample()
    sampler.sample()
    assert sampler.metrics == ["rss"]
    assert len(messages) == 1 and "cannot read disk (PermissionError" in messages[0]
    assert all(set(v) == {"process.rss"} for _, v in sampler.samples)


def test_stop_is_idempotent_and_unknown_metrics_are_refused():
    sampler = HostSampler(0.01, ["rss"]).start()
    sampler.stop()
    sampler.stop()
    assert not sampler.running
    with pytest.raises(ValueError, match="unknown host metric 'gpu'"):
        HostSampler(0.5, ["gpu"])


@pytest.mark.parametrize(
    ("kwargs", "key"),
    [
        ({"host_interval_s": -1}, "host_interval_s"),
        ({"host_interval_s": 0.001}, "host_interval_s"),
        ({"host_metrics": ["cpu", "gpu"]}, "host_metrics[1]"),
        ({"max_events": 0}, "max_events"),
    ],
)
def test_timeline_config_checks_name_the_key(kwargs, key):
    with pytest.raises(ConfigError, match=rf"^`{key.replace('[', '[[]')}`"):
        TimelineConfig(**kwargs)
    assert not TimelineConfig(host_interval_s=0).samples_host


def test_permission_denied_on_proc_at_start_drops_those_groups_and_the_rest_go_on(monkeypatch):
    # GIVEN a locked-down /proc: the process entry and the CPU counters refuse to be read
    def denied(*args: object, **kwargs: object) -> None:
        raise PermissionError(13, "Permission denied", "/proc/self/stat")

    monkeypatch.setattr(psutil, "Process", denied)
    monkeypatch.setattr(psutil, "cpu_percent", denied)
    messages: list[str] = []
    # WHEN built and started THEN nothing raises
    sampler = HostSampler(0.01, ["cpu", "memory", "rss"], on_error=messages.append).start()
    try:
        time.sleep(0.05)
    finally:
        sampler.stop()
    # AND cpu and rss are dropped with one line each, memory goes on with psutil's own values
    assert sampler.metrics == ["memory"]
    assert len(messages) == 2 and all("PermissionError" in m and "dropped" in m for m in messages)
    assert "cannot read cpu" in messages[0] and "cannot read rss" in messages[1]
    assert sampler.samples and all(
        set(v) == {"host.memory_used", "host.memory_percent"} for _, v in sampler.samples
    )


def test_permission_denied_mid_run_drops_only_that_group(monkeypatch):
    sampler = HostSampler(0.5, ["memory", "rss"], on_error=(messages := []).append)
    assert set(sampler.sample()[1]) == {"host.memory_used", "host.memory_percent", "process.rss"}

    def denied() -> None:
        raise PermissionError("/proc/meminfo")

    monkeypatch.setattr(psutil, "virtual_memory", denied)
    sampler.sample()
    sampler.sample()
    assert sampler.metrics == ["rss"] and len(messages) == 1
    assert set(sampler.samples[-1][1]) == {"process.rss"}


@pytest.mark.parametrize("bad", [None, float("nan"), float("inf"), True])
def test_values_that_are_no_finite_number_are_never_kept(monkeypatch, bad):
    # GIVEN psutil handing a non-finite (or no) value for one track mid-run
    class VM:
        total, available, percent = 8 << 30, 6 << 30, bad

    monkeypatch.setattr(psutil, "virtual_memory", VM)
    messages: list[str] = []
    sampler = HostSampler(0.5, ["memory"], on_error=messages.append)
    # WHEN sampled twice THEN the good track is kept, the bad one skipped with one message
    sampler.sample()
    sampler.sample()
    assert [v for _, v in sampler.samples] == [{"host.memory_used": float(2 << 30)}] * 2
    assert len(messages) == 1 and messages[0].startswith(f"host sampler: host.memory_percent read {bad!r}")
    assert sampler.metrics == ["memory"]
