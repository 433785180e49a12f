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


#: The torch releases whose rules the estimate carries (workspaces, kernel scratch, the allocator's
#: settings): an older 2.x is estimated by the oldest's rules, a newer one by the newest's, each
#: with a note; another major version is refused.
KNOWN_TORCH = ((2, 9), (2, 13))


def parse_version(text: str) -> tuple[int, int]:
    """``"2.11.0+cu130"`` -> ``(2, 11)``.

    Raises:
        ConfigError: not a release, or a major version other than torch 2 (no rule knows it).
    """
    found = re.fullmatch(r"\s*(\d+)\.(\d+)(?:\.\d+)?(?:[a-z+.][\w.+-]*)?\s*", str(text))
    if not found:
        raise ConfigError("torch_version", f"got {text!r}; use a release such as 2.11")
    version = int(found.group(1)), int(found.group(2))
    if version[0] != KNOWN_TORCH[0][0]:
        raise ConfigError("torch_version", f"got {text!r}; the estimate's rules are for torch {_known()}")
    return version


#: What an estimate takes from the target's ``torch_version``: rules written from each release's source.
FOLLOWS_TARGET = (
    "cuBLAS and cuBLASLt workspaces",
    "kernel scratch (layer norm, fused RMS norm, embedding backward)",
)
#: What runs as the torch installed where the estimate runs, whatever the target.
RUNS_AS_INSTALLED = (
    "FSDP2",
    "activation checkpointing",
    "autograd",
    "the optimizers",
    "the attention backend's choice",
    "the ops' fake kernels",
)
#: Parsed by the rules of one release whatever the target: the allocator settings (torch 2.13's
#: ``ConfigTokenizer``).
ALLOC_CONF_RULES = (2, 13)


def torch_rules(target: CudaTarget) -> dict[str, str]:
    """Which torch each part of the estimate followed: ``{"FSDP2": "2.13 (installed)", ...}``."""
    major, minor = target.torch_version
    low, high = KNOWN_TORCH
    ruled = min(max(target.torch_version, low), high)
    installed = "{}.{} (installed)".format(*installed_version())
    out = {part: f"{ruled[0]}.{ruled[1]} (target {major}.{minor})" for part in FOLLOWS_TARGET}
    out["PYTORCH_CUDA_ALLOC_CONF parsing"] = "{}.{}".format(*ALLOC_CONF_RULES)
    out.update({part: installed for part in RUNS_AS_INSTALLED})
    return out


def rules_note(target: CudaTarget) -> str:
    """The line that says what the target's torch changed and what ran as the installed torch."""
    major, minor = target.torch_version
    imajor, iminor = installed_version()
    return (
        f"torch {major}.{minor} (the target) decides: {', '.join(FOLLOWS_TARGET)}; the installed torch "
        f"{imajor}.{iminor} ran {', '.join(RUNS_AS_INSTALLED)}"
    )


def target_notes(target: CudaTarget) -> list[str]:
    """The target's lines: a release outside the rules, and what the target's torch decided when it
    is not the installed one."""
    out = [line] if (line := version_note(target.torch_version)) else []
    if target.torch_version != installed_version():
        out.append(rules_note(target))
    return out


def installed_version() -> tuple[int, int]:
    """The installed torch's (major, minor)."""
    major, minor = re.findall(r"\d+", torch.__version__)[:2]
    return int(major), int(minor)


def _known() -> str:
    (a, b), (c, d) = KNOWN_TORCH
    return f"{a}.{b} to {c}.{d}"


def version_note(version: tuple[int, int]) -> str | None:
    """One line when ``version`` is outside :data:`KNOWN_TORCH`: whose rules stand in for it."""
    low, high = KNOWN_TORCH
    if low <= version <= high:
        return None
    nearest = low if version < low else high
    return (
        f"torch {version[0]}.{version[1]} is outside the releases the rules know ({_known()}): its workspaces, "
        f"kernel scratch and allocator settings are estimated by torch {nearest[0]}.{nearest[1]}'s rules"
    )


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
    """A known GPU by name (``NVIDIA H100 80GB HBM3`` -> H100: the longest name its leading words
    spell), or a compute capability the rules know (``9.0``, ``sm90``); else None."""
    words = re.sub(r"[_-]", " ", str(text)).upper().split()
    while words and words[0] in ("NVIDIA", "TESLA", "GEFORCE", "QUADRO"):
        words.pop(0)
    for n in range(len(words), 0, -1):  # "H100 PCIe" is H100PCIE, not H100
        if "".join(words[:n]) in GPUS:
            name = "".join(words[:n])
            return name, GPUS[name]
    found = re.fullmatch(r"(?:SM_?)?(\d{1,2})\.?(\d)", "".join(words))
    if found:
        cap = (int(found.group(1)), int(found.group(2)))
        if cap in THREADS_PER_SM:
            return f"sm{cap[0]}{cap[1]}", Gpu(cap, sms_for(cap))
    return None


def resolve_target(gpu: str | None = None, torch_version: str | None = None) -> CudaTarget:
    """The target for ``gpu`` (a name or compute capability), else this GPU, else the default."""
    version = parse_version(torch_version) if torch_version else installed_version()
    if gpu:
        found = _lookup(gpu)
        if found is None:
            known = ", ".join(GPUS)
            caps = ", ".join(f"{a}.{b}" for a, b in THREADS_PER_SM)
            raise ConfigError(
                "gpu", f"got {gpu!r}; use one of {known} or a compute capability the rules know ({caps})"
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
