"""The torch.compile margin follows a compiled module through FSDP2 and in-place compiling;
float8 modules are named as not modelled."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda.margins import (
    COMPILE_FRACTION,
    NCCL_CHANNELS,
    NCCL_DEFAULT_BUFFSIZE,
    compiled_modules,
)

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
NCCL = NCCL_DEFAULT_BUFFSIZE * 2 * NCCL_CHANNELS * 2


class Blocks(nn.Module):
    """Two blocks in a ModuleList (each sharded apart under ``fsdp``), compiled as ``how`` says."""

    def __init__(self, how: str) -> None:
        super().__init__()
        blocks: list[nn.Module] = [nn.Sequential(nn.Linear(64, 64), nn.ReLU()) for _ in range(2)]
        if how == "wrapped":
            blocks = [torch.compile(b) for b in blocks]
        elif how == "in place":
            for b in blocks:
                b.compile()
        elif how == "forward":
            for b in blocks:
                b.forward = torch.compile(b.forward)  # type: ignore[method-assign]
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for b in self.blocks:
            x = b(x)
        return x


def _estimate(how: str, strategy: str, world_size: int):
    with torch.device("meta"):
        net = Blocks(how)
    return estimate_memory(
        net, torch.randn(4, 64), optimizer=SGD, strategy=strategy, world_size=world_size, gpu="H100"
    )


@pytest.mark.parametrize("how", ["wrapped", "in place"])
@pytest.mark.parametrize(("strategy", "world_size"), [("single", 1), ("fsdp", 2)])
def test_compiled_blocks_get_the_margin_and_the_note_under_every_strategy(how, strategy, world_size):
    # GIVEN two blocks compiled (torch.compile(block) or block.compile())
    est = _estimate(how, strategy, world_size)
    # THEN the margin is 10% of the modelled peak (plus NCCL's under fsdp), and the note names the blocks
    nccl = NCCL if strategy == "fsdp" else 0
    assert est.margin_bytes == int(est.peak_bytes * COMPILE_FRACTION) + nccl
    (line,) = [n for n in est.notes if "torch.compile" in n]
    assert "torch.compile (blocks.0, blocks.1)" in line


def test_fully_shard_keeps_the_compiled_class_under_its_fsdp_name():
    from memprofiler.estimate.parallel.strategies import device_mesh, fake_process_group, fully_shard_model

    with torch.device("meta"):
        net = Blocks("wrapped")
    with fake_process_group(2):
        fully_shard_model(net, device_mesh((2,)), None)
        assert type(net.blocks[0]).__name__ == "FSDPOptimizedModule"
        assert compiled_modules(net) == ["blocks.0", "blocks.1"]


def test_a_compiled_forward_is_found_too():
    with torch.device("meta"):
        net = Blocks("forward")
    assert compiled_modules(net) == ["blocks.0", "blocks.1"]
    assert compiled_modules(Blocks("eager")) == []


def test_a_plain_model_has_no_compile_margin():
    est = _estimate("eager", "fsdp", 2)
    assert est.margin_bytes == NCCL
    assert not any("torch.compile" in n for n in est.notes)


def test_float8_modules_are_named_as_not_modelled():
    class Float8Linear(nn.Linear):  # the name torchao's float8 training module has
        pass

    with torch.device("meta"):
        net = nn.Sequential(Float8Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    est = estimate_memory(net, torch.randn(2, 16), optimizer=SGD, gpu="H100")
    (line,) = [n for n in est.notes if "float8" in n]
    assert line.startswith("float8 training (0): not modelled")
    assert any("float8" in n for n in est.not_modelled)
