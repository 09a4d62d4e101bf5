"""Which output tile a GEMM program computes (the grouped ordering both reference kernels share),
how the TMA kernels write it, and how many programs a one-tile-per-program launch needs."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def grouped_tile(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(pid_m, pid_n)`` of program ``pid`` in grouped order (Triton tutorial 03): GROUP_M
    row-blocks walk the N tiles together, so the weight tiles they share stay in L2."""
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    num_pid_in_group = GROUP_M * num_pid_n
    group_id = pid // num_pid_in_group
    first_pid_m = group_id * GROUP_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_M)
    pid_m = first_pid_m + ((pid % num_pid_in_group) % group_size_m)
    pid_n = (pid % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def store_tile(
    out,
    tile,
    off_m,
    off_n,
    M,
    N,
    stride_om,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    TMA_STORE: tl.constexpr,
):
    """Write an fp32 output ``tile`` at (off_m, off_n) in out's dtype: through the tensor
    descriptor ``out`` (staged in shared memory, clipped at the edges by TMA) when TMA_STORE,
    else from registers through the pointer ``out`` of a row-major (M, N) tensor with row stride
    ``stride_om``, masked at the edges (no shared memory, so a deeper pipeline or two programs
    per SM fit)."""
    if TMA_STORE:
        out.store([off_m, off_n], tile.to(out.dtype))
    else:
        rows = off_m + tl.arange(0, BLOCK_M)
        cols = off_n + tl.arange(0, BLOCK_N)
        ptrs = out + rows.to(tl.int64)[:, None] * stride_om + cols[None, :]
        tl.store(ptrs, tile.to(out.dtype.element_ty), mask=(rows[:, None] < M) & (cols[None, :] < N))


def tile_grid(meta: dict) -> tuple[int]:
    """Launch grid of a one-program-per-output-tile kernel, from its launch arguments (M, N) and
    meta-parameters (BLOCK_M, BLOCK_N)."""
    return (triton.cdiv(meta["M"], meta["BLOCK_M"]) * triton.cdiv(meta["N"], meta["BLOCK_N"]),)
