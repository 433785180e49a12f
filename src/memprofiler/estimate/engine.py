"""Runs training steps on fake tensors (or real CPU ones) under a tracker, one rank's view.

Fake tensors carry shapes, dtypes and storages but no data, so a multi-billion-parameter
model costs no memory and ops cost no compute; everything an op allocates still goes
through the dispatcher, where the tracker sees it.
"""

from __future__ import annotations

import contextlib
import copy
import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import _get_current_function_mode_stack
from torch.utils._device import DeviceContext
from torch.utils._pytree import tree_map_only

from memprofiler.errors import ConfigError, MemProfilerError
from memprofiler.estimate import workers
from memprofiler.estimate.accumulation import lone_counts, routing_hooks
from memprofiler.estimate.allocator.caching import AllocatorConfig, MirroredReplay
from memprofiler.estimate.allocator.conf import read as read_alloc_conf
from memprofiler.estimate.cuda.margins import FLOAT8_NOTE, float8_modules
from memprofiler.estimate.cuda.model import CudaModel
from memprofiler.estimate.cuda.ops import OpHooks
from memprofiler.estimate.cuda.target import CudaTarget, resolve_target, target_notes, torch_rules
from memprofiler.estimate.cuda.workspaces import WorkspacePlan
from memprofiler.estimate.failures import (
    ModuleStack,
    check_batch,
    device_failure,
    fake_errors,
    fake_failure,
    forward_failure,
    mixed_devices,
    quiet_meta_failures,
    shape_failure,
)
from memprofiler.estimate.fake import ties
from memprofiler.estimate.fake.known_data import KnownValues
from memprofiler.estimate.notes import model_notes
from memprofiler.estimate.parallel import pipeline, pipeline_plan, strategies
from memprofiler.estimate.part import Part
from memprofiler.estimate.plan import EstimatePlan, LossFn, OptimizerFn
from memprofiler.estimate.probe import Probe
from memprofiler.estimate.result import MemoryEstimate
from memprofiler.estimate.saved import SavedBytes
from memprofiler.estimate.tracker import CAST_CACHE, Ledger, new_tracker
from memprofiler.tracker_hooks import gradient_free_module_hooks

__all__ = ["LossFn", "OptimizerFn", "as_loss", "default_loss", "describe", "estimate", "meta_copy"]
OPTIMIZER_EXAMPLE = "`lambda ps: torch.optim.AdamW(ps, lr=1e-4)`"


def default_loss(model: nn.Module, batch: Any) -> torch.Tensor:
    """Forward the batch (a tuple/list is unpacked) and reduce the output to a scalar."""
    out = model(*batch) if isinstance(batch, (tuple, list)) else model(batch)
    return as_loss(out)


def as_loss(out: Any) -> torch.Tensor:
    """The loss in a model's output: a scalar, ``out["loss"]``, ``out.loss``, or ``out.sum()``."""
    if isinstance(out, dict) and "loss" in out:
        out = out["loss"]
    elif not isinstance(out, torch.Tensor) and isinstance(getattr(out, "loss", None), torch.Tensor):
        out = out.loss
    if isinstance(out, (tuple, list)) and out and isinstance(out[0], torch.Tensor):
        out = out[0]
    if not isinstance(out, torch.Tensor):
        raise ConfigError(
            "loss_fn", f"the model returned {type(out).__name__}; pass `loss_fn` that returns the loss"
        )
    return out if out.dim() == 0 else out.sum()


#: The run's note where no CUDA target applies (``device`` neither ``cpu`` nor ``cuda``).
ON_CPU = (
    "ran on fake CPU tensors (on every machine, so a GPU node gives the same figures); kernels that "
    "save different tensors on CUDA (attention backends) are counted as on CPU"
)
#: The run's note for a CUDA target (:mod:`memprofiler.estimate.cuda.dispatch`); ``{tensors}``
#: says which tensors the steps ran on.
ON_CPU_AS_CUDA = (
    "ran on {tensors} (on every machine, so a GPU node gives the same figures), dispatching as CUDA "
    "would: attention by torch's CUDA backend rules, cuBLAS workspaces by its handle rules; CPU autocast "
    "stands in for CUDA's"
)
FAKE_TENSORS = "fake CPU tensors"
REAL_TENSORS = "real CPU tensors (fake=False: the memory was allocated)"


