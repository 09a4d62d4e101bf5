"""The demo's kernels, declared as a user declares theirs (``python3 -m pytest_fusion demo`` runs
this file from a temporary directory; read it as the example it is).

- ``fused_linear_gelu``: plain PyTorch (``addmm``, then GELU), checked in
  every dtype and benched against eager and torch.compile on any device.
- ``reference_kernels.linear_act`` and ``reference_kernels.gated_mlp``: Triton, interpreted on a
  CPU (checked only: interpreter timings are not kernel timings), compiled and benched on a GPU at
  the seed blog's GeGLU MLP shape.
- ``strided_blind_linear``: a planted bug (reads ``x`` as if it were contiguous), which the
  oracle shrinks to the smallest transposed input that shows it.

``PYTEST_FUSION_DEMO_SLOWER=1`` makes ``fused_linear_gelu`` do its GEMM three times: the planted
slowdown the demo's gate step catches.
"""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from reference_kernels import gated_mlp, gated_mlp_eager, linear_act, linear_act_eager

ON_GPU = torch.cuda.is_available()
SLOWER = os.environ.get("PYTEST_FUSION_DEMO_SLOWER") == "1"
if not ON_GPU:
    torch.set_num_threads(1)  # the process clock on a shared CPU counts every thread's time


def linear_gelu(x, weight, bias):
    """The eager reference: plain PyTorch."""
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def fused_linear_gelu(x, weight, bias):
    """The kernel under test: the bias added by the GEMM itself (``addmm``), then GELU."""
    for _ in range(2 if SLOWER else 0):
        torch.addmm(bias, x, weight.t())
    return F.gelu(torch.addmm(bias, x, weight.t()), approximate="tanh")


def strided_blind_linear(x, weight, bias):
    """A planted bug: reads x's storage as a contiguous M x K matrix, whatever its strides."""
    M, K = x.shape
    flat = torch.as_strided(x, (M, K), (K, 1), x.storage_offset())
    return linear_gelu(flat, weight, bias)


LINEAR = dict(
    reference=linear_gelu,
    inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
    dims={"M": (1, 512), "K": (16, 512), "N": (16, 512)},
    flops=lambda M, K, N: 2 * M * K * N,
    max_examples=10,
)


@pytest.mark.fused_kernel(**LINEAR, dtypes=("float32", "float16"), triton=False,
                          bench={"small": dict(M=256, K=256, N=512)})
def test_fused_linear_gelu():
    return fused_linear_gelu


@pytest.mark.fused_kernel(**LINEAR, dtypes=("float32",), triton=False, special_values=False)
def test_planted_bug_strided_blind_linear():
    return strided_blind_linear


@pytest.mark.fused_kernel(
    reference=linear_act_eager,
    inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
    dims={"M": (1, 8192), "K": (16, 8192), "N": (16, 8192)},
    dtypes=("float16", "bfloat16"),
    constants={"activation": "gelu_tanh"},
    max_examples=5,
)
def test_triton_linear_gelu():
    return linear_act


@pytest.mark.fused_kernel(
    reference=gated_mlp_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K"), "w_down": ("K", "N")},
    dims={"M": (1, 8192), "K": (16, 4096), "N": (16, 16384)},
    dtypes=("bfloat16", "float16"),
    constants={"activation": "gelu_tanh"},
    bench={"seed-geglu": dict(M=8192, K=768, N=3072)},  # batch 64 x sequence 128 tokens, 768 -> 3072
    flops=lambda M, K, N: 6 * M * K * N,
    max_examples=5,
)
def test_triton_gated_mlp_geglu():
    return gated_mlp
