"""The few values a fake step still knows: tensors of all ones (the batch's, and ``torch.ones``
and kin), and what is cast, viewed, copied or indexed from them, until something writes into them.

A fake tensor has shapes but no values, so where a model branches on values the estimate takes
the branch a tracer would. transformers does so for the attention mask: a real run whose padding
mask is all ones (no padding) builds no 4-D mask and calls SDPA with ``is_causal`` or no mask,
which on CUDA leaves flash attention open; on a FakeTensor its ``is_tracing`` is true, so it
builds the mask, and the estimate kept what a masked attention keeps. That is the whole of the
BERT row's excess on an H200 (``attention_mask`` of ones, batch 8 x 512): 1.0134 of the measured
allocated peak, 1.0000 without it.

:class:`AllOnes` follows such tensors through the step; :func:`transformers_masks` hands
transformers' two "can the mask be skipped" checks ``None`` for a padding mask known to be all
ones, which is what their own test (``padding_mask.all()``) would have found.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import unset_fake_temporarily
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakIdKeyDictionary

_aten = torch.ops.aten
#: Ops whose output holds only values of their first input: all ones in, all ones out.
KEEP = frozenset(
    {
        _aten._to_copy.default,
        _aten.clone.default,
        _aten.alias.default,
        _aten.detach.default,
        _aten.lift_fresh.default,
        _aten.view.default,
        _aten._unsafe_view.default,
        _aten.reshape.default,
        _aten.expand.default,
        _aten.slice.Tensor,
        _aten.select.int,
        _aten.narrow.default,
        _aten.unsqueeze.default,
        _aten.squeeze.dim,
        _aten.squeeze.dims,
        _aten.t.default,
        _aten.transpose.int,
        _aten.permute.default,
        _aten.index.Tensor,
    }
)
#: Factories of ones (``torch.ones`` and kin), and of a fill value where it is 1.
ONES = frozenset({_aten.ones.default, _aten.ones_like.default, _aten.new_ones.default})
FILL_AT = {_aten.full.default: 1, _aten.full_like.default: 1, _aten.new_full.default: 2}
#: transformers' checks (``masking_utils``) whose first argument is the 2-D padding mask.
SKIP_CHECKS = ("_ignore_causal_mask_sdpa", "_ignore_bidirectional_mask_sdpa")


def _all_ones(t: torch.Tensor) -> bool:
    if t.is_meta or t.is_floating_point() or t.is_complex() or t.numel() == 0:
        return False
    try:
        return bool(t.all()) if t.dtype == torch.bool else bool((t == 1).all())
    except RuntimeError:  # a tensor without values (fake, or on a device this process cannot read)
        return False


class AllOnes(TorchDispatchMode):
    """Fake tensors known to hold only ones: the batch's, those :data:`ONES` and ones-filled
    factories make, and what :data:`KEEP` ops make of them. A write into any of their storages
    forgets them all (the mask would then be built, as before: over, never under)."""

    def __init__(self) -> None:
        super().__init__()
        #: One dictionary for the run: :func:`transformers_masks` holds it, so forgetting clears it.
        self.known: WeakIdKeyDictionary = WeakIdKeyDictionary()
        self._written: dict[Any, tuple[str, ...]] = {}

    def seed(self, real_batch: Any, fake_batch: Any) -> int:
        """Mark the fake batch's integer and boolean tensors whose real values are all ones."""
        reals = [t for t in tree_leaves(real_batch) if isinstance(t, torch.Tensor)]
        fakes = [t for t in tree_leaves(fake_batch) if isinstance(t, torch.Tensor)]
        if len(reals) != len(fakes):
            return 0
        with unset_fake_temporarily():  # the real values are read outside the fake step's mode
            ones = [_all_ones(real) for real in reals]
        for fake, is_ones in zip(fakes, ones, strict=True):
            if is_ones:
                self._mark(fake)
        return len(self.known)

    def _known(self, t: Any) -> bool:
        return isinstance(t, torch.Tensor) and t in self.known

    def _mark(self, t: torch.Tensor) -> None:
        self.known[t] = True

    def storages(self) -> set[int]:
        """The storages of the known tensors alive now: a write into one (through any view) forgets
        them all. Taken from the live tensors, never kept: a dead one's address is reused (an Adam
        state, a dropout mask), and a write there is no write into a known tensor."""
        return {t.untyped_storage()._cdata for t in self.known}

    def _ones_made(self, func: Any, args: tuple[Any, ...]) -> bool:
        if func in ONES:
            return True
        at = FILL_AT.get(func)
        return at is not None and len(args) > at and not isinstance(args[at], torch.Tensor) and args[at] == 1

    def _writes_known(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        """Whether ``func`` writes into the storage of a known tensor (or a view of one)."""
        written = self._written.get(func)
        if written is None:
            written = self._written[func] = tuple(
                a.name for a in func._schema.arguments if a.alias_info is not None and a.alias_info.is_write
            )
        if not written or not self.known:
            return False
        storages = self.storages()
        names = [a.name for a in func._schema.arguments]
        for name in written:
            t = kwargs.get(name, args[names.index(name)] if names.index(name) < len(args) else None)
            if isinstance(t, torch.Tensor) and t.untyped_storage()._cdata in storages:
                return True
        return False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        if self._writes_known(func, args, kwargs):  # values changed in place: know nothing from here on
            self.known.clear()
        out = func(*args, **kwargs)
        if isinstance(out, torch.Tensor) and (
            (func in KEEP and args and self._known(args[0])) or self._ones_made(func, args)
        ):
            self._mark(out)
        return out


def _skip_check(check: Callable[..., Any], known: WeakIdKeyDictionary) -> Callable[..., Any]:
    def check_with_values(*args: Any, **kwargs: Any) -> Any:
        if "padding_mask" in kwargs:
            if kwargs["padding_mask"] is not None and kwargs["padding_mask"] in known:
                kwargs["padding_mask"] = None
        elif args and isinstance(args[0], torch.Tensor) and args[0] in known:
            args = (None, *args[1:])  # all ones: no padding, which is what a missing mask means
        return check(*args, **kwargs)

    return check_with_values


@contextlib.contextmanager
def transformers_masks(ones: AllOnes) -> Iterator[int]:
    """While on, transformers (where already imported) sees a known all-ones padding mask as none.
    Yields how many checks it wraps (0 without transformers)."""
    module = sys.modules.get("transformers.masking_utils")
    originals = {
        name: getattr(module, name) for name in SKIP_CHECKS if module is not None and hasattr(module, name)
    }
    for name, check in originals.items():
        setattr(module, name, _skip_check(check, ones.known))
    try:
        yield len(originals)
    finally:
        for name, check in originals.items():
            setattr(module, name, check)
