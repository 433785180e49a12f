"""FSDP2's side streams, named, for the allocator model's per-stream pools.

What each allocates, from torch's source (``torch/distributed/fsdp/_fully_shard/``):

- ``_fsdp_collectives.foreach_all_gather`` runs under ``device_handle.stream(all_gather_copy_in_stream)``:
  the all-gather output (the input is a view into it) and, with a ``MixedPrecisionPolicy``
  ``param_dtype``, the flat cast copy of the shards (``_get_param_all_gather_inputs``, freed
  once copied in). Only in forward and in the pre-backward unshard without ``async_op``
  (``FSDPCommContext.get_all_gather_streams``); otherwise the current stream.
- The all-gather itself runs on ``all_gather_stream`` and allocates nothing there.
- ``foreach_all_gather_copy_out`` (in ``FSDPParamGroup.wait_for_unshard``) allocates the unsharded
  parameters on the current (default) stream. In forward the all-gather output is kept in
  ``comm_ctx.all_gather_state`` until the next group's copy-out (two outputs live at once),
  and the root's post-forward drops the last; in backward it is freed after the copy-out.
- ``foreach_reduce``: the reduce-scatter input on the current (default) stream, kept in
  ``comm_ctx.reduce_scatter_states`` until the next group's post-backward (at most
  ``reduce_scatter_max_input_buffers``, 1 by default); the reduce-scatter output under
  ``device_handle.stream(reduce_scatter_stream)``; the sharded gradients are views of it, or
  casts to the parameter's dtype made on the same stream, so they live in its pool until
  ``zero_grad``.
- HSDP: the all-reduce runs in place on ``all_reduce_stream`` (``_all_reduce_state`` holds the
  reduce-dtype output until the next group's post-backward).

No ``record_stream`` is called; lifetimes follow Python references and events only, which the
estimate's fake run keeps exactly, so each block's stream is the one current at its allocation.
"""

from __future__ import annotations

from typing import Any

from torch import nn

#: ``FSDPCommContext``'s attributes (``_fsdp_param_group.py``, ``lazy_init``) and their names.
SIDE_STREAMS = (
    ("all_gather_copy_in_stream", "all-gather copy-in"),
    ("all_gather_stream", "all-gather"),
    ("reduce_scatter_stream", "reduce-scatter"),
    ("all_reduce_stream", "all-reduce"),
)


def stream_names(model: nn.Module, streams: list[Any]) -> dict[int, str]:
    """``streams`` (the tracker's, the default first) by index -> a name: FSDP2's by their role."""
    names = {0: "default"}
    ctx = _comm_context(model)
    for attr, label in SIDE_STREAMS:
        stream = getattr(ctx, attr, None)
        for i, known in enumerate(streams):
            if i and stream is not None and known is stream:
                names[i] = label
    for i in range(len(streams)):
        names.setdefault(i, f"stream {i}")
    return names


def _comm_context(model: nn.Module) -> Any:
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:
        return None
    for m in model.modules():
        if isinstance(m, FSDPModule):
            return getattr(m._get_fsdp_state(), "_comm_ctx", None)
    return None
