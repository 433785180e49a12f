"""``memprofiler estimate MODEL``: will a model named by its config fit, and how large a batch?"""

from __future__ import annotations

import argparse


class EstimateCommand:
    name = "estimate"
    help = (
        "Estimate one rank's peak memory of a training step for a Hugging Face config (file or "
        "directory) or module:factory, on fake tensors, and the largest batch that fits (--batch-size auto)."
    )

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "model",
            metavar="MODEL",
            help="a Hugging Face config.json or a directory holding one, or module:factory (returns an nn.Module)",
        )
        parser.add_argument(
            "--gpu", default="H100", help="the GPU: H100 (80 GB), H200, A100 (80 GB), ... (default: H100)"
        )
        parser.add_argument(
            "--device-memory", default=None, metavar="SIZE", help="memory of another variant, e.g. 94GiB"
        )
        parser.add_argument("--world-size", type=int, default=1, help="ranks (default: 1)")
        parser.add_argument(
            "--strategy",
            choices=("single", "ddp", "fsdp"),
            default=None,
            help="fsdp: FSDP2 fully_shard on every block and the root (default: fsdp with --world-size > 1)",
        )
        parser.add_argument(
            "--precision",
            default="bf16-mixed",
            help="Lightning's names: bf16-mixed (autocast, the default), bf16-true, 32-true, 16-mixed",
        )
        parser.add_argument("--optimizer", choices=("adamw", "adam", "sgd", "sgd-plain"), default="adamw")
        parser.add_argument(
            "--checkpointing",
            nargs="?",
            const="on",
            default="off",
            choices=("off", "on", "both"),
            help="activation checkpointing on every block (non-reentrant); `both`: rows without and with it",
        )
        parser.add_argument(
            "--param-dtype",
            choices=("bf16", "fp16", "fp32"),
            default=None,
            help="FSDP2 MixedPrecisionPolicy(param_dtype=...): the dtype blocks gather and compute in",
        )
        parser.add_argument(
            "--reduce-dtype",
            choices=("bf16", "fp16", "fp32"),
            default=None,
            help="FSDP2 MixedPrecisionPolicy(reduce_dtype=...): the dtype gradients are reduced in",
        )
        parser.add_argument(
            "--no-reshard-after-forward",
            dest="reshard_after_forward",
            action="store_false",
            help="FSDP2 fully_shard(reshard_after_forward=False): blocks stay gathered from forward to backward",
        )
        parser.add_argument(
            "--jobs",
            type=int,
            default=None,
            help="estimates run at once, one process each (default: one per core; 1: one after another)",
        )
        parser.add_argument(
            "--batch-size",
            default="1",
            metavar="N[,N..]|auto",
            help="rows per rank, or auto: the largest that fits",
        )
        parser.add_argument("--seq-len", type=int, default=4096, help="tokens per row (default: 4096)")
        parser.add_argument(
            "--input-shape",
            default=None,
            metavar="SHAPE",
            help="one row of float32 input in place of tokens, e.g. 3,224,224 for images (the output is summed)",
        )
        parser.add_argument(
            "--context",
            default=None,
            metavar="SIZE",
            help="the CUDA context kept back from the device (default: 512MiB; 0 leaves it out)",
        )
        parser.add_argument("--reserve", default="0", metavar="SIZE", help="more kept back, e.g. 2GiB")
        parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
        parser.add_argument(
            "--steps", type=int, default=2, help="steps per estimate (2 covers optimizer state)"
        )
        parser.add_argument(
            "--torch-version", default=None, help="the torch release the job runs (default: this one)"
        )
        parser.add_argument(
            "--save-dir",
            default="memprofiler",
            help="where memory_estimate.yaml goes (default: ./memprofiler)",
        )

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.errors import ConfigError
        from memprofiler.estimate.command import run

        if args.strategy is None:
            args.strategy = "fsdp" if args.world_size > 1 else "single"
        if args.batch_size != "auto" and not all(
            p.strip().isdigit() and int(p) > 0 for p in args.batch_size.split(",")
        ):
            raise ConfigError("--batch-size", f"got {args.batch_size!r}; give N, N,M,... or auto")
        if args.jobs is not None and args.jobs < 1:
            raise ConfigError("--jobs", f"got {args.jobs}; give 1 or more")
        if args.strategy != "fsdp":
            for flag, value in (("--param-dtype", args.param_dtype), ("--reduce-dtype", args.reduce_dtype)):
                if value is not None:
                    raise ConfigError(
                        flag, f"FSDP2's mixed precision needs --strategy fsdp (got {args.strategy})"
                    )
        return run(args)
