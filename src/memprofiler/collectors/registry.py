"""Which collectors a config switches on, and for which functions.

Adding a collector means adding it here; no other collector changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from memprofiler.collectors.allocator_history import AllocatorHistoryCollector
from memprofiler.collectors.base import Collector, Warn
from memprofiler.collectors.cuda_backend import CudaBackend
from memprofiler.collectors.cuda_stats import CudaStatsCollector
from memprofiler.collectors.fsdp import FSDPMemCollector
from memprofiler.collectors.history_recording import HistoryOptions, HistoryRecording
from memprofiler.collectors.host import HostCollector
from memprofiler.collectors.module_hooks import ModuleHooksCollector
from memprofiler.collectors.module_mem import ModuleMemCollector
from memprofiler.collectors.oom import OomRecorder
from memprofiler.collectors.saved_tensors import SavedTensorsCollector
from memprofiler.config import MemProfilerConfig


@dataclass
class Registered:
    """A collector and the functions it collects."""

    funcs: frozenset[str]
    collector: Collector


def build_collectors(cfg: MemProfilerConfig, cuda: CudaBackend, warn: Warn) -> list[Registered]:
    """Instantiate the collectors ``cfg`` enables, in start order (they end in reverse).

    Collection types whose capability is missing (no CUDA) are warned about once and
    switched off.
    """
    out: list[Registered] = []
    every = cfg.collect_funcs.all_funcs()
    # The module-wise trackers come first: their dispatch mode stays entered until the end of
    # the step, so it must sit below any mode another collector pushes and pops within the call.
    if cfg.track_fsdp_mem or cfg.track_module_mem:
        depth, units, tabulate = cfg.module_mem_depth, cfg.module_mem_units, cfg.module_mem_tabulate
        tracker: Collector = (
            FSDPMemCollector(cfg.fsdp_mem_tracker_root_module, depth, units, tabulate, warn)
            if cfg.track_fsdp_mem
            else ModuleMemCollector(depth, units, tabulate, warn)
        )
        out.append(Registered(cfg.collect_funcs.funcs_for("module_mem"), tracker))
    # Allocator-history snapshots are large dumps: start them before, and end them after, the
    # collectors that measure the call (host peak RSS, CUDA stats), which must not see them.
    out.extend(_history_collectors(cfg, cuda, warn))
    out.append(
        Registered(
            cfg.collect_funcs.funcs_for("cpu"), HostCollector(cfg.rss_peak_method, cfg.rss_sample_interval_ms)
        )
    )
    cuda_funcs = cfg.collect_funcs.funcs_for("cuda")
    if cuda.is_available():
        out.append(Registered(cuda_funcs, CudaStatsCollector(cuda)))
    else:
        warn(
            "CUDA is not available: CUDA allocator statistics (collection type `cuda`) are off; "
            "host and saved-tensor collection continue."
        )
    saved: SavedTensorsCollector | None = None
    if cfg.enable_saved_tensors_hooks:
        saved = SavedTensorsCollector(warn)
        out.append(Registered(every, saved))
    if cfg.enable_memory_hooks:
        hooks = cfg.memory_hooks
        out.append(
            Registered(
                every,
                ModuleHooksCollector(
                    pre=hooks.resolved("pre_forward_hooks"),
                    post=hooks.resolved("post_forward_hooks"),
                    reset=hooks.resolved("reset_state_hooks"),
                    save_attrs=cfg.save_hook_attrs,
                    retain_for=frozenset(cfg.retain_hooks_for_funcs),
                    saved_tensors=saved,
                    warn=warn,
                ),
            )
        )
    return out


def _history_collectors(cfg: MemProfilerConfig, cuda: CudaBackend, warn: Warn) -> list[Registered]:
    """Allocator history and the OOM flight recorder, sharing one recording owner.

    Both call private CUDA bindings, which need CUDA initialised (one is a segmentation
    fault before it), so CUDA is initialised here when a device is present: set-up may come
    before the first CUDA tensor (a plain loop, Fabric before ``setup``) or after it
    (Lightning). Where that fails, both are warned about in one line and switched off.
    """
    out: list[Registered] = []
    if not (cfg.cuda_allocator_history or cfg.oom.enabled):
        return out
    if cuda.is_available():
        not_ready = cuda.ensure_initialized()
        if not_ready is not None:
            keys = [
                k
                for k, on in (
                    ("cuda_allocator_history", cfg.cuda_allocator_history),
                    ("oom.enabled", cfg.oom.enabled),
                )
                if on
            ]
            warn(
                f"CUDA could not be initialised ({not_ready}): {' and '.join(f'`{k}`' for k in keys)} "
                f"{'is' if len(keys) == 1 else 'are'} off; training continues"
            )
            return out
    no_history = cuda.history_unsupported_reason()
    recording = HistoryRecording(cuda, warn) if no_history is None else None
    if cfg.cuda_allocator_history:
        if recording is None:
            warn(
                f"CUDA allocator history is not available here ({no_history}): `cuda_allocator_history` is off"
            )
        else:
            hist = cfg.allocator_history
            out.append(
                Registered(
                    cfg.collect_funcs.funcs_for("cuda_allocator_history"),
                    AllocatorHistoryCollector(
                        cuda,
                        recording,
                        HistoryOptions(hist.max_entries, hist.stacks, hist.context),
                        cfg.flush_interval_s,
                    ),
                )
            )
    if cfg.oom.enabled:
        if not cuda.is_available():
            warn("CUDA is not available: the OOM flight recorder (`oom.enabled`) is off")
        else:
            if recording is None:
                warn(
                    f"CUDA allocator history cannot be recorded here ({no_history}): OOM records "
                    "carry allocator stats but no memory_viz history"
                )
            oom = cfg.oom
            # No functions: the recorder takes no per-call snapshots, it only binds and dumps.
            out.append(
                Registered(
                    frozenset(),
                    OomRecorder(
                        cuda,
                        recording,
                        HistoryOptions(oom.max_entries, oom.stacks, oom.context),
                        oom.max_dumps,
                        warn,
                    ),
                )
            )
    return out
