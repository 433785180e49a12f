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
from memprofiler.estimate.failures import first_line, raised_at

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
    encoder_decoder: bool = False
    """An encoder-decoder (T5, BART): the decoder gets the same ids (``decoder_input_ids``), so no
    start token is needed to shift the labels right."""
    built: str = ""
    """How the model was built, for the notes (``T5ForConditionalGeneration, transformers'
    AutoModelForSeq2SeqLM.from_config``); empty for ``module:factory``."""

    input_shape: tuple[int, ...] | None = None
    """``--input-shape``: each row is a float32 tensor of this shape (an image: ``3, 224, 224``)
    in place of token ids; the output is reduced to a scalar."""

    def batch(self, rows: int, seq_len: int) -> Any:
        """A batch of ``rows`` x ``seq_len`` token ids (and the same ids as labels), or of
        ``rows`` float32 inputs of :attr:`input_shape`."""
        if self.input_shape is not None:
            return torch.randn(rows, *self.input_shape)
        if self.vocab_size is None:
            raise ConfigError(
                KEY,
                f"{self.name}: the model names no vocabulary (`config.vocab_size` or `vocab_size`), so "
                "no token batch can be made; give the shape of one input row (`--input-shape 3,224,224` "
                "for images), or estimate it from Python with `estimate_memory(model, batch, ...)`",
            )
        ids = torch.randint(0, self.vocab_size, (rows, seq_len))
        batch = {"input_ids": ids}
        if self.encoder_decoder:
            batch["decoder_input_ids"] = ids
        if self.takes_labels:
            batch["labels"] = ids
        return batch if len(batch) > 1 else ids

    def loss_fn(self) -> engine.LossFn:
        """The model's own loss when it takes labels, else the output reduced to a scalar."""
        if self.input_shape is None and (self.takes_labels or self.encoder_decoder):
            return lambda model, batch: engine.as_loss(model(**batch))
        return engine.default_loss

    def positions(self) -> tuple[str, int] | None:
        """The config key and size of a learned position table (GPT-2's ``n_positions``, BERT's
        ``max_position_embeddings``): a row longer than it cannot run. ``None`` for rotary or
        relative positions (LLaMA, T5), which take longer rows.

        A table is an ``nn.Embedding`` of as many rows as the config's key says, other than the
        token embedding (a vocabulary of that size too would leave it undecided: ``None``).
        """
        config = getattr(self.model, "config", None)
        for key in ("n_positions", "max_position_embeddings"):
            size = getattr(config, key, None)
            if not isinstance(size, int) or size == self.vocab_size:
                continue
            if any(isinstance(m, nn.Embedding) and m.num_embeddings == size for m in self.model.modules()):
                return key, size
        return None

    def checkpoint(self) -> str:
        """Turn activation checkpointing on for every block; return how, for the notes.

        Raises:
            ConfigError: the model has no blocks to checkpoint.
        """
        from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

        # transformers 5.24 renamed gradient_checkpointing_enable (kept, with a FutureWarning, until v6)
        for name, kwarg in (
            ("activation_checkpointing_enable", "activation_checkpointing_kwargs"),
            ("gradient_checkpointing_enable", "gradient_checkpointing_kwargs"),
        ):
            enable = getattr(self.model, name, None)
            if self.huggingface and callable(enable):
                enable(**{kwarg: {"use_reentrant": False}})
                for _, config in caching_configs(self.model):  # as its first checkpointed
                    config.use_cache = False  # forward would, warning once per estimate's process
                return f"activation checkpointing: transformers' {name} (non-reentrant)"
        # the blocks: the largest nn.ModuleList, else the largest nn.Sequential (a model built of
        # Sequentials, as torchvision's are)
        for kind in (nn.ModuleList, nn.Sequential):
            lists = [(n, m) for n, m in self.model.named_modules() if type(m) is kind and len(m) > 1]
            if lists:
                break
        else:
            raise ConfigError(
                "--checkpointing",
                f"{self.name}: no nn.ModuleList or nn.Sequential of blocks to wrap in checkpoint_wrapper; "
                "checkpoint the model in its factory and leave out --checkpointing",
            )
        name, blocks = max(lists, key=lambda nm: len(nm[1]))
        for i in range(len(blocks)):
            blocks[i] = checkpoint_wrapper(blocks[i])
        where = f"`{name}`" if name else "the model"
        return (
            f"activation checkpointing: checkpoint_wrapper on each of the {len(blocks)} items of {where} "
            f"({type(blocks).__name__})"
        )


