"""``memprofiler estimate MODEL``: one rank's peak for a model named on the command line, on a
GPU named by its kind, and the largest batch that fits. The parser is
:mod:`memprofiler.commands.estimate`; this is the torch side it calls."""

from __future__ import annotations

import argparse
import dataclasses
import functools
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memprofiler.errors import ConfigError
from memprofiler.estimate import batch_search, workers
from memprofiler.estimate.api import estimate_plan
from memprofiler.estimate.cuda.devices import CUDA_CONTEXT, device_memory
from memprofiler.estimate.named import NamedModel, load_model
from memprofiler.estimate.output import render_table, write_estimates
from memprofiler.estimate.plan import EstimatePlan
from memprofiler.estimate.result import MemoryEstimate, context_counted
from memprofiler.units import format_bytes, parse_size

#: Optimizers by the name ``--optimizer`` takes, with the learning rate irrelevant to memory.
OPTIMIZERS: dict[str, Any] = {
    "adamw": lambda ps: torch.optim.AdamW(ps, lr=1e-4),
    "adam": lambda ps: torch.optim.Adam(ps, lr=1e-4),
    "sgd": lambda ps: torch.optim.SGD(ps, lr=1e-2, momentum=0.9),
    "sgd-plain": lambda ps: torch.optim.SGD(ps, lr=1e-2),
}

#: ``--param-dtype`` / ``--reduce-dtype`` names.
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass
class Budget:
    """The device memory the estimate must fit in, and what is kept back, each said in words."""

    memory: int | None
    reserve: int
    lines: list[str]
    context: int = 0
    """Bytes kept back for the CUDA context (0: none, or no device memory to keep them from)."""


def budget(args: argparse.Namespace) -> Budget:
    """``--device-memory`` or the ``--gpu`` variant's memory; the CUDA context and ``--reserve``.

    Raises:
        ConfigError: a bad size, or ``--gpu`` naming a GPU of unknown memory without ``--device-memory``.
    """
    lines: list[str] = []
    memory: int | None = None
    if args.device_memory:
        memory = int(parse_size(args.device_memory, "--device-memory"))
        lines.append(f"device memory {format_bytes(memory)} (--device-memory)")
    elif args.device == "cuda":
        found = device_memory(args.gpu)
        memory = found.total
        lines.append(
            f"device memory {format_bytes(memory)}: {found.variant} ({found.source}); another variant: --device-memory"
        )
    context = int(parse_size(args.context, "--context")) if args.context is not None else CUDA_CONTEXT
    extra = int(parse_size(args.reserve, "--reserve"))
    if memory is not None:
        if context:
            lines.append(
                f"CUDA context counted: {format_bytes(context)} kept back (the driver's context and torch's "
                "kernels, a typical figure; --context 0 leaves it out)"
            )
        if extra:
            lines.append(f"reserve {format_bytes(extra)} kept back (--reserve)")
    if memory is None:
        return Budget(memory, extra, lines)
    return Budget(memory, context + extra, lines, context)


