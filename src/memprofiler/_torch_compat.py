"""Every private torch name memprofiler relies on, in one place, each pinned by
``tests/torch/test_private_api.py``.

torch has no public API for what several features need: the allocator's history and OOM
observer, the module tracker's hooks and ledgers, fake tensors and dispatch modes for the
estimate, memory categories from the profiler. :data:`PINNED` lists each private name (or a
public name inside a private module) with the feature that breaks without it, the parameter
names relied on for a Python callable, and the members read from it;
:data:`PINNED_ATTRIBUTES` the private attributes read from torch objects. The test fails on a
torch release that removes, renames or re-signs any of them, naming the feature. Names of a
CUDA build only (``torch._C._cuda_*``) are checked where torch was built with CUDA.

Checked on torch :data:`CHECKED_ON`. The range memprofiler accepts is ``torch`` in
``pyproject.toml``; this list is what a new torch release must be checked against.
"""

from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass

#: torch releases this list was checked on (the test checks the installed one on every run).
CHECKED_ON = ("2.13.0",)


@dataclass(frozen=True)
class Pin:
    """One private name: what needs it, and what of it is relied on."""

    feature: str
    """What breaks without it (a user-visible feature, and where the code is)."""
    params: tuple[str, ...] | None = None
    """The parameter names of a Python callable, in order; None: only its existence."""
    members: tuple[str, ...] = ()
    """Attributes read from it (enum members, methods, overloads)."""
    cuda: bool = False
    """Only in a CUDA build of torch."""


HIST = "allocator history recording (`cuda_allocator_history`) and snapshots (collectors/cuda_backend.py)"
OOM = "OOM records (the allocator's out-of-memory observer; collectors/cuda_backend.py)"
MARKS = "call marks in the allocator history (collectors/cuda_backend.py)"
SAVED = (
    "saved-tensor collection: each tensor's autograd node and module "
    "(collectors/saved_tensors.py, pytest_plugin/tracking.py)"
)
HOOKS = "module-tracker backward hooks without the gradients they hold (tracker_hooks.py: module_mem, fsdp, estimate)"
MODMEM = "module-wise memory (collectors/module_mem.py)"
FSDP = "FSDP2 memory by module (collectors/fsdp.py)"
RUNID = "the run id every rank agrees on, through the process group's store (core/run_setup.py)"
CATS = (
    "memory by category beside profiler traces (`*.memory_categories.json`, lightning/memory_categories.py)"
)
ADV_CKPT = "advise: activation checkpointing on a copy of the model (advice/checkpointing.py)"
FAKE = "estimate: the training step on fake tensors (estimate/engine.py, failures.py, fake/, cuda/)"
MODES = (
    "dispatch modes: the estimate's CUDA models (estimate/cuda/, fake/known_data.py, accumulation.py), "
    "advise's FLOPs"
)
TREE = "estimate: nested inputs and outputs (torch.utils._pytree; estimate/, lightning/estimate.py, advice/)"
BWD = "estimate: backward dispatched as CUDA would run it (estimate/cuda/dispatch.py)"
SDPA = "estimate: attention dispatched as on CUDA (estimate/cuda/dispatch.py, estimate/tracker.py)"
ACC = "estimate: autograd's gradient accumulation in place (estimate/accumulation.py)"
COMPILED = "estimate: compiled models (estimate/cuda/margins.py)"
OPTIM = "estimate: the optimizer's foreach kernels (estimate/cuda/optim.py)"
PG = "estimate: ranks without processes (the fake process group; estimate/parallel/strategies.py)"
FSDP_EST = "estimate: FSDP2 (estimate/parallel/strategies.py)"
DTENSOR = "estimate: DTensor sharding propagation on fake tensors (estimate/tracker.py)"
TRACKER = "estimate: the memory tracker's ledger (estimate/tracker.py)"
KNOWN = "estimate: real values beside the fake step (estimate/fake/known_data.py, fake/grouped_mm.py)"
NOTES = "estimate: notes on convolutions (estimate/notes.py)"
PIPE = "estimate: pipeline parallelism through torch's schedules (estimate/parallel/pipeline.py)"