def run_device(device: str, fake: bool, target: CudaTarget | None = None) -> tuple[str, list[str]]:
    """Where the steps run (:data:`strategies.RUN_DEVICE` on every machine, whatever it has) and
    the notes that say so; a CUDA ``target`` is named first and modelled by CUDA's dispatch rules
    and the caching allocator's replay."""
    if target is not None:
        tensors = FAKE_TENSORS if fake else REAL_TENSORS
        return strategies.RUN_DEVICE, [f"target: {target.describe()}", ON_CPU_AS_CUDA.format(tensors=tensors)]
    if device == "cpu" or not fake:
        return strategies.RUN_DEVICE, []
    return strategies.RUN_DEVICE, [ON_CPU]


def meta_copy(model: nn.Module) -> nn.Module:
    """A copy of ``model`` whose parameters and buffers are on the meta device (costs no memory)."""
    memo: dict[int, Any] = {}
    for p in model.parameters():
        memo[id(p)] = nn.Parameter(torch.empty_like(p, device="meta"), requires_grad=p.requires_grad)
    for b in model.buffers():
        memo[id(b)] = torch.empty_like(b, device="meta")
    return copy.deepcopy(model, memo)


def _cast_meta(model: nn.Module, dtype: torch.dtype) -> list[list[ties.Place]]:
    """Cast the meta copy to ``dtype`` before fake mode (torch refuses to swap a fake parameter that
    fake mode holds a weak reference to: ``bf16-true`` failed); returns its ties, found first."""
    tied = ties.find_ties(model)
    if dtype != torch.float32:
        model.to(dtype)
    return tied


def _default_device_set() -> bool:
    """Whether a default device is in force (``torch.set_default_device``, ``with torch.device``)."""
    return any(isinstance(m, DeviceContext) for m in _get_current_function_mode_stack())


def _materialize(model: nn.Module, device: str, tied: list[list[ties.Place]]) -> None:
    model.to_empty(device=device)
    ties.restore_ties(tied)


def _to_fake(
    batch: Any, mode: Any, device: str, dtype: torch.dtype | None = None, copies: bool = False
) -> Any:
    """The batch on the run device; with ``dtype``, its floating-point tensors converted to it.

    ``copies`` (a CUDA target): each tensor of the batch is its own copy, as when a batch is moved
    to the GPU tensor by tensor (Lightning's ``batch_to_device``, ``{k: v.to("cuda")}``): a CPU
    tensor that stands in two places (``{"input_ids": ids, "labels": ids}``) becomes two.
    """
    seen: set[int] = set()

    def conv(t: torch.Tensor) -> torch.Tensor:
        key = t.untyped_storage()._cdata
        shared = copies and key in seen
        seen.add(key)
        t = mode.from_tensor(t) if mode is not None else t
        t = t.to(device, dtype) if dtype is not None and t.is_floating_point() else t.to(device)
        return t.clone() if shared else t

    return tree_map_only(torch.Tensor, conv, batch)


def estimate(model: nn.Module, batch: Any, plan: EstimatePlan, probe: Probe | None = None) -> MemoryEstimate:
    """Run ``plan.steps`` training steps of one rank and return the estimate (see ``estimate_plan``);
    with a pipeline, of every rank, the highest peak first."""
    probe = probe if probe is not None else Probe()
    check_batch(batch)
    if plan.pipeline is None:
        return _estimate_rank(model, batch, plan, probe, 0)
    pipeline_plan.check_batch(batch, plan.pipeline.microbatches)
    ranks = [_estimate_rank(model, batch, plan, probe, r) for r in range(plan.world_size)]
    return pipeline_plan.worst_rank(ranks, plan.pipeline)


