"""Values a fake step can still know: the batch's, and what ops compute from them alone.

A fake tensor has no values, so a model that reads one (``labels.max() >= vocab_size``, a CTC
loss's lengths, ``masked_select``) stopped the estimate, and where a model branches on values the
estimate took the branch a tracer would. But the batch is real, and so are the small tensors a
model makes from nothing (``torch.arange``): :class:`KnownData` keeps a real copy of each such
tensor (up to :data:`LIMIT` elements) and computes, beside the fake op, the real result of every
op whose tensor operands all have one. Then

- ``.item()`` / a Python ``if`` on such a tensor gets the real value;
- an op whose output shape depends on values (``nonzero``, ``masked_select``) gets a fake output
  of the real shape, allocated through the dispatcher so the tracker counts it;
- transformers' checks whether a padding mask can be skipped get the real mask: an attention
  mask of ones (in the batch, or made with ``torch.ones`` as BART's decoder does) is skipped as on
  real tensors, where on a FakeTensor transformers built it (BERT on an H200: 1.0134 of the
  measured allocated peak, exact now);
- transformers' ``find_packed_sequence_indices`` (which returns ``None`` for rows without packed
  sequences unless its ``is_tracing`` says the tensor is fake) gets the answer the real run gets:
  without a cache (``use_cache=False``, gradient checkpointing) a decoder fed no attention mask
  built a batch x seq^2 mask the real run skips, and for a CUDA target took an attention kernel
  with a mask (LLaMA, ``use_cache=False``: 49,152 B over the census of real CPU steps).

Random ops are never computed (they would draw from the caller's generator); a write into a known
tensor's storage by an op with an unknown operand forgets the tensors of that storage.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import (
    DataDependentOutputException,
    DynamicOutputShapeException,
    is_fake,
)
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten, tree_map
from torch.utils.weak import WeakIdKeyDictionary

from memprofiler.estimate.fake import queries
from memprofiler.estimate.part import Part

#: The most elements a tensor may have to be kept with its real values (the batch's ids and masks,
#: position ids; not activations).
LIMIT = 1 << 20
_SCALARS = frozenset({torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default})
_SEEDED = torch.Tag.nondeterministic_seeded
_CTC = torch.ops.aten._ctc_loss.Tensor
_aten = torch.ops.aten
#: Factories whose values are whatever memory held: never known, whatever their operands.
_UNINITIALIZED = frozenset(
    {
        _aten.empty.memory_format,
        _aten.empty_strided.default,
        _aten.empty_like.default,
        _aten.new_empty.default,
        _aten.new_empty_strided.default,
    }
)


class KnownData(TorchDispatchMode):
    """Fake tensors with their real values alongside (``known[fake] = real``)."""

    def __init__(self) -> None:
        super().__init__()
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._written: dict[Any, tuple[tuple[int, str], ...]] = {}
        self.computed = 0  # ops computed on real values
        self.shapes = 0  # value-dependent output shapes taken from the real result
        self.scalars = 0  # scalars read from real values
        #: transformers' packed-sequence checks on position ids of unknown values (the mask was built)
        self.unknown_packing = 0

    def seed(self, real_batch: Any, fake_batch: Any) -> int:
        """Keep the real values of the fake batch's tensors (those within :data:`LIMIT`)."""
        reals, _ = tree_flatten(real_batch)
        fakes, _ = tree_flatten(fake_batch)
        reals = [t for t in reals if isinstance(t, torch.Tensor)]
        fakes = [t for t in fakes if isinstance(t, torch.Tensor)]
        if len(reals) != len(fakes):
            return 0
        for real, fake in zip(reals, fakes, strict=True):
            if real.numel() <= LIMIT and real.device.type == "cpu" and not is_fake(real):
                with _disable_current_modes():
                    self.known[fake] = real.detach().to(fake.dtype).clone()
        return len(self.known)

    def real(self, t: Any) -> Any:
        """The real value of a known fake tensor, else None."""
        return self.known.get(t) if isinstance(t, torch.Tensor) else None

    def _operands(self, args: Any, kwargs: Any) -> tuple[list[Any], bool]:
        """The op's tensor operands (an aten op nests them one list deep at most), and whether all
        are known."""
        tensors: list[Any] = []
        for a in (*args, *kwargs.values()):
            if isinstance(a, torch.Tensor):
                tensors.append(a)
            elif isinstance(a, (list, tuple)):
                tensors.extend(x for x in a if isinstance(x, torch.Tensor))
        known = self.known
        return tensors, all(t in known for t in tensors)

    def _forget_written(self, func: Any, args: Any, kwargs: Any) -> None:
        """An op with an unknown operand writes into a known storage: its tensors are forgotten."""
        written = self._written.get(func)
        if written is None:
            arguments = func._schema.arguments
            written = self._written[func] = tuple(
                (i, a.name)
                for i, a in enumerate(arguments)
                if a.alias_info is not None and a.alias_info.is_write
            )
        if not written or not self.known:
            return
        storages = set()
        for i, name in written:
            t = kwargs.get(name, args[i] if i < len(args) else None)
            if isinstance(t, torch.Tensor):
                storages.add(t.untyped_storage()._cdata)
        for t in [t for t in self.known if t.untyped_storage()._cdata in storages]:
            del self.known[t]

    def _compute(self, func: Any, args: Any, kwargs: Any) -> Any:
        def to_real(a: Any) -> Any:
            return self.known[a] if isinstance(a, torch.Tensor) else a

        with _disable_current_modes():  # no mode below sees it: not fake, not counted
            return func(*tree_map(to_real, args), **tree_map(to_real, kwargs))

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        if func is queries.DEVICE:
            found = queries.device_of(args)
            if found is not None:
                return found
        if any(getattr(t, "__name__", "") == "DTensor" for t in types):
            return NotImplemented  # FSDP2's DTensor runs first and brings its local ops back here
        kwargs = kwargs or {}
        tensors, all_known = self._operands(args, kwargs)
        computable = (
            all_known
            and _SEEDED not in func.tags
            and func not in _UNINITIALIZED
            and (tensors or "device" in kwargs)
        )
        if func in _SCALARS and computable:
            self.scalars += 1
            return self._compute(func, args, kwargs)
        try:
            out = func(*args, **kwargs)
        except (DynamicOutputShapeException, DataDependentOutputException):
            if func is _CTC and self.real(args[3]) is not None:
                return _ctc_outputs(args[0], self.known[args[3]])
            if not computable or not tensors:
                raise
            real = self._compute(func, args, kwargs)
            self.shapes += 1
            out = tree_map(_fake_like, real)  # allocated through the dispatcher: counted as the op's
            self._mark(out, real)
            return out
        if not computable:
            self._forget_written(func, args, kwargs)
            return out
        flat, _ = tree_flatten(out)
        if any(isinstance(t, torch.Tensor) and (t.numel() > LIMIT or t.device.type != "cpu") for t in flat):
            self._forget_written(func, args, kwargs)
            return out
        self._mark(out, self._compute(func, args, kwargs))
        self.computed += 1
        return out

    def _mark(self, out: Any, real: Any) -> None:
        fakes, _ = tree_flatten(out)
        reals, _ = tree_flatten(real)
        if len(fakes) != len(reals):
            return
        for f, r in zip(fakes, reals, strict=True):
            if isinstance(f, torch.Tensor) and isinstance(r, torch.Tensor) and f.shape == r.shape:
                self.known[f] = r