def caching_configs(model: nn.Module) -> list[tuple[str, Any]]:
    """``(module name, config)`` of each distinct config in ``model`` that fills a key/value cache
    in forward (a transformers ``config.use_cache``), the first module holding it named.

    An encoder-decoder keeps a copy of the config per stack: T5's decoder fills its cache by its
    own ``decoder.config.use_cache`` whatever the model's ``config.use_cache`` says, and the cross
    attention of a recomputed block then reads its keys and values from the cache where the
    forward computed them (4 tensors fewer saved in a 2-layer T5: torch's checkpoint refuses).
    """
    found: list[tuple[str, Any]] = []
    seen: set[int] = set()
    for name, mod in model.named_modules():
        config = getattr(mod, "config", None)
        if config is None or id(config) in seen:
            continue
        seen.add(id(config))
        if getattr(config, "use_cache", False) is True:
            found.append((name, config))
    return found


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
            f"{spec!r} is neither a file or directory (a Hugging Face config.json) nor module:factory"
            + (_hub_hint(spec) if not sep else ""),
        )
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        factory = getattr(importlib.import_module(module), attr)
    except (ImportError, AttributeError) as err:
        raise ConfigError(KEY, f"{spec!r}: cannot import it ({err})") from None
    except Exception as err:  # the user's module ran code at import that failed
        raise ConfigError(
            KEY,
            f"{spec!r}: importing `{module}` raised {_where(err)}; a module that trains when imported "
            'needs `if __name__ == "__main__":` around that code (or put the factory in a module of its own)',
        ) from None
    if not callable(factory):
        raise ConfigError(KEY, f"{spec!r} is not callable; give a function or class that returns the model")
    with torch.device("meta"):
        try:
            model = factory()
        except Exception as err:
            raise ConfigError(
                KEY,
                f"{spec!r}: calling it raised {_where(err)}; give a function or class that builds the model "
                "with no arguments",
            ) from None
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
    model, auto = _build(transformers, config)
    vocab = getattr(config, "vocab_size", None)
    built = f"{type(model).__name__}, transformers' {auto}.from_config"
    pair = bool(getattr(config, "is_encoder_decoder", False))
    return NamedModel(
        model, spec, vocab if isinstance(vocab, int) else None, _takes_labels(model), True, pair, built
    )


#: The heads tried in order: a causal LM and an encoder-decoder (T5, BART) train on their own loss
#: from ``labels``; a model with neither head (an encoder) is still estimated, its output summed.
HEADS = ("AutoModelForCausalLM", "AutoModelForSeq2SeqLM", "AutoModel")


def _build(transformers: Any, config: Any) -> tuple[nn.Module, str]:
    with torch.device("meta"):
        for auto in HEADS[:-1]:
            try:
                return getattr(transformers, auto).from_config(config), auto
            except ValueError:  # the config's model type has no such head
                continue
        return transformers.AutoModel.from_config(config), HEADS[-1]


def _hub_hint(spec: str) -> str:
    """For a Hub model id (``Qwen/Qwen2-7B``): how to have its config here (the estimate never uses
    the network)."""
    here = Path(spec).name
    save = f"AutoConfig.from_pretrained('{spec}').save_pretrained('{here}')"
    return (
        "; for a Hugging Face Hub model, save its config once where the network is: python -c "
        f'"from transformers import AutoConfig; {save}", then: memprofiler estimate {here}'
    )


def _where(err: BaseException) -> str:
    """``ValueError: bad value (train.py:30)``: the error and the last frame of the user's it was
    raised from (none where it was raised calling the factory, a wrong signature)."""
    at = raised_at(err, outside=str(Path(__file__).parents[1]))
    return f"{type(err).__name__}: {first_line(err)}".rstrip(": ") + at


def _takes_labels(model: nn.Module) -> bool:
    try:
        return "labels" in inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return False
