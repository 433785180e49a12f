"""The estimate is the same on a laptop and on a GPU node: its device never comes from the machine.

The first GPU run (``fixtures/gpu/FINDINGS.md`` item 2) found every ``fsdp`` estimate, and a
``single`` one whose loss made a tensor outside forward, stopping with a FakeTensor device
mismatch (``cuda:0`` against ``cpu``): the fake steps ran on CUDA because this torch had CUDA,
while the device mesh was on CPU. Here the process is made to believe it has CUDA (a CUDA
build, GPUs, CUDA as the accelerator and, where a user set it, as the default device), and every
figure must equal the one computed without that belief.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
import yaml
from models import Net, meta_net
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from memprofiler.errors import ConfigError
from memprofiler.estimate import EstimatePlan, estimate_memory, estimate_plan

ADAM = lambda ps: torch.optim.Adam(ps, lr=1e-3)  # noqa: E731
F32 = 4


def padded_shard_bytes(ws: int) -> int:
    return sum(math.ceil(s[0] / ws) * math.prod(s[1:]) * F32 for s in Net.SHAPES)


def pretend_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    """What a GPU node tells torch: a CUDA build, eight GPUs, CUDA the current accelerator."""
    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch._C, "_get_accelerator", lambda check=False: torch.device("cuda"))
    # asked by every optimizer step on a machine with CUDA (outside a CUDA graph capture); a
    # CUDA build of torch on a machine without a GPU would raise here
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)


@pytest.fixture
def cuda_machine(monkeypatch: pytest.MonkeyPatch) -> None:
    pretend_cuda(monkeypatch)


@pytest.fixture
def cuda_default_device(cuda_machine: None) -> Iterator[None]:
    """A user who called ``torch.set_default_device("cuda")`` before estimating."""
    torch.set_default_device("cuda")
    try:
        yield
    finally:
        torch.set_default_device(None)


def _estimate(**kw: Any) -> dict[str, Any]:
    # one named target: without one the estimate models this machine's GPU, where it has one
    kw.setdefault("gpu", "H100")
    return estimate_memory(meta_net(), torch.randn(4, 10), optimizer=ADAM, steps=2, **kw).to_dict()


CASES = [("single", 1), ("ddp", 2), ("fsdp", 1), ("fsdp", 2), ("fsdp", 8), ("fsdp", 1024)]


@pytest.mark.parametrize("device", ["cuda", "cpu"], ids=["device_cuda", "device_cpu"])
@pytest.mark.parametrize("strategy,ws", CASES, ids=[f"{s}-{w}" for s, w in CASES])
def test_the_estimate_is_the_same_on_a_machine_with_cuda(strategy, ws, device, monkeypatch):
    # GIVEN the estimate on this machine, as it is
    laptop = _estimate(strategy=strategy, world_size=ws, device=device)
    # WHEN the same estimate runs in a process that believes it has CUDA
    with monkeypatch.context() as m:
        pretend_cuda(m)
        gpu_node = _estimate(strategy=strategy, world_size=ws, device=device)
    # THEN every figure, note and label is identical
    assert gpu_node == laptop
    # AND they are the right figures: the (sharded) parameters' analytic bytes
    params = padded_shard_bytes(ws) if strategy == "fsdp" else padded_shard_bytes(1)
    assert gpu_node["resident"]["parameters"] == params
    assert gpu_node["resident"]["gradients"] == params


# ids other than a bare "cuda": conftest reads a keyword `cuda` as the GPU-only marker
@pytest.mark.parametrize("device", ["cpu", "cuda"], ids=["device_cpu", "device_cuda"])
def test_a_default_device_of_cuda_does_not_move_the_estimates_tensors(device, cuda_default_device):
    # GIVEN a loss that makes a tensor with no device outside forward, and Adam, whose step
    # count is made on the default device
    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return (model(batch) + torch.ones(7)).pow(2).mean()

    batch = torch.randn(4, 10, device="cpu")

    def run(**kw: Any) -> dict[str, Any]:
        return estimate_memory(
            meta_net(), batch, optimizer=ADAM, loss_fn=loss_fn, device=device, **kw
        ).to_dict()

    # WHEN estimated under the default device `cuda` and again with the default device unset
    on_cuda_default = {s: run(strategy=s, world_size=ws) for s, ws in [("single", 1), ("fsdp", 2)]}
    torch.set_default_device(None)
    unset = {s: run(strategy=s, world_size=ws) for s, ws in [("single", 1), ("fsdp", 2)]}
    # THEN the figures are identical; Adam's step counts (one float32 per parameter) are in a
    # CPU estimate and, as torch keeps them on the host, not in a CUDA target's
    assert on_cuda_default == unset
    steps = 4 * F32 if device == "cpu" else 0
    assert unset["single"]["resident"]["optimizer_state"] == 2 * padded_shard_bytes(1) + steps


def test_fully_shard_without_a_mesh_shards_on_the_estimates_device(cuda_machine):
    # GIVEN a `configure_model` that calls fully_shard with no mesh, on a machine whose
    # accelerator is CUDA (fully_shard's own pick would be a CUDA mesh)
    from torch.distributed.fsdp import fully_shard

    def configure_model(model: nn.Module) -> None:
        for layer in model.layers:  # type: ignore[union-attr]
            fully_shard(layer)
        fully_shard(model)

    def run(configure: Any) -> dict[str, Any]:
        plan = EstimatePlan(
            optimizer=ADAM,
            strategy="fsdp",
            world_size=4,
            device="cuda",
            parallelize=None if configure is None else lambda model, mesh: configure(model),
        )
        return estimate_plan(meta_net(), torch.randn(4, 10), plan).to_dict()

    # WHEN estimated THEN it equals the estimate that shards the same modules itself
    assert run(configure_model) == run(None)
    assert run(None)["resident"]["parameters"] == padded_shard_bytes(4)


class HardCodedCuda(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + torch.ones(4, device="cuda")


def test_a_module_that_puts_a_tensor_on_a_fixed_device_is_one_line():
    # GIVEN a forward that puts a tensor on `cuda` instead of the input's device
    model = nn.Sequential()
    model.add_module("body", nn.Linear(4, 4))
    model.add_module("head", HardCodedCuda())
    # WHEN estimated THEN one line names the module and says the estimate's tensors are on CPU
    with pytest.raises(ConfigError) as err:
        estimate_memory(model, torch.randn(2, 4), optimizer=ADAM)
    msg = str(err.value)
    assert msg.startswith("`model`: module `head` (HardCodedCuda) mixed tensors on cpu and cuda:0: ")
    assert "the estimate's tensors are on cpu on every machine" in msg
    assert "device=x.device" in msg
    assert "\n" not in msg


def test_an_error_outside_any_forward_is_the_same_on_a_machine_with_cuda(cuda_machine):
    # GIVEN the loss of test_bad_input that is not a scalar, with a constant made outside forward,
    # which stopped with a device mismatch on the GPU node
    def loss_fn(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(batch).sum() + torch.ones(3).sum() * torch.ones(2, 2)

    # WHEN estimated on a machine with CUDA THEN the user's own error is left as it is
    with pytest.raises(RuntimeError, match="grad can be implicitly created only for scalar outputs"):
        estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer=ADAM, loss_fn=loss_fn)


class ShardedTiny(pl.LightningModule):
    """A ModelParallelStrategy module: each block sharded on the strategy's mesh, or on none."""

    def __init__(self, own_mesh: bool = True) -> None:
        super().__init__()
        self.own_mesh = own_mesh
        self.layers = nn.ModuleList([nn.Linear(10, 33), nn.Linear(33, 7)])

    def configure_model(self) -> None:
        from torch.distributed.fsdp import fully_shard

        mesh = self.device_mesh["data_parallel"] if self.own_mesh else None
        for layer in self.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(self, mesh=mesh)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        (x,) = batch
        return self.layers[1](torch.relu(self.layers[0](x))).pow(2).mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=1e-3)

    def train_dataloader(self) -> DataLoader[Any]:
        return DataLoader(TensorDataset(torch.randn(16, 10)), batch_size=4)


