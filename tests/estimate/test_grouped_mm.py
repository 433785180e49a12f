"""``torch._grouped_mm`` (mixture-of-experts layers) in the estimate, for dtypes its fake kernel refuses.

Before: a float32 Mixtral or Qwen2-MoE (transformers 5 runs their experts through
``torch._grouped_mm``) stopped the estimate at ``model.layers.0.mlp.experts`` with "Expected
inputs of BF16 type", though real CPU and CUDA steps run it.
"""

from __future__ import annotations

import pytest
import torch
from models import estimate_and_census

from memprofiler import estimate_memory
from memprofiler.estimate.fake.grouped_mm import out_layout

OFFS = torch.tensor([3, 7, 10], dtype=torch.int32)


def _col_major(*shape: int) -> torch.Tensor:
    """A 3-D operand whose last two dimensions are column major (strides a multiple of 16 bytes)."""
    return torch.randn(*shape[:-2], shape[-1], shape[-2]).transpose(-2, -1)


@pytest.mark.parametrize(
    ("a", "b", "offs"),
    [
        (torch.randn(10, 8), _col_major(3, 8, 5), OFFS),  # tokens x experts' weights (2-D x 3-D)
        (torch.randn(3, 4, 8), _col_major(3, 8, 5), None),  # batched (3-D x 3-D)
        (
            torch.randn(12, 8).t(),
            torch.randn(5, 12).t(),
            torch.tensor([3, 7, 12], dtype=torch.int32),
        ),  # weight grad
    ],
)
def test_the_output_is_laid_out_as_the_real_kernel_lays_it_out(a, b, offs):
    # GIVEN the real CPU kernel's output (its last stride padded to 16 bytes: 5 floats take 8)
    real = torch._grouped_mm(a, b, offs) if offs is not None else torch._grouped_mm(a, b)
    # WHEN laid out by the estimate's rule
    size, stride = out_layout(a, b, offs, a.dtype)
    made = torch.empty_strided(size, stride, dtype=a.dtype)
    # THEN sizes, strides and the bytes its storage takes are the kernel's
    assert (list(real.shape), list(real.stride())) == (size, stride)
    assert made.untyped_storage().nbytes() == real.untyped_storage().nbytes()


def test_the_padded_bytes_are_the_hand_computed_ones():
    # 10 tokens x 5 outputs, float32: rows 8 floats apart, the last row 5 floats: (9 * 8 + 5) * 4 B
    size, stride = out_layout(torch.empty(10, 8), _col_major(3, 8, 5), OFFS, torch.float32)
    assert (size, stride) == ([10, 5], [8, 1])
    assert torch.empty_strided(size, stride).untyped_storage().nbytes() == 308


def test_operands_the_real_kernel_refuses_are_refused():
    a, b = torch.randn(10, 8), torch.randn(3, 8, 5)  # b's rows are 5 floats (20 B) apart
    with pytest.raises(RuntimeError, match="multiple of 16 bytes") as real:
        torch._grouped_mm(a, b, OFFS)
    with pytest.raises(RuntimeError, match="multiple of 16 bytes"):
        out_layout(a, b, OFFS, torch.float32)
    assert "mat_b" in str(real.value) or "strides" in str(real.value)


def _mixtral() -> torch.nn.Module:
    tf = pytest.importorskip("transformers")
    if not hasattr(tf, "MixtralConfig"):
        pytest.skip("this transformers has no Mixtral")
    cfg = tf.MixtralConfig(
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        vocab_size=200,
    )
    return tf.MixtralForCausalLM(cfg)


def _loss(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, labels=ids).loss


def test_a_float32_mixture_of_experts_estimate_equals_real_cpu_steps():
    ids = torch.randint(0, 200, (2, 24), generator=torch.Generator().manual_seed(1))
    adamw = lambda ps: torch.optim.AdamW(ps, lr=1e-4)  # noqa: E731
    # GIVEN two real CPU steps of a float32 Mixtral, every live storage counted, and the estimate
    est, measured = estimate_and_census(_mixtral, ids, _loss, adamw)
    # WHEN it is also estimated for an H200
    torch.manual_seed(0)
    with torch.device("meta"):
        meta = _mixtral()
    meta.train()
    gpu = estimate_memory(meta, ids, optimizer=adamw, loss_fn=_loss, gpu="H200", torch_version="2.11")
    # THEN the CPU estimate is the real peak to the byte, and the CUDA estimate runs through
    assert est == measured
    assert gpu.peak_bytes > gpu.tensor_peak_bytes > 0
