"""Softmax over the last dim: one Triton program per row, the row held in registers.

Eager ``torch.softmax`` on a GPU is already one kernel; this one is the pattern every fused
row-wise op starts from (a max, an exp, a sum and a divide over a row in one pass over memory,
the idea of Triton's fused-softmax tutorial) and the plugin's example of a reduction whose output
has its input's shape.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.kernels.validate import check_operand, row_warps

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

MAX_N = 32768
"""Longest row: the whole row sits in one program's registers (fp32), 64 values per thread at
16 warps. Longer rows (a 128256-token vocabulary) need a loop over the row: not this kernel."""


LOG2E_HI = tl.constexpr(1.4426950216293335)
"""log2(e) rounded to fp32 (0x3FB8AA3B), the constant Triton's ``tl.exp`` multiplies by."""
LOG2E_LO = tl.constexpr(1.92596298909109e-08)
"""log2(e) - LOG2E_HI."""
LN2 = tl.constexpr(0.6931471824645996)


@triton.jit
def _exp(z):
    """exp(z) of fp32 z <= 0, with the error of one ``tl.exp2`` (ex2.approx.ftz.f32 on NVIDIA GPUs,
    so results below 2^-126, z < -87.3, flush to 0) whatever |z|.

    ``tl.exp`` computes ``exp2(fl(z * LOG2E_HI))`` (mul.f32, then ex2.approx.f32): rounding that
    product to fp32 moves the result by up to 2^-24 |z| relative, several ulps once |z| passes a
    few (CUDA's ``__expf``, the same sequence, is documented at 2 + floor(|1.173 z|) ulp). Here the
    product's residual ``r = z log2(e) - p`` is kept, exactly through an fma plus the constant's own
    rounding, and ``2^(p + r) = 2^p (1 + r ln 2)`` to fp32 precision (|r| <= 2^-17 wherever 2^p is
    a normal fp32). The plain ``tl.exp`` softmax failed the oracle's float32 budget
    (docs/oracle.md, "Fast intrinsics in float32").
    """
    p = z * LOG2E_HI
    r = tl.fma(z, LOG2E_HI, -p) + z * LOG2E_LO
    # p = -inf (z = -inf, or z below -2.4e38, where the product overflows): the fma is inf - inf or
    # inf, and exp is 0 anyway. NaN z keeps a NaN p, so the result stays NaN.
    r = tl.where(p > -float("inf"), r, 0.0)
    e = tl.exp2(p)
    return tl.fma(e, r * LN2, e)


def softmax_eager(x: torch.Tensor) -> torch.Tensor:
    """``torch.softmax(x, dim=-1)`` in x's dtype: x (M, N) -> (M, N)."""
    return torch.softmax(x, dim=-1)


@triton.jit
def _softmax_kernel(x_ptr, out_ptr, N, stride_xm, stride_xn, stride_om, BLOCK_N: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)  # int64: M x stride may pass 2**31 elements
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    # Lanes past N load -inf, so they add exp(-inf) = 0 to the sum whatever the row's max.
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=-float("inf"))
    x = x.to(tl.float32)
    # Subtracting the row's max keeps exp <= 1 (no overflow, fp16 activations reach 6e4); a row
    # holding +inf or NaN gives NaN everywhere, as torch.softmax does.
    z = x - tl.max(x, axis=0)
    num = _exp(z)
    # div_rn: Triton's fp32 `/` is div.full.f32, which is up to 2 ulp off; eager divides exactly.
    out = tl.math.div_rn(num, tl.sum(num, axis=0))
    tl.store(out_ptr + row * stride_om + cols, out.to(out_ptr.dtype.element_ty), mask=mask)


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Softmax over the last dim of x (M, N), float16, bfloat16 or float32, any strides.

    Returns:
        (M, N), contiguous, x's dtype: computed in fp32 (exp to within one ``exp2``'s error, an
        IEEE division) and rounded once.

    Raises:
        TypeError: a non-tensor or another dtype.
        ValueError: not 2-D, N > :data:`MAX_N`, or a CPU tensor without the interpreter.
    """
    check_operand("x", x, DTYPES, 2)
    M, N = x.shape
    if N > MAX_N:
        raise ValueError(f"N = {N} exceeds {MAX_N}: one row must fit in one program")
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out
    block = max(16, triton.next_power_of_2(N))
    _softmax_kernel[(M,)](
        x, out, N, x.stride(0), x.stride(1), out.stride(0), BLOCK_N=block, num_warps=row_warps(block)
    )
    return out
