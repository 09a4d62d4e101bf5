"""Kernels with one planted memory or state fault each, for the oracle's hygiene tests.

``linear(x, w, fault)`` is ``x @ w.T`` (x: (M, K), w: (N, K), out: (M, N) in x's dtype): a tiled
Triton kernel (16 x 16 x 16); ``fault`` plants one bug (None: correct):

- ``"out_past_end"``: program (0, 0) also stores one element past the end of the output;
- ``"gap_write"``: programs of the first N tile store into the element just past each row of x
  (the padded layout's gap);
- ``"gap_read"``: x's rows are loaded one element too far and that element is added in.

``rows(x, w)`` is the same product by an autotuned kernel whose configs all write one output
buffer: ``SKIP_ODD=1`` leaves every odd row, and every odd tile of rows, unwritten (about half the
work, so on a GPU it wins the tuning, while the tuning call's output looks right: the other config
wrote the rows it skips). ``ORDER`` (set by the test) is the order of
its configs. ``split_k`` and ``reused_out`` are plain PyTorch with a state fault across calls.
"""

import torch
import triton
import triton.language as tl

BLOCK_M, BLOCK_N, BLOCK_K = 16, 16, 16


@triton.jit
def _linear_kernel(x_ptr, w_ptr, out_ptr, M, N, K, stride_xm, stride_xk, stride_wn, stride_wk,
                   FAULT: tl.constexpr, SKIP_ODD: tl.constexpr,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    n_iter = tl.cdiv(K, BLOCK_K)
    if SKIP_ODD:
        if pid_m % 2 == 1:
            n_iter = 0  # odd row tiles do nothing: half the work, so this config wins the tuning
    for k0 in range(0, n_iter):
        k = k0 * BLOCK_K + offs_k
        x_k = k < K + 1 if FAULT == "gap_read" else k < K
        x = tl.load(x_ptr + offs_m[:, None] * stride_xm + k[None, :] * stride_xk,
                    mask=(offs_m[:, None] < M) & x_k[None, :], other=0.0)
        w = tl.load(w_ptr + offs_n[None, :] * stride_wn + k[:, None] * stride_wk,
                    mask=(offs_n[None, :] < N) & (k[:, None] < K), other=1.0 if FAULT == "gap_read" else 0.0)
        acc = tl.dot(x, w, acc, input_precision="ieee")
    rows = offs_m < M
    if SKIP_ODD:
        rows = rows & (offs_m % 2 == 0) & ((offs_m // BLOCK_M) % 2 == 0)
    tl.store(out_ptr + offs_m[:, None] * N + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=rows[:, None] & (offs_n[None, :] < N))
    if FAULT == "out_past_end":
        if (pid_m == 0) & (pid_n == 0):
            tl.store(out_ptr + M * N + offs_n, tl.zeros((BLOCK_N,), out_ptr.dtype.element_ty) + 1, mask=offs_n == 0)
    if FAULT == "gap_write":
        if pid_n == 0:
            tl.store(x_ptr + offs_m * stride_xm + K * stride_xk, tl.zeros((BLOCK_M,), x_ptr.dtype.element_ty) + 1,
                     mask=offs_m < M)


def _grid(M, N, meta):
    return (triton.cdiv(M, meta["BLOCK_M"]), triton.cdiv(N, meta["BLOCK_N"]))


def linear(x, w, fault=None):
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _linear_kernel[_grid(M, N, {"BLOCK_M": BLOCK_M, "BLOCK_N": BLOCK_N})](
        x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
        FAULT=fault, SKIP_ODD=0, BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K)
    return out


ORDER = ("skip", "full")
CONFIGS = {
    "skip": triton.Config({"SKIP_ODD": 1, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}),
    "full": triton.Config({"SKIP_ODD": 0, "BLOCK_M": 16, "BLOCK_N": 16, "BLOCK_K": 16}),
    "full2": triton.Config({"SKIP_ODD": 0, "BLOCK_M": 32, "BLOCK_N": 32, "BLOCK_K": 16}),
}

_rows = None


def rows(x, w):
    """x @ w.T by the autotuned kernel over the configs named in ORDER, all writing one output."""
    global _rows
    if _rows is None:
        _rows = triton.autotune(configs=[CONFIGS[name] for name in ORDER], key=["M", "N", "K"])(_linear_kernel)
    M, K = x.shape
    N = w.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)  # one buffer for every config
    _rows[lambda meta: _grid(M, N, meta)](x, w, out, M, N, K, x.stride(0), x.stride(1), w.stride(0), w.stride(1),
                                          FAULT=None)
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