def run(args: argparse.Namespace) -> int:
    """Estimate, print the table and the budget lines, write ``memory_estimate.yaml``."""
    t0 = time.perf_counter()
    plan = budget(args)
    both = args.checkpointing == "both"
    variants = {"off": [False], "on": [True], "both": [False, True]}[args.checkpointing]
    models = {ckpt: _model(args, ckpt) for ckpt in variants}
    base = EstimatePlan(
        optimizer=OPTIMIZERS[args.optimizer],
        strategy=args.strategy,
        world_size=args.world_size,
        precision=args.precision,
        device=args.device,
        steps=args.steps,
        gpu=args.gpu if args.device == "cuda" else None,
        torch_version=args.torch_version,
        device_memory=plan.memory,
        param_dtype=DTYPES.get(args.param_dtype or ""),
        reduce_dtype=DTYPES.get(args.reduce_dtype or ""),
        reshard_after_forward=None if args.reshard_after_forward else False,
    )

    def one(ckpt: bool, rows: int) -> MemoryEstimate:
        named, notes = models[ckpt]
        est = estimate_plan(
            named.model, named.batch(rows, args.seq_len), dataclasses.replace(base, loss_fn=named.loss_fn())
        )
        est.batch_size = rows
        est.notes = [*notes, *est.notes]
        if plan.context:  # the budget line says it is counted: so does "not modelled"
            est.not_modelled = context_counted(est.not_modelled, format_bytes(plan.context))
        return est

    auto = args.batch_size == "auto"
    rows: list[tuple[bool, MemoryEstimate]] = []
    searches: dict[bool, batch_search.BatchSearch] = {}
    if auto:
        if plan.memory is None:
            raise ConfigError(
                "--batch-size", "`auto` needs the device's memory: --gpu H100 or --device-memory 80GiB"
            )
        searches = batch_search.search_many(
            {ckpt: functools.partial(one, ckpt) for ckpt in variants},
            plan.memory,
            plan.reserve,
            jobs=args.jobs,
        )
        for ckpt, found in searches.items():
            rows += [(ckpt, found.tried[k]) for k in sorted(found.tried)]
        if not rows:
            raise ConfigError("--batch-size", "no batch size was estimated")
    else:
        wanted = [(ckpt, int(b)) for ckpt in variants for b in args.batch_size.split(",")]
        ahead = workers.prefetch([functools.partial(one, c, b) for c, b in wanted], args.jobs)
        rows = [(c, est if est is not None else one(c, b)) for (c, b), est in zip(wanted, ahead, strict=True)]
    results = [est for _, est in rows]
    labels = ("checkpointing", ["on" if c else "off" for c, _ in rows]) if both else None
    print(render_table(results, plan.memory, plan.reserve, labels))
    for line in plan.lines:
        print(f"budget: {line}")
    for ckpt, found in searches.items():
        best = found.estimate
        print(
            ("with checkpointing, " if ckpt else "without checkpointing, " if both else "")
            + f"largest batch that fits: {found.largest} x {args.seq_len} per rank "
            f"({len(found.tried)} estimates)"
            + (f", peak {format_bytes(best.peak_bytes)}" if best is not None else "")
        )
    out = Path(args.save_dir).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    extra = [{"checkpointing": c} for c, _ in rows]
    path = write_estimates(out, results, plan.memory, plan.reserve, auto=auto, extra=extra)
    print(f"written: {path} ({time.perf_counter() - t0:.1f} s)")
    return 0


def input_shape(text: str) -> tuple[int, ...]:
    """``3,224,224`` (or ``3x224x224``) as a shape.

    Raises:
        ConfigError: not a list of positive whole numbers.

    Example:
        >>> input_shape("3x32x32")
        (3, 32, 32)
    """
    parts = text.replace("x", ",").split(",")
    if not all(p.strip().isdigit() and int(p) > 0 for p in parts):
        raise ConfigError("--input-shape", f"got {text!r}; give one input row's shape, e.g. 3,224,224")
    return tuple(int(p) for p in parts)


def _model(args: argparse.Namespace, checkpointing: bool) -> tuple[NamedModel, list[str]]:
    """The named model (with checkpointing on every block when asked) and its notes."""
    named = load_model(args.model)
    table = named.positions() if not args.input_shape else None
    if table is not None and args.seq_len > table[1]:
        raise ConfigError(
            "--seq-len",
            f"got {args.seq_len}; {args.model}'s position table holds {table[1]} positions (`{table[0]}` in "
            f"its config), so a longer row cannot run; give --seq-len {table[1]} or less",
        )
    notes = [f"model: {named.built}"] if named.built else []
    if args.input_shape:
        named.input_shape = input_shape(args.input_shape)
        shape = " x ".join(str(n) for n in named.input_shape)
        notes.append(f"batch: rows of {shape} float32 (--input-shape); loss: the output summed")
    if checkpointing:
        notes.append(named.checkpoint())
    if named.takes_labels:
        notes.append("loss: the model's own, from `labels` (the input ids)")
    return named, notes
