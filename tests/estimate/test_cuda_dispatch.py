"""A CUDA target estimated on CPU dispatches as CUDA would: attention backend, dropout, autocast."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda.attention import Call, choose
from memprofiler.estimate.cuda.autocast import cast
from memprofiler.estimate.cuda.target import resolve_target

pytest.importorskip("transformers")

H100 = resolve_target("H100", "2.11")
ADAMW = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731
B, T = 2, 64


def _call(dtype=torch.float32, heads_kv=4, mask=False, causal=False, head_dim=64, gqa=False):
    q = torch.empty(B, 4, T, head_dim, dtype=dtype, device="meta")
    k = torch.empty(B, heads_kv, T, head_dim, dtype=dtype, device="meta")
    m = torch.empty(B, 1, T, T, dtype=torch.bool, device="meta") if mask else None
    return Call(q, k, k, m, 0.1, causal, None, gqa)


@pytest.mark.parametrize(
    ("call", "target", "backend"),
    [
        (_call(torch.bfloat16), "H100", "flash"),  # half precision, no mask: flash (dropout is fine)
        (_call(torch.float32), "H100", "efficient"),  # flash needs float16/bfloat16
        (_call(torch.bfloat16, mask=True), "H100", "efficient"),  # flash takes no mask
        (_call(torch.float32, heads_kv=2, gqa=True), "H100", "math"),  # memory-efficient has no GQA
        (_call(torch.bfloat16, heads_kv=2, gqa=True), "H100", "flash"),  # flash has
        (_call(torch.bfloat16), "T4", "math"),  # sm75: no flash, no bfloat16 memory-efficient
        (_call(torch.float16), "T4", "efficient"),
        (_call(torch.float32, head_dim=66), "H100", "math"),  # 66 is not a multiple of 4
    ],
)
def test_backend_choice_follows_torchs_cuda_rules(call, target, backend):
    assert choose(call, resolve_target(target, "2.11"), grad=True)[0] == backend


def _gpt2(attn_pdrop: float) -> tuple[nn.Module, torch.Tensor]:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(vocab_size=128, n_positions=T, n_embd=64, n_layer=2, n_head=4, attn_pdrop=attn_pdrop)
    with torch.device("meta"):
        model = GPT2LMHeadModel(cfg)
    return model.train(), torch.randint(0, 128, (B, T))


def _bert(attn_pdrop: float) -> tuple[nn.Module, torch.Tensor]:
    from transformers import BertConfig, BertForMaskedLM

    cfg = BertConfig(
        vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        max_position_embeddings=T, attention_probs_dropout_prob=attn_pdrop,
    )  # fmt: skip
    with torch.device("meta"):
        model = BertForMaskedLM(cfg)
    return model.train(), torch.randint(0, 128, (B, T))


def _lm_loss(model: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


@pytest.mark.parametrize("build", [_gpt2, _bert])
@pytest.mark.parametrize("precision", ["32-true", "bf16-mixed"])
def test_attention_dropout_saves_nothing_more_on_a_cuda_target(build, precision):
    # GIVEN the model with attention dropout 0.1 (the default) and the same model with 0
    est = {}
    for p in (0.1, 0.0):
        model, ids = build(p)
        est[p] = estimate_memory(
            model, ids, optimizer=ADAMW, loss_fn=_lm_loss, precision=precision, gpu="H100"
        )
    # THEN for a CUDA target both keep the same: flash / memory-efficient support dropout in-kernel
    assert est[0.1].saved_bytes == est[0.0].saved_bytes
    assert est[0.1].tensor_peak_bytes == est[0.0].tensor_peak_bytes
    assert any("scaled_dot_product_attention" in n for n in est[0.1].notes)
    # AND on CPU rules the dropout sends attention to the math path, which keeps the attention matrices
    model, ids = build(0.1)
    cpu = estimate_memory(model, ids, optimizer=ADAMW, loss_fn=_lm_loss, precision=precision, device="cpu")
    attention_matrix = B * 4 * T * T  # batch x heads x T x T elements, per layer
    assert cpu.saved_bytes - est[0.1].saved_bytes >= 2 * attention_matrix * 2  # two layers, >= 2 B each


def test_dropout_keeps_a_one_byte_mask_as_cuda_does():
    with torch.device("meta"):
        net = nn.Sequential(nn.Linear(32, 256), nn.Dropout(0.1), nn.Linear(256, 4))
    x = torch.randn(8, 32)
    cuda = estimate_memory(net, x, optimizer=ADAMW, gpu="H100")
    cpu = estimate_memory(net, x, optimizer=ADAMW, device="cpu")
    # CPU keeps a float32 noise tensor (4 B per element), CUDA's fused dropout a bool mask (1 B)
    assert cpu.saved_bytes - cuda.saved_bytes == 8 * 256 * (4 - 1)
    assert any("native_dropout" in n for n in cuda.notes)


def test_cuda_autocast_casts_cpu_autocast_does_not_make():
    x = torch.empty(4, 8, dtype=torch.bfloat16, device="meta")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        (args, _) = cast(torch.pow, (x, 3.0), {})
        assert args[0].dtype == torch.float32  # pow is in CUDA's float32 list
        (_, kwargs) = cast(torch.softmax, (x, -1), {})
        assert kwargs["dtype"] == torch.float32  # a float32 output unless a dtype is named
        (args, _) = cast(torch.tanh, (x,), {})
        assert args[0].dtype == torch.bfloat16  # not listed: unchanged
    (args, _) = cast(torch.pow, (x, 3.0), {})
    assert args[0].dtype == torch.bfloat16  # autocast off: nothing cast


def _recorded(meta: dict | None) -> torch.Tensor | None:
    if meta is None:
        return None
    dtype = getattr(torch, meta["dtype"].removeprefix("torch."))
    return torch.empty_strided(meta["shape"], meta["stride"], dtype=dtype, device="meta")


def _recorded_sdpa() -> dict:
    import json
    from pathlib import Path

    path = Path(__file__).parents[1] / "fixtures" / "gpu_h200" / "t5_sdpa_calls_h200.json"
    return json.loads(path.read_text())


@pytest.mark.parametrize("kind", ["sdpa_calls", "sdpa_isolated"])
def test_backend_choice_matches_the_h200s_own_choice(kind):
    # GIVEN every sdpa call of a real T5 training step on an H200 (transformers 5.17: the relative
    # position bias is a permuted view, its last dimension has stride = heads) and isolated calls
    # with masks of every form, each with torch's own choice there (0 math, 1 flash, 2 efficient)
    rec = _recorded_sdpa()
    names = {0: "math", 1: "flash", 2: "efficient"}
    h200 = resolve_target("H200", "2.11")
    seen = set()
    for r in rec[kind]:
        if kind == "sdpa_calls":
            q, k, v, mask = (_recorded(r[n]) for n in ("q", "k", "v", "mask"))
        else:  # query = key = value of [8, 8, L, 64]; the mask [mask_b, 8, L, L], maybe expanded
            q = k = v = torch.empty(8, 8, r["L"], 64, device="meta")
            mask = torch.empty(r["mask_b"], 8, r["L"], r["L"], device="meta")
            mask = mask.expand(8, 8, r["L"], r["L"]) if r["form"] == "expanded" else mask
        call = Call(q, k, v, mask, r["dropout"], r.get("causal", False), None, False)
        # THEN the estimate picks what torch picked on the device, for every call
        backend, why = choose(call, h200, grad=True)
        assert backend == names[r["choice"]], (r, why)
        seen.add(backend)
    assert seen == ({"math", "efficient"} if kind == "sdpa_calls" else {"efficient"})


def test_a_mask_with_a_strided_last_dimension_takes_the_math_path_on_cuda():
    # GIVEN a float32 call whose additive mask is a permuted (heads-last) position bias, as T5's
    q = torch.empty(B, 4, T, 64, device="meta")
    bias = torch.empty(T, T, 4, device="meta").permute(2, 0, 1).unsqueeze(0)
    backend, why = choose(Call(q, q, q, bias, 0.1, False, None, False), H100, grad=True)
    # THEN the GPU's fused kernels refuse it: math, and the note says why
    assert backend == "math" and "stride 4" in why
    # AND the same values laid out contiguously run memory-efficient attention
    assert (
        choose(Call(q, q, q, bias.contiguous(), 0.1, False, None, False), H100, grad=True)[0] == "efficient"
    )


@pytest.mark.parametrize(
    ("causal", "gqa", "masked", "dtype"),
    [
        (False, False, True, torch.float32),
        (True, False, False, torch.float32),
        (False, True, True, torch.float32),
        (True, True, False, torch.bfloat16),
    ],
)
def test_the_math_path_op_by_op_computes_what_torchs_math_kernel_does(causal, gqa, masked, dtype):
    from memprofiler.estimate.cuda.attention import math_path

    # GIVEN real CPU tensors (dropout 0, so both are deterministic)
    g = torch.Generator().manual_seed(0)
    q = torch.randn(2, 4, 16, 8, generator=g).to(dtype)
    k = torch.randn(2, 2 if gqa else 4, 16, 8, generator=g).to(dtype)
    v = torch.randn(2, 2 if gqa else 4, 16, 8, generator=g).to(dtype)
    mask = torch.randn(1, 4, 16, 16, generator=g).to(dtype) if masked else None
    # THEN the op-by-op replica equals torch's own math kernel
    want = torch.ops.aten._scaled_dot_product_attention_math(
        q, k, v, mask, 0.0, causal, None, enable_gqa=gqa
    )[0]
    got = math_path(Call(q, k, v, mask, 0.0, causal, None, gqa))
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


class _BiasedAttention(nn.Module):
    """One attention with a learned T5-like position bias: a permuted view (heads last in memory)."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p = p
        self.qkv = nn.Linear(32, 96)
        self.bias = nn.Parameter(torch.zeros(T, T, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(B, T, 3, 4, 8).permute(2, 0, 3, 1, 4)
        mask = self.bias.permute(2, 0, 1).unsqueeze(0)
        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=self.p)
        return out.sum()


def test_math_path_dropout_keeps_cudas_one_byte_mask():
    # GIVEN attention the GPU runs on its math path (strided mask), with and without dropout
    x = torch.randn(B, T, 32)
    est = {}
    for p in (0.1, 0.0):
        with torch.device("meta"):
            model = _BiasedAttention(p)
        est[p] = estimate_memory(model.train(), x, optimizer=ADAMW, loss_fn=lambda m, b: m(b), gpu="H100")
    assert any("math kernel" in n and "stride 4" in n for n in est[0.1].notes)
    # THEN dropout keeps its output (4 B per attention element, for the matmul with v) and the
    # fused kernel's bool mask (1 B), not the CPU's float32 noise (4 B)
    elems = B * 4 * T * T
    assert est[0.1].saved_bytes - est[0.0].saved_bytes == elems * (4 + 1)


class _IdsAndLabels(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.emb = nn.Embedding(128, 16)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        return self.emb(input_ids).sum() + labels.float().sum()


@pytest.mark.parametrize(("kw", "copies"), [({"gpu": "H100"}, 2), ({"device": "cpu"}, 1)])
def test_a_tensor_standing_twice_in_the_batch_is_two_device_copies_on_cuda(kw, copies):
    # GIVEN a language-model batch whose labels are its input ids, one CPU tensor in two places
    ids = torch.randint(0, 128, (B, T))
    with torch.device("meta"):
        model = _IdsAndLabels()
    est = estimate_memory(
        model, {"input_ids": ids, "labels": ids}, optimizer=ADAMW, loss_fn=lambda m, b: m(**b), **kw
    )
    # THEN moved to the GPU tensor by tensor (Lightning's batch_to_device, {k: v.to("cuda")}) it is
    # two copies; on the CPU it stays one
    assert est.by_category["inputs"] == copies * ids.numel() * ids.element_size()


def _rms_net() -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(256, 256), nn.RMSNorm(256), nn.Linear(256, 8))


def _rms_estimate(precision: str = "32-true", **kw):
    sgd = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731
    x = torch.randn(64, 256)
    return estimate_memory(
        _rms_net(), x, optimizer=sgd, loss_fn=lambda m, b: m(b).sum(), precision=precision, **kw
    )


def test_rms_norm_keeps_what_cudas_fused_kernel_keeps():
    # GIVEN Linear -> nn.RMSNorm -> Linear on 64 rows of 256 float32 features
    cuda, cpu = _rms_estimate(gpu="H100"), _rms_estimate(device="cpu")
    act = 64 * 256 * 4
    # THEN for a CUDA target backward keeps the batch (first Linear), the norm's input and a float32
    # rstd per row (the fused kernel), and the norm's output (second Linear): 3 activations + 64 x 4 B
    assert cuda.saved_bytes == 3 * act + 64 * 4
    assert any(n.startswith("rms_norm: 2 call(s) as CUDA's fused kernel") for n in cuda.notes)
    # AND the CPU's composite keeps the normalised input as well: one activation more
    assert cpu.saved_bytes - cuda.saved_bytes == act
    assert not any(n.startswith("rms_norm:") for n in cpu.notes)


def test_rms_norm_under_cuda_autocast_runs_in_float32():
    # GIVEN the same net in bf16-mixed for a CUDA target: CUDA autocast runs rms_norm in float32
    est = _rms_estimate("bf16-mixed", gpu="H100")
    act32, act16 = 64 * 256 * 4, 64 * 256 * 2
    # THEN the norm keeps its input cast to float32 and rstd; the Linears keep bfloat16 copies of
    # their inputs, and the second Linear its bfloat16 weight (8 x 256)
    assert est.saved_bytes == act16 + act32 + 64 * 4 + act16 + 8 * 256 * 2
    assert any(n.startswith("rms_norm: 2 call(s)") for n in est.notes)


def test_rms_norm_with_a_weight_of_another_dtype_takes_the_composite_path_as_on_cuda():
    from torch._subclasses.fake_tensor import FakeTensorMode

    from memprofiler.estimate.cuda.fused_norms import fused_rms_norm

    with FakeTensorMode():
        x = torch.empty(4, 8, dtype=torch.bfloat16)
        assert fused_rms_norm((x, (8,), torch.empty(8)), {}) is None  # float32 weight: composite
        assert fused_rms_norm((x, (8,), torch.empty(8, dtype=torch.bfloat16)), {}) is not None
        cl = torch.empty(2, 3, 4, 4).to(memory_format=torch.channels_last)
        assert fused_rms_norm((cl, (4,)), {}) is None  # channels-last: composite
        # a target of torch 2.7: the fused kernel did not exist yet
        assert fused_rms_norm((x, (8,), torch.empty(8, dtype=torch.bfloat16)), {}, (2, 7)) is None
    assert fused_rms_norm((torch.randn(4, 8), (8,)), {}) is None  # real tensors: their values count
