"""``python -m memprofiler.lightning``: :class:`~memprofiler.lightning.cli.MemProfilerCLI` for any model.

The model (and data) come from the config as ``class_path``, so a model you cannot edit is
trained, profiled and estimated from YAML alone::

    python -m memprofiler.lightning fit --config config.yaml
    python -m memprofiler.lightning estimate --config config.yaml

.. code-block:: yaml

    model:
      class_path: lightning.pytorch.demos.boring_classes.BoringModel
    data:
      class_path: lightning.pytorch.demos.boring_classes.BoringDataModule
    memprofiler:
      collect_funcs: {default: [training_step]}
"""

from __future__ import annotations

from memprofiler.lightning.cli import MemProfilerCLI


def main() -> None:
    MemProfilerCLI(parser_kwargs={"prog": "python -m memprofiler.lightning"})


if __name__ == "__main__":
    main()