#: Private torch names, by dotted path.
PINNED: dict[str, Pin] = {
    "torch.cuda.memory._record_memory_history": Pin(
        HIST,
        params=(
            "enabled",
            "context",
            "stacks",
            "max_entries",
            "device",
            "clear_history",
            "compile_context",
            "global_record_annotations",
            "skip_actions",
        ),
    ),
    "torch.cuda.memory._snapshot": Pin(HIST, params=("device", "augment_with_fx_traces")),
    "torch._C._cuda_record_memory_history": Pin(HIST, cuda=True),
    "torch._C._cuda_memorySnapshot": Pin(HIST, cuda=True),
    "torch._C._cuda_isHistoryEnabled": Pin(HIST, cuda=True),
    "torch._C._cuda_attach_out_of_memory_observer": Pin(OOM, cuda=True),
    "torch._C.DisableTorchFunctionSubclass": Pin(HIST),
    "torch.ops.profiler._record_function_enter_new": Pin(MARKS),
    "torch.ops.profiler._record_function_exit": Pin(MARKS, members=("_RecordFunction",)),
    "torch._C._autograd._get_sequence_nr": Pin(SAVED),
    "torch.nn.Module._wrapped_call_impl": Pin(SAVED, params=("self", "args", "kwargs")),
    "torch._C._current_graph_task_id": Pin(HOOKS),
    "torch._C._will_engine_execute_node": Pin(HOOKS),
    "torch.autograd.graph._MultiHandle": Pin(HOOKS, params=("handles",)),
    "torch.autograd.graph._get_grad_fn_or_grad_acc": Pin(HOOKS, params=("t",)),
    "torch.distributed._tools.mod_tracker.register_multi_grad_hook": Pin(
        HOOKS, params=("tensors", "fn", "mode")
    ),
    "torch.distributed._tools.mem_tracker.MemTracker": Pin(MODMEM),
    "torch.distributed._tools.mem_tracker.MemTracker._pre_fw_hook": Pin(
        MODMEM, params=("self", "module", "inputs")
    ),
    # overridden by tracker_hooks.DeadModulesSkipped (every memory tracker, the estimate's too)
    "torch.distributed._tools.mem_tracker.MemTracker._pre_bw_hook": Pin(
        MODMEM, params=("self", "module", "args")
    ),
    "torch.distributed._tools.mem_tracker.MemTracker._post_bw_hook": Pin(
        MODMEM, params=("self", "module", "args")
    ),
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker": Pin(FSDP),
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker._fsdp_state_pre_forward": Pin(
        FSDP, params=("self", "fsdp_mod", "orig_fsdp_state_pre_fw")
    ),
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker._instrument_optimizer": Pin(
        FSDP, params=("self",)
    ),
    "torch.distributed._tools.fsdp2_mem_tracker.FSDPMemTracker._track_optimizer_states": Pin(
        FSDP, params=("self", "reftype", "optimizer")
    ),
    "torch.distributed._tools.fsdp2_mem_tracker._FSDPRefType": Pin(
        FSDP,
        members=(
            "ALL_GATHER",
            "INP",
            "OPT",
            "REDUCE_SCATTER",
            "SHARDED_GRAD",
            "SHARDED_PARAM",
            "UNSHARDED_GRAD",
            "UNSHARDED_PARAM",
        ),
    ),
    "torch.distributed.distributed_c10d._get_default_store": Pin(RUNID, params=()),
    "torch._C._profiler._EventType": Pin(CATS, members=("Allocation", "TorchOp")),
    "torch._C._profiler._TensorMetadata": Pin(CATS),
    "torch.profiler._memory_profiler.MemoryProfileTimeline": Pin(CATS, params=("memory_profile",)),
    "torch.profiler._memory_profiler.Category": Pin(CATS),
    "torch.profiler._memory_profiler.TensorKey": Pin(CATS, members=("from_allocation", "from_tensor")),
    "torch.profiler._memory_profiler.Action": Pin(
        CATS, members=("CREATE", "DESTROY", "INCREMENT_VERSION", "PREEXISTING")
    ),
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointWrapper": Pin(ADV_CKPT),
    "torch.distributed.algorithms._checkpoint.checkpoint_wrapper.checkpoint_wrapper": Pin(
        ADV_CKPT, params=("module", "checkpoint_impl", "checkpoint_fn", "checkpoint_fn_kwargs")
    ),
    "torch.utils._python_dispatch.TorchDispatchMode": Pin(MODES),
    "torch.utils._python_dispatch._disable_current_modes": Pin(MODES, params=()),
    "torch.utils._pytree.keystr": Pin(TREE, params=("kp",)),
    "torch.utils._pytree.tree_flatten": Pin(TREE, params=("tree", "is_leaf")),
    "torch.utils._pytree.tree_flatten_with_path": Pin(TREE, params=("tree", "is_leaf")),
    "torch.utils._pytree.tree_leaves": Pin(TREE, params=("tree", "is_leaf")),
    "torch.utils._pytree.tree_map": Pin(TREE, params=("func", "tree", "rests", "is_leaf")),
    "torch.utils._pytree.tree_map_only": Pin(
        TREE, params=("type_or_types_or_pred", "func", "tree", "is_leaf")
    ),
    "torch._subclasses.fake_tensor.FakeTensorMode": Pin(FAKE),
    "torch.overrides._get_current_function_mode_stack": Pin(FAKE, params=()),
    "torch.utils._device.DeviceContext": Pin(FAKE),
    "torch._subclasses.fake_tensor.FakeTensor": Pin(FAKE),
    "torch._subclasses.fake_tensor.is_fake": Pin(FAKE, params=("x",)),
    "torch._subclasses.fake_tensor.DataDependentOutputException": Pin(FAKE),
    "torch._subclasses.fake_tensor.DynamicOutputShapeException": Pin(FAKE),
    "torch._subclasses.fake_tensor.UnsupportedFakeTensorException": Pin(FAKE),
    "torch._subclasses.fake_tensor.UnsupportedOperatorException": Pin(FAKE),
    "torch.autograd.graph._engine_run_backward": Pin(BWD, params=("t_outputs", "args", "kwargs")),
    "torch.autograd._make_grads": Pin(BWD, params=("outputs", "grads", "is_grads_batched")),
    "torch.autograd._tensor_or_tensors_to_tuple": Pin(BWD, params=("tensors", "length")),
    "torch._C._nn.scaled_dot_product_attention": Pin(SDPA),
    "torch.ops.aten._scaled_dot_product_efficient_attention": Pin(SDPA, members=("default",)),
    "torch._C._storage_Use_Count": Pin(ACC),
    "torch._prims_common.is_non_overlapping_and_dense_or_false": Pin(ACC, params=("a",)),
    "torch._dynamo.eval_frame.OptimizedModule": Pin(COMPILED),
    "torch.optim.optimizer._foreach_supported_types": Pin(OPTIM),
    "torch.testing._internal.distributed.fake_pg.FakeStore": Pin(PG),
    "torch.distributed.fsdp._fully_shard._fully_shard": Pin(FSDP_EST),
    "torch.distributed.tensor._sharding_prop.ShardingPropagator": Pin(DTENSOR),
    "torch.distributed._tools.mem_tracker._MemRefType": Pin(
        TRACKER, members=("ACT", "BUFFER", "GRAD", "OPT", "OTH", "PARAM", "TEMP")
    ),
    "torch.distributed._tools.mem_tracker._UpdateType": Pin(TRACKER, members=("ADD", "DEL", "REF", "SIZE")),
    "torch.distributed._tools.mem_tracker.MemTracker._track": Pin(TRACKER, params=("self", "reftype", "t")),
    "torch.distributed._tools.mem_tracker.MemTracker._update_and_maybe_create_winfos": Pin(
        TRACKER, params=("self", "t", "reftype", "update_existing")
    ),
    "torch.distributed._tools.mem_tracker.MemTracker._update_snap": Pin(
        TRACKER, params=("self", "u_type", "winfo", "old_mem_consumed", "old_reftype")
    ),
    "torch.distributed._tools.mem_tracker.MemTracker._track_module_params_and_buffers": Pin(
        TRACKER, params=("self", "module", "install_grad_hooks")
    ),
    "torch.distributed._tools.mem_tracker.MemTracker._update_peak_stats": Pin(
        TRACKER, params=("self", "peak_state")
    ),
    "torch.ops.aten._ctc_loss": Pin(KNOWN, members=("Tensor",)),
    "torch.ops.aten._grouped_mm": Pin(KNOWN, members=("default",)),
    "torch.ops.aten._local_scalar_dense": Pin(KNOWN, members=("default",)),
    "torch.nn.modules.conv._ConvNd": Pin(NOTES),
    "torch.distributed.pipelining._utils.InferenceMode": Pin(PIPE, members=("STATIC",)),
    "torch.distributed.pipelining.schedules._batch_p2p": Pin(PIPE, params=("p2p_ops", "desc")),
    "torch.distributed.pipelining.schedules._PipelineSchedule._warmup_p2p": Pin(
        PIPE, params=("self", "stages", "has_backward", "p2p_done")
    ),
}

