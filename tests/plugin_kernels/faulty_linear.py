"""A small Triton linear + bias + activation kernel with one switchable planted fault.

The plugin's own tests run it under pytester: ``FAULT = None`` is the correct kernel; every other
value plants exactly one bug, so each broken kernel differs from the correct one by that fault alone.
Tiles are fixed (16 x 16 x 16) so small dims already cross tile edges under the interpreter.
"""

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 16, 16
TILES = (BLOCK_M,)  # the marker's `tiles=`: edge dims 15, 16, 17 are always tried

FAULTS = ("k_tail", "bias_last_tile", "grid_floor", "strides", "gelu_erf", "relu_nan", "writes_input", "large_m")
"""``large_m``: a separate path for M > 64 (as a kernel dispatching on M would have) drops the bias."""


@triton.jit
def _linear_act_kernel(
    x_ptr, w_ptr, b_ptr, out_ptr, M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_b, stride_om, stride_on,
    ACT: tl.constexpr, FAULT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    if FAULT == "strides":  # assumes contiguous row-major inputs
        stride_xm = K
        stride_xk = 1
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, tl.cdiv(K, BLOCK_K)):
        k = k0 * BLOCK_K + offs_k
        if FAULT == "k_tail":
            k_mask = offs_k < BLOCK_K  # the tail of K is read past its end
        else:
            k_mask = k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & k_mask[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None] * stride_wk,
                    mask=(offs_n[None, :] < N) & k_mask[:, None], other=0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")
    n_mask = offs_n < N
    bias = tl.load(b_ptr + offs_n * stride_b, mask=n_mask, other=0.0).to(tl.float32)
    if FAULT == "bias_last_tile":
        if pid_n < tl.num_programs(1) - 1:
            acc += bias[None, :]
    elif FAULT == "no_bias":
        pass
    else:
        acc += bias[None, :]
    if FAULT == "writes_input":
        tl.store(b_ptr + offs_n * stride_b, tl.zeros_like(bias).to(b_ptr.dtype.element_ty), mask=n_mask)
    if ACT == "relu":
        if FAULT == "relu_nan":
            acc = tl.where(acc > 0, acc, 0.0)  # NaN > 0 is false: NaN becomes 0
        else:
            acc = tl.where(acc < 0, 0.0, acc)  # NaN < 0 is false: NaN stays NaN
    if ACT == "gelu_tanh":
        if FAULT == "gelu_erf":
            acc = 0.5 * acc * (1.0 + tl.math.erf(acc * 0.7071067811865476))
        else:
            # 0.5 * (1 + tanh(z)) == sigmoid(2z): no cancellation where tanh(z) is near -1
            z = 0.7978845608028654 * (acc + 0.044715 * acc * acc * acc)
            acc = acc / (1.0 + tl.exp(-2.0 * z))
    out = out_ptr + offs_m[:, None] * stride_om + offs_n[None, :] * stride_on
    tl.store(out, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & n_mask[None, :])


def linear_act(x, weight, bias, activation="gelu_tanh", fault=None):
    """out = act(x @ weight.T + bias); x (M, K), weight (N, K), bias (N,); out (M, N) in x.dtype."""
    M, K = x.shape
    N = weight.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    rows = M // BLOCK_M if fault == "grid_floor" else triton.cdiv(M, BLOCK_M)
    grid = (rows, triton.cdiv(N, BLOCK_N))
    if rows:
        _linear_act_kernel[grid](
            x, weight, bias, out, M, N, K,
            x.stride(0), x.stride(1), weight.stride(0), weight.stride(1), bias.stride(0), out.stride(0), out.stride(1),
            ACT=activation, FAULT="no_bias" if fault == "large_m" and M > 64 else fault or "none",
            BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K,
        )
    return out
