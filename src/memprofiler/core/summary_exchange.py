"""The two transports of the cross-rank summary; both move reduced figures, never snapshots.

* :func:`reduce_collective` (normal end of a run; every rank must call it): one
  ``all_gather`` of a 64-bit hash of each rank's metric keys, then three reductions of
  fixed-length float64 vectors (MAX, then SUM and MIN to rank 0). Each rank sends and rank 0
  holds O(metrics), whatever the world size. Ranks whose key sets differ (a rank that
  collected fewer calls, pipeline stages with other modules) first agree on the union: the
  lowest rank of each distinct key set broadcasts its keys, one broadcast per distinct set.
* :func:`post_to_store` / :func:`reduce_from_store` (after an exception): each rank posts
  its values (8 bytes a metric) to the default store without blocking, and its key list
  once per distinct key set; rank 0 folds in what arrives within a bounded time, one rank at
  a time, and deletes each post as it reads it. A collective here could hang forever when
  the other ranks are blocked in a different collective (one rank failed, the others still
  train); the store cannot.
"""

from __future__ import annotations

import json
import struct
import time
from array import array
from typing import Any

import torch

from memprofiler.core.summary_stats import Accumulator, MetricKey, Partial, RankMetrics

_STORE_PREFIX = "memprofiler/summary"
_HEADER = struct.Struct("<qq")  # key digest, number of metrics
_INF = float("inf")


def dist_ready() -> bool:
    """Whether a default process group exists to reduce over."""
    return bool(torch.distributed.is_available() and torch.distributed.is_initialized())


def _device() -> torch.device:
    # NCCL reduces CUDA tensors only; gloo (and "cpu:gloo,cuda:nccl") takes CPU tensors.
    if torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _agree_on_keys(metrics: RankMetrics, device: torch.device) -> list[MetricKey]:
    """The key order every rank uses: the shared one, or the union of differing ones."""
    dist = torch.distributed
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = torch.tensor([metrics.digest()], dtype=torch.int64, device=device)
    gathered = [torch.empty_like(mine) for _ in range(world)]
    dist.all_gather(gathered, mine)
    digests = torch.cat(gathered).tolist()
    if len(set(digests)) == 1:
        return metrics.keys
    owners: dict[int, int] = {}
    for r, d in enumerate(digests):
        owners.setdefault(d, r)
    union: dict[MetricKey, None] = {}
    for owner in sorted(owners.values()):
        box: list[Any] = [metrics.keys if rank == owner else None]
        dist.broadcast_object_list(box, src=owner, device=device)
        union.update(dict.fromkeys(tuple(k) for k in box[0]))
    return list(union)


def reduce_collective(metrics: RankMetrics) -> Partial | None:
    """Reduce every rank's metrics to rank 0 over the default process group.

    Every rank must call it, in the same order relative to other collectives.

    Args:
        metrics: this rank's flattened snapshots.

    Returns:
        On rank 0 the reduced figures over all ranks; elsewhere ``None``.

    Raises:
        RuntimeError: no process group, or a collective failed.
    """
    if not dist_ready():
        raise RuntimeError("torch.distributed is not initialized")
    dist = torch.distributed
    rank = dist.get_rank()
    device = _device()
    keys = _agree_on_keys(metrics, device)
    n = len(keys)
    if n == 0:  # every rank agreed on no keys: nothing to reduce
        return Partial.empty([]) if rank == 0 else None
    if keys is metrics.keys:
        vals, present, not_int = metrics.values, torch.ones(n, dtype=torch.float64), metrics.not_int
    else:
        slot = {k: i for i, k in enumerate(keys)}
        idx = torch.tensor([slot[k] for k in metrics.keys], dtype=torch.long)
        vals, present, not_int = (torch.zeros(n, dtype=torch.float64) for _ in range(3))
        vals[idx], present[idx], not_int[idx] = metrics.values, 1.0, metrics.not_int
    vals, present, not_int = vals.to(device), present.to(device), not_int.to(device)
    here = present > 0
    neg_inf = torch.full_like(vals, -_INF)
    high = torch.cat([torch.where(here, vals, neg_inf), torch.where(here, -vals, neg_inf), not_int])
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    top, neg_min, any_float = high.split(n)
    sums = torch.cat([torch.where(here, vals, torch.zeros_like(vals)), present])
    dist.reduce(sums, dst=0, op=dist.ReduceOp.SUM)
    # The max is one rank's value copied bit for bit, so == finds exactly the ranks holding it.
    cand = torch.where(here & (vals == top), torch.full_like(vals, float(rank)), -neg_inf)
    dist.reduce(cand, dst=0, op=dist.ReduceOp.MIN)
    if rank != 0:
        return None
    total, count = sums.cpu().split(n)
    return Partial(keys, top.cpu(), neg_min.cpu(), total, count, cand.cpu(), any_float.cpu())


