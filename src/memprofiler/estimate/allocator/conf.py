"""``PYTORCH_CUDA_ALLOC_CONF`` read as torch reads it, or refused where torch would refuse it.

torch parses the variable once, at the first CUDA allocation, in two passes over the same
tokens (torch 2.13's ``c10/core/AllocatorConfig.{h,cpp}`` and ``c10/cuda/CUDAAllocatorConfig.{h,cpp}``):

- the tokenizer splits on ``,`` ``:`` ``[`` ``]`` and drops every whitespace character
  (``max_split_size_mb: 128`` is ``max_split_size_mb:128``);
- numbers are read by ``std::stoull`` / ``std::stod``: a leading number is taken and the rest of
  the token ignored (``128MB`` is 128), a token with no number fails, and ``stoull`` negates a
  minus sign in unsigned arithmetic (``-5`` is 2**64 - 5, which the option then clamps);
- booleans are exactly ``True`` or ``False``;
- a key neither pass knows is an error on a CUDA build (``Unrecognized key``);
- each option checks its range: ``max_split_size_mb`` and ``max_non_split_rounding_mb`` at least
  the large segment size (20 MiB), ``garbage_collection_threshold`` in (0, 1),
  ``roundup_power2_divisions`` a power of two, ``large_segment_size_mb`` over 10;
- the variable is ``PYTORCH_CUDA_ALLOC_CONF`` when it is set (even empty), else ``PYTORCH_ALLOC_CONF``.

Where torch fails, the estimate refuses with one line naming the variable (a job with that
setting would stop at its first CUDA tensor); what torch accepts but the allocator model does not
follow is listed by name in the estimate's notes.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from memprofiler.errors import ConfigError

MiB = 1 << 20
SIZE_T_MAX = (1 << 64) - 1
#: ``kLargeBuffer``: the default size of a large-pool segment for requests of 1-10 MiB.
LARGE_BUFFER = 20 * MiB
#: ``kMinLargeAlloc``: requests from here up get segments of their own rounded size.
MIN_LARGE_ALLOC = 10 * MiB
#: The variables torch reads, in its order: the first one set wins.
VARIABLES = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
#: ``AcceleratorAllocatorConfig::getMutableKeys``: the device-independent options.
COMMON_KEYS = frozenset(
    {
        "large_segment_size_mb",
        "max_split_size_mb",
        "max_non_split_rounding_mb",
        "garbage_collection_threshold",
        "roundup_power2_divisions",
        "expandable_segments",
        "pinned_use_background_threads",
        "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",
    }
)
#: ``CUDAAllocatorConfig::getKeys``: the CUDA options (registered with the common parser too).
CUDA_KEYS = frozenset(
    {
        "backend",
        "release_lock_on_cudamalloc",
        "pinned_use_cuda_host_register",
        "release_lock_on_hipmalloc",
        "pinned_use_hip_host_register",
        "graph_capture_record_stream_reuse",
        "pinned_reserve_segment_size_mb",
        "pinned_num_register_threads",
        "per_process_memory_fraction",
        "pinned_free_catch_all",
        "throw_on_cudamalloc_oom",
    }
)
#: Options that change nothing on the device's peak: the host's pinned memory, locking, errors.
NO_DEVICE_EFFECT = frozenset(
    {
        "pinned_use_background_threads",
        "pinned_max_round_threshold_mb",
        "pinned_max_cached_size_mb",
        "pinned_use_cuda_host_register",
        "pinned_use_hip_host_register",
        "pinned_reserve_segment_size_mb",
        "pinned_num_register_threads",
        "pinned_free_catch_all",
        "release_lock_on_cudamalloc",
        "release_lock_on_hipmalloc",
        "graph_capture_record_stream_reuse",
        "throw_on_cudamalloc_oom",
    }
)
#: ``pinned_max_register_threads``.
MAX_REGISTER_THREADS = 128
_STOULL = re.compile(r"[ \t\n\v\f\r]*([+-]?)([0-9]+)")
_STOD = re.compile(
    r"[ \t\n\v\f\r]*[+-]?(?:(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|inf(?:inity)?|nan)",
    re.IGNORECASE,
)


class _Refused(Exception):
    """torch's parser fails here: the message says why."""


