"""Compare the profiler traces of two runs by operator and by module: time and memory deltas."""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.analysis.traces.ops import OpRow
from memprofiler.analysis.traces.views import ProfilerViews, merged_rows


@dataclass(frozen=True)
class OpDelta:
    """One operator (or module) in run A and run B (``None`` where a run lacks it); deltas are B - A."""

    name: str
    a: OpRow | None
    b: OpRow | None

    def _d(self, attr: str) -> float:
        return float(getattr(self.b, attr, 0) if self.b else 0) - float(
            getattr(self.a, attr, 0) if self.a else 0
        )

    @property
    def host_self_us(self) -> float:
        return self._d("host_self_us")

    @property
    def host_total_us(self) -> float:
        return self._d("host_total_us")

    @property
    def device_total_us(self) -> float:
        return self._d("device_total_us")

    @property
    def alloc_bytes(self) -> int:
        return int(self._d("alloc_bytes"))

    @property
    def calls(self) -> int:
        return int(self._d("calls"))


def diff_views(a: ProfilerViews, b: ProfilerViews, modules: bool = False) -> list[OpDelta]:
    """Every operator (``modules``: module) of either run, largest change of host self plus device time first."""
    ra, rb = merged_rows(a.traces, modules), merged_rows(b.traces, modules)
    rows = [OpDelta(n, ra.get(n), rb.get(n)) for n in sorted(set(ra) | set(rb))]
    return sorted(
        rows, key=lambda d: (-(abs(d.host_self_us) + abs(d.device_total_us)), -abs(d.alloc_bytes), d.name)
    )
