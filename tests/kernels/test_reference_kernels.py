"""Dogfood: the reference kernels tested through pytest-fusion's own fused_kernel marker.

Dims span the real scale (M up to 8192 tokens, hidden K up to 8192, intermediate N up to 28672,
Llama-3-70B's); the plugin caps them on the CPU, where the kernels run under the Triton
interpreter and bf16 is skipped. ``--fusion-bench`` times the real model shapes of
reference_kernels.models.shapes in bf16 and fp16 on a GPU.
"""

from __future__ import annotations

import pytest

import pytest_fusion
from reference_kernels.models import shapes
from reference_kernels.gemm.configs import GATED_CONFIGS, LINEAR_CONFIGS, tile_sizes
from reference_kernels.kernels.eager import gated_act_eager, gated_mlp_eager, linear_act_eager, mlp_eager
from reference_kernels.kernels.gated_mlp import gated_act
from reference_kernels.kernels.linear_act import linear_act
from reference_kernels.models.modules import gated_mlp, mlp

DIMS = {"M": (1, 8192), "K": (1, 8192), "N": (1, 28672)}
LINEAR = dict(
    reference=linear_act_eager,
    inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
    dims=DIMS,
    special_values=True,
    tiles=tile_sizes(LINEAR_CONFIGS),
    flops=shapes.up_flops,
)

GATED = dict(
    reference=gated_act_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")},
    dims=DIMS,
    special_values=True,
    tiles=tile_sizes(GATED_CONFIGS),
    flops=shapes.gated_flops,
)


def _bench(**filters):
    return shapes.bench_cases(shapes.select(**filters))


@pytest.mark.fused_kernel(**LINEAR, constants={"activation": "gelu_tanh"}, bench=_bench(kind="plain", activation="gelu_tanh"))
def test_linear_gelu_tanh():
    """GPT-2's c_fc + NewGELU."""
    return linear_act


@pytest.mark.fused_kernel(**LINEAR, constants={"activation": "gelu"}, bench=_bench(kind="plain", activation="gelu"))
def test_linear_gelu_erf():
    """BERT / all-MiniLM's intermediate dense + GELU (erf)."""
    return linear_act


@pytest.mark.fused_kernel(**LINEAR, constants={"activation": "relu"})
def test_linear_relu():
    return linear_act


@pytest.mark.fused_kernel(**LINEAR, constants={"activation": "silu"})
def test_linear_silu():
    return linear_act


@pytest.mark.fused_kernel(**{**LINEAR, "inputs": {"x": ("M", "K"), "weight": ("N", "K")}}, constants={"activation": "none"})
def test_linear_no_bias():
    """Plain GEMM (a down projection without bias)."""
    return linear_act


@pytest.mark.fused_kernel(**GATED, constants={"activation": "silu"}, bench=_bench(kind="gated", activation="silu"))
def test_gated_swiglu():
    """Llama / Mistral / Qwen gate_proj + up_proj with SiLU."""
    return gated_act


@pytest.mark.fused_kernel(**GATED, constants={"activation": "gelu_tanh"}, bench=_bench(kind="gated", activation="gelu_tanh"))
def test_gated_geglu_tanh():
    """Gemma and the seed blog's GeGLU."""
    return gated_act


@pytest.mark.fused_kernel(
    **{**GATED, "inputs": {**GATED["inputs"], "b_gate": ("N",), "b_up": ("N",)}},
    constants={"activation": "gelu"},
)
def test_gated_geglu_erf_bias():
    """GeGLU (erf) with both biases."""
    return gated_act


# Whole MLPs: K is the hidden size, N the intermediate size, so both weights get values of scale
# 1/sqrt(K) (the plugin's default for an input naming K) and outputs stay near unit variance.
@pytest.mark.fused_kernel(
    reference=mlp_eager,
    inputs={"x": ("M", "K"), "w_in": ("N", "K"), "b_in": ("N",), "w_out": ("K", "N"), "b_out": ("K",)},
    dims={"M": (1, 8192), "K": (1, 4096), "N": (1, 16384)},
    constants={"activation": "gelu_tanh"},
    special_values=True,
    tiles=tile_sizes(LINEAR_CONFIGS),
    bench=_bench(kind="plain", activation="gelu_tanh"),
    flops=shapes.mlp_flops,
)
def test_mlp_gpt2():
    """GPT-2's MLP: c_fc + gelu_tanh fused, then c_proj."""
    return mlp


GATED_MLP = dict(
    reference=gated_mlp_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K"), "w_down": ("K", "N")},
    dims=DIMS,
    special_values=True,
    tiles=tile_sizes(GATED_CONFIGS),
    flops=shapes.gated_mlp_flops,
)


@pytest.mark.fused_kernel(**GATED_MLP, constants={"activation": "gelu_tanh"}, bench=_bench(kind="gated", activation="gelu_tanh"))
def test_gated_mlp_geglu():
    """The seed blog's GeGLU MLP (and Gemma's): gate/up fused, then the down projection."""
    return gated_mlp


@pytest.mark.fused_kernel(**GATED_MLP, constants={"activation": "silu"}, bench=_bench(kind="gated", activation="silu"))
def test_gated_mlp_swiglu():
    """Llama-style SwiGLU MLP."""
    return gated_mlp


def linear_act_tf32(x, weight, bias, activation="none"):
    """linear_act with the TF32 opt-in (fp32 operands rounded to a 10-bit mantissa)."""
    return linear_act(x, weight, bias, activation, allow_tf32=True)


# TF32 rounds each operand to 2^-11 relative, so each product is off by up to 2^-10 of itself; with
# weights of scale 1/sqrt(K) the summed error has std ~2^-10 ~ 1e-3 at any K, and its maximum over
# millions of outputs stays under ~6e-3. Declared tolerance: 1e-2 absolute and relative, which holds
# for unit-scale activations only (the error grows with them), so x keeps scale 1 rather than the
# oracle's amplitude tier.
@pytest.mark.fused_kernel(
    **{**LINEAR, "dtypes": ("float32",), "inputs": {**LINEAR["inputs"], "x": pytest_fusion.Tensor(("M", "K"), scale=1.0)}},
    constants={"activation": "gelu_tanh"}, atol=1e-2, rtol=1e-2, fp32_precision="tf32",
)
def test_linear_tf32_opt_in():
    return linear_act_tf32
