"""Human byte units: parse ``2GiB`` / ``300MiB`` / ``1.5GB`` and format byte counts back."""

from __future__ import annotations

import math
import re

from memprofiler.errors import ConfigError

#: The one unit table: binary units by name, smallest first. Formatting walks it, parsing and
#: the config's ``module_mem_units`` are derived from it.
BINARY_UNITS: dict[str, int] = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40, "PiB": 2**50}
#: Units of the module-wise tracker's ``.log`` reports (``module_mem_units``).
MEM_UNITS: dict[str, int] = {u: BINARY_UNITS[u] for u in ("B", "KiB", "MiB", "GiB")}
#: Parsing, case-insensitive: the binary units, ``K``/``M``/``G``/``T`` alone as binary (as in
#: ``ulimit`` and most memory tools), and the decimal ``KB``/``MB``/``GB``/``TB``.
_FACTORS: dict[str, int] = {
    "": 1,
    **{u.lower(): f for u, f in BINARY_UNITS.items() if u != "PiB"},
    **{u[0].lower(): f for u, f in BINARY_UNITS.items() if u not in ("B", "PiB")},
    **{f"{u[0].lower()}b": 1000 ** (i + 1) for i, u in enumerate(("KiB", "MiB", "GiB", "TiB"))},
}
_NUMBER = re.compile(r"^\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*([A-Za-z]*)\s*$")

#: Metric-name parts that mark a value as a byte count (everything else is shown as a plain number).
_BYTE_HINTS = (
    "bytes",
    "rss",
    "vms",
    "npp",
    "mem",
    "size",
    "free",
    "total",
    "reserved",
    "allocated",
    "fsdp.",
    "saved_tensors.by_module",
)
_COUNT_HINTS = ("count", "num_", "imbalance", "rank", "time", "calls", "_ns", "entries", "allocation.")
#: Families whose every leaf is bytes, whatever the module or category name in it says
#: (``saved_tensors.by_module.unet.time_embed.0`` is bytes although it contains "time").
_BYTE_PREFIXES = ("saved_tensors.by_module.", "fsdp.", "module_mem.")
#: CUDA ``memory_stats()`` families that count blocks, segments or events; their ``*_bytes``
#: siblings are caught by the "bytes" test first (``oversize_allocations.current`` is a count
#: although it contains "size").
_COUNT_PREFIXES = ("oversize_", "active.", "segment.", "inactive_split.", "allocation.", "num_")


_CUDA_POOLED = (
    "allocation",
    "segment",
    "active",
    "inactive_split",
    "allocated_bytes",
    "reserved_bytes",
    "active_bytes",
    "inactive_split_bytes",
    "requested_bytes",
)
#: Every flat key ``torch.cuda.memory_stats()`` documents, known without a device (budgets
#: check CUDA metric names for typos on CPU-only machines; the CUDA fake and benchmarks use it).
CUDA_MEMORY_STATS: tuple[str, ...] = (
    *(
        f"{stat}.{pool}.{kind}"
        for stat in _CUDA_POOLED
        for pool in ("all", "large_pool", "small_pool")
        for kind in ("current", "peak", "allocated", "freed")
    ),
    *(
        f"oversize_{s}.{k}"
        for s in ("allocations", "segments")
        for k in ("current", "peak", "allocated", "freed")
    ),
    "num_alloc_retries",
    "num_ooms",
    "num_sync_all_streams",
    "num_device_alloc",
    "num_device_free",
    "max_split_size",
)


def parse_size(text: str, key: str = "size") -> float:
    """Parse ``"2GiB"``, ``"300 MiB"``, ``"1.5GB"``, ``"4096"`` or ``"1e9"`` into a number of bytes.

    Args:
        text: the value; a bare number is taken as is (also right for non-byte metrics).
        key: named in the error message.

    Raises:
        ConfigError: the text is not a number with a known unit.

    Example:
        >>> parse_size("1.5GiB")
        1610612736.0
    """
    m = _NUMBER.match(str(text))
    unit = m.group(2).lower() if m else ""
    if m is None or unit not in _FACTORS:
        raise ConfigError(
            key,
            f"got {text!r}; expected a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB), e.g. 2GiB or 300MiB",
        )
    value = float(m.group(1)) * _FACTORS[unit]
    if not math.isfinite(value):
        raise ConfigError(key, f"got {text!r}; must be finite")
    if value < 0:
        raise ConfigError(key, f"got {text!r}; must not be negative")
    return value


def format_bytes(n: float | int | None) -> str:
    """``1610612736 -> "1.50 GiB"``; small values stay exact (``"512 B"``), ``None`` is ``"-"``."""
    if n is None:
        return "-"
    value = float(n)
    if not math.isfinite(value):
        return str(value)  # "nan", "inf", "-inf": an edited file, shown rather than crashing
    sign = "-" if value < 0 else ""
    value = abs(value)
    last = next(reversed(BINARY_UNITS))
    for unit in BINARY_UNITS:
        if value < 1024 or unit == last:
            if unit == "B":
                return f"{sign}{int(value)} B"
            return f"{sign}{value:.2f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def looks_like_bytes(metric: str) -> bool:
    """Whether a metric name holds bytes (``rss_peak``, ``allocated_bytes.all.peak``, ``fsdp.Activation``)."""
    name = str(metric).lower()
    if name.startswith(_BYTE_PREFIXES) or "bytes" in name:
        return True
    if name.startswith(_COUNT_PREFIXES):
        return False
    if any(h in name for h in _COUNT_HINTS):
        return False
    return any(h in name for h in _BYTE_HINTS)


def format_value(metric: str, value: float | int | None) -> str:
    """Bytes in human units when the metric holds bytes, else the number itself."""
    if value is None:
        return "-"
    if looks_like_bytes(metric):
        return format_bytes(value)
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, float) and not value.is_integer():
        return f"{value:.3g}"
    return f"{int(value):,}"
