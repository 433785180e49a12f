"""Fake steps that departed from real ones on transformers model families (the robustness sweep).

Each test pins one divergence to its root: the CPU estimate must equal a census of real CPU
steps to the byte (``models.census_peak``), and the unit under it must behave as the real run.
"""

from __future__ import annotations

import gc
import sys
import types

import pytest
import torch
from models import census_peak

from memprofiler import estimate_memory
from memprofiler.estimate.known_values import AllOnes, transformers_masks

tf = pytest.importorskip("transformers")
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731


def _hf_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _ids(vocab: int, b: int = 2, t: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _pair(build, batch, steps: int = 2, loss=_hf_loss, optimizer=ADAMW) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(the CPU estimate's tensor peak, the census of the same real CPU steps)."""
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = build()
    meta.train()
    est = estimate_memory(meta, batch, optimizer=optimizer, loss_fn=loss, device="cpu", steps=steps)
    torch.manual_seed(0)
    model = build()
    model.train()
    return est.tensor_peak_bytes, census_peak(model, batch, optimizer(model.parameters()), loss, steps=steps)


# --- known all-ones masks: forgetting must not lose the check's view, nor fire on a reused address


def test_a_mask_of_ones_made_after_a_write_is_still_no_mask_to_transformers(monkeypatch):
    # GIVEN transformers' skip check (a stand-in that says whether it was handed a padding mask)
    seen: list[bool] = []
    fake_utils = types.ModuleType("transformers.masking_utils")
    fake_utils._ignore_causal_mask_sdpa = lambda padding_mask, *a: seen.append(padding_mask is None)  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", fake_utils)
    ones = AllOnes()
    with torch._subclasses.FakeTensorMode(), ones, transformers_masks(ones):
        first = torch.ones(2, 8, dtype=torch.int64)
        first.add_(1)  # a write into a known tensor: everything known is forgotten
        second = torch.ones(2, 8, dtype=torch.int64)  # the next step's mask, made anew
        fake_utils._ignore_causal_mask_sdpa(second, 8)
    # THEN the check sees the new mask as known: no padding (it saw a stale dictionary before)
    assert seen == [True]


def test_a_dead_known_tensor_leaves_no_storage_behind():
    # GIVEN a known tensor that dies: its storage's address is free for an Adam state or a dropout mask
    ones = AllOnes()
    with torch._subclasses.FakeTensorMode(), ones:
        keep = torch.ones(4, dtype=torch.int64)
        gone = torch.ones(4, dtype=torch.int64)
        address = gone.untyped_storage()._cdata
        del gone
        gc.collect()
        # THEN only live known tensors' storages count as known (a write at the old address forgot
        # every known mask before, so BART's second step built the masks its real run skips)
        assert ones.storages() == {keep.untyped_storage()._cdata}
        assert address not in ones.storages()


def _bart() -> torch.nn.Module:
    cfg = tf.BartConfig(
        vocab_size=300,
        d_model=32,
        encoder_layers=1,
        decoder_layers=1,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        encoder_ffn_dim=64,
        decoder_ffn_dim=64,
        max_position_embeddings=64,
    )
    return tf.BartForConditionalGeneration(cfg)


def test_bart_two_steps_equal_the_census_in_every_estimate_of_a_process():
    # GIVEN BART, whose decoder makes its own mask of ones each step (skipped on real tensors)
    ids = _ids(300)
    batch = {"input_ids": ids, "labels": ids}
    # WHEN estimated twice in one process (an address reused from step 1 forgot the masks before:
    # +65,536 B on the sweep's BART, in some estimates of a process and not others)
    runs = [_pair(_bart, batch) for _ in range(2)]
    # THEN each equals the real steps' census
    assert [est for est, _ in runs] == [census for _, census in runs]


# --- module backward hooks: the tracker's must not keep a gradient a real run frees


class _Output(torch.nn.Module):
    """Two inputs, like MobileViTOutput(hidden_states, input_tensor): the first one's gradient is
    computed long before the residual's, which waits for the whole branch below."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(512, 256)

    def forward(self, h: torch.Tensor, res: torch.Tensor) -> torch.Tensor:
        return self.fc(h) + res


class _TwoInputs(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.pre = torch.nn.Linear(256, 256)
        self.up = torch.nn.Linear(256, 512)
        self.out = _Output()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        r = self.pre(x)
        return self.out(torch.nn.functional.silu(self.up(r)), r)


def _square_mean(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
    return model(batch).pow(2).mean()


def test_a_module_s_first_input_gradient_is_freed_when_its_node_has_run():
    # GIVEN a module whose second input's gradient arrives after a whole branch's backward
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    # WHEN estimated THEN the peak is the real one: torch's module tracker kept the first input's
    # gradient (64 x 512 float32) until the second's arrived, 130,048 B over (2,890,760 vs 2,760,712)
    est, census = _pair(_TwoInputs, torch.randn(64, 256), steps=1, loss=_square_mean, optimizer=sgd)
    assert est == census


def test_the_gradient_free_hook_fires_once_per_backward_after_every_gradient_it_computes():
    from memprofiler.estimate.module_hooks import _all_without_grads

    a = torch.randn(3, requires_grad=True)
    b = torch.randn(3, requires_grad=True)
    x, y = a * 2, b * 3
    calls: list[object] = []
    handle = _all_without_grads([x, y], calls.append)
    (x.sum() + y.sum()).backward(retain_graph=True)  # both gradients: one call, after the second
    x.sum().backward()  # only x's gradient is computed in this backward: one call too
    handle.remove()
    assert calls == [[None, None], [None, None]]


# --- layer norm backward: the input gradient is contiguous in the real kernels, strided in the fake


def _swin() -> torch.nn.Module:
    cfg = tf.SwinConfig(
        image_size=64, embed_dim=16, depths=[1, 1], num_heads=[2, 2], window_size=4, num_labels=10
    )
    return tf.SwinForImageClassification(cfg)


def test_swin_costs_what_the_real_step_costs():
    # GIVEN Swin, whose patch merging normalises a strided tensor and reshapes the gradient
    g = torch.Generator().manual_seed(4)
    batch = {
        "pixel_values": torch.randn(2, 3, 64, 64, generator=g),
        "labels": torch.randint(0, 10, (2,), generator=g),
    }
    # WHEN estimated THEN the peak is the real one: the fake layer norm gradient took the input's
    # strides and the view after it became a copy (a clone no real step makes: 1,435,812 vs 1,419,428 B)
    est, census = _pair(_swin, batch)
    assert est == census


def test_the_layer_norm_backward_stand_in_lays_the_input_gradient_out_contiguous():
    from memprofiler.estimate.fake_layouts import LAYER_NORM_BACKWARD, REAL_LAYOUT

    def grads(x: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, ...]:
        w, b = torch.ones(32), torch.zeros(32)
        _, mean, rstd = torch.ops.aten.native_layer_norm(x, [32], w, b, 1e-5)
        return REAL_LAYOUT[LAYER_NORM_BACKWARD](g, x, [32], mean, rstd, w, b, [True, True, True])

    real = grads(torch.randn(2, 32, 16).transpose(1, 2), torch.randn(2, 32, 16).transpose(1, 2))
    with torch._subclasses.FakeTensorMode() as mode:
        fake = grads(
            mode.from_tensor(torch.randn(2, 32, 16)).transpose(1, 2),
            mode.from_tensor(torch.randn(2, 32, 16)).transpose(1, 2),
        )
    # THEN every output has the real kernel's sizes and strides (the fake kernel alone gives (512, 1, 16))
    assert [(t.shape, t.stride()) for t in fake] == [(t.shape, t.stride()) for t in real]
    assert fake[0].stride() == (512, 32, 1)


def test_a_cuda_layer_norm_over_a_strided_tensor_takes_its_contiguous_copies_as_scratch():
    from memprofiler.estimate.kernel_scratch import layer_norm, layer_norm_backward

    x = torch.empty(2, 32, 16, device="meta").transpose(1, 2)  # 4,096 B, not contiguous
    g = torch.empty(2, 16, 32, device="meta")  # contiguous: no copy
    assert layer_norm((x,)) == [[4096]]
    assert layer_norm((x.contiguous(),)) == []
    assert layer_norm_backward((g, x)) == [[4096]]
    assert layer_norm_backward((x, x)) == [[4096, 4096]]
