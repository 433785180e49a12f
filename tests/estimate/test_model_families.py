"""Fake steps that departed from real ones on transformers model families (the robustness sweep).

Each test pins one divergence to its root: the CPU estimate must equal a census of real CPU
steps to the byte (``models.census_peak``), and the unit under it must behave as the real run.
"""

from __future__ import annotations

import pytest
import torch
from models import estimate_and_census

from memprofiler import estimate_memory

tf = pytest.importorskip("transformers")
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731


def _hf_loss(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    return model(**batch).loss


def _ids(vocab: int, b: int = 2, t: int = 32, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, vocab, (b, t), generator=torch.Generator().manual_seed(seed))


def _pair(build, batch, steps: int = 2, loss=_hf_loss, optimizer=ADAMW) -> tuple[int, int]:  # type: ignore[no-untyped-def]
    """(the CPU estimate's tensor peak, the census of the same real CPU steps)."""
    return estimate_and_census(build, batch, loss, optimizer, steps)


# --- BART's decoder makes its own mask of ones: a real run skips it


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
    from memprofiler.tracker_hooks import _all_without_grads

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
    from memprofiler.estimate.fake.layouts import LAYER_NORM_BACKWARD, REAL_LAYOUT

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
    from memprofiler.estimate.cuda.kernel_scratch import layer_norm, layer_norm_backward

    x = torch.empty(2, 32, 16, device="meta").transpose(1, 2)  # 4,096 B, not contiguous
    g = torch.empty(2, 16, 32, device="meta")  # contiguous: no copy
    assert layer_norm((x,)) == [[4096]]
    assert layer_norm((x.contiguous(),)) == []
    assert layer_norm_backward((g, x)) == [[4096]]
    assert layer_norm_backward((x, x)) == [[4096, 4096]]


# --- values the fake step knows from the batch (known_data.py)


def _llama_no_cache() -> torch.nn.Module:
    cfg = tf.LlamaConfig(
        vocab_size=300,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        use_cache=False,  # as under gradient checkpointing: transformers checks the position ids for packing
    )
    return tf.LlamaForCausalLM(cfg)


def test_a_decoder_without_a_cache_builds_no_mask_for_unpacked_position_ids():
    ids = _ids(300)
    batch = {"input_ids": ids, "labels": ids}
    # WHEN estimated THEN the peak is the real one: on fake position ids transformers found "packed
    # sequences" and built the batch x seq^2 mask the real run skips (+49,152 B on the sweep's LLaMA)
    est, census = _pair(_llama_no_cache, batch)
    assert est == census
    # AND for a CUDA target the attention runs without a mask, as in the real run
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = _llama_no_cache()
    cuda = estimate_memory(meta, batch, optimizer=ADAMW, loss_fn=_hf_loss, gpu="H200", torch_version="2.11")
    attention = [n for n in cuda.notes if n.startswith("scaled_dot_product_attention on H200")]
    assert attention and not any("an attention mask is given" in n for n in attention)
    assert not any("packed-sequence" in n for n in cuda.notes)


class _ChecksLabels(torch.nn.Module):
    """Reads the batch's values: a Python check on ``labels.max()`` and ``masked_select`` (a CTC
    loss's flattened targets), both refused on fake tensors before."""

    def __init__(self) -> None:
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)

    def forward(self, labels: torch.Tensor) -> torch.Tensor:
        if labels.max() >= 16:
            raise ValueError("labels out of range")
        picked = labels.masked_select(labels > 3)  # data-dependent length
        return self.emb(picked).pow(2).mean()


def test_values_read_from_the_batch_are_the_real_ones():
    labels = torch.tensor([[1, 5, 7, 2], [9, 9, 0, 4]])  # 5 of 8 above 3

    def loss(model: torch.nn.Module, batch: torch.Tensor) -> torch.Tensor:
        return model(batch)

    est, census = _pair(_ChecksLabels, labels, steps=1, loss=loss)
    assert est == census


def test_random_ops_draw_nothing_from_the_caller_s_generator():
    class Noisy(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = torch.nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(x + torch.rand(4))  # a factory with no tensor operand: never computed

    torch.manual_seed(3)
    state = torch.get_rng_state()
    with torch.device("meta"):
        model = Noisy()
    estimate_memory(model, torch.ones(2, 4), optimizer=ADAMW, loss_fn=_square_mean, device="cpu", steps=1)
    assert torch.equal(torch.get_rng_state(), state)


class _LeafInput(torch.nn.Module):
    """Wav2Vec2's feature encoder in small: it sets ``requires_grad`` on a view of its input."""

    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv1d(1, 8, 5)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x[:, None]
        h.requires_grad = True
        return self.fc(self.conv(h).transpose(1, 2))


def test_a_leaf_module_input_and_its_gradient_die_with_the_step():
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    # WHEN three steps are estimated THEN the peak is the real one: torch's module-tracker hook kept
    # the leaf and its 25,600 B gradient alive, one more each step (767,448 / 793,048 vs 741,848)
    est, census = _pair(_LeafInput, torch.randn(2, 3200), steps=3, loss=_square_mean, optimizer=sgd)
    assert est == census


def _wav2vec2_ctc() -> torch.nn.Module:
    cfg = tf.Wav2Vec2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=64,
        conv_dim=(16, 16),
        conv_stride=(5, 2),
        conv_kernel=(10, 3),
        vocab_size=32,
        num_conv_pos_embeddings=16,
        num_conv_pos_embedding_groups=2,
        mask_time_prob=0.0,
        layerdrop=0.0,  # a random skip decided by `torch.rand([]) < layerdrop`: cannot be known
    )
    return tf.Wav2Vec2ForCTC(cfg)


def test_wav2vec2_with_a_ctc_loss_is_estimated_as_the_real_step():
    # GIVEN a CTC batch: the loss reads the labels' values (`labels.max()`, `masked_select`, and
    # `_ctc_loss`, whose output shape follows the longest target); all stopped the estimate before
    g = torch.Generator().manual_seed(6)
    batch = {
        "input_values": torch.randn(2, 1600, generator=g),
        "labels": torch.tensor([[3, 4, 5, 6, 7, 0, 0, 0], [9, 9, 8, 1, 2, 3, 4, 5]]),
    }
    est, census = _pair(_wav2vec2_ctc, batch)
    assert est == census


def test_known_values_follow_ops_and_are_forgotten_when_an_unknown_value_is_written_in():
    from memprofiler.estimate.fake.known_data import KnownData

    data = KnownData()
    real = torch.tensor([[0, 1, 2, 3], [0, 1, 0, 1]])
    with torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True) as mode:
        fake = mode.from_tensor(real)
        assert data.seed(real, fake) == 1
        with data:
            pos = torch.arange(4).unsqueeze(0).expand(2, 4)  # made from nothing, then viewed
            diff = (fake[:, 1:] - fake[:, :-1]).ne(1).sum()  # computed from the batch alone
            assert int(diff) == 1  # .item() on a fake tensor: the real value
            pos_value = data.real(pos)
            unknown = mode.from_tensor(torch.ones(2, 4, dtype=torch.int64)) * 3  # not the batch's
            assert data.real(unknown) is None
            view = fake[0]
            view.add_(unknown[0])  # an unknown value written into the batch's storage
            assert data.real(fake) is None and data.real(view) is None
            assert data.real(pos) is not None  # another storage: still known
    assert torch.equal(pos_value, torch.arange(4).expand(2, 4))
