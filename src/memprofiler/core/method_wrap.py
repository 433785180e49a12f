"""Collect methods named in ``collect_funcs`` without editing their class.

A framework adapter (the Lightning callback) hands the profiler the objects whose methods a
user may name: the LightningModule, the DataModule, the strategy. Each name in
``collect_funcs`` is looked up on them in that order, preferring one whose own code defines it
over one that only inherits the framework's default hook; that owner gets it wrapped, at its class, exactly as ``@memprofilable`` wraps it
(:func:`~memprofiler.core.decorator.collecting`), and the wrapping is undone by
:meth:`WrappedMethods.restore`. A method decorated in the class or in a base (an override
calling the decorated one through ``super()``) is left alone: the decorator wins and no call
is counted twice.

Why the class and not the instance: a function put into the instance's ``__dict__`` would be
pickled with it (``torch.save(model)`` fails on a closure) and copied with it. At the class,
the wrapper serves every instance, and each call still finds its profiler through the
instance's attachment, so an unattached copy (an EMA model, another Trainer's module) costs one
dict lookup and is not collected.
"""

from __future__ import annotations

import difflib
import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from memprofiler.core.decorator import collecting, deferred_kind

_ABSENT = object()


@dataclass(frozen=True)
class Owner:
    """An object whose methods ``collect_funcs`` may name, and what it is to the user."""

    role: str
    """What the object is, for messages: ``the LightningModule``."""
    obj: Any
    """The object itself."""
    base: type | None = None
    """The framework's base class of ``obj`` (``LightningModule``): a method only it defines
    is a default hook, so another owner that defines the name itself is preferred."""

    def label(self) -> str:
        return f"`{type(self.obj).__name__}` ({self.role})"


@dataclass
class _Patch:
    cls: type
    name: str
    before: Any  # the class's own attribute before, or _ABSENT when it inherited the method
    wrapper: Any


@dataclass
class WrappedMethods:
    """What :func:`wrap_methods` did: the wrappers put on classes, and the names it could not place."""

    owners: list[Any] = field(default_factory=list)
    """Objects with a collected method (wrapped or decorated): each needs the profiler attached."""
    unresolved: dict[str, str] = field(default_factory=dict)
    """Name -> one line saying why nothing collects it, naming the classes searched."""
    _patches: list[_Patch] = field(default_factory=list)

    @property
    def wrapped(self) -> list[str]:
        """``Class.name`` of every method wrapped, in order."""
        return [f"{p.cls.__name__}.{p.name}" for p in self._patches]

    def restore(self) -> None:
        """Put every wrapped class back as it was. Idempotent.

        A class whose attribute was replaced since (by the user, or by a later profiler's own
        wrapping) keeps the newer one.
        """
        for p in reversed(self._patches):
            if p.cls.__dict__.get(p.name) is not p.wrapper:
                continue
            if p.before is _ABSENT:
                delattr(p.cls, p.name)
            else:
                setattr(p.cls, p.name, p.before)
        self._patches.clear()


def wrap_methods(names: Mapping[str, str], owners: Sequence[Owner]) -> WrappedMethods:
    """Wrap, on the first owner that has it, each method named in ``names``.

    Args:
        names: each function name -> the dotted config key that names it (for messages).
        owners: the objects to search, in order.

    Returns:
        The wrapping, to :meth:`~WrappedMethods.restore` at teardown (also after an exception).
    """
    done = WrappedMethods()
    for name, key in names.items():
        why = _wrap_one(name, owners, done)
        if why is not None:
            done.unresolved[name] = f"`{key}` names `{name}`, {why}"
    return done


def _wrap_one(name: str, owners: Sequence[Owner], done: WrappedMethods) -> str | None:
    """Wrap ``name`` on the first owner that has it; ``None``, or why nothing collects it."""
    having = [o for o in owners if inspect.getattr_static(o.obj, name, _ABSENT) is not _ABSENT]
    if not having:
        return _nowhere(name, owners)
    # `train_dataloader` is a default hook of every LightningModule; the DataModule's own is meant.
    owner = next((o for o in having if _defines(o, name)), having[0])
    found = inspect.getattr_static(owner.obj, name)
    if _in_instance_dict(owner.obj, name):
        return (
            f"an attribute set on the instance of {owner.label()}, not a method of its class; "
            "it cannot be wrapped: decorate the function with `@memprofilable` instead"
        )
    if _decorated(owner.obj, name):
        # The decorator wins, also on a base class whose method an override calls through
        # super(): wrapping the override too would count each call twice. It only needs the
        # attachment.
        _add_owner(done, owner.obj)
        return None
    if not inspect.isfunction(found):
        return (
            f"which on {owner.label()} is a {type(found).__name__}, not a plain method; "
            "nothing collects it (name a method defined with `def` in the class)"
        )
    if (kind := deferred_kind(found)) is not None:
        return (
            f"which on {owner.label()} is {kind}: a call returns at once and its body runs later, "
            "so only making the object would be collected; it is not collected (name the method "
            "that iterates or awaits it, or profile its body with `profiler.profile(...)`)"
        )
    cls = type(owner.obj)
    patch = _Patch(cls, name, cls.__dict__.get(name, _ABSENT), collecting(found, name))
    setattr(cls, name, patch.wrapper)
    done._patches.append(patch)
    _add_owner(done, owner.obj)
    return None


def _nowhere(name: str, owners: Sequence[Owner]) -> str:
    labels = [o.label() for o in owners]
    searched = labels[0] if len(labels) == 1 else ", ".join(labels[:-1]) + " or " + labels[-1]
    candidates = sorted({a for o in owners for a in _methods(type(o.obj))})
    close = difflib.get_close_matches(name, candidates, n=2, cutoff=0.75)
    hint = (
        "did you mean " + " or ".join(f"`{c}`" for c in close) + "?" if close else "name one of their methods"
    )
    return (
        f"which is not a method of {searched}; nothing collects it unless your code runs "
        f'`profiler.profile("{name}")`; {hint}'
    )


def _decorated(obj: Any, name: str) -> bool:
    """Whether any class of ``obj`` defines ``name`` with ``@memprofilable``."""
    return any(getattr(c.__dict__.get(name), "__memprofilable__", False) for c in type(obj).__mro__)


def _defines(owner: Owner, name: str) -> bool:
    """Whether ``name`` on ``owner`` comes from below its framework base (the user's own code)."""
    if owner.base is None:
        return True
    definer = next((c for c in type(owner.obj).__mro__ if name in c.__dict__), None)
    return definer is None or not issubclass(owner.base, definer)


def _methods(cls: type) -> list[str]:
    """The public plain methods of ``cls``: what a name in ``collect_funcs`` could mean."""
    return [
        a
        for a in dir(cls)
        if not a.startswith("_") and inspect.isfunction(inspect.getattr_static(cls, a, None))
    ]


def _in_instance_dict(obj: Any, name: str) -> bool:
    try:
        return name in vars(obj)
    except TypeError:  # __slots__: no instance dict
        return False


def _add_owner(done: WrappedMethods, obj: Any) -> None:
    if not any(o is obj for o in done.owners):
        done.owners.append(obj)
