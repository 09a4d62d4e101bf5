"""Weight-only int8 linear: ``y = x @ (w * scale[:, None]).T`` with w int8 and per-output-channel
fp32 scales, one Triton GEMM that converts each int8 weight tile to x's dtype in registers.

Eager PyTorch dequantizes the whole weight to a new tensor (N x K values written and read back)
before its GEMM; the kernel reads the int8 weight once, half the bytes of a bf16 one, which is
what bounds a decode step (M = 1). The scale is applied to the fp32 accumulator in the epilogue:
``sum_k x_k (w_k s) = s sum_k x_k w_k``, exact in real arithmetic, one rounding in fp32.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.gemm.pointer_tile import pointer_accumulate, store_rows, tile_offsets
from reference_kernels.gemm.schedule import grouped_tile, tile_grid
from reference_kernels.gemm.targets import INTERPRET
from reference_kernels.kernels.validate import check_operand

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def int8_linear_eager(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """``F.linear(x, dequantized w)``: x (M, K) any float dtype, w (N, K) int8, scale (N,) fp32
    -> (M, N) in x's dtype. The weight is dequantized in scale's dtype (float64 in the golden
    run), then rounded to x's dtype for the GEMM."""
    return torch.nn.functional.linear(x, (w.to(scale.dtype) * scale[:, None]).to(x.dtype))


def _config(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    blocks = {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": 8}
    return triton.Config(blocks, num_warps=warps, num_stages=stages)


# In groups of 8 row-blocks (``_schedule.grouped_tile``) so that weight tiles stay in L2. The first
# (small tiles) is what the Triton interpreter runs, for every dtype.
MMA_CONFIGS = [
    _config(16, 32, 32, 4, 2),  # decode (M <= 16): thin tiles, deep in K, many programs along N
    _config(16, 64, 256, 4, 4),
    _config(16, 128, 128, 4, 4),
    _config(64, 128, 64, 4, 4),  # prefill
    _config(128, 128, 64, 8, 3),
    _config(128, 256, 64, 8, 3),
]
"""Tiles for fp16 and bf16 x, whose ``tl.dot`` runs on the tensor cores (wgmma on Hopper)."""

FMA_CONFIGS = [
    MMA_CONFIGS[0],
    _config(32, 64, 32, 4, 3),
    _config(64, 64, 32, 4, 3),
]
"""Tiles for fp32 x. An IEEE fp32 ``tl.dot`` has no tensor-core instruction: Triton unrolls it into
BLOCK_M x BLOCK_N x BLOCK_K FMAs per K step, spread over the program's threads, and the compile
time grows with that count. The tiles above make 2048-8192 FMAs per thread per step beyond the
first, too many to compile in a test's time (docs/reference-kernels.md#configs-kept-and-why);
these make 128-1024 (:data:`MAX_FMA_PER_THREAD`)."""

MAX_FMA_PER_THREAD = 1024
"""The most FMAs per thread per K step of an fp32 tile: BLOCK_M * BLOCK_N * BLOCK_K / (32 * num_warps)."""

CONFIGS = MMA_CONFIGS + FMA_CONFIGS[1:]
"""``triton.autotune`` tunes per (M, N, K, dtypes) on a GPU over the subset of these that
:func:`_configs_for_dtype` keeps for x's dtype; the interpreter runs the first."""


def _configs_for_dtype(
    configs: list[triton.Config], named_args: dict, **kwargs: object
) -> list[triton.Config]:
    """``prune_configs_by`` hook: :data:`FMA_CONFIGS` for fp32 x, :data:`MMA_CONFIGS` otherwise."""
    keep = FMA_CONFIGS if named_args["x_ptr"].dtype == torch.float32 else MMA_CONFIGS
    return [c for c in configs if any(c is k for k in keep)]


@triton.jit
def _int8_linear_kernel(
    x_ptr,
    w_ptr,
    s_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_s,
    stride_om,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m, offs_n, rows, cols = tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
    # Every K step masked (no EVEN_K switch); each int8 weight tile converted to x's dtype before
    # its dot: int8 values (|w| <= 128 = 2**7) are exact in fp16, bf16 and fp32.
    acc, _ = pointer_accumulate(
        x_ptr, w_ptr, None, rows, cols, K, stride_xm, stride_xk, stride_wn, stride_wk, None, None,
        GATED=False, EVEN_K=False, DOT_PRECISION=DOT_PRECISION, BLOCK_K=BLOCK_K, COLS_FIRST=True,
    )
    scale = tl.load(s_ptr + cols * stride_s).to(tl.float32)
    store_rows(out_ptr, acc * scale[None, :], offs_m, offs_n, M, N, stride_om, 1)


_int8_linear_tuned = triton.autotune(
    configs=CONFIGS, key=["M", "N", "K"], prune_configs_by={"early_config_prune": _configs_for_dtype}
)(_int8_linear_kernel)


def int8_linear(x: torch.Tensor, w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """Fused weight-only int8 linear (see :func:`int8_linear_eager`).

    Args:
        x: (M, K), float16, bfloat16 or float32, any strides.
        w: (N, K), int8, any strides.
        scale: (N,), float32: output channel n's weights are ``w[n] * scale[n]``.

    Returns:
        (M, N), contiguous, x's dtype: accumulated in fp32 (IEEE fp32 products for fp32 x, no
        TF32), scaled in fp32, rounded once.

    Raises:
        TypeError: a non-tensor or another dtype.
        ValueError: mismatched shapes or a CPU tensor without the interpreter.
    """
    check_operand("x", x, DTYPES, 2)
    check_operand("w", w, (torch.int8,), 2)
    check_operand("scale", scale, (torch.float32,), 1)
    M, K = x.shape
    N = w.shape[0]
    if w.shape[1] != K or scale.shape[0] != N:
        raise ValueError(
            f"need w (N, K) with x's K = {K} and scale (N,), "
            f"got w {tuple(w.shape)}, scale {tuple(scale.shape)}"
        )
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    if K == 0:
        return out.zero_()

    args = (x, w, scale, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), scale.stride(0),
            out.stride(0))
    precision = "ieee" if x.dtype == torch.float32 else "tf32"
    if INTERPRET:  # autotuning times candidates on a GPU; the interpreter has none
        first = CONFIGS[0]
        kernel = _int8_linear_kernel[tile_grid]
        kernel(*args, DOT_PRECISION=precision, **first.kwargs, num_warps=first.num_warps)
    else:
        _int8_linear_tuned[tile_grid](*args, DOT_PRECISION=precision)
    return out
