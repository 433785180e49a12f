"""A model that cannot run on fake tensors gets one line naming the op and the module."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate import estimate_memory

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
FIX = r"; estimate with real tensors on CPU \(`fake=False`, `--estimate.fake false`\)$"


@torch.library.custom_op("memprofiler_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


twice.register_autograd(lambda ctx, g: g * 2)


class Scaled(nn.Module):
    def __init__(self, how: str) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.how = how

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.lin(x)
        if self.how == "item":
            return y * y.sum().item()
        if self.how == "nonzero":
            return y[y.nonzero()[:, 0]]
        return twice(y)


@pytest.mark.parametrize(
    "how,line",
    [
        ("item", "op `aten._local_scalar_dense.default` in module `head` needs tensor data"),
        ("nonzero", "op `aten.nonzero.default` in module `head` has a data-dependent output shape"),
        ("custom", "op `memprofiler_test::twice` in module `head` has no fake \\(meta\\) kernel"),
    ],
)
def test_fake_failure_names_op_and_module_and_real_tensors_work(how, line):
    # GIVEN a model whose `head` cannot run on fake tensors
    model = nn.Sequential()
    model.add_module("body", nn.Linear(4, 4))
    model.add_module("head", Scaled(how))
    x = torch.randn(2, 4)
    # WHEN estimated on fake tensors THEN one line names the op, the module and the fix
    with pytest.raises(ConfigError, match=rf"^`estimate.fake`: {line}.*{FIX}") as err:
        estimate_memory(model, x, optimizer=SGD)
    assert "\n" not in str(err.value)
    # AND on real CPU tensors the estimate runs, with the exact parameter bytes
    est = estimate_memory(model, x, optimizer=SGD, fake=False, device="cpu")
    assert est.resident["parameters"] == 2 * 4 * (16 + 4)
    assert est.fake is False


@pytest.mark.parametrize(
    "factory,got",
    [
        (lambda ps: None, "None"),
        (lambda ps: torch.optim.AdamW, "the class `AdamW`"),
        (lambda ps: {}, "a dict"),
    ],
)
def test_an_optimizer_factory_that_returns_no_optimizer_is_one_line(factory, got):
    with pytest.raises(
        ConfigError,
        match=rf"^`optimizer`: the factory returned {got}, not a torch.optim.Optimizer; return an instance "
        r"built from the parameters it is given, e.g. `lambda ps: torch.optim.AdamW\(ps, lr=1e-4\)`$",
    ):
        estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer=factory)


def test_a_batch_of_the_wrong_shape_names_the_module_and_the_shapes(capfd):
    # GIVEN a batch with 5 features for a model whose `body` takes 4
    model = nn.Sequential()
    model.add_module("body", nn.Sequential(nn.Linear(4, 3)))
    model.add_module("head", nn.Linear(3, 2))
    # WHEN estimated THEN one line names the innermost module, its class and its input shapes
    with pytest.raises(ConfigError) as err:
        estimate_memory(model, torch.randn(2, 5), optimizer=SGD)
    assert str(err.value) == (
        "`batch`: module `body.0` (Linear) failed on inputs of shape [2, 5]: a and b must have same "
        "reduction dim, but got [2, 5] X [4, 3]; make the batch's shapes fit the model (`fit` would "
        "stop here too)"
    )
    # AND torch's multi-line log of the failing meta kernel is not printed
    assert "failed while attempting to run meta" not in capfd.readouterr().err


def test_an_error_outside_any_forward_is_left_as_it_is():
    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(batch).sum() + torch.ones(3).sum() * torch.ones(2, 2)  # not a scalar

    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer=SGD, loss_fn=loss_fn)


class NeedsDecoderIds(nn.Module):
    """Raises as an encoder-decoder does when the batch lacks an argument its forward needs."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Linear(4, 4)
        self.decoder = Decoder()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.decoder(self.encoder(x))


class Decoder(nn.Linear):
    def __init__(self) -> None:
        super().__init__(4, 4)

    def forward(self, x: torch.Tensor, ids: torch.Tensor | None = None) -> torch.Tensor:
        if ids is None:
            raise ValueError("You have to specify either decoder_input_ids or decoder_inputs_embeds")
        return super().forward(x)


def test_a_models_own_error_in_its_forward_is_one_line_with_where_it_was_raised():
    # WHEN a module's forward raises an error of its own THEN one line names the module, its class,
    # the error, and the file and line it was raised at; the model's traceback is its cause
    with pytest.raises(ConfigError) as err:
        estimate_memory(NeedsDecoderIds(), torch.randn(2, 4), optimizer=SGD)
    line = str(err.value)
    assert line.startswith("`model`: module `decoder` (Decoder) raised ValueError (test_bad_input.py:")
    assert "You have to specify either decoder_input_ids or decoder_inputs_embeds; the model fails" in line
    assert "\n" not in line and isinstance(err.value.__cause__, ValueError)
