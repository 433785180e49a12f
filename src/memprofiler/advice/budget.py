"""The memory budget: parsed, and checked against the device it is meant for."""

from __future__ import annotations

from memprofiler.errors import ConfigError
from memprofiler.units import format_bytes, parse_size

GiB = 1 << 30
#: Memory of each GPU ``estimate`` names (its largest board), as sold, taken as GiB: a budget
#: above it is a typo. (An H100 reports 79.2 GiB to torch; ``80GiB`` is still accepted.)
DEVICE_MEMORY_GIB: dict[str, int] = {
    "V100": 32,
    "T4": 16,
    "A100": 80,
    "A30": 24,
    "A10": 24,
    "A10G": 24,
    "A40": 48,
    "RTX3090": 24,
    "L4": 24,
    "L40": 48,
    "L40S": 48,
    "RTX4090": 24,
    "H100": 80,
    "H100PCIE": 80,
    "H100NVL": 94,
    "H200": 141,
    "GH200": 144,
    "B200": 192,
    "GB200": 192,
    "B300": 288,
    "RTX5090": 32,
}


def parse_budget(budget: int | float | str, gpu_name: str, key: str = "budget") -> int:
    """Bytes of ``budget`` (``80GiB`` or a number); one line when it is 0 or above ``gpu_name``'s memory."""
    value = int(parse_size(str(budget), key)) if isinstance(budget, str) else budget
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ConfigError(key, f"got {budget!r}; use the memory one device may take, e.g. 80GiB")
    limit = DEVICE_MEMORY_GIB.get(gpu_name)
    if limit is not None and value > limit * GiB:
        raise ConfigError(
            key,
            f"got {format_bytes(value)}, more than the {limit} GiB of an {gpu_name}; use at most {limit}GiB "
            "or name the GPU you target (`gpu`)",
        )
    return int(value)
