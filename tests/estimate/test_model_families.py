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