def _cli_estimate(tmp_path: Path, own_mesh: bool) -> list[dict[str, Any]]:
    from memprofiler import layout
    from memprofiler.lightning.cli import MemProfilerCLI

    MemProfilerCLI(
        ShardedTiny,
        args=[
            "estimate",
            "--trainer.accelerator=cpu",
            "--trainer.strategy=ModelParallelStrategy",
            f"--model.own_mesh={own_mesh}",
            "--estimate.world_size=4",
            "--estimate.gpu=H100",
            f"--estimate.save_dir={tmp_path}",
        ],
        save_config_callback=None,
    )
    rows: list[dict[str, Any]] = yaml.safe_load((tmp_path / layout.MEMORY_ESTIMATE_YAML).read_text())[
        "estimates"
    ]
    return rows


@pytest.mark.parametrize("own_mesh", [True, False], ids=["strategy_mesh", "no_mesh"])
def test_the_cli_fsdp_estimate_is_the_same_on_a_machine_with_cuda(own_mesh, tmp_path, monkeypatch):
    # GIVEN `memprofiler estimate` of a ModelParallelStrategy module on this machine
    laptop = _cli_estimate(tmp_path / "laptop", own_mesh=True)
    # WHEN the same runs in a process that believes it has CUDA, the module sharding on the
    # strategy's mesh or on none (fully_shard's own pick)
    with monkeypatch.context() as m:
        pretend_cuda(m)
        gpu_node = _cli_estimate(tmp_path / "gpu", own_mesh=own_mesh)
    # THEN the rows are identical, and the parameters are rank 0's padded shards of 4
    assert gpu_node == laptop
    assert gpu_node[0]["resident"]["parameters"] == padded_shard_bytes(4)


