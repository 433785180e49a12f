"""The estimate's saved-for-backward bytes equal the measured ``saved_tensors.unique_bytes``."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from models import panel

from memprofiler import MemProfiler
from memprofiler.estimate import estimate_memory

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def measured_saved_bytes(name: str, tmp_path: Path) -> int:
    build, make_batch, loss_fn = panel()[name]
    model, batch = build(), make_batch()
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(model)
    with prof.profile("training_step", module=model):
        loss = loss_fn(model, batch)
    loss.backward()
    return int(prof.snapshots["0.training_step.1.end"]["saved_tensors.unique_bytes"])


@pytest.mark.parametrize("name", ["mlp", "conv", "transformer_block", "checkpointed", "hf_llama"])
@pytest.mark.parametrize("fake", [True, False])
def test_saved_bytes_equal_the_measured_step(name, fake, tmp_path):
    if name == "hf_llama":
        pytest.importorskip("transformers")
    # GIVEN a panel model and the same step measured for real on CPU
    build, make_batch, loss_fn = panel()[name]
    truth = measured_saved_bytes(name, tmp_path)
    # WHEN estimated on fake (or real) tensors from a meta copy
    with torch.device("meta"):
        meta_model = build()
    est = estimate_memory(meta_model, make_batch(), optimizer=SGD, loss_fn=loss_fn, device="cpu", fake=fake)
    # THEN the saved bytes are exactly the measured ones
    assert truth > 0
    assert est.saved_bytes == truth


def test_mlp_saved_bytes_match_the_analytic_truth():
    # GIVEN x -> Linear(64,128) -> ReLU -> Linear(128,8) -> pow(2).mean(), batch 16
    build, make_batch, loss_fn = panel()["mlp"]
    est = estimate_memory(build(), make_batch(), optimizer=SGD, loss_fn=loss_fn, device="cpu")
    # THEN x, the relu output (saved by relu and linear2: once) and the output
    assert est.saved_bytes == 4 * (16 * 64 + 16 * 128 + 16 * 8)


def test_bf16_mixed_saved_bytes_equal_the_measured_autocast_step(tmp_path):
    # GIVEN the transformer block measured under CPU autocast to bfloat16
    build, make_batch, loss_fn = panel()["transformer_block"]
    model, batch = build(), make_batch()
    prof = MemProfiler({"schedule": {"warmup": 0, "active": 1}}, save_dir=tmp_path, rank=0).setup(model)
    with prof.profile("training_step", module=model), torch.autocast("cpu", dtype=torch.bfloat16):
        loss = loss_fn(model, batch)
    truth = prof.snapshots["0.training_step.1.end"]["saved_tensors.unique_bytes"]
    # WHEN estimated with precision bf16-mixed
    est = estimate_memory(
        build(), make_batch(), optimizer=SGD, loss_fn=loss_fn, device="cpu", precision="bf16-mixed"
    )
    fp32 = estimate_memory(build(), make_batch(), optimizer=SGD, loss_fn=loss_fn, device="cpu")
    # THEN it is the measured figure, and autocast changed it (bf16 copies of inputs and weights)
    assert est.saved_bytes == truth
    assert est.saved_bytes != fp32.saved_bytes
    assert loss.dtype == torch.float32
