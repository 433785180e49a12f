"""``collect_funcs`` names methods of classes nobody edited: wrapped as ``@memprofilable`` would, then undone."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch
from torch import nn

from memprofiler import MemProfiler, memprofilable
from memprofiler.core.method_wrap import Owner, wrap_methods


class Library(nn.Module):
    """A model from a library: no decorator, nothing to edit."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def train_step(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x).sum()

    @property
    def size(self) -> int:
        return 4


class Derived(Library):
    """Inherits ``train_step``: wrapping it must leave ``Library`` untouched."""


class Decorated(nn.Module):
    @memprofilable
    def train_step(self, x: torch.Tensor) -> torch.Tensor:
        return x.sum()


def _prof(tmp_path, names):
    return MemProfiler(
        {"schedule": {"warmup": 0, "active": 2}, "collect_funcs": {"default": names}},
        save_dir=tmp_path,
        rank=0,
    ).setup()


def test_a_named_method_is_collected_and_its_class_restored_at_teardown(tmp_path):
    # GIVEN a library model whose class defines `train_step`, with no decorator
    model = Library()
    original = Library.__dict__["train_step"]
    prof = _prof(tmp_path, ["train_step"])
    prof.attach(model)
    # WHEN the profiler wraps the configured names and the model runs three steps
    assert prof.wrap_methods([Owner("the model", model)]) == ["Library.train_step"]
    for _ in range(3):
        model.train_step(torch.ones(2, 4))
    # THEN each call was counted once and the first two were collected, as the decorator would
    assert prof.call_counts() == {"train_step": 3}
    assert sorted(prof.snapshots) == [f"0.train_step.{c}.{p}" for c in (1, 2) for p in ("end", "start")]
    # AND teardown puts the class back as it was
    prof.teardown()
    assert Library.__dict__["train_step"] is original
    assert "_memprofiler_attachment" not in vars(model)


def test_an_inherited_method_is_wrapped_on_the_instance_class_only(tmp_path):
    # GIVEN a subclass that inherits `train_step` from its library base
    model = Derived()
    prof = _prof(tmp_path, ["train_step"])
    prof.attach(model)
    # WHEN wrapped
    assert prof.wrap_methods([Owner("the model", model)]) == ["Derived.train_step"]
    # THEN the base is untouched: another instance of it is not counted
    Library().train_step(torch.ones(1, 4))
    model.train_step(torch.ones(1, 4))
    assert prof.call_counts() == {"train_step": 1}
    # AND unwrapping removes what it added, leaving the subclass inheriting again
    prof.unwrap_methods()
    assert "train_step" not in Derived.__dict__


def test_the_decorator_wins_and_nothing_is_wrapped_twice(tmp_path):
    # GIVEN a method that carries @memprofilable and is named in collect_funcs too
    model = Decorated()
    decorated = Decorated.__dict__["train_step"]
    prof = _prof(tmp_path, ["train_step"])
    prof.attach(model)
    # WHEN wrapping runs
    assert prof.wrap_methods([Owner("the model", model)]) == []
    model.train_step(torch.ones(2))
    # THEN the class keeps the decorated function and a call is counted once
    assert Decorated.__dict__["train_step"] is decorated
    assert prof.call_counts() == {"train_step": 1}
    prof.teardown()


class Override(Decorated):
    """Overrides the decorated method and calls it through super(), undecorated itself."""

    def train_step(self, x: torch.Tensor) -> torch.Tensor:
        return super().train_step(x) * 2


def test_an_override_of_a_decorated_method_is_not_wrapped_over_it(tmp_path):
    # GIVEN a subclass overriding a decorated method, calling it through super()
    model = Override()
    prof = _prof(tmp_path, ["train_step"])
    prof.attach(model)
    # WHEN wrapping runs and the method is called once
    assert prof.wrap_methods([Owner("the model", model)]) == []
    model.train_step(torch.ones(2))
    # THEN the decorated base counts it once; the override is not wrapped around it
    assert "train_step" in Override.__dict__ and not hasattr(
        Override.__dict__["train_step"], "__memprofilable__"
    )
    assert prof.call_counts() == {"train_step": 1}
    prof.teardown()


def test_a_copy_and_a_pickle_of_the_model_are_unaffected(tmp_path):
    # GIVEN a wrapped, attached model
    model = Library()
    prof = _prof(tmp_path, ["train_step"])
    prof.attach(model)
    prof.wrap_methods([Owner("the model", model)])
    # WHEN it is deep-copied (an EMA model) and pickled (torch.save of the whole module)
    twin = copy.deepcopy(model)
    twin.train_step(torch.ones(1, 4))
    restored = pickle.loads(pickle.dumps(model))
    # THEN the copy runs but reports nothing, and the pickle holds no wrapper
    assert prof.call_counts() == {}
    assert "train_step" not in vars(restored)
    prof.teardown()


