"""The compiled pack hook: built wherever the install found a C compiler, and as safe as the Python one."""

from __future__ import annotations

import gc
import shutil
import sys
import sysconfig
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from memprofiler.collectors import saved_tensors
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

F32 = 4


def test_the_pack_hook_is_compiled_where_a_compiler_is():
    cc = (sysconfig.get_config_var("CC") or "").split()
    if not cc or shutil.which(cc[0]) is None:
        pytest.skip("no C compiler here: the Python pack hook runs, with the same figures")
    assert saved_tensors._CPacker is not None, (
        "memprofiler._packer was not built although a C compiler is here: "
        "reinstall with `pip install -e .` and read the compiler's error"
    )
    assert type(SavedTensorsCollector()._p) is saved_tensors._CPacker
    assert type(SavedTensorsCollector(compiled=False)._p) is saved_tensors._PyPacker


def test_the_compiled_pack_hook_is_built_from_the_source_beside_it():
    # GIVEN the compiled pack hook of this checkout, where one was built
    if saved_tensors._CPacker is None:
        pytest.skip("memprofiler._packer is not built (no C compiler when installed)")
    # THEN it was built from this _packer.c: a build left from an earlier _packer.c would run (and
    # be timed) in place of the code being read and changed
    assert saved_tensors.packer_build() in ("compiled", "compiled, tensors through python"), (
        "memprofiler._packer or _tensor_facts was built from other sources than those in "
        "src/memprofiler: rebuild them with `make install-dev` or `python setup.py build_ext --inplace`"
    )


def test_the_tensor_facts_are_built_where_a_cpp_compiler_is():
    # GIVEN a C++ compiler here, and torch (importable while `make install` builds)
    cxx = (sysconfig.get_config_var("CXX") or "").split()
    if saved_tensors._CPacker is None or not cxx or shutil.which(cxx[0]) is None:
        pytest.skip("no C++ compiler (or no compiled hook) here: the hook reads tensors through Python")
    # THEN the compiled hook reads tensors in C++
    assert saved_tensors.NO_TENSOR_FACTS == "", (
        f"{saved_tensors.NO_TENSOR_FACTS}: rebuild with `make install-dev` (torch must be importable "
        "while building: `pip install --no-build-isolation -e .`) and read the compiler's error"
    )
    assert saved_tensors.packer_build() == "compiled"


def test_a_build_from_another_source_is_told_stale(monkeypatch: pytest.MonkeyPatch):
    # GIVEN a compiled pack hook that records another source's hash (or none: built by hand)
    if saved_tensors._CPacker is None:
        pytest.skip("memprofiler._packer is not built (no C compiler when installed)")
    _packer = sys.modules[saved_tensors._CPacker.__module__]
    for recorded in ("0" * 64, ""):
        monkeypatch.setattr(_packer, "SOURCE_SHA256", recorded)
        # THEN it is told stale; without a compiled hook, the Python one is named
        assert saved_tensors.packer_build() == "compiled, stale"
    monkeypatch.setattr(saved_tensors, "_CPacker", None)
    assert saved_tensors.packer_build() == "python"


def _mlp() -> tuple[nn.Module, torch.Tensor, SimpleNamespace]:
    torch.manual_seed(0)
    mlp = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    return (
        mlp,
        torch.randn(2, 8),
        SimpleNamespace(module=mlp, closes_window=False, fn_name="step", scratch={}),
    )


@pytest.mark.usefixtures("packer")
def test_a_packer_whose_state_is_broken_warns_once_and_training_goes_on():
    # GIVEN a collected call whose packer state is replaced by something it cannot read
    mlp, x, ctx = _mlp()
    warnings: list[str] = []
    coll = SavedTensorsCollector(warn=warnings.append)
    expected = torch.autograd.grad(mlp(x).pow(2).mean(), mlp[0].weight)[0]
    coll.start(ctx)
    coll._p.held = None  # type: ignore[assignment]
    loss = mlp(x).pow(2).mean()
    out = coll.end(ctx, True)
    # THEN no saved-tensor figures, one warning naming the hook, and exact gradients
    assert out == {}
    assert len(warnings) == 1 and "`saved_tensors` pack hook raised" in warnings[0]
    assert torch.equal(torch.autograd.grad(loss, mlp[0].weight)[0], expected)


