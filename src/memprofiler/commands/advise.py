"""``memprofiler advise RUN_DIR``: the blocks to checkpoint first, from a collected run's saved tensors."""

from __future__ import annotations

import argparse

from memprofiler.commands._shared import add_run_dir, add_top, load


class AdviseCommand:
    name = "advise"
    help = "Propose checkpointing the blocks that saved the most for backward, with what each takes off the peak."

    def prepare_parser(self, parser: argparse.ArgumentParser) -> None:
        add_run_dir(parser)
        add_top(parser, 8, "blocks proposed")
        parser.add_argument("--budget", default=None, help="memory one device may take, e.g. 80GiB")

    def run(self, args: argparse.Namespace) -> int:
        from memprofiler.analysis.files.fs import named_as_given
        from memprofiler.errors import ArtifactError
        from memprofiler.reporters.model.report import build_model
        from memprofiler.reporters.run_advice import advise_run, render_lines
        from memprofiler.units import parse_size

        budget = int(parse_size(args.budget, "--budget")) if args.budget else None
        if budget is not None and budget <= 0:
            raise ArtifactError(
                f"--budget: got {args.budget!r}; use the memory one device may take, e.g. 80GiB"
            )
        run = load(self.name, args.run_dir)
        with named_as_given():
            advice = advise_run(build_model(run), top=args.top)
        if advice is None:
            raise ArtifactError(
                f"{args.run_dir}: no call has saved-tensor bytes per module; collect with "
                "`saved_tensors: {enabled: true}` (the default) on a training step"
            )
        for line in render_lines(advice, budget):
            print(line)
        return 0
