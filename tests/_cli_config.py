"""The small DemoGPT LightningCLI config the CLI tests write: one epoch, no logger, quiet."""

from __future__ import annotations

from pathlib import Path

import yaml


def write_cli_config(tmp_path: Path, extra: dict, trainer: dict | None = None) -> Path:
    """Write ``config.yaml`` under ``tmp_path``: 3 training batches of a 1-layer DemoGPT,
    ``trainer`` overriding Trainer keys and ``extra`` adding top-level groups."""
    cfg = {
        "trainer": {
            "max_epochs": 1,
            "limit_train_batches": 3,
            "limit_val_batches": 0,
            "logger": False,
            "enable_checkpointing": False,
            "enable_progress_bar": False,
            "enable_model_summary": False,
            "default_root_dir": str(tmp_path / "run"),
            **(trainer or {}),
        },
        "model": {"n_layers": 1, "d_model": 32, "num_samples": 48},
        **extra,
    }
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path
