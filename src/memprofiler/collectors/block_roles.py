"""What each block alive before a recording is: parameter, gradient, optimizer state, buffer.

A recording that starts mid-training sees the model's own memory only as blocks without a
stack: they were allocated before it began. At the window's start memprofiler knows the
module and its optimizers, so it lists the storage of every parameter, gradient, optimizer
state tensor and buffer (FSDP2: the local shard of each ``DTensor`` parameter, and the
unsharded parameter while it is gathered) with its role and dotted name. Readers match a
block to a role by its address: a caching-allocator block starts where its storage starts.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from memprofiler.analysis.snapshot.roles import role_category, role_label

__all__ = ["ROLES", "role_category", "role_label", "role_map"]

#: Role categories, in the order readers list them.
ROLES = ("parameter", "parameter (unsharded)", "gradient", "optimizer state", "buffer")


def _local(t: torch.Tensor) -> torch.Tensor:
    """The local shard of a ``DTensor`` (FSDP2's sharded parameters); the tensor otherwise."""
    local = getattr(t, "_local_tensor", None)
    return local if isinstance(local, torch.Tensor) else t


def _storage(t: torch.Tensor) -> tuple[int, int] | None:
    """``(address, bytes)`` of the storage behind ``t``; ``None`` for meta or empty tensors."""
    t = _local(t)
    if t.device.type == "meta":
        return None
    try:
        storage = t.untyped_storage()
        addr, nbytes = int(storage.data_ptr()), int(storage.nbytes())
    except (RuntimeError, NotImplementedError):  # tensor subclasses without a storage
        return None
    return (addr, nbytes) if addr and nbytes else None


def _entry(t: torch.Tensor, role: str, name: str, detail: str | None = None) -> dict[str, Any] | None:
    where = _storage(t)
    if where is None:
        return None
    out: dict[str, Any] = {"addr": where[0], "bytes": where[1], "role": role, "name": name}
    if detail:
        out["detail"] = detail
    return out


def _fsdp_params(module: nn.Module) -> dict[int, Any]:
    """FSDP2's ``FSDPParam`` behind each tensor it may register on a module, by ``id``.

    Between steps a module holds the sharded ``DTensor``; while gathered (inside forward, or
    after it with ``reshard_after_forward=False``) it holds the unsharded parameter instead,
    yet the local shard stays alive and the optimizer keeps its state under the ``DTensor``.
    """
    out: dict[int, Any] = {}
    for mod in module.modules():
        get_state = getattr(mod, "_get_fsdp_state", None)
        if get_state is None:
            continue
        try:
            group = getattr(get_state(), "_fsdp_param_group", None)
        except Exception:
            continue
        for fp in getattr(group, "fsdp_params", None) or ():
            for attr in ("sharded_param", "_unsharded_param", "_sharded_post_forward_param"):
                t = getattr(fp, attr, None)
                if isinstance(t, torch.Tensor):
                    out[id(t)] = fp
    return out


def role_map(
    module: nn.Module | None, optimizers: Sequence[torch.optim.Optimizer] = ()
) -> list[dict[str, Any]]:
    """Every storage of ``module`` and its ``optimizers`` with its role, sorted by address.

    Each entry is ``{"addr", "bytes", "role", "name"}`` (``"detail"``: the optimizer state's
    key, ``exp_avg``...). A storage named twice (tied weights) keeps its first name; one that
    holds several tensors of one role (FSDP2 reduce-scatters a parameter group's gradients
    into one buffer) lists the other names under ``"others"``.

    Example:
        >>> role_map(nn.Linear(2, 2))[0]["role"]  # doctest: +SKIP
        'parameter'
    """
    if module is None:
        return []
    entries: list[dict[str, Any] | None] = []
    names: dict[int, str] = {}
    fsdp = _fsdp_params(module)
    for name, p in module.named_parameters():
        fp = fsdp.get(id(p))
        if fp is not None:  # FSDP2: the local shard, whichever tensor the module holds now
            p = fp.sharded_param
        names[id(p)] = name
        entries.append(_entry(p, "parameter", name))
        if p.grad is not None:
            entries.append(_entry(p.grad, "gradient", name))
        unsharded = getattr(fp, "_unsharded_param", None)
        if isinstance(unsharded, torch.Tensor):  # its storage is freed (0 bytes) once resharded
            entries.append(_entry(unsharded, "parameter (unsharded)", name))
            if unsharded.grad is not None:  # kept across steps without gradient sync
                entries.append(_entry(unsharded.grad, "gradient", name, "unsharded"))
    for opt in optimizers:
        for group in getattr(opt, "param_groups", ()):
            for p in group.get("params", ()):
                state = opt.state.get(p) if hasattr(opt, "state") else None
                for key, value in _tensors(state):
                    entries.append(_entry(value, "optimizer state", names.get(id(p), "?"), key))
    for name, b in module.named_buffers():
        entries.append(_entry(b, "buffer", name))
    first: dict[int, dict[str, Any]] = {}
    for e in entries:
        if e is None:
            continue
        kept = first.setdefault(e["addr"], e)
        same_role = (kept["role"], kept.get("detail")) == (e["role"], e.get("detail"))
        if kept is not e and same_role and e["name"] != kept["name"]:
            # one block, several tensors: FSDP2 reduce-scatters a group's gradients into one
            others = kept.setdefault("others", [])
            if e["name"] not in others:
                others.append(e["name"])
    return sorted(first.values(), key=lambda e: e["addr"])


def _tensors(state: Any) -> Iterable[tuple[str, torch.Tensor]]:
    if not isinstance(state, dict):
        return ()
    return [(str(k), v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.numel() > 0]