@dataclass(frozen=True)
class AllocConf:
    """What torch took from the variable: the options the allocator model follows, and the rest."""

    variable: str = ""
    """The variable read (``PYTORCH_CUDA_ALLOC_CONF`` or ``PYTORCH_ALLOC_CONF``); empty: neither set."""
    text: str = ""
    max_split_size: int | None = None
    max_non_split_rounding: int | None = None
    expandable_segments: bool = False
    garbage_collection_threshold: float = 0.0
    roundup_power2_divisions: int = 0
    """One division count for every size (the model's form); 0: off."""
    backend: str = "native"
    not_modelled: tuple[str, ...] = ()
    """Options torch follows that the allocator model does not, as ``key:value``."""
    no_effect: tuple[str, ...] = ()
    """Options that do not change the device's memory (pinned host memory, locking)."""
    read_as: tuple[str, ...] = field(default_factory=tuple)
    """Values torch reads otherwise than they look (``max_split_size_mb:-5`` is no limit)."""


class _Tokens:
    """``ConfigTokenizer``: index checks fail as torch's internal assert does."""

    def __init__(self, text: str) -> None:
        self.items: list[str] = []
        buf = ""
        for ch in text:
            if ch in ",:[]":
                if buf:
                    self.items.append(buf)
                    buf = ""
                self.items.append(ch)
            elif not ch.isspace() or ord(ch) > 127:
                buf += ch
        if buf:
            self.items.append(buf)

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> str:
        if i >= len(self.items):
            raise _Refused(
                "it ends where a value should follow (torch: index out of bounds in ConfigTokenizer)"
            )
        return self.items[i]

    def size_t(self, i: int) -> int:
        return stoull(self[i])

    def double(self, i: int) -> float:
        return stod(self[i])

    def boolean(self, i: int) -> bool:
        tok = self[i]
        if tok not in ("True", "False"):
            raise _Refused(f"expected 'True' or 'False', got {tok!r}")
        return tok == "True"

    def skip_key(self, i: int) -> int:
        i += 2  # the ':' is not checked, the value is
        if self[i] != "[":
            return i
        i += 1
        while i < len(self.items) and self.items[i] != "]":
            i += 1
        if i >= len(self.items):
            raise _Refused("a '[' list is not closed by ']'")
        return i


def stoull(token: str) -> int:
    """``std::stoull``: the leading integer of ``token``, a minus sign negated modulo 2**64."""
    found = _STOULL.match(token)
    if not found:
        raise _Refused(f"{token!r} is not a number (std::stoull)")
    value = int(found.group(2))
    if value > SIZE_T_MAX:
        raise _Refused(f"{token!r} is out of range (std::stoull)")
    return (-value) % (1 << 64) if found.group(1) == "-" else value


def stod(token: str) -> float:
    """``std::stod``: the leading floating-point number of ``token``."""
    found = _STOD.match(token)
    if not found:
        raise _Refused(f"{token!r} is not a number (std::stod)")
    value = float(found.group(0))
    if math.isinf(value) and "inf" not in found.group(0).lower():
        raise _Refused(f"{token!r} is out of range (std::stod)")
    return value


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


@dataclass
class _Parsed:
    large_segment: int = LARGE_BUFFER
    max_split: int | None = None
    max_non_split: int | None = None
    gc: float = 0.0
    divisions: list[int] = field(default_factory=lambda: [0] * 16)
    expandable: bool = False
    backend: str = "native"
    seen: list[str] = field(default_factory=list)
    read_as: list[str] = field(default_factory=list)


