"""The GEMM epilogue, on the fp32 accumulator, in Triton: the activations, and the TMA kernels'
tile epilogue (bias, activation, gate product, store: :func:`tile_epilogue`).

The math of each activation is written so that its non-finite values match PyTorch's float64
results (the golden reference): act(+inf) = +inf and act(-inf) = NaN for gelu, gelu_tanh and
silu; relu(-inf) = 0; NaN stays NaN everywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

from reference_kernels.gemm.schedule import store_tile

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
"""Activation names the kernels accept.

- ``none``: identity.
- ``relu``: max(x, 0), NaN kept.
- ``gelu``: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as ``F.gelu(x)``.
- ``gelu_tanh``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ``F.gelu(x, approximate="tanh")``.
- ``silu``: x * sigmoid(x), as ``F.silu``.
"""


@triton.jit
def _gelu_erfc(x):
    """GELU (erf) as x erfc(-x / sqrt 2) / 2, erfc(z) for z >= 0 from the Chebyshev fit of
    Numerical Recipes in C (2nd ed., section 6.2, ``erfcc``; fractional error < 1.2e-7):
    erfc(z) = t exp(-z^2 + P(t)), t = 1 / (1 + z / 2), P of degree 9 (its coefficients below)."""
    # x Phi(x) = x erfc(-x / sqrt 2) / 2, with erfc(-z) = 2 - erfc(z): one exp, one division and
    # nine FMAs, no branch (libdevice's erff branches on |x|; a warp holding both ranges would run
    # both paths). Its error, far below half an fp16 ulp, and its speed:
    # docs/reference-kernels.md#gelu-erf-without-a-branch.
    z = tl.abs(x) * 0.7071067811865476
    t = 1.0 / (1.0 + 0.5 * z)
    p = 0.17087277
    p = p * t - 0.82215223
    p = p * t + 1.48851587
    p = p * t - 1.13520398
    p = p * t + 0.27886807
    p = p * t - 0.18628806
    p = p * t + 0.09678418
    p = p * t + 0.37409196
    p = p * t + 1.00002368
    p = p * t - 1.26551223
    erfc = t * tl.exp(p - z * z)
    # +inf: erfc = 0, 0.5 inf 2 = inf; -inf: 0.5 (-inf) 0 = NaN, as torch in float64
    return 0.5 * x * tl.where(x >= 0.0, 2.0 - erfc, erfc)


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr, OUT_16BIT: tl.constexpr):
    """``ACTIVATION`` (one of :data:`ACTIVATIONS`) applied elementwise to the fp32 tile ``x``.
    ``OUT_16BIT``: the result is rounded to fp16/bf16, so GELU (erf) may take the branch-free
    form accurate to ~1e-5 relative (:func:`_gelu_erfc`); fp32 outputs keep libdevice's erf."""
    if ACTIVATION == "relu":
        # tl.maximum leaves NaN handling unspecified; the comparison keeps NaN as F.relu does.
        return tl.where(x < 0.0, 0.0, x)
    elif ACTIVATION == "gelu":
        if OUT_16BIT:
            return _gelu_erfc(x)
        # 1 / sqrt(2)
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        # 0.5 (1 + tanh(u)) = sigmoid(2u): one exp instead of a tanh, and the same non-finite
        # results (x = -inf gives -inf * 0 = NaN, as torch in float64). 2 sqrt(2 / pi) below.
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    elif ACTIVATION == "silu":
        return x * tl.sigmoid(x)
    else:
        return x


@triton.jit
def tile_epilogue(
    acc,
    acc_up,
    b_ptr,
    bu_ptr,
    out,
    off_m,
    off_n,
    M,
    N,
    stride_b,
    stride_bu,
    stride_om,
    HAS_BIAS: tl.constexpr,
    HAS_BIAS_UP: tl.constexpr,
    GATED: tl.constexpr,
    ACTIVATION: tl.constexpr,
    OUT_16BIT: tl.constexpr,
    TMA_STORE: tl.constexpr,
):
    """Bias, activation and the store of one tile of the TMA kernels (gemm.tile_loop):
    ``act(acc + b)``, or with ``GATED`` ``act(acc + b) * (acc_up + b_up)`` (gate and up), written
    by :func:`reference_kernels.gemm.schedule.store_tile`."""
    BLOCK_M: tl.constexpr = acc.shape[0]
    BLOCK_N: tl.constexpr = acc.shape[1]
    cols = off_n + tl.arange(0, BLOCK_N)
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + cols * stride_b, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS_UP:
            up_bias = tl.load(bu_ptr + cols * stride_bu, mask=cols < N, other=0.0).to(tl.float32)
            acc_up = acc_up + up_bias[None, :]
        acc = apply_activation(acc, ACTIVATION, OUT_16BIT) * acc_up
    else:
        acc = apply_activation(acc, ACTIVATION, OUT_16BIT)
    store_tile(out, acc, off_m, off_n, M, N, stride_om, BLOCK_M, BLOCK_N, TMA_STORE)
