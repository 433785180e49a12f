"""The unified step timeline: Lightning hook spans, data-loader waits and sampled host metrics."""

from __future__ import annotations

from dataclasses import dataclass, field

from memprofiler import metrics
from memprofiler.errors import ConfigError

#: Host metrics the sampler can read, one or more counter tracks each:
#: ``cpu`` (system and process CPU %), ``memory`` (system used bytes and %), ``disk`` (read and
#: write bytes/s), ``network`` (sent and received bytes/s), ``rss`` (this process's RSS).
HOST_METRICS = metrics.HOST_GROUPS


@dataclass
class TimelineConfig:
    """What the extended profiler adds to its traces besides operators and memory.

    On by default: recording a hook's start and end is two clock reads, and the host sampler
    is a thread that sleeps between samples (about 0.1 ms of work per sample).
    """

    enabled: bool = True
    """Record the step timeline at all."""
    hooks: bool = True
    """A span per Lightning hook and callback call of every step (``[Callback]X.on_...``)."""
    dataloader: bool = True
    """A span per wait for the next batch, on its own ``data loader`` row."""
    host_interval_s: float = 0.5
    """Seconds between two host samples; ``0`` turns the sampler off."""
    host_metrics: list[str] = field(default_factory=lambda: list(HOST_METRICS))
    """Which host metrics to sample, from ``cpu``, ``memory``, ``disk``, ``network``, ``rss``."""
    max_events: int = 1_000_000
    """Spans and samples kept in memory before the oldest are dropped (a bounded footprint for
    very long runs); the per-rank timeline file is rewritten at every trace cycle."""

    def __post_init__(self) -> None:
        if self.host_interval_s < 0:
            raise ConfigError("host_interval_s", f"got {self.host_interval_s}; must be >= 0 (0 = off)")
        if 0 < self.host_interval_s < 0.01:
            raise ConfigError(
                "host_interval_s", f"got {self.host_interval_s}; must be >= 0.01 s (sampling costs CPU)"
            )
        for i, name in enumerate(self.host_metrics):
            if name not in HOST_METRICS:
                raise ConfigError(
                    f"host_metrics[{i}]", f"unknown metric {name!r}; allowed: {', '.join(HOST_METRICS)}"
                )
        if self.max_events < 1:
            raise ConfigError("max_events", f"got {self.max_events}; must be >= 1")

    @property
    def samples_host(self) -> bool:
        return self.enabled and self.host_interval_s > 0 and bool(self.host_metrics)