def _estimate_rank(
    model: nn.Module, batch: Any, plan: EstimatePlan, probe: Probe, rank: int
) -> MemoryEstimate:
    """One rank's estimate: rank ``rank`` of the fake process group (a pipeline's stages differ by rank)."""
    cuda = plan.device.startswith("cuda")
    target: CudaTarget | None = resolve_target(plan.gpu, plan.torch_version) if cuda else None
    # The environment is read (and refused where torch would refuse it) before anything runs.
    env_conf = read_alloc_conf(os.environ) if cuda else None
    workspaces = WorkspacePlan.for_target(target) if target is not None else None
    where, notes = run_device(plan.device, plan.fake, target)
    if target is not None:
        notes += target_notes(target)
    notes += model_notes(model)
    user_model = model
    distributed = plan.strategy in strategies.DISTRIBUTED or plan.pipeline is not None
    loss_fn = plan.loss_fn or default_loss
    pg = strategies.fake_process_group(plan.world_size, rank) if distributed else contextlib.nullcontext()
    with pg:
        from torch._subclasses.fake_tensor import FakeTensorMode

        mode = FakeTensorMode(allow_non_fake_inputs=True) if plan.fake else None
        stages = _Stages(user_model, plan, rank, where)
        model = stages.model if stages.plan is not None else meta_copy(model)  # never the caller's module
        _parallelize(model, plan, distributed)
        fsdp = strategies.has_fsdp(
            model
        )  # FSDP2's tracker; a tensor-parallel model alone takes the plain one
        tied = _cast_meta(model, strategies.param_dtype(plan.precision))
        # Tensors made with no device (a loss's constant, Adam's step count) go to the run
        # device, not to a default device the caller set (`torch.set_default_device("cuda")`).
        # Without a default device of the caller's (torch's is the CPU, the run device), no device
        # mode is entered: each tensor method and attribute of the steps (92,000 in two 7B steps)
        # would pass through it for nothing.
        redirect = (
            torch.device(where) if where != "cpu" or _default_device_set() else contextlib.nullcontext()
        )
        with redirect, mode if mode is not None else contextlib.nullcontext():
            _materialize(model, where, tied)
            fake_batch = _to_fake(batch, mode, where, strategies.input_dtype(plan.precision), copies=cuda)
            opt = _optimizer(model, plan)
            # the tracker is made below; a stage's backward runs only inside the steps
            train = stages.train(fake_batch, lambda outputs: routing_hooks(tracker, outputs))
            alloc_conf = AllocatorConfig.from_conf(env_conf) if env_conf is not None else AllocatorConfig()
            lone_counts()  # measured once per process, before a tracker's module hooks exist
            tracker = new_tracker(fsdp, model, opt, MirroredReplay(alloc_conf, plan.device_memory))
            led: Ledger = tracker.ledger
            tracker.host_data_in_opt = target is not None
            tracker.host_rng = target is not None
            tracker.repeated_forwards = train is not None
            if fsdp:
                tracker.track_inputs((fake_batch,))
            else:
                tracker.track_external(*[t for t in _tensors(fake_batch)])
            if plan.strategy == "ddp":  # allocated when DDP wraps the model, held for the run
                for n in strategies.ddp_buckets(model):
                    led.move("ddp_buckets", n)
                    led.allocator.alloc(led.no_tensor_key(), n)
            saved = SavedBytes(model)
            peak_step = 1
            resident: dict[str, int] = {}
            device = None
            if target is not None and env_conf is not None and workspaces is not None:
                device = CudaModel(target, tracker, opt, env_conf, workspaces, plan.steps, model)
            parts: list[Part] = [*(device.parts if device is not None else [])]
            if mode is not None:
                parts.append(KnownValues(batch, fake_batch))
            with contextlib.ExitStack() as stack:
                stack.enter_context(gradient_free_module_hooks())
                stack.enter_context(tracker)
                hooks = [h for h in (part.hook() for part in parts) if h is not None]
                if hooks:
                    stack.enter_context(OpHooks(hooks))
                for part in parts:
                    stack.enter_context(part.mode())
                probe.steps_start(model, opt, tracker)
                for step in range(1, plan.steps + 1):
                    probe.step_start(step)
                    before = led.peak
                    resident = _one_step(
                        model, fake_batch, opt, loss_fn, tracker, saved, plan.precision, where, train
                    )
                    if led.peak > before:
                        peak_step = step
                probe.steps_end()
    for part in parts:
        notes = part.notes(notes)
    peak = led.allocator.peak_allocated if cuda else led.peak
    float8 = float8_modules(user_model, model)
    if float8:
        notes.append(FLOAT8_NOTE.format(names=", ".join(float8)))
    models = [user_model, model]
    strategy = "pipeline" if plan.pipeline is not None else plan.strategy
    extra = device.margins(models, peak, strategy, plan.world_size) if device is not None else []
    notes += [m.line() for m in extra]
    cast = led.peak_by_category.get(CAST_CACHE, 0)
    if cast:
        notes.append(
            f"autocast's copies of the weights in {plan.precision.split('-')[0]} (its cast cache, kept from a weight's "
            f"first use to the end of forward and saved for backward) are {cast:,} B of the peak, counted as "
            f"`{CAST_CACHE}`, not activations; FSDP2's mixed precision (MixedPrecisionPolicy(param_dtype=...)) "
            "gathers the weights in that dtype instead and keeps no such copy"
        )
    workers.warmed()
    return MemoryEstimate(
        peak_bytes=peak,
        tensor_peak_bytes=led.peak - led.peak_held,
        reserved_peak_bytes=led.allocator.peak_reserved if cuda else led.peak,
        by_category=dict(sorted(led.peak_by_category.items(), key=lambda kv: -kv[1])),
        resident=resident,
        saved_bytes=saved.unique_bytes,
        peak_module=led.peak_module,
        peak_op=led.peak_op,
        peak_phase=led.peak_phase,
        peak_step=peak_step,
        strategy=plan.strategy,
        world_size=plan.world_size,
        precision=plan.precision,
        device=plan.device,
        steps=plan.steps,
        fake=plan.fake,
        notes=notes,
        target=target.describe() if target is not None else "",
        workspace_bytes=device.workspace_bytes() if device is not None else {},
        torch_rules=torch_rules(target) if target is not None else {},
        margin_bytes=sum(m.nbytes for m in extra),
    )


