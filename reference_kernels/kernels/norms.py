"""Fused residual add + RMSNorm: one Triton program per row.

``h = x + residual``; ``out = weight * rmsnorm(h)``, the block boundary of Llama-style models
(vLLM's and Liger-Kernel's ``fused_add_rms_norm``). Eager PyTorch reads x and residual, writes h,
reads it back for the mean of squares and again to normalise; the kernel reads each input once
and writes the two outputs once. It returns both rather than writing into its inputs (vLLM's
version overwrites x and residual; declared with ``mutates=`` it would test the same way).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.kernels.validate import check_operand, row_warps

DTYPES = (torch.float16, torch.bfloat16, torch.float32)

MAX_N = 32768
"""Largest row: the whole row sits in one program's registers (fp32), 64 values per thread at
16 warps; every model in reference_kernels.models.shapes has hidden <= 8192."""


def add_rms_norm_eager(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(weight * rmsnorm(x + residual), x + residual)``: x, residual (M, N), weight (N,).

    The mean of squares is taken in fp32 (float64 for float64 inputs, the golden run) on the
    rounded sum, and the normalised row is rounded to the input dtype before the weight, as
    Hugging Face's LlamaRMSNorm does."""
    h = x + residual
    hf = h.to(torch.promote_types(h.dtype, torch.float32))
    normed = hf * torch.rsqrt(hf.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(h.dtype), h


@triton.jit
def _add_rms_norm_kernel(
    x_ptr,
    r_ptr,
    w_ptr,
    out_ptr,
    h_ptr,
    N,
    stride_xm,
    stride_xn,
    stride_rm,
    stride_rn,
    stride_w,
    stride_om,
    stride_hm,
    eps,
    BLOCK_N: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)  # int64: M x stride may pass 2**31 elements
    cols = tl.arange(0, BLOCK_N)
    mask = cols < N
    x = tl.load(x_ptr + row * stride_xm + cols * stride_xn, mask=mask, other=0.0).to(tl.float32)
    r = tl.load(r_ptr + row * stride_rm + cols * stride_rn, mask=mask, other=0.0).to(tl.float32)
    h = x + r
    # The sum is stored rounded (it is the next block's residual) but normalised unrounded: one
    # rounding fewer than eager, so closer to the float64 golden.
    tl.store(h_ptr + row * stride_hm + cols, h.to(h_ptr.dtype.element_ty), mask=mask)
    mean_sq = tl.sum(h * h, axis=0) / N  # masked lanes hold 0
    rstd = 1.0 / tl.sqrt(mean_sq + eps)
    w = tl.load(w_ptr + cols * stride_w, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * stride_om + cols, (h * rstd * w).to(out_ptr.dtype.element_ty), mask=mask)


def add_rms_norm(
    x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6
) -> tuple[torch.Tensor, torch.Tensor]:
    """Fused ``(weight * rmsnorm(x + residual), x + residual)`` (see :func:`add_rms_norm_eager`).

    Args:
        x, residual: (M, N), float16, bfloat16 or float32, any strides.
        weight: (N,), the same dtype.
        eps: added to the mean of squares.

    Returns:
        (out, h): both (M, N), contiguous, x's dtype; the sum in fp32 rounded once, the output
        from the fp32 sum and fp32 statistics, rounded once.

    Raises:
        TypeError: a non-tensor or another dtype.
        ValueError: mismatched shapes, N > :data:`MAX_N`, or a CPU tensor without the interpreter.
    """
    check_operand("x", x, DTYPES, 2)
    check_operand("residual", residual, (x.dtype,), 2)
    check_operand("weight", weight, (x.dtype,), 1)
    M, N = x.shape
    if residual.shape != x.shape or weight.shape[0] != N:
        raise ValueError(
            f"need residual of x's shape {tuple(x.shape)} and weight ({N},), got "
            f"{tuple(residual.shape)} and {tuple(weight.shape)}"
        )
    if N > MAX_N:
        raise ValueError(f"N = {N} exceeds {MAX_N}: one row must fit in one program")
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    h = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out, h
    block = max(16, triton.next_power_of_2(N))
    _add_rms_norm_kernel[(M,)](
        x, residual, weight, out, h, N,
        x.stride(0), x.stride(1), residual.stride(0), residual.stride(1), weight.stride(0),
        out.stride(0), h.stride(0), float(eps),
        BLOCK_N=block, num_warps=row_warps(block),
    )
    return out, h
