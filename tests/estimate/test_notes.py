"""An estimate's notes name what an op-level count cannot see for the model at hand."""

from __future__ import annotations

import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.notes import CONV_SCRATCH

SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def test_a_convolution_gets_the_kernel_scratch_note():
    conv = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten())
    est = estimate_memory(conv, torch.randn(1, 3, 6, 6), optimizer=SGD, device="cpu")
    assert CONV_SCRATCH in est.notes and not any("packed-sequence" in n for n in est.notes)
    assert "convolution_backward makes a contiguous copy" in CONV_SCRATCH
    mlp = estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), optimizer=SGD, device="cpu")
    assert mlp.notes == []
    assert any("scratch a kernel allocates inside itself" in n for n in mlp.not_modelled)


def test_transformers_gradient_checkpointing_needs_no_attention_mask_note():
    """Without a cache transformers checks the position ids for packed sequences; the estimate knows
    them (made by torch.arange), so it skips the mask as the real run does and has nothing to say."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model.gradient_checkpointing_enable()
    ids = torch.randint(0, 64, (2, 8))
    est = estimate_memory(
        model, ids, optimizer=SGD, loss_fn=lambda m, b: m(input_ids=b, labels=b).loss, device="cpu", steps=1
    )
    assert est.notes == []


def test_a_cuda_target_names_the_tensors_the_steps_ran_on():
    """fake=False runs the steps on real CPU tensors: the note says so instead of 'fake'."""
    kw = dict(optimizer=SGD, gpu="H100", torch_version="2.11")
    fake = estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), **kw)
    real = estimate_memory(nn.Linear(4, 4), torch.randn(2, 4), fake=False, **kw)
    assert fake.notes[0] == real.notes[0] == "target: H100 (sm90), torch 2.11"
    assert fake.notes[1].startswith("ran on fake CPU tensors (on every machine")
    assert real.notes[1].startswith("ran on real CPU tensors (fake=False: the memory was allocated)")
    assert "fake CPU" not in " ".join(real.notes)
    assert real.peak_bytes == fake.peak_bytes


def test_the_peak_module_does_not_depend_on_the_hash_seed():
    """Siblings active at once tie on depth and length; the pick is by name, not by the order a
    set iterates in (which follows PYTHONHASHSEED, so two processes named different modules)."""
    from memprofiler.estimate.tracker import _deepest

    names = [f"Net.stages.{i}" for i in range(10)] + ["Global", "Net"]
    assert _deepest(names) == _deepest(names[::-1]) == "stages.9"