class _Stages:
    """A pipeline rank's stage modules (a meta copy each, cut by ``pipeline.split``) and, once
    materialised, torch's schedule over them (:mod:`memprofiler.estimate.parallel.pipeline`)."""

    def __init__(self, user_model: nn.Module, plan: EstimatePlan, rank: int, where: str) -> None:
        self.plan = plan.pipeline
        self.user_model = user_model
        self.precision = plan.precision
        self.where = where
        self.count = plan.world_size * self.plan.per_rank if self.plan is not None else 1
        self.ids = self.plan.stages_of(rank, plan.world_size) if self.plan is not None else [0]
        self.modules = [self.cut(s) for s in self.ids] if self.plan is not None else []
        self.model = pipeline.rank_model(self.modules) if self.modules else user_model
        # Every stage once more, for the shapes a stage takes and gives; cut and cast before fake
        # mode, as the rank's own (see _cast_meta).
        dtype = strategies.param_dtype(plan.precision)
        every = [self.cut(s) for s in range(self.count)] if self.plan is not None else []
        self.shape_runs = [(m, _cast_meta(m, dtype)) for m in every]

    def cut(self, stage: int) -> nn.Module:
        assert self.plan is not None
        with torch.device("meta"):
            return self.plan.split(meta_copy(self.user_model), stage, self.count)

    def _fake_stage(self, stage: int) -> nn.Module:
        module, tied = self.shape_runs[stage]
        _materialize(module, self.where, tied)
        return module

    def train(
        self, fake_batch: Any, around_backward: Callable[[list[torch.Tensor]], Any]
    ) -> Callable[[], None] | None:
        """The step's forward and backward as torch's schedule runs them; None without a pipeline.
        Call inside the fake mode, after the rank's modules are materialised."""
        if self.plan is None:
            return None
        plan = self.plan
        inputs, target = pipeline_plan.check_batch(fake_batch, plan.microbatches)
        with quiet_meta_failures():
            io = pipeline.stage_io(
                self._fake_stage,
                inputs,
                self.count,
                plan.microbatches,
                lambda: strategies.autocast(self.precision, self.where),
            )
        schedule = pipeline.new_schedule(
            plan, self.modules, self.ids, self.count, io, self.where, around_backward
        )
        first, last = 0 in self.ids, self.count - 1 in self.ids
        return lambda: pipeline.step(schedule, plan, first, last, inputs, target)


def _parallelize(model: nn.Module, plan: EstimatePlan, distributed: bool) -> None:
    """The plan's parallelisation of the meta copy, outside fake mode (the device mesh needs real
    ranks): the user's ``parallelize`` with the plan's mesh, then, under ``fsdp``, FSDP2 on what
    it left unsharded (``tp`` shards only what ``parallelize`` shards)."""
    if plan.pipeline is not None:  # each stage is the plan's split; nothing else is parallel
        return
    if not distributed:
        if plan.parallelize is not None:
            with torch.device("meta"):
                plan.parallelize(model, None)
        return
    with strategies.default_mesh_on_run_device(plan.world_size):
        mesh = strategies.device_mesh(*plan.mesh())
        if plan.parallelize is not None:
            with torch.device("meta"):
                plan.parallelize(model, mesh)
        if plan.strategy == "tp" and not strategies.is_fully_sharded(model):
            raise ConfigError(
                "parallelize",
                "strategy 'tp' needs a `parallelize(model, mesh)` that shards the model "
                "(`parallelize_module(model, mesh, plan)`); it left every parameter whole",
            )
        if plan.parallelize is not None:
            # left unsharded (a configure_model that shards nothing): data parallel over every rank
            mesh = None if strategies.is_fully_sharded(model) else strategies.device_mesh((plan.world_size,))
        if plan.strategy == "fsdp" and mesh is not None:
            strategies.fully_shard_model(model, mesh, plan.shard_policy, **plan.fsdp_options())