@pytest.mark.usefixtures("packer")
def test_a_graph_kept_past_the_call_and_the_collector_is_still_exact():
    # GIVEN a graph built in a collected call and kept after the collector is gone
    mlp, x, ctx = _mlp()
    coll = SavedTensorsCollector()
    expected = torch.autograd.grad(mlp(x).pow(2).mean(), mlp[2].weight)[0]
    coll.start(ctx)
    loss = mlp(x).pow(2).mean()
    out = coll.end(ctx, True)
    del coll
    gc.collect()
    # THEN its figures are the analytic ones and backward later gives the same gradients
    assert out["saved_tensors.unique_bytes"] == F32 * (2 * 8 + 2 * 16 + 2 * 4)
    assert torch.equal(torch.autograd.grad(loss, mlp[2].weight)[0], expected)
    del loss
    gc.collect()


class _Inner(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class _Outer(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = _Inner()
        self.head = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.inner.forward(x).exp()  # `forward` called directly: no `inner.__call__` on the stack
        y = torch.utils.checkpoint.checkpoint(self.inner, y, use_reentrant=False)
        return self.head(self.inner(y).sigmoid())


def _figures(compiled: bool) -> list[object]:
    torch.manual_seed(0)
    model, x = _Outer(), torch.randn(3, 8)
    ctx = SimpleNamespace(module=model, closes_window=False, fn_name="step", scratch={})
    coll = SavedTensorsCollector(compiled=compiled)
    out: list[object] = []
    for _ in range(2):
        coll.start(ctx)
        loss = model(x).pow(2).mean()
        out.append(list(coll.end(ctx, True).items()))
        loss.backward()
    return out


def test_the_compiled_walk_names_the_modules_the_python_walk_names():
    # GIVEN nested modules, a forward called directly, a checkpointed call and a save outside forward
    if saved_tensors._CPacker is None:
        pytest.skip("memprofiler._packer is not built (no C compiler when installed)")
    # WHEN the compiled hook (which reads the interpreter's frames) and the Python one count them
    compiled, python = _figures(compiled=True), _figures(compiled=False)
    # THEN the same figures, the same modules in the same order, on every call
    assert compiled == python
    # and the analytic ones (one activation: 3 x 8 floats): `inner.forward` called directly runs
    # under the root's `__call__` (its tanh output, then exp's and sigmoid's: the root's), its
    # Linear under `inner.fc`'s; the checkpoint keeps its input (exp's output, counted once);
    # `inner` called normally saves its tanh output; `head` saves sigmoid's output (the root's).
    act = 3 * 8 * F32
    assert dict(compiled[0])["saved_tensors.by_module"] == {  # type: ignore[call-overload]
        "(root)": 3 * act,
        "inner.fc": 2 * act,
        "inner": act,
        "(outside forward)": 3 * 4 * F32,
    }


def test_the_build_says_what_the_hook_reads_with_now():
    # GIVEN the compiled hook reading tensors in C++
    if saved_tensors._CPacker is None or saved_tensors.NO_TENSOR_FACTS:
        pytest.skip("the compiled hook does not read tensors in C++ here")
    try:
        # WHEN its C++ reads are switched off (as the benchmarks' Python-read variants do)
        saved_tensors.read_tensors_in_cpp(False)
        # THEN the build it reports is the one that runs
        assert saved_tensors.packer_build() == "compiled, tensors through python"
    finally:
        saved_tensors.read_tensors_in_cpp(True)
    assert saved_tensors.packer_build() == "compiled"