def _mb_option(t: _Tokens, i: int, key: str, minimum_mb: int, out: _Parsed) -> tuple[int, int]:
    raw = t[i + 2]
    val = t.size_t(i + 2)
    if val < minimum_mb:
        raise _Refused(f"{key} must be >= {minimum_mb}, got {raw!r}")
    clamped = min(val, SIZE_T_MAX // MiB)
    if not raw.lstrip("+").isdigit() or clamped != val:
        out.read_as.append(f"{key}:{raw} reads as {clamped} MiB")
    return i + 2, clamped * MiB


def _divisions(t: _Tokens, i: int, out: _Parsed) -> int:
    i += 2
    if t[i] != "[":
        value = t.size_t(i)
        if not _power_of_two(value):
            raise _Refused(f"roundup_power2_divisions must be a power of 2, got {t[i]!r}")
        out.divisions = [value] * 16
        return i
    first, last = True, 0
    i += 1
    while i < len(t) and t.items[i] != "]":
        at = i
        i += 2
        value = t.size_t(i)
        if value != 0 and not _power_of_two(value):
            raise _Refused(f"roundup_power2_divisions values must be 0 or a power of 2, got {t[i]!r}")
        if t[at] == ">":
            out.divisions[last + 1 :] = [value] * (15 - last)
        else:
            bound = t.size_t(at)
            if not _power_of_two(bound):
                raise _Refused(f"roundup_power2_divisions intervals must be powers of 2, got {t[at]!r}")
            index = min(max(bound.bit_length() - 1, 0), 15)
            if first:
                out.divisions[:index] = [value] * index
                first = False
            out.divisions[index] = value
            last = index
        if t[i + 1] != "]":
            i += 1  # the ',' is not checked
        i += 1
    if i >= len(t):
        raise _Refused("a '[' list is not closed by ']'")
    return i


def _common_pass(t: _Tokens, out: _Parsed) -> None:
    """``AcceleratorAllocatorConfig::parseArgs``."""
    i = 0
    while i < len(t):  # large_segment_size_mb first: the other limits depend on it
        if t.items[i] == "large_segment_size_mb":
            i += 2
            val = t.size_t(i)
            if val <= MIN_LARGE_ALLOC // MiB:
                raise _Refused(f"large_segment_size_mb must be > {MIN_LARGE_ALLOC // MiB}, got {t[i]!r}")
            out.large_segment = min(val, SIZE_T_MAX // MiB) * MiB
        i += 1
    i = 0
    while i < len(t):
        key = t.items[i]
        if key == "large_segment_size_mb":
            i = t.skip_key(i)
        elif key in ("max_split_size_mb", "max_non_split_rounding_mb"):
            i, size = _mb_option(t, i, key, out.large_segment // MiB, out)
            if key == "max_split_size_mb":
                out.max_split = size
            else:
                out.max_non_split = size
        elif key == "garbage_collection_threshold":
            i += 2
            threshold = t.double(i)
            if not 0.0 < threshold < 1.0:
                raise _Refused(f"garbage_collection_threshold must be in (0.0, 1.0), got {t[i]!r}")
            out.gc = threshold
        elif key == "roundup_power2_divisions":
            i = _divisions(t, i, out)
        elif key == "expandable_segments":
            i += 2
            out.expandable = t.boolean(i)
        elif key == "pinned_use_background_threads":
            i += 2
            t.boolean(i)
        elif key in ("pinned_max_round_threshold_mb", "pinned_max_cached_size_mb"):
            i += 2
            t.size_t(i)
        elif key in CUDA_KEYS:
            i = t.skip_key(i)
        else:
            raise _Refused(f"unrecognized key {key!r}")
        if key in COMMON_KEYS:
            out.seen.append(key)
        if i + 1 < len(t):
            i += 1  # the ',' is not checked: whatever stands there is passed over
        i += 1


def _cuda_pass(t: _Tokens, out: _Parsed) -> None:
    """``CUDAAllocatorConfig::parseArgs``."""
    i = 0
    while i < len(t):
        key = t.items[i]
        if key == "backend":
            i += 2
            if t[i] not in ("native", "cudaMallocAsync"):
                raise _Refused(f"backend must be native or cudaMallocAsync, got {t[i]!r}")
            out.backend = t[i]
        elif key in (
            "release_lock_on_cudamalloc",
            "release_lock_on_hipmalloc",
            "pinned_use_cuda_host_register",
            "pinned_use_hip_host_register",
            "graph_capture_record_stream_reuse",
            "pinned_free_catch_all",
            "throw_on_cudamalloc_oom",
        ):
            i += 2
            t.boolean(i)
        elif key == "pinned_num_register_threads":
            i += 2
            n = t.size_t(i)
            if not _power_of_two(n) or n > MAX_REGISTER_THREADS:
                raise _Refused(f"pinned_num_register_threads must be a power of 2 <= 128, got {t[i]!r}")
        elif key == "pinned_reserve_segment_size_mb":
            i += 2
            if t.size_t(i) == 0:
                raise _Refused("pinned_reserve_segment_size_mb must be > 0")
        elif key == "per_process_memory_fraction":
            i += 2
            fraction = t.double(i)
            if not 0.0 <= fraction <= 1.0:
                raise _Refused(f"per_process_memory_fraction must be in [0.0, 1.0], got {t[i]!r}")
        elif key in COMMON_KEYS:
            i = t.skip_key(i)
        else:
            raise _Refused(f"unrecognized key {key!r}")
        if key in CUDA_KEYS:
            out.seen.append(key)
        if i + 1 < len(t):
            i += 1
        i += 1


def _item(text: str, key: str) -> str:
    """``key:value`` as the user wrote it (for the notes)."""
    found = re.search(rf"{re.escape(key)}\s*:\s*(\[[^\]]*\]?|[^,]*)", text)
    return f"{key}:{found.group(1).strip()}" if found else key


def read(env: Mapping[str, str]) -> AllocConf:
    """The allocator settings of ``env`` as torch reads them.

    Raises:
        ConfigError: torch would stop at its first CUDA allocation; names the variable.

    Example:
        >>> read({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True, max_split_size_mb:-5"}).read_as
        ('max_split_size_mb:-5 reads as 17592186044415 MiB',)
    """
    variable = next((v for v in VARIABLES if v in env), "")
    if not variable:
        return AllocConf()
    text = env[variable]
    tokens = _Tokens(text)
    out = _Parsed()
    try:
        _common_pass(tokens, out)
        _cuda_pass(tokens, out)
    except _Refused as why:
        raise ConfigError(
            variable,
            f"got {text!r}: torch refuses it at the first CUDA allocation ({why}); use comma-separated "
            "key:value pairs such as expandable_segments:True,max_split_size_mb:512",
        ) from None
    not_modelled: list[str] = []
    divisions = 0
    if any(out.divisions):
        if len(set(out.divisions)) == 1:
            divisions = out.divisions[0]
        else:
            not_modelled.append(_item(text, "roundup_power2_divisions"))
    for key in ("large_segment_size_mb", "per_process_memory_fraction"):
        if key in out.seen:
            not_modelled.append(_item(text, key))
    if out.backend != "native":
        not_modelled.append(f"backend:{out.backend}")
    no_effect = tuple(dict.fromkeys(_item(text, k) for k in out.seen if k in NO_DEVICE_EFFECT))
    return AllocConf(
        variable=variable,
        text=text,
        max_split_size=out.max_split,
        max_non_split_rounding=out.max_non_split,
        expandable_segments=out.expandable,
        garbage_collection_threshold=out.gc,
        roundup_power2_divisions=divisions,
        backend=out.backend,
        not_modelled=tuple(not_modelled),
        no_effect=no_effect,
        read_as=tuple(out.read_as),
    )
