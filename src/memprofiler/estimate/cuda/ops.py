"""One dispatch mode for the device model's parts that look at each op: :class:`OpHooks`.

Each part that only needs to see an op (the workspaces a matrix product takes, the scratch a
kernel allocates inside itself, the statistics CUDA keeps in float32, the custom ops a step runs)
is an :class:`OpHook`, and one mode runs them all around the op. A mode of its own each would give
the same figures, but every mode on the stack re-enters torch's dispatcher once more per op (about
15 us each on the 80,000 ops of two 7B steps).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from torch.utils._python_dispatch import TorchDispatchMode

from memprofiler.estimate.fake import queries


class OpHook:
    """What a part does around one op: :meth:`before` it runs, :meth:`after` it returned."""

    def before(self, func: Any) -> None:
        """Called before the op runs (nothing by default)."""

    def after(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any], out: Any) -> Any:
        """The op's outputs, as this part makes them (``out`` by default)."""
        return out


class OpHooks(TorchDispatchMode):
    """Runs ``hooks`` around every op, as if each were a mode of its own entered in their order:
    the first hook's :meth:`~OpHook.after` sees the op's outputs first, and each later one sees
    what the earlier ones made of them."""

    def __init__(self, hooks: Sequence[OpHook]) -> None:
        super().__init__()
        self.hooks = list(hooks)
        self._before = [h for h in self.hooks if type(h).before is not OpHook.before]
        self._after = [h for h in self.hooks if type(h).after is not OpHook.after]

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None
    ) -> Any:
        if func is queries.DEVICE:
            found = queries.device_of(args)
            if found is not None:
                return found
        kwargs = kwargs or {}
        for hook in self._before:
            hook.before(func)
        out = func(*args, **kwargs)
        for hook in self._after:
            out = hook.after(func, args, kwargs, out)
        return out