def encode_values(metrics: RankMetrics) -> bytes:
    """One rank's post: key digest, count, float64 values, one not-integer byte per value."""
    values = array("d", metrics.values.tolist()).tobytes()
    not_int = bytes(int(v) for v in metrics.not_int.tolist())
    return _HEADER.pack(metrics.digest(), len(metrics.keys)) + values + not_int


def decode_values(payload: bytes) -> tuple[int, torch.Tensor, torch.Tensor]:
    """``(digest, values, not_int)`` of an :func:`encode_values` post."""
    digest, n = _HEADER.unpack_from(payload)
    start = _HEADER.size
    values = torch.frombuffer(bytearray(payload[start : start + 8 * n]), dtype=torch.float64)
    flags = torch.frombuffer(bytearray(payload[start + 8 * n : start + 9 * n]), dtype=torch.uint8)
    return digest, values, flags.to(torch.float64)


def _prefix(generation: int, channel: str) -> str:
    return f"{_STORE_PREFIX}/{generation}/{channel}"


def post_to_store(store: Any, metrics: RankMetrics, rank: int, generation: int, channel: str = "") -> None:
    """Post ``metrics`` for rank 0 to collect; never blocks. The key list goes once per set."""
    prefix = _prefix(generation, channel)
    keys_key = f"{prefix}/keys/{metrics.digest()}"
    if not store.check([keys_key]):  # a race posts it twice at worst: same value
        store.set(keys_key, json.dumps(metrics.keys))
    store.set(f"{prefix}/{rank}", encode_values(metrics))


def reduce_from_store(
    store: Any, own: RankMetrics, world_size: int, generation: int, timeout_s: float, channel: str = ""
) -> tuple[Partial, list[int]]:
    """On rank 0: fold in its own metrics and whatever the other ranks post within ``timeout_s``.

    Returns:
        The reduced figures and the ranks folded in, sorted.
    """
    prefix = _prefix(generation, channel)
    acc = Accumulator()
    acc.add(0, own)
    got = [0]
    digests = {own.digest()}
    deadline = time.monotonic() + timeout_s
    missing = set(range(1, world_size))
    while missing:
        for r in sorted(missing):
            key = f"{prefix}/{r}"
            if not store.check([key]):
                continue
            digest, values, not_int = decode_values(store.get(key))
            store.delete_key(key)  # consumed: a later exchange never reads it again
            keys: list[MetricKey] = []
            if not acc.knows(digest):  # the sender posted its key list before its values
                keys = [(s, m) for s, m in json.loads(store.get(f"{prefix}/keys/{digest}"))]
                digests.add(digest)
            acc.add_values(r, acc.index_of(keys, digest), values, not_int)
            got.append(r)
            missing.discard(r)
        if not missing or time.monotonic() >= deadline:
            break
        time.sleep(0.05)
    for digest in digests:
        store.delete_key(f"{prefix}/keys/{digest}")
    return acc.partial, sorted(got)
