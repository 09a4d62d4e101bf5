"""Kernels with one planted memory or state fault each, for the oracle's hygiene tests.

``linear(x, w, fault)`` is ``x @ w.T`` (x: (M, K), w: (N, K), out: (M, N) in x's dtype): a Triton
kernel with one program per row of x; ``fault`` plants one bug (None: correct):

- ``"out_past_end"``: program 0 also stores one element past the end of the output;
- ``"gap_write"``: each program stores into x's element just past its row (the padded layout's gap);
- ``"gap_read"``: each program loads x's row one element too far and adds it in.

``rows(x, w)`` is the same product by an autotuned kernel whose configs all write one output
buffer: ``SKIP_ODD=1`` leaves every odd row unwritten. ``ORDER`` (set by the test) is the order of
its configs. ``split_k`` and ``reused_out`` are plain PyTorch with a state fault across calls.
"""

import torch
import triton
import triton.language as tl

BLOCK = 16


@triton.jit
def _row_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                FAULT: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    m = tl.program_id(0)
    offs_n = tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    x_mask = offs_k < K + 1 if FAULT == "gap_read" else offs_k < K
    x = tl.load(x_ptr + m * stride_xm + offs_k * stride_xk, mask=x_mask, other=0.0).to(tl.float32)
    w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=1.0 if FAULT == "gap_read" else 0.0)
    acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
    tl.store(out_ptr + m * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)
    if FAULT == "out_past_end":
        if m == 0:
            tl.store(out_ptr + M * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n == 0)
    if FAULT == "gap_write":
        tl.store(x_ptr + m * stride_xm + (K + offs_k) * stride_xk, x.to(x_ptr.dtype.element_ty), mask=offs_k == 0)


def linear(x, w, fault=None):
    M, K = x.shape
    N = w.shape[0]
    if N > BLOCK or K >= BLOCK:
        raise ValueError(f"linear: N <= {BLOCK} and K < {BLOCK}, got N={N}, K={K}")
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _row_kernel[(M,)](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                      FAULT=fault, BLOCK_N=BLOCK, BLOCK_K=BLOCK)
    return out


ORDER = ("skip", "full")
CONFIGS = {"skip": triton.Config({"SKIP_ODD": 1}), "full": triton.Config({"SKIP_ODD": 0}),
           "full2": triton.Config({"SKIP_ODD": 0}, num_warps=2)}


def _autotuned():
    @triton.autotune(configs=[CONFIGS[name] for name in ORDER], key=["M", "N", "K"])
    @triton.jit
    def _rows_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                     SKIP_ODD: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
        m = tl.program_id(0)
        if SKIP_ODD == 0 or m % 2 == 0:
            offs_n = tl.arange(0, BLOCK_N)
            offs_k = tl.arange(0, BLOCK_K)
            x = tl.load(x_ptr + m * stride_xm + offs_k * stride_xk, mask=offs_k < K, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + offs_n[:, None] * stride_wn + offs_k[None, :] * stride_wk,
                        mask=(offs_n[:, None] < N) & (offs_k[None, :] < K), other=0.0)
            acc = tl.sum(w.to(tl.float32) * x[None, :], axis=1)
            tl.store(out_ptr + m * N + offs_n, acc.to(out_ptr.dtype.element_ty), mask=offs_n < N)

    return _rows_kernel


_rows = None


def rows(x, w):
    global _rows
    if _rows is None:
        _rows = _autotuned()
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)  # one buffer for every config
    _rows[(M,)](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1), BLOCK_N=BLOCK, BLOCK_K=BLOCK)
    return out


_workspaces = {}


def split_k(x, w):
    """x @ w.T in two K halves summed through a cached float32 workspace that is never zeroed."""
    M, K = x.shape
    key = (M, w.shape[0], K, x.dtype, x.device)
    if key not in _workspaces:
        _workspaces[key] = torch.zeros((2, M, w.shape[0]), dtype=torch.float32, device=x.device)
    ws = _workspaces[key]
    h = K // 2
    ws[0] += x[:, :h].float() @ w[:, :h].float().T  # stale partials of the previous call stay
    ws[1] += x[:, h:].float() @ w[:, h:].float().T
    return ws.sum(0).to(x.dtype)


_outputs = {}


def reused_out(x, w):
    """x @ w.T into one cached output buffer, returned on every call."""
    key = (x.shape[0], w.shape[0], x.dtype, x.device)
    if key not in _outputs:
        _outputs[key] = torch.empty((x.shape[0], w.shape[0]), dtype=x.dtype, device=x.device)
    out = _outputs[key]
    out.copy_(x.float() @ w.float().T)
    return out