def test_a_name_found_nowhere_is_one_line_naming_the_classes_and_the_close_match(tmp_path):
    # GIVEN a typo in collect_funcs and two objects to search
    model, other = Library(), Decorated()
    prof = _prof(tmp_path, ["train_stpe"])
    # WHEN wrapping runs
    with pytest.warns(UserWarning) as caught:
        prof.wrap_methods([Owner("the model", model), Owner("the scorer", other)])
    # THEN one line names the key, both classes searched and the method meant
    assert [str(w.message) for w in caught if "train_stpe" in str(w.message)] == [
        "memprofiler: `collect_funcs.default` names `train_stpe`, which is not a method of `Library` "
        "(the model) or `Decorated` (the scorer); nothing collects it unless your code runs "
        '`profiler.profile("train_stpe")`; did you mean `train_step`?'
    ]
    # AND the run's note at the end is the same line (warned once, kept in the manifest)
    prof.teardown()
    notes = (tmp_path / "memprofiler_run.yaml").read_text()
    assert "names `train_stpe`, which is not a method of `Library`" in " ".join(notes.split())


def test_a_property_is_refused_with_its_kind():
    # GIVEN a name that is a property, not a method
    done = wrap_methods({"size": "collect_funcs.cpu"}, [Owner("the model", Library())])
    # THEN nothing is wrapped and the line says what it is
    assert done.wrapped == []
    assert done.unresolved == {
        "size": "`collect_funcs.cpu` names `size`, which on `Library` (the model) is a property, not a "
        "plain method; nothing collects it (name a method defined with `def` in the class)"
    }


def test_an_owner_defining_the_name_is_preferred_to_one_inheriting_a_default_hook():
    # GIVEN two owners with `train_step`: one only inherits it from its framework base
    class Base:
        def train_step(self) -> None: ...

    class Framework(Base):
        pass

    class Mine:
        def train_step(self) -> None: ...

    first, second = Framework(), Mine()
    # WHEN the first owner names Base as its framework base
    done = wrap_methods(
        {"train_step": "collect_funcs.default"}, [Owner("a", first, Base), Owner("b", second)]
    )
    # THEN the owner whose own code defines it gets it
    try:
        assert done.wrapped == ["Mine.train_step"]
        assert done.owners == [second]
    finally:
        done.restore()
    assert "train_step" not in Framework.__dict__


class Deferred(nn.Module):
    """Methods whose call only makes an object: the body runs while it is iterated or awaited."""

    def batches(self, n: int):
        for k in range(n):
            yield torch.zeros(k)

    async def fetch(self) -> int:
        return 1

    async def stream(self):
        yield 1


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("batches", "a generator function"),
        ("fetch", "an `async def` coroutine function"),
        ("stream", "an async generator function"),
    ],
)
def test_generator_and_async_methods_are_refused_in_one_line_at_set_up(tmp_path, name, kind):
    # GIVEN collect_funcs naming a method whose call returns before its body runs
    model = Deferred()
    prof = _prof(tmp_path, [name])
    # WHEN wrapping runs at set-up
    with pytest.warns(UserWarning) as caught:
        assert prof.wrap_methods([Owner("the model", model)]) == []
    # THEN it is not wrapped ("collected" with figures covering only making the object before),
    # in one line saying why
    lines = [str(w.message) for w in caught if f"`{name}`" in str(w.message)]
    assert lines == [
        f"memprofiler: `collect_funcs.default` names `{name}`, which on `Deferred` (the model) is {kind}: "
        "a call returns at once and its body runs later, so only making the object would be collected; "
        "it is not collected (name the method that iterates or awaits it, or profile its body with "
        "`profiler.profile(...)`)"
    ]
    assert name not in Deferred.__dict__ or not getattr(Deferred.__dict__[name], "__memprofilable__", False)
    list(model.batches(2))
    assert prof.call_counts() == {}
    prof.teardown()


def test_the_decorator_refuses_a_generator_method_when_the_class_is_made():
    from memprofiler.errors import ConfigError

    with pytest.raises(
        ConfigError, match=r"`@memprofilable` on `.*Gen.steps`, a generator function, would collect nothing"
    ):

        class Gen(nn.Module):
            @memprofilable
            def steps(self):
                yield 1