def test_the_device_mismatch_of_older_torch_is_recognised_too():
    # torch before 2.12 raised a RuntimeError with the devices in its text (the GPU run's 2.11)
    from memprofiler.estimate.failures import mixed_devices

    old = RuntimeError(
        "Unhandled FakeTensor Device Propagation for fsdp.all_gather_copy_in.default, found two different "
        "devices cuda:0, cpu"
    )
    assert mixed_devices(old) == ("cuda:0", "cpu")
    assert mixed_devices(RuntimeError("a and b must have same reduction dim")) is None


def _unsharded_layer0_bytes(ws: int) -> int:
    """``layers.0``'s weight and bias all-gathered: its padded dim 0 (33 rows) times 10 + 1 columns."""
    return math.ceil(33 / ws) * ws * (10 + 1) * F32


def _adam_whose_steps_miss_dtensors_cache(params: Any) -> torch.optim.Optimizer:
    """Adam on a torch whose DTensor sharding cache misses at every step: torch 2.11 (the GPU
    run's) keys Adam's per-step ``addcdiv_`` value, so there each new step missed."""
    from torch.distributed.tensor.debug import _clear_sharding_prop_cache

    opt = ADAM(params)
    opt.register_step_pre_hook(lambda *_: _clear_sharding_prop_cache())
    return opt


@pytest.mark.parametrize("ws", [1, 2])
def test_dtensors_shape_inference_is_not_counted_where_its_cache_misses(ws):
    # GIVEN the estimate where DTensor's sharding cache hits (torch 2.13 on every step)
    hit = _estimate(strategy="fsdp", world_size=ws, device="cuda")
    # WHEN DTensor's cache misses at each optimizer step, so that DTensor infers each output's
    # shape by running the op on fake tensors of its own
    missed = estimate_memory(
        meta_net(),
        torch.randn(4, 10),
        optimizer=_adam_whose_steps_miss_dtensors_cache,
        steps=2,
        strategy="fsdp",
        world_size=ws,
        device="cuda",
        gpu="H100",
    ).to_dict()
    # THEN those tensors are not counted: the figures are identical
    assert missed == hit
    # AND the peak is layers.0's backward, its parameters all-gathered (padded to ws rows),
    # not the optimizer step
    assert (missed["peak_phase"], missed["peak_module"]) == ("backward", "layers.0")
    assert missed["by_category"]["unsharded_parameters"] == _unsharded_layer0_bytes(ws)
    assert "optimizer_temporaries" not in missed["by_category"]
