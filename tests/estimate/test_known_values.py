"""A batch's all-ones attention mask in the estimate: transformers skips it on real tensors, so must the estimate.

Before: on fake tensors transformers built the 4-D mask it skips for a mask without padding
(its ``is_tracing`` is true for a FakeTensor), and the estimate kept what masked attention keeps:
the BERT row on an H200 was 1.0134 of the measured allocated peak (+33,554,432 B); it is now
the measurement to the byte (``benchmarks/results/estimate_gpu_h200_20261127.json``).
"""

from __future__ import annotations

import sys
import types

import pytest
import torch
from models import estimate_and_census

from memprofiler import estimate_memory
from memprofiler.estimate.fake.known_data import KnownData, transformers_checks

tf = pytest.importorskip("transformers")
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731


def _bert() -> torch.nn.Module:
    cfg = tf.BertConfig(
        vocab_size=120,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        max_position_embeddings=64,
        attn_implementation="sdpa",
    )
    return tf.BertForMaskedLM(cfg)


def _meta() -> torch.nn.Module:
    torch.manual_seed(0)
    with torch.device("meta"):
        model = _bert()
    model.train()
    return model


def _batch(pad: int = 0) -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 120, (2, 48), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if pad:
        mask[1, -pad:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": ids}


def _loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


@pytest.mark.parametrize("pad", [0, 5], ids=["all-ones mask", "padded mask"])
def test_the_cpu_estimate_equals_real_cpu_steps_with_or_without_padding(pad):
    # GIVEN two real CPU steps (transformers skips the 4-D mask only when nothing is padded)
    # WHEN estimated on fake tensors THEN the peak is the real one to the byte
    est, measured = estimate_and_census(_bert, _batch(pad), _loss, ADAMW)
    assert est == measured


def test_for_a_cuda_target_a_mask_of_ones_is_no_mask():
    # GIVEN the same steps for an H200, with a mask of ones and with no mask at all
    ones = estimate_memory(
        _meta(), _batch(), optimizer=ADAMW, loss_fn=_loss, gpu="H200", torch_version="2.11"
    )
    no_mask = {k: v for k, v in _batch().items() if k != "attention_mask"}
    bare = estimate_memory(_meta(), no_mask, optimizer=ADAMW, loss_fn=_loss, gpu="H200", torch_version="2.11")
    padded = estimate_memory(
        _meta(), _batch(5), optimizer=ADAMW, loss_fn=_loss, gpu="H200", torch_version="2.11"
    )
    # THEN the mask of ones costs what no mask costs (the mask's own 2 x 48 int64 = 768 B aside),
    # and a padded mask is built: its 4-D float mask is kept for the attention's backward
    assert ones.tensor_peak_bytes - bare.tensor_peak_bytes == 2 * 48 * 8
    assert padded.tensor_peak_bytes > ones.tensor_peak_bytes


def _check_stand_in(monkeypatch) -> tuple[types.ModuleType, list[bool]]:  # type: ignore[no-untyped-def]
    """transformers' skip check, standing in: True (skip the mask) where the mask it gets is all ones."""
    answers: list[bool] = []

    def check(padding_mask, *args):  # type: ignore[no-untyped-def]
        answers.append(padding_mask is None or bool(padding_mask.all()))
        return answers[-1]

    utils = types.ModuleType("transformers.masking_utils")
    utils._ignore_causal_mask_sdpa = check  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "transformers.masking_utils", utils)
    return utils, answers


def test_the_skip_check_gets_the_real_mask_of_the_batch_or_of_torch_ones(monkeypatch):
    utils, answers = _check_stand_in(monkeypatch)
    data = KnownData()
    real = {"ones": torch.ones(2, 8, dtype=torch.int64), "padded": torch.tensor([[1, 1, 0], [1, 1, 1]])}
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = {k: mode.from_tensor(v) for k, v in real.items()}
        assert data.seed(real, fake) == 2
        with data, transformers_checks(data) as wrapped:
            assert wrapped == 1
            utils._ignore_causal_mask_sdpa(fake["ones"].to(torch.bool), 8)
            utils._ignore_causal_mask_sdpa(fake["padded"].to(torch.bool)[:, :3], 3)
            made = torch.ones(2, 8, device="cpu")  # BART's decoder makes its own mask of ones
            utils._ignore_causal_mask_sdpa(made.bool(), 8)
            made[1, -1] = 0  # a value written in from a tensor made outside the step's knowledge
            forgotten = data.real(made) is None  # so transformers would build this mask (over, not under)
    # THEN each check answered as on real tensors: skip, keep, skip
    assert answers == [True, False, True]
    assert forgotten


def test_a_mask_whose_values_are_unknown_is_built(monkeypatch):
    utils, answers = _check_stand_in(monkeypatch)
    data = KnownData()
    with torch._subclasses.FakeTensorMode(), data, transformers_checks(data):
        unknown = torch.rand(2, 8) > 0.5  # a random draw: never computed, so its values are unknown
        with pytest.raises(RuntimeError):  # the check reads values it cannot have...
            utils._ignore_causal_mask_sdpa(unknown, 8)
    assert answers == []  # ...so transformers (which checks is_tracing first) keeps the mask


def test_uninitialized_memory_is_never_known():
    data = KnownData()
    with torch._subclasses.FakeTensorMode(), data:
        made = [torch.empty(3, device="cpu"), torch.ones(3, device="cpu").new_empty(3)]
        made.append(torch.empty_like(torch.ones(3, device="cpu")))
        filled = torch.empty(3, device="cpu").fill_(1)  # its values are written in: known from there
        assert [data.real(t) for t in made] == [None, None, None]
        assert data.real(filled) is None or bool((data.real(filled) == 1).all())