def _optimizer(model: nn.Module, plan: EstimatePlan) -> torch.optim.Optimizer:
    if plan.optimizer_of_model is not None:  # LightningModule.configure_optimizers
        return plan.optimizer_of_model(model)
    if plan.optimizer is not None:
        return _checked_optimizer(plan.optimizer(model.parameters()))
    raise ConfigError("optimizer", f"pass a callable, e.g. {OPTIMIZER_EXAMPLE}")


def _checked_optimizer(opt: Any) -> torch.optim.Optimizer:
    """``opt`` when the factory returned an optimizer; else one line naming ``optimizer``."""
    if isinstance(opt, torch.optim.Optimizer):
        return opt
    raise ConfigError(
        "optimizer",
        f"the factory returned {describe(opt)}, not a torch.optim.Optimizer; return an instance built "
        f"from the parameters it is given, e.g. {OPTIMIZER_EXAMPLE}",
    )


def describe(obj: Any) -> str:
    """``None``, ``the class `AdamW```, or ``a dict``: what a user's callable returned."""
    if obj is None:
        return "None"
    if isinstance(obj, type):
        return f"the class `{obj.__name__}`"
    return f"a {type(obj).__name__}"


def _one_step(
    model: nn.Module,
    batch: Any,
    opt: torch.optim.Optimizer,
    loss_fn: LossFn,
    tracker: Any,
    saved: SavedBytes,
    precision: str,
    where: str,
    train: Callable[[], None] | None = None,
) -> dict[str, int]:
    """One training step; ``train``: a pipeline schedule's forward and backward instead of
    ``loss_fn`` and ``backward()``."""
    tracker.reset_mod_stats()
    saved.reset()
    tracker.phase = "forward"
    with ModuleStack(model) as stack, quiet_meta_failures():
        try:
            tracker.autocast_dtype = strategies.PRECISIONS[precision][0]
            try:
                with saved, strategies.autocast(precision, where):
                    loss = loss_fn(model, batch) if train is None else None
                    if train is not None:
                        train()
            finally:
                tracker.autocast_dtype = None
            if loss is not None:
                with routing_hooks(tracker, loss):
                    loss.backward()
            tracker.optimizer = opt
            try:
                opt.step()
            finally:
                tracker.optimizer = None
        except fake_errors() as err:
            raise fake_failure(err, stack.innermost()) from None
        except (RuntimeError, IndexError) as err:
            if "fake impl" in str(err) or "Meta kernel" in str(err):
                raise fake_failure(err, stack.innermost()) from None
            if not stack.stack:  # outside any module's forward: not the batch's doing
                raise
            devices = mixed_devices(err)
            if devices is not None:  # a tensor put on a fixed device in forward
                raise device_failure(devices, stack.innermost(), stack.innermost_inputs()[0]) from None
            raise shape_failure(err, stack.innermost(), *stack.innermost_inputs()) from None
        except (ValueError, TypeError, KeyError, AttributeError) as err:
            if isinstance(err, MemProfilerError) or not stack.stack:
                raise
            raise forward_failure(err, stack.innermost(), stack.innermost_inputs()[0]) from err
    tracker.mark_optimizer_state(opt)
    resident = _resident(model, opt, tracker._host)
    opt.zero_grad()
    return resident


def _tensors(batch: Any) -> list[torch.Tensor]:
    out: list[torch.Tensor] = []
    tree_map_only(torch.Tensor, out.append, batch)
    return out


def _resident(model: nn.Module, opt: torch.optim.Optimizer, host: Any = None) -> dict[str, int]:
    """Bytes that outlive a step, each storage once: what the analytic formulas give.

    ``host``: storages a real run keeps on the host (a CUDA target's optimizer step counts; none
    for a CPU estimate), left out.
    """

    def total(tensors: Sequence[torch.Tensor]) -> int:
        seen: dict[int, int] = {}
        for t in tensors:
            to_local = getattr(t, "to_local", None)
            st = (to_local() if callable(to_local) else t).untyped_storage()
            if host is not None and st in host:
                continue
            seen[st._cdata] = st.nbytes()
        return sum(seen.values())

    params = list(model.parameters())
    state = [v for s in opt.state.values() for v in s.values() if isinstance(v, torch.Tensor)]
    return {
        "parameters": total(params),
        "buffers": total(list(model.buffers())),
        "gradients": total([p.grad for p in params if p.grad is not None]),
        "optimizer_state": total(state),
    }
