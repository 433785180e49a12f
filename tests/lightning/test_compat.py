"""Lightning's private API, as memprofiler uses it: each name pinned, so a Lightning release that
changes one fails here (and the ``lightning`` range in pyproject.toml says what is supported)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement

import lightning
from memprofiler import MemProfilerCallback, ProfilerHooksMixin
from memprofiler.lightning import _compat
from memprofiler.lightning.cli import MemProfilerCLI
from memprofiler.lightning.extended_profiler import ExtendedPyTorchProfiler
from memprofiler.lightning.profiler_schedule import CyclicSchedule

ROOT = Path(__file__).resolve().parents[2]


class MixinModule(ProfilerHooksMixin, lightning.pytorch.LightningModule):
    pass


SRC = ROOT / "src" / "memprofiler"


def _resolve(dotted: str) -> object:
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj: object = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for name in parts[cut:]:
            obj = getattr(obj, name)
        return obj
    raise ImportError(dotted)


@pytest.mark.parametrize("dotted", sorted(_compat.PINNED))
def test_each_pinned_private_name_has_the_parameters_relied_on(dotted):
    # GIVEN a private Lightning function or method memprofiler calls or overrides
    # WHEN it is looked up in the installed Lightning
    fn = _resolve(dotted)
    # THEN it exists and its parameters are the ones the shims pass
    assert tuple(inspect.signature(fn).parameters) == _compat.PINNED[dotted]


@pytest.mark.parametrize("owner", sorted(_compat.PINNED_ATTRIBUTES))
def test_each_pinned_private_attribute_is_still_set_by_lightning(owner):
    # GIVEN the source of the Lightning class (and its Lightning bases) that owns the attributes
    classes = [c for c in inspect.getmro(_resolve(owner)) if c.__module__.startswith("lightning")]  # type: ignore[arg-type]
    source = "".join(inspect.getsource(c) for c in classes)
    # THEN each attribute memprofiler reads or writes is still assigned there (or is a property)
    forms = ("self.{} =", "self.{}:", "def {}(")
    missing = [a for a in _compat.PINNED_ATTRIBUTES[owner] if not any(f.format(a) in source for f in forms)]
    assert missing == []


@pytest.mark.parametrize(
    "ours", [MemProfilerCLI, ExtendedPyTorchProfiler, CyclicSchedule, MemProfilerCallback, MixinModule]
)
def test_every_private_override_is_pinned(ours):
    # GIVEN our subclasses of Lightning classes
    overrides = []
    for cls in inspect.getmro(ours):
        if cls.__module__.startswith("lightning"):
            continue
        for name in vars(cls):
            if not name.startswith("_") or name.startswith("__") or name == "_abc_impl":
                continue
            for base in inspect.getmro(ours):
                if base.__module__.startswith("lightning") and name in vars(base):
                    overrides.append(f"{base.__module__}.{base.__qualname__}.{name}")
                    break
    # THEN each private method they replace is pinned
    assert [o for o in overrides if o not in _compat.PINNED] == []


def test_no_module_but_the_shims_imports_a_private_lightning_name():
    offenders = []
    for path in SRC.rglob("*.py"):
        if path.name == "_compat.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("lightning"):
                offenders += [f"{path.name}: {a.name}" for a in node.names if a.name.startswith("_")]
    assert offenders == []


def test_installed_lightning_is_in_the_supported_range():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if Requirement(d).name == "lightning"]
    assert req.specifier.contains(lightning.__version__), (str(req), lightning.__version__)
    assert any(s.operator == "<" for s in req.specifier), "the supported range needs an upper bound"


class _RecordingProfiler(lightning.pytorch.profilers.Profiler):
    """Every profiler action Lightning starts, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.actions: list[str] = []

    def start(self, action_name: str) -> None:
        self.actions.append(action_name)

    def stop(self, action_name: str) -> None:
        pass

    def summary(self) -> str:
        return ""


class _Marker(lightning.pytorch.Callback):
    def on_train_start(self, trainer, pl_module):
        pass


def test_lightning_names_its_profiler_actions_as_the_shims_read_them(tmp_path):
    from lightning.pytorch.demos.boring_classes import BoringModel

    from memprofiler.lightning.trace_output import action_track
    from memprofiler.output.step_timeline import DATA

    # GIVEN a Trainer whose profiler records every action, through fit (with its sanity check),
    # validate, test and predict
    profiler = _RecordingProfiler()
    trainer = lightning.pytorch.Trainer(
        default_root_dir=tmp_path,
        accelerator="cpu",
        max_steps=2,
        limit_train_batches=2,
        limit_val_batches=1,
        limit_test_batches=1,
        limit_predict_batches=1,
        num_sanity_val_steps=1,
        profiler=profiler,
        callbacks=[_Marker()],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = BoringModel()
    trainer.fit(model)
    trainer.validate(model, verbose=False)
    trainer.test(model, verbose=False)
    trainer.predict(model)
    actions = set(profiler.actions)
    # THEN each loop's wait for a batch is one the shims (and the step timeline's data row) know
    waits = {a for a in actions if a.endswith("_next")}
    assert waits == {
        _compat.TRAIN_DATALOADER_WAIT,
        "[_EvaluationLoop].val_next",
        "[_EvaluationLoop].test_next",
        "[_PredictionLoop].predict_next",
    }
    assert {a for a in actions if _compat.is_dataloader_wait(a)} == waits
    assert {a for a in actions if action_track(a) == DATA} == waits
    # AND a callback's hooks are actions under its state key
    prefix = _compat.callback_action_prefix(_Marker().state_key)
    assert f"{prefix}on_train_start" in actions


def test_lightnings_trace_annotations_are_the_prefixes_the_trace_readers_use():
    from lightning.pytorch.profilers import pytorch as pl_pytorch

    from memprofiler.analysis.traces import events as trace_events
    from memprofiler.analysis.traces import steps as profiler_steps

    # GIVEN the source of Lightning's PyTorchProfiler, which names the trace annotations
    source = inspect.getsource(pl_pytorch)
    # THEN it still prefixes actions and module spans as the shims say
    assert f'record_function("{_compat.TRACE_ACTION_PREFIX}" + action_name)' in source
    assert f'record_function("{_compat.TRACE_MODULE_PREFIX}" + record_name)' in source
    # AND the torch-free trace readers' copies are the same
    assert trace_events.LIGHTNING_ACTION_PREFIX == _compat.TRACE_ACTION_PREFIX
    assert trace_events.LIGHTNING_MODULE_PREFIX == _compat.TRACE_MODULE_PREFIX
    assert _compat.TRACE_ACTION_PREFIX + _compat.TRAIN_DATALOADER_WAIT in profiler_steps.DATA_LOADING
