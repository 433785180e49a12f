"""The changes ``advise`` tries, each only where it applies to the model and plan.

A :class:`Candidate` is one kind of change with its variants, cheapest first: memory falls
along them (more blocks checkpointed, a smaller micro-batch), so the search takes the first
that fits. Changes of one kind exclude each other; changes of different kinds combine.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch

from memprofiler.advice import checkpointing
from memprofiler.advice.costs import FREE, THROUGHPUT, TRAINING, WORK, Cost, ring_share
from memprofiler.advice.flops import ForwardFlops
from memprofiler.advice.optimizers import OptimizerSpec, has_flag, inspect_factory, steps_with
from memprofiler.advice.plan import Plan
from memprofiler.errors import ConfigError

CHECKPOINT, PRECISION, SHARDING, OPTIMIZER, BATCH = (
    "checkpointing",
    "precision",
    "sharding",
    "optimizer",
    "batch",
)


@dataclass(frozen=True)
class Variant:
    """One concrete change: its words, how it changes a plan, what it costs there, its patch."""

    change: str
    apply: Callable[[Plan], Plan]
    cost: Callable[[Plan], Cost]
    yaml: tuple[str, ...] = ()
    python: tuple[str, ...] = ()


@dataclass(frozen=True)
class Candidate:
    name: str
    kind: str
    variants: tuple[Variant, ...]
    """Cheapest first; each saves at least as much memory as the one before."""


@dataclass
class Context:
    """What the candidates need to know of the base plan, read once."""

    plan: Plan
    flops: ForwardFlops
    block_names: list[str]
    params: int
    spec: OptimizerSpec | None

    @classmethod
    def of(cls, plan: Plan, flops: ForwardFlops) -> Context:
        found = checkpointing.blocks(plan.model)
        names = [f"{name}.{i}" if name else str(i) for name, _, i in found]
        params = sum(p.numel() for p in plan.model.parameters())
        return cls(plan, flops, names, params, inspect_factory(plan.optimizer))


#: Every candidate name, in the order the table lists them.
NAMES = (
    "checkpoint-blocks",
    "checkpoint-every-2",
    "checkpoint-selective",
    "checkpoint-full",
    "bf16-mixed",
    "bf16-true",
    "fsdp",
    "hsdp",
    "fsdp-mixed-precision",
    "reshard-after-forward",
    "larger-shard-group",
    "cpu-offload",
    "fused-step",
    "for-loop-step",
    "set-to-none",
    "sgd-momentum",
    "adafactor",
    "8bit-optimizer",
    "micro-batch",
)
#: The optimizers whose state the lighter ones replace: two moments per parameter.
_ADAM = (torch.optim.Adam, torch.optim.AdamW)
#: 8-bit AdamW of each library that has one, by the module that must be importable: (module, class).
EIGHT_BIT = (("torchao", "torchao.optim", "AdamW8bit"), ("bitsandbytes", "bitsandbytes.optim", "AdamW8bit"))
#: Why FSDP2's CPU offload is not tried: it cannot run on fake tensors.
OFFLOAD = "FSDP2's CPUOffloadPolicy pins host memory (aten._pin_memory), which fake tensors cannot do"
_CHECKPOINTS = {n for n in NAMES if n.startswith("checkpoint-")}


def check_names(names: list[str] | None, key: str = "candidates") -> None:
    for name in names or []:
        if name not in NAMES:
            raise ConfigError(key, f"unknown candidate {name!r}; use some of {', '.join(NAMES)}")


def param_bytes(ctx: Context, plan: Plan) -> int:
    size = {"bf16-true": 2, "16-true": 2, "64-true": 8}.get(plan.precision, 4)
    return ctx.params * size


def _checkpoint_cost(ctx: Context, ck: checkpointing.Checkpoint) -> Callable[[Plan], Cost]:
    def cost(plan: Plan) -> Cost:
        flops = ctx.flops.recomputed(ck)
        share = flops / ctx.flops.step() if ctx.flops.total else 0.0
        how = "selectively (every other matmul and attention kept)" if ck.selective else "in full"
        return Cost(
            f"backward recomputes {len(ck.blocks)} block(s)' forward {how}",
            WORK,
            share,
            recompute_flops=flops,
            recompute_share=share,
        )

    return cost


def _checkpoint_variant(ctx: Context, ck: checkpointing.Checkpoint, words: str) -> Variant:
    containers = sorted({name.rsplit(".", 1)[0] for name in ctx.block_names})
    picked = [ctx.block_names[i] for i in ck.blocks]
    python = ["from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper"]
    for owner, _ in checkpointing.caching_configs(ctx.plan.model):
        where = f"model.{owner}" if owner else "model"
        python.append(f"{where}.config.use_cache = False  # recomputation must not see a filled cache")
    if ck.selective:
        python.append(
            "# context_fn: torchtitan's per-op policy (memprofiler.advice.checkpointing.selective_context)"
        )
    extra = ", context_fn=selective_context" if ck.selective else ""
    if len(picked) == len(ctx.block_names):
        for c in containers:
            python.append(
                f"for i, block in enumerate(model.{c}): model.{c}[i] = checkpoint_wrapper(block{extra})"
            )
    else:
        for name in picked:
            c, i = name.rsplit(".", 1)
            python.append(f"model.{c}[{i}] = checkpoint_wrapper(model.{c}[{i}]{extra})")
    return Variant(
        words,
        lambda plan: plan.with_change(words, checkpoint=ck),
        _checkpoint_cost(ctx, ck),
        python=tuple(python),
    )


def _checkpoints(ctx: Context) -> list[Candidate]:
    n = len(ctx.block_names)
    out = []
    if n >= 2:
        variants = tuple(
            _checkpoint_variant(
                ctx,
                checkpointing.Checkpoint(checkpointing.pick(n, k)),
                f"checkpoint the first {k} of {n} blocks",
            )
            for k in range(1, n)
        )
        out.append(Candidate("checkpoint-blocks", CHECKPOINT, variants))
    if n >= 4:
        ck = checkpointing.Checkpoint(checkpointing.every(n, 2))
        out.append(
            Candidate(
                "checkpoint-every-2",
                CHECKPOINT,
                (_checkpoint_variant(ctx, ck, f"checkpoint every other block ({len(ck.blocks)} of {n})"),),
            )
        )
    every = tuple(range(n))
    out.append(
        Candidate(
            "checkpoint-selective",
            CHECKPOINT,
            (
                _checkpoint_variant(
                    ctx,
                    checkpointing.Checkpoint(every, selective=True),
                    f"selective per-op checkpointing of all {n} blocks",
                ),
            ),
        )
    )
    out.append(
        Candidate(
            "checkpoint-full",
            CHECKPOINT,
            (_checkpoint_variant(ctx, checkpointing.Checkpoint(every), f"checkpoint all {n} blocks"),),
        )
    )
    return out


def _precisions(ctx: Context) -> list[Candidate]:
    out = []
    base = ctx.plan.precision
    if base in ("32-true", "32", "16-mixed"):
        out.append(
            Candidate(
                "bf16-mixed",
                PRECISION,
                (
                    Variant(
                        "precision bf16-mixed (autocast; fp32 weights and optimizer state)",
                        lambda plan: plan.with_change("bf16-mixed", precision="bf16-mixed"),
                        lambda plan: Cost(
                            "matmuls in bf16 under autocast (usually faster on GPU)", THROUGHPUT
                        ),
                        yaml=("trainer:", "  precision: bf16-mixed"),
                        python=("with torch.autocast('cuda', dtype=torch.bfloat16): loss = ...",),
                    ),
                ),
            )
        )
    if base in ("32-true", "32", "16-mixed", "bf16-mixed"):
        out.append(
            Candidate(
                "bf16-true",
                PRECISION,
                (
                    Variant(
                        "precision bf16-true (bf16 weights, gradients and optimizer state)",
                        lambda plan: plan.with_change("bf16-true", precision="bf16-true"),
                        lambda plan: Cost(
                            "no fp32 master weights: updates smaller than bf16's precision are lost", TRAINING
                        ),
                        yaml=("trainer:", "  precision: bf16-true"),
                        python=("model.to(torch.bfloat16)  # and the batch's floating-point tensors",),
                    ),
                ),
            )
        )
    return out


def _one(name: str, kind: str, variant: Variant) -> Candidate:
    return Candidate(name, kind, (variant,))


_FSDP_LINES = ("from torch.distributed.fsdp import fully_shard",)


def _sharding(ctx: Context) -> list[Candidate]:
    plan = ctx.plan
    out: list[Candidate] = []
    n = plan.world_size
    if plan.strategy == "ddp" and n >= 2:

        def cost(p: Plan) -> Cost:
            extra = int(ring_share(p.world_size) * param_bytes(ctx, p))
            base = 2 * ring_share(p.world_size) * param_bytes(ctx, p)
            return Cost(
                "FSDP2 all-gathers the parameters in forward and again in backward and reduce-scatters the "
                "gradients, where DDP all-reduces the gradients",
                WORK,
                extra / base if base else 0.0,
                comm_bytes=extra,
            )

        out.append(
            _one(
                "fsdp",
                SHARDING,
                Variant(
                    f"FSDP2 over {n} ranks instead of DDP",
                    lambda p: p.with_change("fsdp", strategy="fsdp"),
                    cost,
                    yaml=(
                        "trainer:",
                        "  strategy:",
                        "    class_path: lightning.pytorch.strategies.ModelParallelStrategy",
                        "# and in configure_model: fully_shard(block) for each block, then fully_shard(self)",
                    ),
                    python=(*_FSDP_LINES, "for block in blocks: fully_shard(block)", "fully_shard(model)"),
                ),
            )
        )
        if n >= 16 and n % 8 == 0:
            shape = (n // 8, 8)
            out.append(
                _one(
                    "hsdp",
                    SHARDING,
                    Variant(
                        f"HSDP instead of DDP: sharded within groups of 8 ranks, replicated over {n // 8}",
                        lambda p: p.with_change("hsdp", strategy="fsdp", mesh_shape=shape),
                        lambda p: Cost(
                            "parameters all-gathered within each group of 8 (fast links), gradients reduce-scattered "
                            "there and all-reduced across groups",
                            WORK,
                            0.5,
                            comm_bytes=int(ring_share(8) * param_bytes(ctx, p)),
                        ),
                        python=(
                            "mesh = init_device_mesh('cuda', "
                            + repr(shape)
                            + ", mesh_dim_names=('replicate', 'shard'))",
                            *_FSDP_LINES,
                            "for block in blocks: fully_shard(block, mesh=mesh)",
                            "fully_shard(model, mesh=mesh)",
                        ),
                    ),
                )
            )
    if plan.strategy != "fsdp" or n < 2 or plan.parallelize is not None:  # its own sharding decides
        return out
    if not plan.fsdp_mixed_precision and plan.precision in ("32-true", "32"):
        out.append(
            _one(
                "fsdp-mixed-precision",
                PRECISION,
                Variant(
                    "FSDP2 MixedPrecisionPolicy: bf16 parameters in forward and backward, fp32 gradient reduction",
                    lambda p: p.with_change("fsdp-mixed-precision", fsdp_mixed_precision=True),
                    lambda p: Cost(
                        "bf16 compute on the gathered parameters; all-gathers send half the bytes",
                        THROUGHPUT,
                        comm_bytes=-int(ring_share(p.world_size) * param_bytes(ctx, p)),
                    ),
                    python=(
                        "from torch.distributed.fsdp import MixedPrecisionPolicy",
                        "mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)",
                        "fully_shard(block, mp_policy=mp)  # for each block, then the root",
                    ),
                ),
            )
        )
    if not plan.reshard_after_forward:
        out.append(
            _one(
                "reshard-after-forward",
                SHARDING,
                Variant(
                    "reshard_after_forward=True: each block's gathered parameters freed after its forward",
                    lambda p: p.with_change("reshard-after-forward", reshard_after_forward=True),
                    lambda p: Cost(
                        "each block's parameters all-gathered again in backward",
                        WORK,
                        0.5,
                        comm_bytes=int(ring_share(p.world_size) * param_bytes(ctx, p)),
                    ),
                    python=("fully_shard(block, reshard_after_forward=True)",),
                ),
            )
        )
    if plan.mesh_shape is not None and plan.mesh_shape[0] >= 2:
        r, g = plan.mesh_shape
        bigger = (r // 2, g * 2)
        out.append(
            _one(
                "larger-shard-group",
                SHARDING,
                Variant(
                    f"shard over groups of {g * 2} ranks instead of {g} (mesh {bigger})",
                    lambda p: p.with_change("larger-shard-group", mesh_shape=bigger),
                    lambda p: Cost(
                        f"all-gathers and reduce-scatters span {g * 2} ranks (beyond one node's links when over 8)",
                        WORK,
                        0.3,
                    ),
                    python=(
                        f"mesh = init_device_mesh('cuda', {bigger!r}, mesh_dim_names=('replicate', 'shard'))",
                    ),
                ),
            )
        )
    return out


def _with_spec(
    spec: OptimizerSpec, label: str, words: str, cost: Cost, yaml_args: dict[str, object]
) -> Variant:
    yaml = [
        "optimizer:",
        f"  class_path: {spec.cls.__module__.split('.')[0]}.optim.{spec.cls.__name__}"
        if spec.cls.__module__.startswith("torch.optim")
        else f"  class_path: {spec.cls.__module__}.{spec.cls.__name__}",
        "  init_args:",
    ]
    yaml += [f"    {k}: {_yaml_value(v)}" for k, v in yaml_args.items()]
    return Variant(
        words,
        lambda plan: plan.with_change(label, optimizer_spec=spec),
        lambda plan: cost,
        yaml=tuple(yaml),
        python=(f"optimizer = {spec.python()}",),
    )


def _yaml_value(v: object) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(str(x) for x in v) + "]"
    return str(v)


def _optimizers(ctx: Context) -> list[Candidate]:
    spec = ctx.spec
    out: list[Candidate] = []
    if not ctx.plan.set_to_none:
        out.append(
            Candidate(
                "set-to-none",
                OPTIMIZER,
                (
                    Variant(
                        "zero_grad(set_to_none=True): gradients freed between steps",
                        lambda plan: plan.with_change("set-to-none", set_to_none=True),
                        lambda plan: Cost("none (gradients are made again in backward)", FREE),
                        python=("optimizer.zero_grad(set_to_none=True)",),
                    ),
                ),
            )
        )
    if spec is None:
        return out
    how = steps_with(spec)
    lr = spec.kwargs.get("lr", 1e-3)
    if has_flag(spec, "fused") and how != "fused":
        kw = (
            {**spec.kwargs, "fused": True, "foreach": None}
            if "foreach" in spec.kwargs
            else {**spec.kwargs, "fused": True}
        )
        fused = OptimizerSpec(spec.cls, kw)
        out.append(
            Candidate(
                "fused-step",
                OPTIMIZER,
                (
                    _with_spec(
                        fused,
                        "fused-step",
                        f"{spec.cls.__name__}(fused=True) instead of the {how} step",
                        Cost("none: one fused kernel per step on CUDA", FREE),
                        {"fused": True},
                    ),
                ),
            )
        )
    if has_flag(spec, "foreach") and how != "for-loop":
        kw = {**spec.kwargs, "foreach": False}
        if "fused" in kw:
            kw["fused"] = None
        loop = OptimizerSpec(spec.cls, kw)
        out.append(
            Candidate(
                "for-loop-step",
                OPTIMIZER,
                (
                    _with_spec(
                        loop,
                        "for-loop-step",
                        f"{spec.cls.__name__}(foreach=False): one parameter at a time",
                        Cost("a slower step: kernels launched per parameter", THROUGHPUT),
                        {"foreach": False},
                    ),
                ),
            )
        )
    if spec.cls in _ADAM:
        out.append(_adafactor(spec))
        out += _eight_bit(spec, lr)
    if spec.cls is not torch.optim.SGD:
        sgd = OptimizerSpec(torch.optim.SGD, {"lr": lr, "momentum": 0.9})
        out.append(
            Candidate(
                "sgd-momentum",
                OPTIMIZER,
                (
                    _with_spec(
                        sgd,
                        "sgd-momentum",
                        "SGD with momentum 0.9 (one state tensor per parameter)",
                        Cost("another optimizer: retune the learning rate", TRAINING),
                        {"lr": lr, "momentum": 0.9},
                    ),
                ),
            )
        )
    return out


def _adafactor(spec: OptimizerSpec) -> Candidate:
    # Adafactor's own learning rate: its update is scaled by the parameter's norm, not Adam's
    lr = 1e-2
    factored = OptimizerSpec(torch.optim.Adafactor, {"lr": lr}, scalar_reads=True)
    return _one(
        "adafactor",
        OPTIMIZER,
        _with_spec(
            factored,
            "adafactor",
            f"Adafactor instead of {spec.cls.__name__}: a row and a column of second moments per "
            "matrix, no first moment",
            Cost(
                "another optimizer: factored second moments, no momentum; retune the learning rate", TRAINING
            ),
            {"lr": lr},
        ),
    )


def eight_bit_class() -> tuple[str, type[torch.optim.Optimizer] | None, str]:
    """``(library, its 8-bit AdamW class, why not)``: the first of :data:`EIGHT_BIT` installed,
    else ``("", None, why)``."""
    import importlib
    import importlib.util

    for lib, module, name in EIGHT_BIT:
        if importlib.util.find_spec(lib) is None:
            continue
        try:
            cls = getattr(importlib.import_module(module), name)
        except (ImportError, AttributeError) as err:  # installed, but broken or another version
            return lib, None, f"{module}.{name} could not be imported: {' '.join(str(err).split())[:200]}"
        return lib, cls, ""
    return (
        "",
        None,
        "neither torchao nor bitsandbytes is installed (either has an 8-bit AdamW: pip install torchao)",
    )


def _eight_bit(spec: OptimizerSpec, lr: float) -> list[Candidate]:
    _, cls, _ = eight_bit_class()
    if cls is None:
        return []
    quantized = OptimizerSpec(cls, {"lr": lr})
    return [
        _one(
            "8bit-optimizer",
            OPTIMIZER,
            _with_spec(
                quantized,
                "8bit-optimizer",
                f"{cls.__module__.split('.')[0]}'s {cls.__name__} instead of {spec.cls.__name__}: "
                "both moments in 8 bits, block-wise scaled",
                Cost("optimizer state quantized to 8 bits (its updates differ slightly)", THROUGHPUT),
                {"lr": lr},
            ),
        )
    ]


def _batch(ctx: Context) -> list[Candidate]:
    plan = ctx.plan
    rows = plan.rows()
    if rows is None or rows < 2 or plan.accumulation != 1:
        return []
    sizes = [m for m in range(rows - 1, 0, -1) if rows % m == 0]
    ranks = plan.world_size

    def variant(m: int) -> Variant:
        k = rows // m

        def cost(p: Plan) -> Cost:
            return Cost(
                f"{k} micro-batches of {m} per optimizer step (smaller kernels, lower throughput)",
                THROUGHPUT,
                1 - m / rows,
                effective_batch=m * k * ranks,
            )

        return Variant(
            f"micro-batch {m} x {k} accumulation steps (the batch of {rows} kept)",
            lambda p: p.with_change("micro-batch", micro_batch=m, accumulation=k),
            cost,
            yaml=(
                "data:",
                "  init_args:",
                f"    batch_size: {m}",
                "trainer:",
                f"  accumulate_grad_batches: {k}",
            ),
            python=(f"# {k} micro-batches of {m}: loss.backward() each, optimizer.step() after the last",),
        )

    return [Candidate("micro-batch", BATCH, tuple(variant(m) for m in sizes))]


def candidates(ctx: Context, names: list[str] | None = None) -> tuple[list[Candidate], dict[str, str]]:
    """The candidates that apply (of ``names``, or all), and why each other one does not."""
    check_names(names)
    wanted = list(names) if names else list(NAMES)
    skipped: dict[str, str] = {}
    found: list[Candidate] = []
    if any(n in _CHECKPOINTS for n in wanted):
        if checkpointing.checkpointed_already(ctx.plan.model):
            skipped.update({n: "the model checkpoints already" for n in _CHECKPOINTS})
        elif not ctx.block_names:
            if names:  # asked for by name: the user's mistake, said in one line
                checkpointing.need_blocks(ctx.plan.model, "candidates")
            skipped.update({n: "the model has no repeated blocks" for n in _CHECKPOINTS})
        else:
            found += _checkpoints(ctx)
    found += _precisions(ctx) + _sharding(ctx) + _optimizers(ctx) + _batch(ctx)
    if "cpu-offload" in wanted:
        skipped["cpu-offload"] = OFFLOAD
    kept = [c for c in found if c.name in wanted]
    have = {c.name for c in kept}
    for n in wanted:
        if n not in have and n not in skipped:
            skipped[n] = _why_not(n, ctx)
    in_order = {n: skipped[n] for n in sorted(skipped, key=NAMES.index)}  # as the table lists them
    return sorted(kept, key=lambda c: NAMES.index(c.name)), in_order


def _why_not(name: str, ctx: Context) -> str:
    plan = ctx.plan
    if name in ("bf16-mixed", "bf16-true"):
        return f"the plan runs {plan.precision} already"
    if name == "fsdp":
        return (
            "applies to a DDP plan over 2 or more ranks"
            if plan.strategy != "fsdp"
            else "the plan shards with FSDP already"
        )
    if name == "hsdp":
        return "applies to a DDP plan over 16 or more ranks, a multiple of 8"
    if name in ("fsdp-mixed-precision", "reshard-after-forward", "larger-shard-group"):
        if plan.strategy != "fsdp" or plan.world_size < 2:
            return "applies to an FSDP plan over 2 or more ranks"
        if plan.parallelize is not None:
            return "the model's own parallelize decides its sharding"
        if name == "fsdp-mixed-precision":
            return (
                "the plan has it already"
                if plan.fsdp_mixed_precision
                else f"the plan runs {plan.precision}, not float32"
            )
        if name == "reshard-after-forward":
            return "the plan reshards after forward already"
        return "applies to an HSDP plan (mesh_shape with 2 or more replicas)"
    if name == "set-to-none":
        return "zero_grad sets gradients to None already"
    if name == "micro-batch":
        return "the batch has one row" if plan.rows() == 1 else "the batch has no first dimension to split"
    if name == "checkpoint-every-2":
        return "fewer than 4 blocks"
    if name == "checkpoint-blocks":
        return "fewer than 2 blocks"
    if ctx.spec is None:
        return "the optimizer factory did not build a torch.optim.Optimizer over a meta parameter"
    if name in ("adafactor", "8bit-optimizer") and ctx.spec.cls not in _ADAM:
        return f"replaces Adam or AdamW; the plan's optimizer is {ctx.spec.cls.__name__}"
    if name == "8bit-optimizer":
        return eight_bit_class()[2]
    return f"the plan's optimizer is {ctx.spec.cls.__name__} ({steps_with(ctx.spec)}) already"


def replace_variants(c: Candidate, variants: tuple[Variant, ...]) -> Candidate:
    return dataclasses.replace(c, variants=variants)
