"""The compiled pack hook reading tensors in C++ (``memprofiler._tensor_facts``): the same figures
as reading them through Python, on the tensors where the two routes could part."""

from __future__ import annotations

import sys
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from memprofiler.collectors import saved_tensors
from memprofiler.collectors.saved_tensors import SavedTensorsCollector

F32 = 4


def _packer_module() -> Any:
    if saved_tensors._CPacker is None:
        pytest.skip("memprofiler._packer is not built (no C compiler when installed)")
    return sys.modules[saved_tensors._CPacker.__module__]


@pytest.fixture
def facts() -> Any:
    """The compiled hook's module, reading tensors in C++ (restored after the test)."""
    module = _packer_module()
    if saved_tensors.NO_TENSOR_FACTS:
        pytest.skip(saved_tensors.NO_TENSOR_FACTS)
    yield module
    saved_tensors.read_tensors_in_cpp(True)


class _Odd(nn.Module):
    """Saves a plain activation, a view of its own weight, an empty tensor, a sparse tensor and a
    view of an activation."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(6, 6)
        self.sp = torch.eye(6).to_sparse().requires_grad_()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.fc(x))  # tanh saves its output (by its own node: detached)
        w = self.fc.weight[:2]  # a view of a parameter, saved by mul below and by the sum
        v = (h[:, :2] * w.sum(1) * w[:, 0]).sum()  # h[:, :2]: a view of an activation
        e = (x[:0] * 2.0).exp().sum()  # exp saves its empty output
        s = torch.sparse.mm(self.sp, h.t()).sum()  # saves the sparse matrix (no strided storage)
        return v + e + s


def _figures(model: nn.Module, x: torch.Tensor, use_facts: bool, module: Any | None) -> list[object]:
    saved_tensors.read_tensors_in_cpp(use_facts)
    ctx = SimpleNamespace(module=module, closes_window=False, fn_name="step", scratch={})
    coll = SavedTensorsCollector()
    out: list[object] = []
    for _ in range(2):
        coll.start(ctx)
        loss = model(x).sum()
        out.append(sorted(coll.end(ctx, True).items()))
        loss.backward()
    return out


@pytest.mark.parametrize("with_model", [True, False], ids=["model", "no model"])
def test_cpp_facts_give_the_python_figures(facts: Any, with_model: bool):
    # GIVEN saves of a plain activation, views of a weight and of an activation, an empty and a
    # sparse tensor, with the model given (its parameters excluded) and without
    torch.manual_seed(0)
    model, x = _Odd(), torch.randn(4, 6, requires_grad=True)
    module = model if with_model else None
    # WHEN the compiled hook reads them in C++ and through Python
    cpp = _figures(model, x, True, module)
    assert facts.facts_in_use()
    py = _figures(model, x, False, module)
    # THEN the same figures, call by call
    assert cpp == py
    # and the analytic ones: fc's input x and tanh's output h (4 x 6 floats each, h counted once
    # though mul and the sparse product save views of it too), the first product (4 x 2) and the
    # weight's row sums (2) the muls save; the weight's column view is left out (with the model its
    # storage is the weight's, without it it is a view of a parameter); empty and sparse add nothing
    first = dict(cpp[0])  # type: ignore[call-overload]
    assert first["saved_tensors.unique_bytes"] == (2 * 4 * 6 + 4 * 2 + 2) * F32


class _Passthrough(TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


def test_under_a_torch_function_mode_the_hook_asks_python_and_counts_the_same(facts: Any):
    # GIVEN a torch function mode active around the collected call (attribute reads go through it)
    torch.manual_seed(0)
    model, x = _Odd(), torch.randn(4, 6, requires_grad=True)
    # WHEN both routes count the call under it
    with _Passthrough():
        cpp = _figures(model, x, True, model)
        py = _figures(model, x, False, model)
    # THEN the same figures as without the mode
    assert cpp == py == _figures(model, x, True, model)


def test_a_build_for_another_torch_is_not_used(monkeypatch: pytest.MonkeyPatch):
    # GIVEN tensor facts built against another torch than the one imported
    module = _packer_module()
    try:
        from memprofiler import _tensor_facts
    except ImportError:
        pytest.skip("memprofiler._tensor_facts is not built here")
    monkeypatch.setattr(_tensor_facts, "TORCH_VERSION", "1.0.0")
    try:
        saved_tensors.read_tensors_in_cpp(False)
        # WHEN the collector hands them to the hook
        why = saved_tensors._use_tensor_facts()
        monkeypatch.setattr(saved_tensors, "NO_TENSOR_FACTS", why)
        # THEN it does not, says why, and the build says the hook reads tensors through Python
        assert why == "memprofiler._tensor_facts was built for torch 1.0.0"
        assert not module.facts_in_use()
        assert saved_tensors.packer_build() == "compiled, tensors through python"
    finally:
        monkeypatch.undo()
        saved_tensors.read_tensors_in_cpp(True)
    assert module.facts_in_use()


def test_a_stale_facts_build_is_told(monkeypatch: pytest.MonkeyPatch, facts: Any):
    # GIVEN tensor facts whose recorded source hash is not the one of the sources beside them
    from memprofiler import _tensor_facts

    monkeypatch.setattr(_tensor_facts, "SOURCE_SHA256", "0" * 64)
    # THEN the build is told stale
    assert saved_tensors.packer_build() == "compiled, stale"


def test_use_facts_takes_only_the_facts_capsule():
    # GIVEN something that is not the tensor-facts capsule: another object, another capsule
    import datetime

    module = _packer_module()
    before = module.facts_in_use()
    # THEN it is refused, and what the hook reads with is unchanged
    with pytest.raises(ValueError, match="invalid PyCapsule"):
        module.use_facts(object())
    with pytest.raises(ValueError, match="incorrect name"):
        module.use_facts(datetime.datetime_CAPI)  # type: ignore[attr-defined]
    assert module.facts_in_use() == before


def test_meta_tensors_count_nothing_on_both_routes(facts: Any):
    # GIVEN the model and its input on the meta device (storages with bytes and no data)
    model = nn.Sequential(nn.Linear(6, 6), nn.Tanh(), nn.Linear(6, 2)).to("meta")
    x = torch.randn(4, 6, device="meta", requires_grad=True)
    # WHEN both routes count a call
    cpp, py = _figures(model, x, True, model), _figures(model, x, False, model)
    # THEN nothing is counted, the same on both
    assert cpp == py
    assert dict(cpp[0])["saved_tensors.unique_bytes"] == 0  # type: ignore[call-overload]
