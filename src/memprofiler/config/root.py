"""Typed configuration for :class:`memprofiler.MemProfiler`.

One source of options: a tree of dataclasses, validated when built. Field names follow
finetuning-scheduler's ``MemProfilerCfg`` wherever it has one, so existing YAML carries over.
Every error names the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

import yaml

from memprofiler.config._build import build_dataclass
from memprofiler.errors import ConfigError

HookSpec = str | Callable[..., Any]

#: Collection types a function can be registered for in ``collect_funcs``.
COLLECT_TYPES = ("cpu", "cuda", "cuda_allocator_history", "fsdp")

_DEFAULT_HOOKS = "memprofiler.collectors.module_hooks"

#: Units accepted by ``fsdp_mem_tracker_units`` (bytes per unit).
MEM_UNITS = {"B": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}


@dataclass
class ScheduleConfig:
    """Which calls of each ``@memprofilable`` function are collected.

    Calls are counted per function, starting at 1. The cyclic fields follow
    ``torch.profiler.schedule`` exactly (call ``n`` is profiler step ``n - 1``). The default
    collects exactly call 2, with call 1 as warmup.
    """

    skip_first: int = 0
    """Calls to skip entirely before the first cycle starts."""
    wait: int = 0
    """Idle calls at the start of every cycle."""
    warmup: int = 1
    """Calls per cycle before collection; allocator-history recording starts here."""
    active: int = 1
    """Collected calls per cycle."""
    repeat: int = 1
    """Number of cycles; ``0`` repeats forever."""
    warmup_iters: int | None = None
    """Short form (the ancestor's): collect calls with ``warmup_iters < call <= max_iter``."""
    max_iter: int | None = None
    """Short form: the last collected call. Defaults to ``warmup_iters + 1``."""
    follow_profiler: bool = False
    """Take the cyclic fields from the Trainer's :class:`~memprofiler.ExtendedPyTorchProfiler`
    ``schedule_cfg`` at set-up, so memory snapshots and the kernel trace cover the same calls
    (training call ``n`` is profiler step ``n - 1``, traced as ``ProfilerStep#{n-1}``). The
    cyclic fields given here are then ignored. Without that profiler: a warning, and this
    schedule is used as given."""

    _CYCLIC: ClassVar[tuple[str, ...]] = ("skip_first", "wait", "warmup", "active", "repeat")

    def __post_init__(self) -> None:
        for name in ("skip_first", "wait", "warmup", "repeat"):
            if getattr(self, name) < 0:
                raise ConfigError(name, f"got {getattr(self, name)}; must be >= 0")
        if self.active < 1:
            raise ConfigError("active", f"got {self.active}; must be >= 1")
        if self.follow_profiler and self.is_short_form:
            raise ConfigError(
                "follow_profiler",
                "cannot be combined with the short form `warmup_iters`/`max_iter`; drop one of them",
            )
        if self.is_short_form:
            defaults = ScheduleConfig.__dataclass_fields__
            changed = [n for n in self._CYCLIC if getattr(self, n) != defaults[n].default]
            if changed:
                raise ConfigError(
                    changed[0],
                    "cannot be combined with the short form `warmup_iters`/`max_iter`; use one form",
                )
            if self.warmup_iters is None:
                self.warmup_iters = 1
            if self.warmup_iters < 0:
                raise ConfigError("warmup_iters", f"got {self.warmup_iters}; must be >= 0")
            if self.max_iter is None:
                self.max_iter = self.warmup_iters + 1
            if self.max_iter <= self.warmup_iters:
                raise ConfigError(
                    "max_iter", f"got {self.max_iter}; must be greater than warmup_iters={self.warmup_iters}"
                )

    @property
    def is_short_form(self) -> bool:
        return self.warmup_iters is not None or self.max_iter is not None


@dataclass
class CollectFuncsConfig:
    """Which ``@memprofilable`` functions get which collection type.

    The names in ``default`` are added to every other set.
    """

    default: list[str] = field(default_factory=lambda: ["training_step"])
    """Functions collected by every enabled collection type."""
    cpu: list[str] = field(default_factory=list)
    """Extra functions for host memory (RSS, VMS, peak RSS)."""
    cuda: list[str] = field(default_factory=list)
    """Extra functions for ``torch.cuda.memory_stats()``."""
    cuda_allocator_history: list[str] = field(default_factory=list)
    """Extra functions for CUDA allocator-history pickles."""
    fsdp: list[str] = field(default_factory=list)
    """Extra functions for FSDP2 memory tracking."""

    def funcs_for(self, collect_type: str) -> frozenset[str]:
        """Return the functions collected by ``collect_type``, ``default`` included."""
        if collect_type not in COLLECT_TYPES:
            raise ConfigError("collect_funcs", f"unknown collection type {collect_type!r}")
        return frozenset(self.default) | frozenset(getattr(self, collect_type))

    def all_funcs(self) -> frozenset[str]:
        """Every function named anywhere."""
        out = frozenset(self.default)
        for t in COLLECT_TYPES:
            out |= frozenset(getattr(self, t))
        return out


def resolve_hook(spec: HookSpec, key: str) -> Callable[..., Any]:
    """Turn a callable or dotted import path into a callable.

    Raises:
        ConfigError: the path does not import or does not name a callable.
    """
    if callable(spec):
        return spec
    module_name, _, attr = spec.rpartition(".")
    if not module_name:
        raise ConfigError(key, f"got {spec!r}; expected a dotted import path like `pkg.module.func`")
    try:
        obj = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(
            key, f"cannot import {spec!r} ({err}); give an importable `module.function`"
        ) from None
    if not callable(obj):
        raise ConfigError(key, f"{spec!r} is not callable")
    return obj


@dataclass
class MemoryHooksConfig:
    """Forward hooks run on the profiled module during collected calls (``enable_memory_hooks``).

    A pre-forward hook is called as ``hook(state, module, args)``, a post-forward hook as
    ``hook(state, module, args, output)`` and a reset hook as ``hook(state)``. ``state`` is a
    :class:`memprofiler.collectors.module_hooks.HookState` held by the profiler; attributes
    named in ``save_hook_attrs`` are copied from it into the snapshot.
    """

    pre_forward_hooks: list[HookSpec] = field(
        default_factory=lambda: [f"{_DEFAULT_HOOKS}.rss_pre_forward", f"{_DEFAULT_HOOKS}.npp_pre_forward"]
    )
    """Called before the outermost forward of the profiled module."""
    post_forward_hooks: list[HookSpec] = field(
        default_factory=lambda: [f"{_DEFAULT_HOOKS}.rss_post_forward", f"{_DEFAULT_HOOKS}.npp_post_forward"]
    )
    """Called after the outermost forward of the profiled module."""
    reset_state_hooks: list[HookSpec] = field(default_factory=lambda: [f"{_DEFAULT_HOOKS}.reset_state"])
    """Called at the start of every collected call."""

    def __post_init__(self) -> None:
        for name in ("pre_forward_hooks", "post_forward_hooks", "reset_state_hooks"):
            for i, spec in enumerate(getattr(self, name)):
                resolve_hook(spec, f"{name}[{i}]")

    def resolved(self, name: str) -> list[Callable[..., Any]]:
        return [resolve_hook(s, f"memory_hooks.{name}[{i}]") for i, s in enumerate(getattr(self, name))]


#: ``stacks`` values torch's ``_record_memory_history`` accepts.
HISTORY_STACKS = ("python", "all")
#: ``context`` values torch's ``_record_memory_history`` accepts (``None`` keeps no tracebacks).
HISTORY_CONTEXTS = (None, "state", "alloc", "all")


def _check_history_options(max_entries: int, stacks: str, context: str | None) -> None:
    if max_entries < 1:
        raise ConfigError("max_entries", f"got {max_entries}; must be >= 1 (the history is a bounded ring)")
    if stacks not in HISTORY_STACKS:
        raise ConfigError("stacks", f"got {stacks!r}; allowed: python, all")
    if context not in HISTORY_CONTEXTS:
        raise ConfigError("context", f"got {context!r}; allowed: null, state, alloc, all")


@dataclass
class AllocatorHistoryConfig:
    """Options of CUDA allocator-history recording (``cuda_allocator_history``).

    Passed to ``torch.cuda.memory._record_memory_history`` while a collected window is open.
    """

    max_entries: int = 100_000
    """Alloc/free events kept (a ring: the newest win). Bounded because torch's default is
    unbounded and each entry costs host RAM (several KB with stacks)."""
    stacks: str = "python"
    """``python``: Python, TorchScript and inductor frames; ``all``: also C++ frames, which
    makes dumps about 100x slower and the pickles much larger."""
    context: str | None = "all"
    """Which events keep tracebacks: ``all`` (allocs and frees), ``alloc``, ``state`` (live
    blocks only) or ``null`` (none)."""

    def __post_init__(self) -> None:
        _check_history_options(self.max_entries, self.stacks, self.context)


@dataclass
class OomConfig:
    """The OOM flight recorder: a bounded allocator-history ring kept for the whole run.

    On a CUDA out-of-memory, and on any exception that ends training, it writes
    ``oom_rank_{rank}_{n}.pickle`` (for pytorch.org/memory_viz) and ``oom_rank_{rank}_{n}.yaml``
    (allocator stats, device free/total, the failed allocation, the step and the snapshots
    collected so far).
    """

    enabled: bool = False
    """Keep the ring and write the records. Off by default: recording costs about 2 us per
    allocation for the whole run."""
    max_entries: int = 100_000
    """Alloc/free events the ring keeps."""
    stacks: str = "python"
    """``python`` or ``all`` (C++ frames too; much slower to record and dump)."""
    context: str | None = "all"
    """Which events keep tracebacks: ``all``, ``alloc``, ``state`` or ``null``."""
    max_dumps: int = 5
    """Records written per rank and run at most, so a loop that keeps catching OOMs (a batch
    size search) cannot fill the disk."""

    def __post_init__(self) -> None:
        _check_history_options(self.max_entries, self.stacks, self.context)
        if self.max_dumps < 1:
            raise ConfigError("max_dumps", f"got {self.max_dumps}; must be >= 1")


@dataclass
class MemProfilerConfig:
    """All options of :class:`memprofiler.MemProfiler`.

    Accepts nested mappings anywhere a nested config is expected. Build from a dict, a YAML
    mapping or a YAML file with :meth:`from_any`.

    Example:
        >>> cfg = MemProfilerConfig.from_any({"schedule": {"warmup": 0, "active": 2}})
        >>> cfg.schedule.active
        2
    """

    enabled: bool = True
    """Master switch. When false the profiler attaches nothing and costs nothing."""
    save_dir: str | None = None
    """Output directory. Default: ``<trainer.log_dir or default_root_dir>/memprofiler``."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """Which calls are collected."""
    collect_funcs: CollectFuncsConfig = field(default_factory=CollectFuncsConfig)
    """Which functions get which collection type."""
    dump_memorystats_yaml: bool = True
    """Write ``rank_{rank}_memory_stats.yaml``."""
    dump_memorystats_pickle: bool = False
    """Also write the same data to ``rank_{rank}_memory_stats.pickle``."""
    enable_saved_tensors_hooks: bool = True
    """Count bytes autograd saves for backward (``saved_tensors.*``) inside collected calls."""
    enable_memory_hooks: bool = False
    """Install ``memory_hooks`` on the profiled module during collected calls."""
    memory_hooks: MemoryHooksConfig = field(default_factory=MemoryHooksConfig)
    """The forward hooks run when ``enable_memory_hooks`` is on."""
    save_hook_attrs: list[str] = field(
        default_factory=lambda: [
            "rss_pre_forward",
            "rss_post_forward",
            "rss_diff",
            "npp_pre_forward",
            "npp_post_forward",
            "npp_diff",
        ]
    )
    """Hook-state attributes copied into the ``end`` snapshot."""
    retain_hooks_for_funcs: list[str] = field(default_factory=lambda: ["training_step"])
    """Functions whose memory hooks stay installed between consecutive collected calls
    instead of being removed and re-installed; they are removed when the window closes."""
    rss_peak_method: str = "auto"
    """How ``rss_peak`` is measured: ``clear_refs`` (Linux: reset and read the kernel's
    ``VmHWM``, exact, no thread), ``sampler`` (a thread polling RSS during collected calls
    only) or ``auto`` (``clear_refs`` where it works, else ``sampler``)."""
    rss_sample_interval_ms: float = 1.0
    """Polling interval of the ``sampler`` method."""
    cuda_allocator_history: bool = False
    """Record CUDA allocator history during collected windows and write one memory_viz pickle
    at the start and one at the end of each collected call of the
    ``collect_funcs.cuda_allocator_history`` functions."""
    allocator_history: AllocatorHistoryConfig = field(default_factory=AllocatorHistoryConfig)
    """Recording options used by ``cuda_allocator_history``."""
    oom: OomConfig = field(default_factory=OomConfig)
    """The OOM flight recorder."""
    track_fsdp_mem: bool = False
    """Track FSDP2 memory per module with ``torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker``
    during the functions of collection type ``fsdp``. The window runs from the start of the call to
    the end of the step (backward and optimizer step included; see the README). Writes
    ``fsdp_mem_rank_{rank}_{fn}_{call}.log``/``.yaml`` and ``fsdp.peak.*`` snapshot keys."""
    fsdp_mem_tracker_root_module: str = ""
    """Dotted path, from the profiled module (the LightningModule), of the ``fully_shard``-ed module
    to track; ``""`` means the profiled module itself."""
    fsdp_mem_track_module_depth: int = 2
    """Deepest module level shown in the module-wise snapshots. Levels count from the profiled
    module (the LightningModule is 1, ``model`` under it 2, ``model.blocks.0`` 4)."""
    fsdp_mem_tracker_units: str = "MiB"
    """Units of the human-readable ``.log`` reports: ``B``, ``KiB``, ``MiB`` or ``GiB``. The ``.yaml``
    reports and snapshot keys are always in bytes."""
    fsdp_mem_tracker_tabulate: bool = False
    """Render the ``.log`` reports as tables instead of one line per category."""
    track_module_mem: bool = False
    """Track memory per module without FSDP, with ``torch.distributed._tools.mem_tracker.MemTracker``
    (CPU and CUDA), during the functions of collection type ``fsdp``. Same window and report layout
    as ``track_fsdp_mem``, named ``module_mem_rank_...``, with ``module_mem.peak.*`` snapshot keys.
    Costs about 2x a step while collecting; nothing outside the window."""
    dump_memory_trace: bool = True
    """Write ``memory_trace_rank_{rank}.json``: Chrome-trace counters and ``{fn}.{call}`` spans
    of every snapshot, on the PyTorch profiler's clock. With the extended profiler the same
    events are also merged into its trace."""
    log_metrics: bool = True
    """Log each collected call's headline figures (``rss_peak``, saved-tensor bytes, CUDA and
    FSDP peaks) to every logger the Trainer has, as ``memprofiler/{fn}/{metric}`` at the
    global step. No effect without a logger or outside Lightning."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            nested = _NESTED_TYPES.get(f.name)
            if nested is not None and isinstance(value, Mapping):
                try:
                    setattr(self, f.name, build_dataclass(nested, value))
                except ConfigError as err:
                    raise err.prefixed(f.name) from None
        if self.rss_peak_method not in ("auto", "clear_refs", "sampler"):
            raise ConfigError(
                "rss_peak_method", f"got {self.rss_peak_method!r}; allowed: auto, clear_refs, sampler"
            )
        if self.rss_sample_interval_ms <= 0:
            raise ConfigError("rss_sample_interval_ms", f"got {self.rss_sample_interval_ms}; must be > 0")
        if self.fsdp_mem_tracker_units not in MEM_UNITS:
            raise ConfigError(
                "fsdp_mem_tracker_units",
                f"got {self.fsdp_mem_tracker_units!r}; allowed: {', '.join(MEM_UNITS)}",
            )
        if self.fsdp_mem_track_module_depth < 0:
            raise ConfigError(
                "fsdp_mem_track_module_depth", f"got {self.fsdp_mem_track_module_depth}; must be >= 0"
            )
        if self.track_fsdp_mem and self.track_module_mem:
            raise ConfigError(
                "track_module_mem",
                "cannot be combined with `track_fsdp_mem` (both are dispatch-mode trackers over the "
                "same calls); use `track_fsdp_mem` for fully_shard-ed models, `track_module_mem` otherwise",
            )

    @classmethod
    def from_any(cls, obj: MemProfilerConfig | Mapping[str, Any] | str | Path | None) -> MemProfilerConfig:
        """Build a config from a config, a mapping, YAML text or a YAML file path.

        Raises:
            ConfigError: unknown key, wrong type or value out of range; names the dotted key.
        """
        if obj is None:
            return cls()
        if isinstance(obj, cls):
            return obj
        source = ""
        if isinstance(obj, (str, Path)):
            text = str(obj)
            looks_like_file = isinstance(obj, Path) or ("\n" not in text and text.endswith((".yaml", ".yml")))
            if looks_like_file:
                path = Path(obj)
                source = f" in {str(path)!r}"
                try:
                    text = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as err:
                    raise ConfigError(
                        "", f"cannot read config file {str(path)!r} ({err}); give a readable UTF-8 YAML file"
                    ) from None
            try:
                obj = yaml.safe_load(text) or {}
            except yaml.YAMLError as err:
                raise ConfigError("", f"cannot parse config YAML{source}: {err}") from None
        if not isinstance(obj, Mapping):
            raise ConfigError(
                "", f"expected a mapping of MemProfilerConfig fields{source}, got {type(obj).__name__}"
            )
        try:
            return build_dataclass(cls, obj)
        except ConfigError as err:
            if not source:
                raise
            raise ConfigError(err.key, f"{err.rule}{source}") from None

    def to_dict(self) -> dict[str, Any]:
        """Plain-data view (callables shown by their qualified name), for logging and YAML."""
        return _plain(self)


_NESTED_TYPES: dict[str, type] = {
    "schedule": ScheduleConfig,
    "collect_funcs": CollectFuncsConfig,
    "memory_hooks": MemoryHooksConfig,
    "allocator_history": AllocatorHistoryConfig,
    "oom": OomConfig,
}


def _plain(obj: Any) -> Any:
    if hasattr(obj, "__dataclass_fields__"):
        return {f.name: _plain(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [_plain(v) for v in obj]
    if callable(obj):
        return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', repr(obj))}"
    return obj
