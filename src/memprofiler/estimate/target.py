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

import torch

from memprofiler.errors import ConfigError

#: Compute capability (major, minor) of the GPUs a user names most often.
GPUS: dict[str, tuple[int, int]] = {
    "V100": (7, 0),
    "T4": (7, 5),
    "A100": (8, 0),
    "A30": (8, 0),
    "A10": (8, 6),
    "A10G": (8, 6),
    "A40": (8, 6),
    "RTX3090": (8, 6),
    "L4": (8, 9),
    "L40": (8, 9),
    "L40S": (8, 9),
    "RTX4090": (8, 9),
    "H100": (9, 0),
    "H200": (9, 0),
    "GH200": (9, 0),
    "B200": (10, 0),
    "GB200": (10, 0),
    "B300": (10, 3),
    "RTX5090": (12, 0),
}
#: The target assumed when none is named and this machine has no GPU.
DEFAULT_GPU = "H100"


@dataclass(frozen=True)
class CudaTarget:
    """A CUDA device and torch release an estimate models.

    Example:
        >>> t = resolve_target("H200", torch_version="2.11.0")
        >>> (t.name, t.capability, t.torch_version)
        ('H200', (9, 0), (2, 11))
    """

    name: str
    capability: tuple[int, int]
    torch_version: tuple[int, int]
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


def _capability(text: str) -> tuple[str, tuple[int, int]] | None:
    key = re.sub(r"[\s_-]", "", text).upper().removeprefix("NVIDIA")
    for name, cap in GPUS.items():  # "NVIDIA H100 80GB HBM3" -> H100
        if key == name or (key.startswith(name) and not key[len(name) : len(name) + 1].isalpha()):
            return name, cap
    found = re.fullmatch(r"(?:SM_?)?(\d{1,2})\.?(\d)", key)
    if found:
        cap = (int(found.group(1)), int(found.group(2)))
        return f"sm{cap[0]}{cap[1]}", cap
    return None


def resolve_target(gpu: str | None = None, torch_version: str | None = None) -> CudaTarget:
    """The target for ``gpu`` (a name or compute capability), else this GPU, else the default."""
    version = parse_version(torch_version or torch.__version__)
    if gpu:
        found = _capability(gpu)
        if found is None:
            known = ", ".join(GPUS)
            raise ConfigError(
                "gpu", f"got {gpu!r}; use one of {known} or a compute capability such as 9.0 or sm90"
            )
        return CudaTarget(found[0], found[1], version, "named")
    local = _local_gpu()
    if local is not None:
        return CudaTarget(local[0], local[1], version, "local")
    return CudaTarget(DEFAULT_GPU, GPUS[DEFAULT_GPU], version, "default")


def _local_gpu() -> tuple[str, tuple[int, int]] | None:
    """This machine's GPU 0 as (name, capability), or None where there is none or it cannot be read."""
    try:
        if not torch.cuda.is_available():
            return None
        major, minor = torch.cuda.get_device_capability()
        found = _capability(torch.cuda.get_device_name())
    except Exception:  # a CPU-only build told otherwise, a device id it does not have, a broken driver
        return None
    return (found[0] if found else f"sm{major}{minor}"), (major, minor)
