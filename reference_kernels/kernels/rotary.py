"""Rotary position embedding applied to q and k in place: one Triton program per few tokens.

Each head's ``D`` values are two halves ``(x1, x2)`` rotated by the token's angles,
``(x1 cos - x2 sin, x2 cos + x1 sin)`` (GPT-NeoX / Llama "rotate half" order). Like vLLM's
``rotary_embedding`` the kernel overwrites q and k and returns None: no new tensors, one read
and one write of each. Its test declares that with ``mutates=("q", "k")``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.gemm.targets import INTERPRET
from reference_kernels.kernels.validate import check_operand

DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def rotary_eager(
    q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotated ``(q, k)`` as new tensors: q (T, Hq, D), k (T, Hk, D), cos and sin (T, D / 2)."""
    return _rotate_half(q, cos, sin), _rotate_half(k, cos, sin)


def _rotate_half(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    x1, x2 = x.chunk(2, dim=-1)
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


@triton.jit
def _rotate_heads(
    ptr, tokens, stride_t, stride_h, stride_d, T, H, c, s, R, BLOCK_H: tl.constexpr, BLOCK_R: tl.constexpr
):
    """Rotate the H heads of ``tokens`` (BLOCK_T,) by their angles' ``c``, ``s`` (BLOCK_T, BLOCK_R)."""
    heads = tl.arange(0, BLOCK_H)
    half = tl.arange(0, BLOCK_R)
    mask = (tokens[:, None, None] < T) & (heads[None, :, None] < H) & (half[None, None, :] < R)
    p1 = ptr + tokens[:, None, None] * stride_t + heads[None, :, None] * stride_h
    p1 += half[None, None, :] * stride_d
    p2 = p1 + R * stride_d
    # Both halves are loaded before either is stored: the stores overwrite what was read.
    x1 = tl.load(p1, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(p2, mask=mask, other=0.0).to(tl.float32)
    cc, ss = c[:, None, :], s[:, None, :]
    tl.store(p1, (x1 * cc - x2 * ss).to(ptr.dtype.element_ty), mask=mask)
    tl.store(p2, (x2 * cc + x1 * ss).to(ptr.dtype.element_ty), mask=mask)


@triton.jit
def _rotary_kernel(
    q_ptr,
    k_ptr,
    cos_ptr,
    sin_ptr,
    T,
    HQ,
    HK,
    R,
    stride_qt,
    stride_qh,
    stride_qd,
    stride_kt,
    stride_kh,
    stride_kd,
    stride_ct,
    stride_cr,
    stride_st,
    stride_sr,
    BLOCK_T: tl.constexpr,
    BLOCK_HQ: tl.constexpr,
    BLOCK_HK: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    # int64 token offsets: T x stride may pass 2**31 elements.
    tokens = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)
    half = tl.arange(0, BLOCK_R)
    cs_mask = (tokens[:, None] < T) & (half[None, :] < R)
    c = tl.load(cos_ptr + tokens[:, None] * stride_ct + half[None, :] * stride_cr, mask=cs_mask, other=0.0)
    s = tl.load(sin_ptr + tokens[:, None] * stride_st + half[None, :] * stride_sr, mask=cs_mask, other=0.0)
    c, s = c.to(tl.float32), s.to(tl.float32)
    _rotate_heads(q_ptr, tokens, stride_qt, stride_qh, stride_qd, T, HQ, c, s, R, BLOCK_HQ, BLOCK_R)
    _rotate_heads(k_ptr, tokens, stride_kt, stride_kh, stride_kd, T, HK, c, s, R, BLOCK_HK, BLOCK_R)


def rotary_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q and k in place (see :func:`rotary_eager`); returns None.

    Args:
        q: (T, Hq, D), k: (T, Hk, D): float16, bfloat16 or float32, one dtype, D even, any
            strides (q and k must not overlap).
        cos, sin: (T, D / 2), q's dtype or float32.

    Raises:
        TypeError: a non-tensor or another dtype.
        ValueError: mismatched shapes, an odd D, or a CPU tensor without the interpreter.
    """
    check_operand("q", q, DTYPES, 3)
    check_operand("k", k, (q.dtype,), 3)
    check_operand("cos", cos, (q.dtype, torch.float32), 2)
    check_operand("sin", sin, (q.dtype, torch.float32), 2)
    T, HQ, D = q.shape
    HK = k.shape[1]
    if D % 2 or k.shape[0] != T or k.shape[2] != D:
        raise ValueError(
            f"need q (T, Hq, D) and k (T, Hk, D) with D even, got {tuple(q.shape)}, {tuple(k.shape)}"
        )
    if cos.shape != (T, D // 2) or sin.shape != (T, D // 2):
        raise ValueError(
            f"cos and sin must be (T, D / 2) = {(T, D // 2)}, got {tuple(cos.shape)}, {tuple(sin.shape)}"
        )
    if T == 0 or D == 0:
        return None
    # Blocks of at least 2 x 2 x 16: no size-1 tile dims for the compiler to special-case.
    block_r = max(16, triton.next_power_of_2(D // 2))
    block_hq, block_hk = max(2, triton.next_power_of_2(HQ)), max(2, triton.next_power_of_2(HK))
    # Tokens per program: tiles of about 4096 q pairs on a GPU (Llama-3-8B's 32 heads x 64
    # pairs: 2 tokens, 8 warps, 32 fp32 values per thread); 16 under the interpreter, whose
    # cost is per program and per operation, not per element.
    per_tile = max(1, 4096 // (block_hq * block_r))
    block_t = max(2, min(16 if INTERPRET else triton.next_power_of_2(per_tile), triton.next_power_of_2(T)))
    warps = 4 if block_t * block_hq * block_r <= 2048 else 8
    _rotary_kernel[(triton.cdiv(T, block_t),)](
        q, k, cos, sin, T, HQ, HK, D // 2,
        q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
        cos.stride(0), cos.stride(1), sin.stride(0), sin.stride(1),
        BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=block_hk, BLOCK_R=block_r, num_warps=warps,
    )
    return None
