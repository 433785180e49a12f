"""How much memory a GPU named on the command line has, and what a process loses to CUDA first.

``--gpu H100`` decides the kernels (:mod:`memprofiler.estimate.cuda.target`) and, from this
table, the memory the estimate must fit in. The totals are what torch reports for the device
(``torch.cuda.mem_get_info()``'s total, printed in its OOM message as "total capacity"), a
little under the marketed size: an H100 sold as 80 GB shows 81,559 MiB in ``nvidia-smi`` and
79.11 GiB to torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.errors import ConfigError

GiB = 2**30


@dataclass(frozen=True)
class DeviceMemory:
    """One GPU variant's memory as torch sees it."""

    variant: str
    """The variant the figure is for, as its name is printed (``H100 SXM 80 GB HBM3``)."""
    total: int
    """Bytes torch reports as the device's total."""
    source: str
    """Where the figure comes from."""


#: Variants by the name ``--gpu`` takes (:data:`target.GPUS`' keys). A variant not listed is
#: named with ``--device-memory``.
MEMORY: dict[str, DeviceMemory] = {
    "H100": DeviceMemory("H100 SXM 80 GB HBM3", int(79.11 * GiB), "torch's total capacity, 79.11 GiB"),
    "H200": DeviceMemory(
        "H200 141 GB HBM3e", 150_109_880_320, "measured on an H200 (tests/fixtures/gpu_oom_run)"
    ),
    "A100": DeviceMemory("A100 80 GB", int(79.15 * GiB), "torch's total capacity, 79.15 GiB"),
    "T4": DeviceMemory("T4 16 GB", int(14.75 * GiB), "torch's total capacity, 14.75 GiB"),
    "RTX4090": DeviceMemory("RTX 4090 24 GB", int(23.68 * GiB), "torch's total capacity, 23.68 GiB"),
}

#: What the CUDA context takes on the device before the first tensor (the driver's context,
#: torch's kernels loaded lazily, cuBLAS handles): about 500 MiB on an H100 with torch 2.x; a
#: typical figure, not measured by this estimate, counted unless ``--context 0``.
CUDA_CONTEXT = 512 * 2**20


def device_memory(gpu: str) -> DeviceMemory:
    """The memory of the variant ``gpu`` names (``H100``, ``h100``, ``NVIDIA H100 80GB HBM3``).

    Raises:
        ConfigError: a GPU without a known memory size: one line naming ``--device-memory``.

    Example:
        >>> device_memory("h100").variant
        'H100 SXM 80 GB HBM3'
    """
    from memprofiler.estimate.cuda.target import GPUS

    words = gpu.replace("-", " ").replace("_", " ").upper().split()
    while words and words[0] in ("NVIDIA", "TESLA", "GEFORCE"):
        words.pop(0)
    for n in range(len(words), 0, -1):
        name = "".join(words[:n])
        if name in GPUS:
            found = MEMORY.get(name)
            if found is None:
                break
            return found
    known = ", ".join(f"{k} ({v.variant})" for k, v in MEMORY.items())
    raise ConfigError(
        "--gpu",
        f"no memory size known for {gpu!r}; give it with --device-memory (e.g. 94GiB); known: {known}",
    )
