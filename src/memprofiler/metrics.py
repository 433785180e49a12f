"""Names of the metrics in a snapshot, and of the host metrics the step timeline samples. One
place, so the collectors that write them and every reader (the logger, the pytest markers, the
timeline, the estimate reader, the report, the host sampler and its config) agree.

``tests/test_metrics_vocabulary.py`` fails when one of those modules spells a name here as a
string of its own.
"""

from __future__ import annotations

#: Host memory (bytes), from ``psutil``: resident and virtual size at the snapshot.
RSS = "rss"
VMS = "vms"
#: The highest RSS seen during the call (``rss_peak_method``).
RSS_PEAK = "rss_peak"

#: Saved-tensor bytes of a call: each storage counted once, and as packed for backward.
SAVED_UNIQUE = "saved_tensors.unique_bytes"
SAVED_PACKED = "saved_tensors.packed_bytes"
#: How many tensors autograd saved.
SAVED_COUNT = "saved_tensors.count"
#: ``{module: bytes}``: each module's own share of :data:`SAVED_UNIQUE`.
SAVED_BY_MODULE = "saved_tensors.by_module"

#: CUDA ``torch.cuda.memory_stats()`` keys read by name (the collector writes them all).
CUDA_ALLOCATED = "allocated_bytes.all.current"
CUDA_RESERVED = "reserved_bytes.all.current"
CUDA_ALLOCATED_PEAK = "allocated_bytes.all.peak"
CUDA_RESERVED_PEAK = "reserved_bytes.all.peak"

#: Per-category peaks the module-wise trackers merge into a call's ``end`` snapshot:
#: ``fsdp.peak.<category>`` (``track_fsdp_mem``) or ``module_mem.peak.<category>``
#: (``track_module_mem``), ``total`` among the categories.
FSDP_PEAK_PREFIX = "fsdp.peak."
MODULE_MEM_PEAK_PREFIX = "module_mem.peak."
TRACKER_PEAK_PREFIXES = (FSDP_PEAK_PREFIX, MODULE_MEM_PEAK_PREFIX)
FSDP_PEAK_TOTAL = FSDP_PEAK_PREFIX + "total"
MODULE_MEM_PEAK_TOTAL = MODULE_MEM_PEAK_PREFIX + "total"

#: Host metric groups the step timeline's sampler reads (``timeline.host_metrics``); ``rss`` is
#: :data:`RSS`, this process's resident size.
HOST_CPU = "cpu"
HOST_MEMORY = "memory"
HOST_DISK = "disk"
HOST_NETWORK = "network"
HOST_GROUPS: tuple[str, ...] = (HOST_CPU, HOST_MEMORY, HOST_DISK, HOST_NETWORK, RSS)
#: The sampler's counter tracks, as named in the trace and ``step_timeline_rank_N.json``.
HOST_CPU_PERCENT = "host.cpu_percent"
PROCESS_CPU_PERCENT = "process.cpu_percent"
HOST_MEMORY_USED = "host.memory_used"
HOST_MEMORY_PERCENT = "host.memory_percent"
HOST_DISK_READ = "host.disk_read"
HOST_DISK_WRITE = "host.disk_write"
HOST_NET_SENT = "host.net_sent"
HOST_NET_RECV = "host.net_recv"
PROCESS_RSS = "process.rss"
HOST_TRACKS: tuple[str, ...] = (
    HOST_CPU_PERCENT,
    PROCESS_CPU_PERCENT,
    HOST_MEMORY_USED,
    HOST_MEMORY_PERCENT,
    HOST_DISK_READ,
    HOST_DISK_WRITE,
    HOST_NET_SENT,
    HOST_NET_RECV,
    PROCESS_RSS,
)

#: Every snapshot metric name above, for the test that keeps the readers on this vocabulary.
ALL: tuple[str, ...] = (
    RSS,
    VMS,
    RSS_PEAK,
    SAVED_UNIQUE,
    SAVED_PACKED,
    SAVED_COUNT,
    SAVED_BY_MODULE,
    CUDA_ALLOCATED,
    CUDA_RESERVED,
    CUDA_ALLOCATED_PEAK,
    CUDA_RESERVED_PEAK,
    FSDP_PEAK_PREFIX,
    MODULE_MEM_PEAK_PREFIX,
    FSDP_PEAK_TOTAL,
    MODULE_MEM_PEAK_TOTAL,
)
