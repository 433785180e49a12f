"""cuBLAS / cuBLASLt workspaces: torch's rules (CublasHandlePool.cpp) and what they add to an estimate."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from memprofiler.errors import ConfigError
from memprofiler.estimate import estimate_memory
from memprofiler.estimate.cuda.target import DEFAULT_GPU, resolve_target
from memprofiler.estimate.cuda.workspaces import (
    WorkspacePlan,
    cublas_workspace_bytes,
    cublaslt_workspace_bytes,
    lt_unified,
)

KiB, MiB = 1024, 1 << 20
H200_211 = resolve_target("H200", "2.11.0+cu130")
SGD = lambda ps: torch.optim.SGD(ps, lr=0.1)  # noqa: E731


def _mlp(bias: bool = True) -> nn.Module:
    with torch.device("meta"):
        return nn.Sequential(nn.Linear(64, 128, bias=bias), nn.ReLU(), nn.Linear(128, 8, bias=bias))


# ---- the target ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "cap"),
    [
        ("H100", (9, 0)),
        ("NVIDIA H200", (9, 0)),
        ("a100", (8, 0)),
        ("sm86", (8, 6)),
        ("8.9", (8, 9)),
        ("B200", (10, 0)),
    ],
)
def test_target_from_a_name_or_a_compute_capability(name, cap):
    assert resolve_target(name, "2.11").capability == cap


def test_no_target_and_no_gpu_is_the_stated_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    t = resolve_target(None, "2.13")
    assert (t.name, t.how) == (DEFAULT_GPU, "default")
    assert "the default" in t.describe()


def test_unknown_gpu_is_one_line_naming_the_key():
    with pytest.raises(ConfigError, match="gpu"):
        resolve_target("Voodoo5", "2.11")


# ---- the rules, as torch parses them ------------------------------------------------------------


def test_default_cublas_workspace_per_architecture_and_release():
    assert cublas_workspace_bytes(H200_211, {}) == 32 * MiB  # sm90: 4096 KiB x 8
    # ":4096:2:16:8" elsewhere: 2 x 4 MiB + 8 x 16 KiB
    assert (
        cublas_workspace_bytes(resolve_target("A100", "2.11"), {})
        == 2 * 4096 * KiB + 8 * 16 * KiB
        == 8_519_680
    )
    assert cublas_workspace_bytes(resolve_target("B200", "2.11"), {}) == 8_519_680  # 2.11: sm90 only
    assert (
        cublas_workspace_bytes(resolve_target("B200", "2.12"), {}) == 32 * MiB
    )  # 2.12: Hopper and Blackwell


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (":4096:8", 4096 * KiB * 8),
        (":4096:2:16:8", 4096 * KiB * 2 + 16 * KiB * 8),  # every :SIZE:COUNT pair, summed
        (":16:8", 16 * KiB * 8),
        (":0:0", 0),
    ],
)
def test_cublas_workspace_config_is_summed_pair_by_pair(config, expected):
    assert cublas_workspace_bytes(H200_211, {"CUBLAS_WORKSPACE_CONFIG": config}) == expected


def test_an_unparseable_config_warns_and_takes_the_default():
    with pytest.warns(UserWarning, match="CUBLAS_WORKSPACE_CONFIG"):
        assert cublas_workspace_bytes(H200_211, {"CUBLAS_WORKSPACE_CONFIG": "big"}) == 32 * MiB


def test_cublaslt_workspace_size_and_unification_by_release():
    assert cublaslt_workspace_bytes(H200_211, {}) == 1024 * KiB  # default 1,024 KiB
    assert cublaslt_workspace_bytes(H200_211, {"CUBLASLT_WORKSPACE_SIZE": "2048"}) == 2 * MiB
    # capped at the cuBLAS workspace
    env = {"CUBLASLT_WORKSPACE_SIZE": "65536", "CUBLAS_WORKSPACE_CONFIG": ":4096:1"}
    assert cublaslt_workspace_bytes(H200_211, env) == 4 * MiB
    # 2.11: its own allocation unless opted in; 2.12: shared unless opted out
    assert not lt_unified(H200_211, {})
    assert lt_unified(H200_211, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "1"})
    t212 = resolve_target("H200", "2.12")
    assert lt_unified(t212, {}) and not lt_unified(t212, {"TORCH_CUBLASLT_UNIFIED_WORKSPACE": "0"})


def test_one_workspace_per_thread_and_the_lt_one_beside_it():
    plan = WorkspacePlan.for_target(H200_211, {})
    assert plan.needed("forward", lt=True) == [("cublas forward", 32 * MiB), ("cublaslt forward", MiB)]
    assert plan.needed("forward", lt=False) == []  # the thread has its workspace
    assert plan.needed("backward", lt=False) == [("cublas backward", 32 * MiB)]
    assert (
        plan.total() == 68_157_440
    )  # what _cuda_clearCublasWorkspaces freed after GPT-2's fp32 steps (H200)


# ---- in an estimate -----------------------------------------------------------------------------


def test_gpt2_shape_model_holds_the_measured_workspaces():
    # GIVEN a model whose Linear layers have a bias (addmm with a 1-D bias: the cuBLASLt path)
    est = estimate_memory(_mlp(), torch.randn(4, 64), optimizer=SGD, gpu="H200", torch_version="2.11")
    # THEN forward and backward thread each hold 32 MiB, and the forward thread 1 MiB of cuBLASLt
    assert est.workspace_bytes == {"cublas": 64 * MiB, "cublaslt": MiB}
    assert sum(est.workspace_bytes.values()) == 68_157_440
    assert est.target.startswith("H200 (sm90), torch 2.11")
    assert est.by_category["cublas_workspaces"] == 64 * MiB
    # no bias: plain GEMMs only -> 67,108,864 B
    no_bias = estimate_memory(
        _mlp(False), torch.randn(4, 64), optimizer=SGD, gpu="H200", torch_version="2.11"
    )
    assert no_bias.workspace_bytes == {"cublas": 64 * MiB}


def test_cublas_workspace_config_changes_the_estimate_by_what_torch_allocates(monkeypatch):
    base = estimate_memory(_mlp(False), torch.randn(4, 64), optimizer=SGD, gpu="H100", torch_version="2.11")
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":4096:1")
    small = estimate_memory(_mlp(False), torch.randn(4, 64), optimizer=SGD, gpu="H100", torch_version="2.11")
    # two threads x (32 MiB - 4 MiB), exactly
    assert base.peak_bytes - small.peak_bytes == 2 * (32 * MiB - 4 * MiB)
    assert base.tensor_peak_bytes == small.tensor_peak_bytes


def test_disable_addmm_cuda_lt_drops_the_lt_workspace(monkeypatch):
    monkeypatch.setenv("DISABLE_ADDMM_CUDA_LT", "1")
    est = estimate_memory(_mlp(), torch.randn(4, 64), optimizer=SGD, gpu="H200", torch_version="2.11")
    assert est.workspace_bytes == {"cublas": 64 * MiB}


def test_cpu_estimates_hold_no_workspace():
    est = estimate_memory(_mlp(), torch.randn(4, 64), optimizer=SGD, device="cpu")
    assert est.workspace_bytes == {} and est.target == ""
    assert est.peak_bytes == est.tensor_peak_bytes
