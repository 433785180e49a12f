"""The CUDA device an estimate is made for: its compute capability and the torch that will run.

A laptop estimates for a cluster, so the target is an input, not the machine the estimate runs
on: ``gpu="H100"``, ``"A100"``, ``"H200"``, ``"sm90"`` or ``"9.0"``. Without one the local GPU
is used when this torch sees one, else :data:`DEFAULT_GPU`; every estimate names the target it
assumed. The torch version decides which of torch's rules apply (workspace defaults changed
between releases); it defaults to the torch installed here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import NamedTuple

import torch

from memprofiler.errors import ConfigError


class Gpu(NamedTuple):
    """What an estimate needs to know of a GPU model: its compute capability and SM count."""

    capability: tuple[int, int]
    sms: int
    """Streaming multiprocessors (``multiProcessorCount``), from NVIDIA's data sheets."""


#: The GPUs a user names most often: compute capability (major, minor) and SM count (the SXM or
#: flagship board where a model comes in several: ``H100`` is the SXM part, 132 SMs).
GPUS: dict[str, Gpu] = {
    "V100": Gpu((7, 0), 80),
    "T4": Gpu((7, 5), 40),
    "A100": Gpu((8, 0), 108),
    "A30": Gpu((8, 0), 56),
    "A10": Gpu((8, 6), 72),
    "A10G": Gpu((8, 6), 80),
    "A40": Gpu((8, 6), 84),
    "RTX3090": Gpu((8, 6), 82),
    "L4": Gpu((8, 9), 58),
    "L40": Gpu((8, 9), 142),
    "L40S": Gpu((8, 9), 142),
    "RTX4090": Gpu((8, 9), 128),
    "H100": Gpu((9, 0), 132),
    "H100PCIE": Gpu((9, 0), 114),
    "H100NVL": Gpu((9, 0), 132),
    "H200": Gpu((9, 0), 132),
    "GH200": Gpu((9, 0), 132),
    "B200": Gpu((10, 0), 148),
    "GB200": Gpu((10, 0), 148),
    "B300": Gpu((10, 3), 148),
    "RTX5090": Gpu((12, 0), 170),
}
#: Resident threads per SM (``maxThreadsPerMultiProcessor``) by compute capability (CUDA
#: programming guide, "Compute Capabilities"); one not listed is taken as 2048.
THREADS_PER_SM: dict[tuple[int, int], int] = {
    (7, 0): 2048,
    (7, 5): 1024,
    (8, 0): 2048,
    (8, 6): 1536,
    (8, 7): 1536,
    (8, 9): 1536,
    (9, 0): 2048,
    (10, 0): 2048,
    (10, 3): 2048,
    (12, 0): 1536,
}
#: The target assumed when none is named and this machine has no GPU.
DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class CudaTarget:
    """A CUDA device and torch release an estimate models.

    Example:
        >>> t = resolve_target("H200", torch_version="2.11.0")
        >>> (t.name, t.capability, t.torch_version, t.sms, t.threads_per_sm)
        ('H200', (9, 0), (2, 11), 132, 2048)
    """

    name: str
    capability: tuple[int, int]
    torch_version: tuple[int, int]
    sms: int
    """Streaming multiprocessors: CUDA reductions size their grids (and global scratch) by them."""
    threads_per_sm: int
    """Resident threads per SM (``maxThreadsPerMultiProcessor``)."""
    how: str = "named"
    """``named`` (``gpu=``), ``local`` (this machine's GPU) or ``default`` (:data:`DEFAULT_GPU`)."""

    @property
    def sm(self) -> str:
        return f"sm{self.capability[0]}{self.capability[1]}"

    def describe(self) -> str:
        """``H200 (sm90), torch 2.11`` and how it was chosen, for the output's first note."""
        why = {
            "named": "",
            "local": ", this machine's GPU",
            "default": ", the default (no GPU here; set `gpu`)",
        }
        major, minor = self.torch_version
        return f"{self.name} ({self.sm}), torch {major}.{minor}{why.get(self.how, '')}"


def parse_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11)``."""
    found = re.match(r"\s*(\d+)\.(\d+)", str(text))
    if not found:
        raise ConfigError("torch_version", f"got {text!r}; use a release such as 2.11")
    return int(found.group(1)), int(found.group(2))


def sms_for(capability: tuple[int, int]) -> int:
    """The SM count assumed for a target named by compute capability: the first GPU of :data:`GPUS`
    with that capability, else with that major version, else :data:`DEFAULT_GPU`'s."""
    for gpu in GPUS.values():
        if gpu.capability == capability:
            return gpu.sms
    for gpu in GPUS.values():
        if gpu.capability[0] == capability[0]:
            return gpu.sms
    return GPUS[DEFAULT_GPU].sms


def threads_per_sm(capability: tuple[int, int]) -> int:
    """Resident threads per SM for ``capability`` (:data:`THREADS_PER_SM`, else 2048)."""
    return THREADS_PER_SM.get(capability, 2048)


def _lookup(text: str) -> tuple[str, Gpu] | None:
    key = re.sub(r"[\s_-]", "", text).upper().removeprefix("NVIDIA")
    for name, gpu in GPUS.items():  # "NVIDIA H100 80GB HBM3" -> H100
        if key == name or (key.startswith(name) and not key[len(name) : len(name) + 1].isalpha()):
            return name, gpu
    found = re.fullmatch(r"(?:SM_?)?(\d{1,2})\.?(\d)", key)
    if found:
        cap = (int(found.group(1)), int(found.group(2)))
        return f"sm{cap[0]}{cap[1]}", Gpu(cap, sms_for(cap))
    return None


def resolve_target(gpu: str | None = None, torch_version: str | None = None) -> CudaTarget:
    """The target for ``gpu`` (a name or compute capability), else this GPU, else the default."""
    version = parse_version(torch_version or torch.__version__)
    if gpu:
        found = _lookup(gpu)
        if found is None:
            known = ", ".join(GPUS)
            raise ConfigError(
                "gpu", f"got {gpu!r}; use one of {known} or a compute capability such as 9.0 or sm90"
            )
        name, spec = found
        return CudaTarget(name, spec.capability, version, spec.sms, threads_per_sm(spec.capability), "named")
    local = _local_gpu()
    if local is not None:
        return CudaTarget(local[0], local[1].capability, version, local[1].sms, local[2], "local")
    spec = GPUS[DEFAULT_GPU]
    return CudaTarget(
        DEFAULT_GPU, spec.capability, version, spec.sms, threads_per_sm(spec.capability), "default"
    )


def _local_gpu() -> tuple[str, Gpu, int] | None:
    """This machine's GPU 0 as (name, its capability and SM count, threads per SM), read from the
    device's properties; None where there is none or it cannot be read."""
    try:
        if not torch.cuda.is_available():
            return None
        props = torch.cuda.get_device_properties(0)
        cap = (int(props.major), int(props.minor))
        found = _lookup(str(props.name))
        sms = int(props.multi_processor_count)
        threads = int(getattr(props, "max_threads_per_multi_processor", 0)) or threads_per_sm(cap)
    except Exception:  # a CPU-only build told otherwise, a device id it does not have, a broken driver
        return None
    return (found[0] if found else f"sm{cap[0]}{cap[1]}"), Gpu(cap, sms), threads