def _ctc_outputs(log_probs: torch.Tensor, target_lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``_ctc_loss``'s outputs, whose shape depends on the longest target: the loss per sample and
    ``log_alpha`` (batch x input length x (2 x longest target + 1)), as the CPU and CUDA kernels
    allocate them (``LossCTC.cpp``, ``cuda/LossCTC.cu``), made through the dispatcher."""
    batch = int(log_probs.shape[1]) if log_probs.dim() == 3 else 1
    with _disable_current_modes():  # real values, read with no mode below
        longest = int(target_lengths.max()) if target_lengths.numel() else 0
    nll = torch.empty((batch,), dtype=log_probs.dtype, device="cpu")
    alpha = torch.empty(
        (batch, int(log_probs.shape[0]), 2 * longest + 1), dtype=log_probs.dtype, device="cpu"
    )
    return nll, alpha


def _fake_like(t: Any) -> Any:
    """A fake tensor of ``t``'s sizes, strides and dtype, made through the dispatcher."""
    if not isinstance(t, torch.Tensor):
        return t
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device="cpu")


#: transformers' checks (``masking_utils``) whose first argument is the 2-D padding mask: on a fake
#: one they answer "keep the mask" (their ``is_tracing`` is true for a FakeTensor).
MASK_CHECKS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")


