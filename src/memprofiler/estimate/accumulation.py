"""Gradient accumulation in autograd's input buffers, counted as a run without a mode does it.

When two gradients reach one input of a backward node (a tensor used twice in forward: a
residual connection, a tied weight), the engine adds them in ``InputBuffer::accumulate``
(torch/csrc/autograd/input_buffer.cpp): in place (``old.add_(new)``) when grad mode is off, the
gradient already in the buffer is dense and non-overlapping, and the buffer holds the only
reference to it and to its storage; out of place (``old + new``) otherwise. torch also takes the
out-of-place branch whenever a ``TorchDispatchMode`` is active (``isTensorSubclassLike``), so
under the estimate's tracker every merge would allocate one gradient-sized tensor that a real
run never allocates.

:func:`routing_hooks` finds the engine's adds: a post hook on every node that sends a gradient
to an input another edge also reaches records the storages of the gradients the node has just
computed (the engine routes them into input buffers next); a pre hook on every node clears them. An
``aten.add.Tensor`` whose second operand is
one of them is an accumulation. :func:`inplace_candidate` then applies torch's rule to the
buffer's gradient: grad mode off, dense and non-overlapping, its storage referenced no more
than a lone buffer gradient's is inside ``__torch_dispatch__`` (:func:`lone_counts`, measured
once per process on a two-branch graph: views, ``.grad``, a saved tensor sharing it count more),
and its tensor referenced no more than the incoming gradient, which only the engine holds
(modes stacked above the tracker add the same references to both).

Assumed: merges inside a backward that a node runs itself (reentrant checkpointing) are not
hooked and stay out of place, as before; a gradient a node routes to two buffers at once
(``AddBackward`` passing one tensor to both inputs) is not taken for a merge operand, so the
merge stays out of place there (torch may do it in place once the other buffer has consumed it).
The sum is counted in the buffer gradient's block: no new bytes, no new allocator block.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch._prims_common import is_non_overlapping_and_dense_or_false
from torch.utils._python_dispatch import _disable_current_modes

ADD = torch.ops.aten.add.Tensor


def counts(t: torch.Tensor) -> tuple[int, int]:
    """References to ``t``'s tensor and to its storage, as seen from here."""
    st = t.untyped_storage()
    return t._use_count(), torch._C._storage_Use_Count(st._cdata)  # type: ignore[attr-defined]


@functools.cache
def lone_counts() -> tuple[int, int]:
    """:func:`counts` of a buffer's gradient inside ``__torch_dispatch__`` when only the buffer
    holds it (``h = pre(x); a(h).sum() + b(h).sum()``: torch accumulates ``h``'s in place)."""
    seen: list[tuple[int, int]] = []

    class Probe(torch.utils._python_dispatch.TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            if func is ADD and not torch.is_grad_enabled():
                seen.append(counts(args[0]))
            return func(*args, **(kwargs or {}))

    try:
        with _disable_current_modes(), torch.device("cpu"), torch.enable_grad():
            pre, a, b = (torch.nn.Linear(2, 2) for _ in range(3))
            h = pre(torch.ones(1, 2))
            loss = a(h).sum() + b(h).sum()
            with Probe():
                loss.backward()
    except (AttributeError, RuntimeError):  # a torch without the private counts used here
        return (0, 0)
    if len(seen) != 1:  # a torch that merges elsewhere: claim nothing in place (as before)
        return (0, 0)
    return seen[0]


def inplace_candidate(routing: frozenset[int], args: Any, kwargs: Any) -> torch.Tensor | None:
    """The buffer's gradient when ``add(*args)`` is an engine merge torch would do in place."""
    if not routing or kwargs or len(args) != 2 or torch.is_grad_enabled():
        return None
    lone_t, lone_s = lone_counts()
    if lone_t == 0:
        return None
    old, new = args
    if type(old) is not type(new) or not isinstance(old, torch.Tensor):
        return None
    if getattr(old, "to_local", None) is not None:  # DTensor: torch's subclass branch
        return None
    if new.untyped_storage()._cdata not in routing:
        return None
    if old.shape != new.shape or old.dtype != new.dtype or not is_non_overlapping_and_dense_or_false(old):
        return None
    # Modes stacked above the tracker (a CUDA target's) hold each operand once more, so the
    # tensor count is compared with the incoming gradient's, which only the engine holds
    # (a gradient routed to two buffers at once is left out of ``routing``).
    old_t, old_s = counts(old)
    new_t, _ = counts(new)
    return old if old_t <= new_t and old_s <= lone_s else None


def _graph(*roots: Any) -> tuple[list[Any], list[Any]]:
    """Every node of the graph below ``roots``, and those that send a gradient to an input that
    another edge also reaches (the merges' producers: only their outputs are ever accumulated)."""
    nodes: list[Any] = []
    seen: set[Any] = set()
    edges: dict[tuple[Any, int], list[Any]] = {}
    stack = list(roots)
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        nodes.append(node)
        for nxt, nr in node.next_functions:
            if nxt is not None:
                edges.setdefault((nxt, nr), []).append(node)
                stack.append(nxt)
    feeders = {id(n): n for senders in edges.values() if len(senders) > 1 for n in senders}
    return nodes, list(feeders.values())


@contextlib.contextmanager
def routing_hooks(tracker: Any, loss: torch.Tensor | Sequence[torch.Tensor]) -> Iterator[None]:
    """While the block runs ``loss.backward()``, ``tracker.routing`` holds the storages of the
    gradients the engine is routing into input buffers; the hooks are gone afterwards. ``loss`` may
    be several outputs a backward starts from (a pipeline stage's)."""
    outputs = [loss] if isinstance(loss, torch.Tensor) else list(loss)
    roots = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    handles: list[Any] = []

    def routed(grad_inputs: Any, grad_outputs: Any) -> None:
        keys = [
            t.untyped_storage()._cdata
            for t in grad_inputs
            if isinstance(t, torch.Tensor) and getattr(t, "to_local", None) is None
        ]
        tracker.routing = frozenset(k for k in keys if keys.count(k) == 1)

    def applying(grad_outputs: Any) -> None:
        if tracker.routing:
            tracker.routing = frozenset()

    try:
        if roots:
            nodes, feeders = _graph(*roots)
            handles.extend(node.register_hook(routed) for node in feeders)
            handles.extend(node.register_prehook(applying) for node in nodes)
        yield
    finally:
        for handle in handles:
            handle.remove()
        tracker.routing = frozenset()
