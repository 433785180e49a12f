"""A model named on the command line: a Hugging Face config (file or directory) or
``module:factory``, built on the meta device, with the token batch and the loss it trains on."""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate import engine

KEY = "MODEL"


@dataclass
class NamedModel:
    """The model built on the meta device, and what its batch looks like."""

    model: nn.Module
    name: str
    """As given on the command line."""
    vocab_size: int | None
    """Token ids are drawn below it; ``None`` when the model names no vocabulary."""
    takes_labels: bool
    """``forward`` has a ``labels`` argument: the batch passes the ids as labels, the model's
    own loss is trained (transformers' causal LM loss: shifted cross-entropy)."""
    huggingface: bool

    def batch(self, rows: int, seq_len: int) -> Any:
        """A batch of ``rows`` x ``seq_len`` token ids (and the same ids as labels)."""
        if self.vocab_size is None:
            raise ConfigError(
                KEY,
                f"{self.name}: the model names no vocabulary (`config.vocab_size` or `vocab_size`), so "
                "no token batch can be made; estimate it from Python with `estimate_memory(model, batch, ...)`",
            )
        ids = torch.randint(0, self.vocab_size, (rows, seq_len))
        return {"input_ids": ids, "labels": ids} if self.takes_labels else ids

    def loss_fn(self) -> engine.LossFn:
        """The model's own loss when it takes labels, else the output reduced to a scalar."""
        if self.takes_labels:
            return lambda model, batch: engine.as_loss(model(**batch))
        return engine.default_loss

    def checkpoint(self) -> str:
        """Turn activation checkpointing on for every block; return how, for the notes.

        Raises:
            ConfigError: the model has no blocks to checkpoint.
        """
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        enable = getattr(self.model, "gradient_checkpointing_enable", None)
        if self.huggingface and callable(enable):
            enable(gradient_checkpointing_kwargs={"use_reentrant": False})
            return "activation checkpointing: transformers' gradient_checkpointing_enable (non-reentrant)"
        lists = [m for m in self.model.modules() if isinstance(m, nn.ModuleList) and len(m)]
        if not lists:
            raise ConfigError(
                "--checkpointing", f"{self.name}: no nn.ModuleList of blocks to wrap in checkpoint_wrapper"
            )
        blocks = max(lists, key=len)
        for i in range(len(blocks)):
            blocks[i] = checkpoint_wrapper(blocks[i])
        return f"activation checkpointing: checkpoint_wrapper on each of {len(blocks)} blocks"


def load_model(spec: str) -> NamedModel:
    """Build the model ``spec`` names on the meta device.

    Args:
        spec: a Hugging Face ``config.json`` or a directory holding one (built with
            transformers' ``AutoModelForCausalLM.from_config``, else ``AutoModel``), or
            ``module:factory`` (a callable returning an ``nn.Module``; the current directory is
            importable).

    Raises:
        ConfigError: one line naming the model and what is wrong.
    """
    path = Path(spec).expanduser()
    if path.exists():
        return _from_config(spec, path)
    module, sep, attr = spec.partition(":")
    if not sep or not module or not attr:
        raise ConfigError(
            KEY,
            f"{spec!r} is neither a file or directory (a Hugging Face config.json) nor module:factory",
        )
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(KEY, f"{spec!r}: cannot import it ({err})") from None
    if not callable(factory):
        raise ConfigError(KEY, f"{spec!r} is not callable; give a function or class that returns the model")
    with torch.device("meta"):
        model = factory()
    if not isinstance(model, nn.Module):
        raise ConfigError(KEY, f"{spec!r} returned {type(model).__name__}, not an nn.Module")
    config = getattr(model, "config", None)
    vocab = getattr(config, "vocab_size", None) or getattr(model, "vocab_size", None)
    return NamedModel(
        model, spec, vocab if isinstance(vocab, int) else None, _takes_labels(model), config is not None
    )


def _from_config(spec: str, path: Path) -> NamedModel:
    file = path / "config.json" if path.is_dir() else path
    if not file.is_file():
        raise ConfigError(KEY, f"{spec}: no config.json in this directory")
    try:
        raw = json.loads(file.read_text())
    except (OSError, ValueError) as err:
        raise ConfigError(KEY, f"{file}: not a readable JSON config ({err})") from None
    if not isinstance(raw, dict) or "model_type" not in raw:
        raise ConfigError(KEY, f"{file}: not a Hugging Face config (no `model_type`)")
    try:
        import transformers
    except ImportError:
        raise ConfigError(
            KEY, f"{spec}: a Hugging Face config needs transformers (pip install transformers)"
        ) from None
    try:
        config = transformers.AutoConfig.for_model(**raw)
    except (ValueError, KeyError) as err:
        raise ConfigError(KEY, f"{file}: transformers cannot read it ({err})") from None
    with torch.device("meta"):
        try:  # a causal LM trains on its own loss; an encoder without a head is still estimated
            model: nn.Module = transformers.AutoModelForCausalLM.from_config(config)
        except ValueError:
            model = transformers.AutoModel.from_config(config)
    vocab = getattr(config, "vocab_size", None)
    return NamedModel(model, spec, vocab if isinstance(vocab, int) else None, _takes_labels(model), True)


def _takes_labels(model: nn.Module) -> bool:
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
