"""The TMA kernel, written once for linear_act and gated_act: the K loop of one tile
(:func:`accumulate`), and the walk over the whole tiles followed by the split tail
(:func:`tma_gemm`, the kernel both launch: reference_kernels.kernels.dispatch.launch_tma).

``GATED`` (a constexpr) is the one difference between the two kernels: a linear tile has one fp32
accumulator from one weight descriptor; a gated tile two (gate and up), from one descriptor over
both weights as a (2, N, K) tensor, multiplied in one wgmma of N = 2 BLOCK_N per K step. The
epilogue is :func:`reference_kernels.gemm.epilogue.tile_epilogue`, with the same switch.
"""

from __future__ import annotations

import triton
import triton.language as tl

from reference_kernels.gemm.epilogue import tile_epilogue
from reference_kernels.gemm.schedule import grouped_tile
from reference_kernels.gemm.split_tail import (
    arrive,
    slice_of,
    slice_program,
    store_partial,
    sum_partials,
    whole_tiles,
)


@triton.jit
def accumulate(
    x_desc,
    w_desc,
    off_m,
    off_n,
    k_lo,
    k_hi,
    GATED: tl.constexpr,
    UP_FIRST: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """``(acc, acc_up)``: the fp32 accumulators of the tile at (off_m, off_n) over K steps
    [k_lo, k_hi). Linear: ``w_desc`` is the (N, K) weight's descriptor, ``acc_up`` is ``acc``
    (unused). ``GATED``: ``w_desc`` reads the two weights as one (2, N, K) tensor
    (gemm.tma.pair_descriptor; ``UP_FIRST``: w_up is its first half), so each K step copies both
    weight tiles in one TMA load and multiplies them in one wgmma of N = 2 BLOCK_N, which reads the
    x tile from shared memory once instead of once per weight; ``acc`` is the gate's, ``acc_up``
    the up projection's."""
    if GATED:
        acc = tl.zeros((BLOCK_M, 2 * BLOCK_N), dtype=tl.float32)
    else:
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(k_lo, k_hi):
        a = x_desc.load([off_m, k * BLOCK_K])
        if GATED:
            w = w_desc.load([0, off_n, k * BLOCK_K]).reshape(2 * BLOCK_N, BLOCK_K)
        else:
            w = w_desc.load([off_n, k * BLOCK_K])
        acc = tl.dot(a, w.T, acc, input_precision=DOT_PRECISION)
    if GATED:
        # Columns [0, BLOCK_N) come from the pair's first tensor. A thread of the wgmma layout holds
        # column c and c + BLOCK_N alike, so the split moves no data.
        first, second = acc.reshape(BLOCK_M, 2, BLOCK_N).permute(0, 2, 1).split()
        if UP_FIRST:
            acc, acc_up = second, first
        else:
            acc, acc_up = first, second
    else:
        acc_up = acc
    return acc, acc_up


@triton.jit
def tma_gemm(
    x_desc,
    w_desc,
    b_ptr,
    bu_ptr,
    out,
    workspace,
    counters,
    M,
    N,
    K,
    stride_b,
    stride_bu,
    stride_om,
    dp_tiles,
    splits,
    HAS_BIAS: tl.constexpr,
    HAS_BIAS_UP: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OUT_16BIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    PERSISTENT: tl.constexpr,
    TMA_STORE: tl.constexpr,
    SPLIT_TAIL: tl.constexpr,
    GATED: tl.constexpr,
    UP_FIRST: tl.constexpr,
):
    """One TMA kernel program: its whole tiles, then (SPLIT_TAIL) its K slice of a tail tile.

    Tiles come in through TMA descriptors, which zero-fill past M, N and K: no load masks.
    Launched with one program per tile, the tile loop runs once; launched persistent (one program
    per SM) it walks tiles, flattened with the K loop so that the compiler pipelines the next
    tile's loads under this tile's epilogue. ``out`` is a descriptor (its store clips at the
    edges) when TMA_STORE, else a pointer to a row-major (M, N) tensor. SPLIT_TAIL: after the
    whole tiles, programs take one K slice each of a tile past the last full wave
    (gemm.split_tail); each stores its accumulators (one, or two when GATED) in its workspace slot
    and the last of a tile's slices to finish sums them and writes the tile. ``bu_ptr``,
    ``stride_bu``, ``HAS_BIAS_UP`` and ``UP_FIRST`` are read only when GATED (``b_ptr`` is then
    the gate's bias); the linear launch passes None for ``bu_ptr`` and ``stride_bu``, so they are
    not kernel arguments there."""
    PARTS: tl.constexpr = 2 if GATED else 1
    num_tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    pid = tl.program_id(0)
    last, step = whole_tiles(pid, num_tiles, dp_tiles, SPLIT_TAIL, PERSISTENT)
    for tile in tl.range(pid, last, step, flatten=PERSISTENT):
        pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc, acc_up = accumulate(
            x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, 0, k_tiles,
            GATED, UP_FIRST, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
        )
        tile_epilogue(
            acc, acc_up, b_ptr, bu_ptr, out, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_b, stride_bu,
            stride_om, HAS_BIAS, HAS_BIAS_UP, GATED, ACTIVATION, OUT_16BIT, TMA_STORE,
        )
    if SPLIT_TAIL:
        sp = slice_program(pid, dp_tiles, num_tiles, splits, PERSISTENT)
        if sp >= 0:
            tile, slot, k_lo, k_hi = slice_of(sp, dp_tiles, splits, k_tiles)
            pid_m, pid_n = grouped_tile(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
            acc, acc_up = accumulate(
                x_desc, w_desc, pid_m * BLOCK_M, pid_n * BLOCK_N, k_lo, k_hi,
                GATED, UP_FIRST, DOT_PRECISION, BLOCK_M, BLOCK_N, BLOCK_K,
            )
            store_partial(workspace, slot, 0, acc, PARTS)
            if GATED:
                store_partial(workspace, slot, 1, acc_up, PARTS)
            if arrive(counters, slot, splits):
                acc = sum_partials(workspace, slot, splits, 0, PARTS, BLOCK_M, BLOCK_N)
                if GATED:
                    acc_up = sum_partials(workspace, slot, splits, 1, PARTS, BLOCK_M, BLOCK_N)
                tile_epilogue(
                    acc, acc_up, b_ptr, bu_ptr, out, pid_m * BLOCK_M, pid_n * BLOCK_N, M, N, stride_b,
                    stride_bu, stride_om, HAS_BIAS, HAS_BIAS_UP, GATED, ACTIVATION, OUT_16BIT, TMA_STORE,
                )