#: :func:`_on_real`'s answer where a value it needs is unknown.
_UNKNOWN = object()


def _on_real(data: KnownData, fn: Any, first: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``fn`` called with modes off on the real value of its first argument (positional, or by the
    name ``first``), or :data:`_UNKNOWN` where that value, or another tensor argument's, is unknown."""
    if first in kwargs:
        value, others = kwargs[first], [*args, *(v for k, v in kwargs.items() if k != first)]
    else:
        value, others = (args[0] if args else None), [*args[1:], *kwargs.values()]
    real = data.real(value)
    if real is None or any(isinstance(a, torch.Tensor) and is_fake(a) for a in others):
        return _UNKNOWN
    with _disable_current_modes():
        if first in kwargs:
            return fn(*args, **{**kwargs, first: real})
        return fn(real, *args[1:], **kwargs)


def _mask_check(data: KnownData, check: Any) -> Any:
    """``check`` answered from the padding mask's real values where they are known: a real run whose
    mask is all ones (no padding) builds no 4-D mask and calls SDPA with ``is_causal`` or no mask,
    which on CUDA leaves flash attention open; the BERT row on an H200 kept a float mask per layer
    (1.0134 of the measured peak, exact without it). Unknown: transformers builds the mask (over,
    not under)."""

    def answer(*args: Any, **kwargs: Any) -> Any:
        known = _on_real(data, check, "padding_mask", args, kwargs)
        return check(*args, **kwargs) if known is _UNKNOWN else known

    return answer


def _packing_check(data: KnownData, original: Any) -> Any:
    """``find_packed_sequence_indices`` answered from the real position ids where they are known
    (``None``: no packed sequences, as the real run finds)."""

    def find(*args: Any, **kwargs: Any) -> Any:
        known = _on_real(data, original, "position_ids", args, kwargs)
        if known is _UNKNOWN:
            data.unknown_packing += 1
        elif known is None:
            return None
        return original(*args, **kwargs)

    return find


@contextlib.contextmanager
def transformers_checks(data: KnownData) -> Iterator[int]:
    """While on, transformers' data-dependent mask checks (where transformers is already imported)
    answer from the real values :class:`KnownData` keeps: the two "can the mask be skipped" checks
    and ``find_packed_sequence_indices``. Yields how many it wraps (0 without transformers)."""
    module = sys.modules.get("transformers.masking_utils")
    wrappers: dict[str, Callable[[KnownData, Any], Any]] = {name: _mask_check for name in MASK_CHECKS}
    wrappers["find_packed_sequence_indices"] = _packing_check
    originals = {
        name: getattr(module, name) for name in wrappers if module is not None and hasattr(module, name)
    }
    for name, original in originals.items():
        setattr(module, name, wrappers[name](data, original))
    try:
        yield len(originals)
    finally:
        for name, original in originals.items():
            setattr(module, name, original)


def packing_note(calls: int) -> str:
    """The note for transformers' packed-sequence checks the estimate could not answer."""
    return (
        f"transformers' packed-sequence check ran {calls} time(s) on position ids whose values the estimate "
        "does not know: it built the batch x seq^2 mask a real run skips when nothing is packed, so the "
        "estimate can be high by that mask (and, for a CUDA target, count an attention kernel with a mask)"
    )


class KnownValues(Part):
    """The estimate's part for real values beside the fake step: :class:`KnownData` seeded with
    the batch, and transformers' mask checks answered from it."""

    def __init__(self, batch: Any, fake_batch: Any) -> None:
        self.data = KnownData()
        self.data.seed(batch, fake_batch)

    @contextlib.contextmanager
    def _on(self) -> Iterator[None]:
        with self.data, transformers_checks(self.data):
            yield

    def mode(self) -> contextlib.AbstractContextManager[Any]:
        return self._on()

    def notes(self, notes: list[str]) -> list[str]:
        if self.data.unknown_packing:
            return [*notes, packing_note(self.data.unknown_packing)]
        return notes