#: Private attributes read from torch objects, by the class that sets them, with the feature.
PINNED_ATTRIBUTES: dict[str, tuple[tuple[str, ...], str]] = {
    "torch.distributed._tools.mem_tracker.MemTracker": (
        ("_mod_tracker", "_in_opt", "_param_to_grad_hook_handles"),
        TRACKER,
    ),
    "torch.distributed.pipelining.stage.PipelineStage": (("_inference_mode",), PIPE),
}


def resolve(dotted: str) -> object:
    """The object at ``dotted``: the longest importable module, then attributes.

    Raises:
        ImportError: no prefix of ``dotted`` imports.
        AttributeError: an attribute after the module is missing.
    """
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


def problem(name: str, pin: Pin, version: str) -> str | None:
    """What is wrong with ``name`` on the installed torch (``version``), naming the feature; None
    when it is there as relied on."""
    try:
        obj = resolve(name)
    except (ImportError, AttributeError) as err:
        return f"torch {version} has no `{name}` ({err}): {pin.feature} breaks"
    missing = [m for m in pin.members if not hasattr(obj, m)]
    if missing:
        return f"torch {version}: `{name}` lacks {', '.join(missing)}: {pin.feature} breaks"
    if pin.params is not None:
        try:
            params = tuple(inspect.signature(obj).parameters)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return f"torch {version}: `{name}` has no signature to check: {pin.feature} may break"
        if params != pin.params:
            return (
                f"torch {version}: `{name}` takes ({', '.join(params)}), memprofiler relies on "
                f"({', '.join(pin.params)}): {pin.feature} breaks"
            )
    return None
