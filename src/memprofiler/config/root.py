"""The root config, :class:`MemProfilerConfig`: every option of :class:`memprofiler.MemProfiler`.

One source of options: a tree of dataclasses, validated when built. Field names follow
finetuning-scheduler's ``MemProfilerCfg`` wherever it has one, so existing YAML carries over.
Every error names the dotted key, the bad value and what is allowed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from memprofiler.config._build import build_dataclass
from memprofiler.config.cuda import AllocatorHistoryConfig, OomConfig
from memprofiler.config.hooks import MemoryHooksConfig
from memprofiler.config.schedule import CollectFuncsConfig, ScheduleConfig
from memprofiler.config.urls import check_dir
from memprofiler.errors import ConfigError
from memprofiler.units import MEM_UNITS


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
    instead of being removed and re-installed; they are removed when the window closes. The
    hooks sit on the profiled module's own submodules only, never process-wide."""
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
    during the functions of collection type ``module_mem``. The window runs from the start of the call to
    the end of the step (backward and optimizer step included; see docs/guides/fsdp.md). Writes
    ``fsdp_mem_rank_{rank}_{fn}_{call}.log``/``.yaml`` and ``fsdp.peak.*`` snapshot keys."""
    fsdp_mem_tracker_root_module: str = ""
    """Dotted path, from the profiled module (the LightningModule), of the ``fully_shard``-ed module
    to track; ``""`` means the profiled module itself."""
    module_mem_depth: int = 2
    """Deepest module level shown in the module-wise snapshots. Levels count from the profiled
    module (level 1), below any wrappers: a module that runs one module and nothing else (a
    LightningModule around ``self.model``) shares its level with it, so the default shows the
    parts of the model it holds (``DemoGPT`` and ``DemoGPT.model`` are 1, ``DemoGPT.model.blocks.0``
    3). Each report names the module counting starts from (``module_depth_from``)."""
    module_mem_units: str = "MiB"
    """Units of the human-readable ``.log`` reports: ``B``, ``KiB``, ``MiB`` or ``GiB``. The ``.yaml``
    reports and snapshot keys are always in bytes."""
    module_mem_tabulate: bool = False
    """Render the ``.log`` reports as tables instead of one line per category."""
    track_module_mem: bool = False
    """Track memory per module without FSDP, with ``torch.distributed._tools.mem_tracker.MemTracker``
    (CPU and CUDA), during the functions of collection type ``module_mem``. Same window and report layout
    as ``track_fsdp_mem``, named ``module_mem_rank_...``, with ``module_mem.peak.*`` snapshot keys.
    Costs about 9x a step while collecting (8.8x measured on CPU, a 122-module residual MLP
    in a Lightning Trainer); nothing outside the window."""
    dump_memory_trace: bool = True
    """Write ``memory_trace_rank_{rank}.json``: Chrome-trace counters and ``{fn}.{call}`` spans
    of every snapshot, on the PyTorch profiler's clock. With the extended profiler the same
    events are also merged into its trace."""
    log_metrics: bool = True
    """Log each collected call's headline figures (``rss_peak``, saved-tensor bytes, CUDA and
    FSDP peaks) to every logger the Trainer has, as ``memprofiler/{fn}/{metric}`` at the
    global step. No effect without a logger or outside Lightning."""
    flush_every_calls: int = 50
    """Write what was collected at least every this many collected calls, whatever the
    schedule (besides every window close), so a process killed by SIGKILL or the host's OOM
    killer leaves it on disk. Each write appends only what is new."""
    flush_interval_s: float = 60.0
    """...and at least every this many seconds (checked when a collected call ends)."""
    max_snapshots_in_memory: int = 20_000
    """Snapshots kept in memory (``MemProfiler.snapshots``); older ones already on disk are
    dropped from memory, so a 100k-call run stays bounded (about 3 KB each). The files, the
    cross-rank summary and ``memprofiler report`` still see every snapshot."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            nested = _NESTED_TYPES.get(f.name)
            if nested is not None and isinstance(value, Mapping):
                try:
                    setattr(self, f.name, build_dataclass(nested, value))
                except ConfigError as err:
                    raise err.prefixed(f.name) from None
        if self.save_dir:
            check_dir(self.save_dir, "save_dir")
        if self.rss_peak_method not in ("auto", "clear_refs", "sampler"):
            raise ConfigError(
                "rss_peak_method", f"got {self.rss_peak_method!r}; allowed: auto, clear_refs, sampler"
            )
        if self.max_snapshots_in_memory < 1:
            raise ConfigError("max_snapshots_in_memory", f"got {self.max_snapshots_in_memory}; must be >= 1")
        if self.flush_every_calls < 1:
            raise ConfigError("flush_every_calls", f"got {self.flush_every_calls}; must be >= 1")
        if not self.flush_interval_s > 0:
            raise ConfigError("flush_interval_s", f"got {self.flush_interval_s}; must be > 0 seconds")
        if self.rss_sample_interval_ms <= 0:
            raise ConfigError("rss_sample_interval_ms", f"got {self.rss_sample_interval_ms}; must be > 0")
        if self.module_mem_units not in MEM_UNITS:
            raise ConfigError(
                "module_mem_units",
                f"got {self.module_mem_units!r}; allowed: {', '.join(MEM_UNITS)}",
            )
        if self.module_mem_depth < 0:
            raise ConfigError("module_mem_depth", f"got {self.module_mem_depth}; must be >= 0")
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
            except RecursionError:
                raise ConfigError("", f"cannot parse config YAML{source}: nested too deep") from None
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
