"""The pointer kernels' body, written once: one output tile per program, its operands read through
pointers and strides (any layout, any alignment), for linear_act and gated_act when the TMA path
cannot run or the config does not ask for it, and the K loop and store of int8_linear.

The pieces: which rows and columns a tile reads and writes (:func:`tile_offsets`), the K loop
over one or two weights (:func:`pointer_accumulate`), the masked store (:func:`store_rows`), and
the whole kernel of linear_act and gated_act (:func:`pointer_gemm`, launched as
:data:`pointer_kernel`). As in :mod:`reference_kernels.gemm.tile_loop`, ``GATED`` (a constexpr) is
the one difference between the linear and the gated kernel: one weight and one fp32 accumulator,
or two of each.
"""

from __future__ import annotations

import triton
import triton.language as tl

from reference_kernels.gemm.epilogue import apply_activation
from reference_kernels.gemm.schedule import grouped_tile


@triton.jit
def tile_offsets(pid_m, pid_n, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """``(offs_m, offs_n, rows, cols)`` of output tile (pid_m, pid_n): ``offs_m`` (BLOCK_M,) and
    ``offs_n`` (BLOCK_N,) its int32 row and column indices, which run past M and N at the edges
    (the store masks them); ``rows`` and ``cols`` the same indices wrapped modulo M and N onto
    valid ones, int64, for the loads, which then need no M/N mask (the wrapped rows' results are
    dropped by the store). int64: M x stride, or N x stride of a 28672 x 8192 weight, passes
    2**31 elements."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    return offs_m, offs_n, rows, cols


@triton.jit
def pointer_accumulate(
    x_ptr, w_ptr, wu_ptr, rows, cols, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_un, stride_uk,
    GATED: tl.constexpr, EVEN_K: tl.constexpr, DOT_PRECISION: tl.constexpr, BLOCK_K: tl.constexpr,
    COLS_FIRST: tl.constexpr,
):
    """``(acc, acc_up)``: the fp32 (BLOCK_M, BLOCK_N) accumulators of x @ w.T (and with
    ``GATED`` x @ wu.T) over all of K for the tile of ``rows`` (BLOCK_M,) of x (M, K) and
    ``cols`` (BLOCK_N,) of w (N, K) (:func:`tile_offsets`), each operand read through its two
    strides in BLOCK_K steps. Loads past K are masked to zero unless ``EVEN_K`` (K a multiple of
    BLOCK_K). A weight tile is converted to x's dtype before the dot (a no-op for a float weight
    of x's dtype; int8 weights are exact in fp16, bf16 and fp32). Linear: ``acc_up`` is ``acc``
    (``wu_ptr``, ``stride_un`` and ``stride_uk`` are not read; None will do).

    ``COLS_FIRST``: w's offsets are summed column term first (int8_linear's order), else K term
    first (linear_act's and gated_act's). The same addresses either way; the order is kept per
    kernel because ptxas allocates registers by it (the other order gives int8_linear's bf16
    16 x 128 x 128 tile a 48-byte spill on sm_80)."""
    BLOCK_M: tl.constexpr = rows.shape[0]
    BLOCK_N: tl.constexpr = cols.shape[0]
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    if COLS_FIRST:
        w_ptrs = w_ptr + cols[None, :] * stride_wn + offs_k[:, None] * stride_wk
    else:
        w_ptrs = w_ptr + offs_k[:, None] * stride_wk + cols[None, :] * stride_wn
    if GATED:
        u_ptrs = wu_ptr + offs_k[:, None] * stride_uk + cols[None, :] * stride_un

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if GATED:
        acc_up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
            if GATED:
                bu = tl.load(u_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            if GATED:
                bu = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b.to(a.dtype), acc, input_precision=DOT_PRECISION)
        if GATED:
            acc_up = tl.dot(a, bu, acc_up, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk
        if GATED:
            u_ptrs += BLOCK_K * stride_uk
    if not GATED:
        acc_up = acc
    return acc, acc_up


@triton.jit
def store_rows(out_ptr, tile, offs_m, offs_n, M, N, stride_om, stride_on):
    """Write the fp32 ``tile`` (BLOCK_M, BLOCK_N) in out's dtype at rows ``offs_m`` and columns
    ``offs_n`` (:func:`tile_offsets`) of out (M, N), read through its two strides (int64 row
    offsets), masked at the M and N edges."""
    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, tile.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def pointer_gemm(
    x_ptr, w_ptr, wu_ptr, b_ptr, bu_ptr, out_ptr,
    M, N, K,
    stride_xm, stride_xk, stride_wn, stride_wk, stride_un, stride_uk,
    stride_b, stride_bu, stride_om, stride_on,
    HAS_BIAS: tl.constexpr, HAS_BIAS_UP: tl.constexpr, GATED: tl.constexpr,
    ACTIVATION: tl.constexpr, DOT_PRECISION: tl.constexpr, OUT_16BIT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    """One program of the pointer kernel: output tile ``tl.program_id(0)`` in grouped order
    (:func:`reference_kernels.gemm.schedule.grouped_tile`), accumulated in fp32 over all of K
    (:func:`pointer_accumulate`), then bias, activation and the store in out's dtype.

    Linear (linear_act): ``act(x @ w.T + b)``, x (M, K), w (N, K), b (N,), out (M, N). ``GATED``
    (gated_act): ``act(x @ w.T + b) * (x @ wu.T + bu)``, w the gate's weight and b its bias, wu
    and bu the up projection's. The biases are read only with HAS_BIAS / HAS_BIAS_UP; ``wu_ptr``,
    ``bu_ptr`` and their strides only when GATED (the linear kernel passes None for them, so they
    are not kernel arguments there). ``OUT_16BIT``: out is fp16 or bf16
    (:func:`reference_kernels.gemm.epilogue.apply_activation`)."""
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    offs_m, offs_n, rows, cols = tile_offsets(pid_m, pid_n, M, N, BLOCK_M, BLOCK_N)
    acc, acc_up = pointer_accumulate(
        x_ptr, w_ptr, wu_ptr, rows, cols, K, stride_xm, stride_xk, stride_wn, stride_wk, stride_un, stride_uk,
        GATED, EVEN_K, DOT_PRECISION, BLOCK_K, COLS_FIRST=False,
    )
    if HAS_BIAS:
        acc = acc + tl.load(b_ptr + cols * stride_b).to(tl.float32)[None, :]
    if GATED:
        if HAS_BIAS_UP:
            acc_up = acc_up + tl.load(bu_ptr + cols * stride_bu).to(tl.float32)[None, :]
        acc = apply_activation(acc, ACTIVATION, OUT_16BIT) * acc_up
    else:
        acc = apply_activation(acc, ACTIVATION, OUT_16BIT)
    store_rows(out_ptr, acc, offs_m, offs_n, M, N, stride_om, stride_on)


pointer_kernel = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(pointer_gemm)
""":func:`pointer_gemm` as linear_act and gated_act launch it: ``EVEN_K`` from K and BLOCK_K, one
program per output tile (grid: :func:`reference_kernels.gemm.schedule.tile_grid`)."""
