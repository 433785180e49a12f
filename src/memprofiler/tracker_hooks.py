"""torch's module tracker, without the gradients its backward hooks hold.

torch's ``MemTracker`` and ``FSDPMemTracker`` (the run-time module-wise collectors) and the
estimate's tracker follow modules with ``ModTracker``, which marks a module's backward done with
``register_multi_grad_hook(inputs, ..., mode="all")``. In that mode torch keeps every input's
gradient in a buffer until the last one arrives, to hand them all to the hook; the tracker's
hook never reads them. An untracked run has no such hook, so a gradient freed there as soon as
its node ran lived on under the tracker until the module's other inputs had theirs:
MobileViT's ``MobileViTOutput(hidden_states, input_tensor)`` held the gradient of its first
input (8 x 16 x 288 float32, 147,456 B) from the activation's backward to the residual's merge.
A profiler that holds memory the training does not is measuring itself.

:func:`gradient_free_module_hooks` swaps in the same counting (hooks fire when the engine has
computed every gradient it will compute in this backward) with ``None`` in place of each gradient.
"""

from __future__ import annotations

import contextlib
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch.autograd.graph import _get_grad_fn_or_grad_acc, _MultiHandle


def _all_without_grads(tensors: Sequence[torch.Tensor], fn: Callable[[Any], None]) -> _MultiHandle:
    """``register_multi_grad_hook(tensors, fn, mode="all")`` that keeps no gradient: ``fn`` gets
    one ``None`` per tensor once every gradient this backward computes for them is computed.

    Like torch it keeps the tensors' nodes to count them, but only until the first backward is
    done with them: each node holds the hook, so the node, every node above it and a leaf's
    gradient accumulator (which holds the leaf) lived as long as the hook did. Wav2Vec2's feature
    encoder sets ``requires_grad`` on its input: that leaf and its ``.grad`` outlived every step
    (25,600 B more each step on the sweep's Wav2Vec2). A later backward (``retain_graph``) finds
    the nodes again through weak references to the tensors.
    """
    lock = threading.Lock()
    seen: dict[int, int] = {}
    expected: dict[int, int] = {}
    held: list[Any] = [_get_grad_fn_or_grad_acc(t) for t in tensors]
    refs = [weakref.ref(t) for t in tensors]
    n = len(tensors)

    def will_run() -> int:
        nodes = held
        if not nodes:
            with torch.enable_grad():  # a leaf's accumulator is found through a view made now
                nodes = [_get_grad_fn_or_grad_acc(t) for ref in refs if (t := ref()) is not None]
        return sum(map(torch._C._will_engine_execute_node, nodes))

    def hook(_grad: torch.Tensor) -> None:
        task = torch._C._current_graph_task_id()
        with lock:
            if task not in expected:
                expected[task] = will_run()
            seen[task] = seen.get(task, 0) + 1
            done = seen[task] == expected[task]
            if done:
                del seen[task], expected[task]
                held.clear()
        if done:
            fn([None] * n)

    return _MultiHandle(tuple(t.register_hook(hook) for t in tensors))


_patch_lock = threading.Lock()
_patch_users = 0
_patch_original: Any = None


@contextlib.contextmanager
def gradient_free_module_hooks() -> Iterator[bool]:
    """While on, torch's ``ModTracker`` registers its ``"all"`` hooks through
    :func:`_all_without_grads`; ``"any"`` hooks hold nothing and are left to torch. Yields whether
    it could (a torch whose tracker registers elsewhere is left as it is).

    The swap is torch's module attribute, one for the process: windows that overlap (two
    trackers, or an estimate made inside a profiled call) share it, and the last one out puts
    torch's function back, whatever order they close in.
    """
    global _patch_users, _patch_original
    from torch.distributed._tools import mod_tracker

    with _patch_lock:
        if _patch_users == 0:
            original = getattr(mod_tracker, "register_multi_grad_hook", None)
            if original is None:
                ok = False
            else:
                _patch_original = original
                mod_tracker.register_multi_grad_hook = _register
                ok = True
        else:
            ok = True
        if ok:
            _patch_users += 1
    if not ok:
        yield False
        return
    try:
        yield True
    finally:
        with _patch_lock:
            _patch_users -= 1
            if _patch_users == 0:
                mod_tracker.register_multi_grad_hook = _patch_original
                _patch_original = None


def _register(tensors: Sequence[torch.Tensor], fn: Callable[..., None], mode: str = "all") -> Any:
    if mode == "all":
        return _all_without_grads(tensors, fn)
    return _patch_original(tensors, fn, mode=mode)


class DeadModulesSkipped:
    """A mixin for torch's memory trackers: the backward hook of a module that no longer exists
    (one made inside a forward and dropped before backward) is skipped as torch skips it, without
    torch's ``UserWarning: Module is None`` once per such module and step; they are counted in
    :attr:`dead_module_hooks` instead."""

    dead_module_hooks = 0

    def _pre_bw_hook(self, module: Any, args: Any) -> None:
        if module is None:
            self.dead_module_hooks += 1
            return
        super()._pre_bw_hook(module, args)  # type: ignore[misc]

    def _post_bw_hook(self, module: Any, args: Any) -> None:
        if module is None:
            self.dead_module_hooks += 1
            return
        super()._post_bw_hook(module, args)  # type: ignore[misc]
