"""``@memprofilable``: mark a method whose calls the profiler may collect.

Only methods: the profiler is found through the object the method is called on (the one
:meth:`MemProfiler.attach` was given). A plain function has no such object, so decorating one
is refused at once rather than collecting nothing; profile its calls with
``with prof.profile("name", module=model):`` instead.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any, TypeVar, cast

from memprofiler.errors import ConfigError

F = TypeVar("F", bound=Callable[..., Any])

#: Attribute through which ``@memprofilable`` finds the profiler on the decorated object.
#: It is the only thing memprofiler writes onto a user's object; all state is on the profiler.
#: Not ``_memprofiler``: finetuning-scheduler's ``ProfilerHooksMixin`` keeps its own profiler
#: there, and a module using both would read the other's object.
ATTACH_ATTR = "_memprofiler_attachment"


def _detached() -> None:
    return None


class Attachment:
    """The reference ``attach`` writes onto a user's object.

    Copies and pickles of the object come out unattached: Lightning's SWA, EMA and teacher
    models ``deepcopy`` the LightningModule, and must neither copy the profiler (it holds
    locks and hooks) nor report to it.
    """

    __slots__ = ("profiler",)

    def __init__(self, profiler: Any) -> None:
        self.profiler = profiler

    def __deepcopy__(self, memo: dict[int, Any]) -> None:
        return None

    def __reduce__(self) -> tuple[Callable[[], None], tuple[()]]:
        return (_detached, ())


def memprofilable(fn: F) -> F:
    """Let an attached :class:`~memprofiler.MemProfiler` count and collect calls of ``fn``.

    With no profiler attached the cost is one instance-dict lookup per call. The call is
    counted under ``fn.__name__``.

    Raises:
        ConfigError: ``fn`` is a plain function, not a method defined in a class body.

    Example:
        >>> class Model(LightningModule):  # doctest: +SKIP
        ...     @memprofilable
        ...     def training_step(self, batch, batch_idx): ...
    """
    _refuse_plain_function(fn)
    if (kind := deferred_kind(fn)) is not None:
        raise ConfigError(
            "",
            f"`@memprofilable` on `{fn.__qualname__}`, {kind}, would collect nothing of its body: a call "
            "returns at once and the body runs later, while it is iterated or awaited. Decorate the "
            "method that iterates or awaits it, or wrap the body in `with prof.profile(...)`",
        )
    return collecting(fn, fn.__name__)


def deferred_kind(fn: Callable[..., Any]) -> str | None:
    """``"a generator function"`` (or coroutine, async generator) when calling ``fn`` only
    makes an object whose body runs later; ``None`` for a plain function."""
    if inspect.isasyncgenfunction(fn):
        return "an async generator function"
    if inspect.iscoroutinefunction(fn):
        return "an `async def` coroutine function"
    if inspect.isgeneratorfunction(fn):
        return "a generator function"
    return None


def collecting(fn: F, name: str) -> F:
    """``fn`` wrapped as ``@memprofilable`` wraps it, its calls counted under ``name``.

    The decorator's body, shared with the wrapping of methods named in ``collect_funcs``
    (:mod:`memprofiler.core.method_wrap`), so both collect a call the same way.
    """

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            att = self.__dict__.get(ATTACH_ATTR)
        except AttributeError:  # a class with __slots__ cannot be attached to
            att = None
        if att is None:
            return fn(self, *args, **kwargs)
        prof = att.profiler
        run = prof.begin(name)
        if run is None:
            return fn(self, *args, **kwargs)
        ok = False
        try:
            out = fn(self, *args, **kwargs)
            ok = True
            return out
        finally:
            prof.finish(run, ok)

    wrapper.__memprofilable__ = True  # type: ignore[attr-defined]
    return cast(F, wrapper)


def _refuse_plain_function(fn: Callable[..., Any]) -> None:
    """A function defined in a class body has its class in ``__qualname__``: ``Model.step``."""
    parts = getattr(fn, "__qualname__", "").split(".")
    if len(parts) >= 2 and parts[-2] != "<locals>":
        return
    raise ConfigError(
        "",
        f"`@memprofilable` on the plain function `{fn.__name__}` would collect nothing: it finds the "
        "profiler through the object a method is called on. Make it a method of the object given "
        f'to `MemProfiler.attach` (a LightningModule), or wrap its calls in `with prof.profile("{fn.__name__}", '
        "module=model):`",
    )
