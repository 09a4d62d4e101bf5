"""Gated MLP projections in one Triton kernel: act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up).

Both GEMMs share one pass over x (two fp32 accumulators per program, each x tile loaded once) and
the gate product happens in the epilogue, so neither projection goes to memory: eager PyTorch
writes gate and up (2 x M x N), reads them for the activation and the product, writes again.
SwiGLU is ``activation="silu"`` (Llama, Mistral, Qwen), GeGLU ``"gelu_tanh"`` (Gemma) or ``"gelu"``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.gemm import targets
from reference_kernels.gemm.configs import GATED_CONFIGS, check_forced, launch_kwargs, tma_switches, uses_tma
from reference_kernels.gemm.epilogue import ACTIVATIONS, apply_activation
from reference_kernels.gemm.schedule import grouped_tile, tile_grid
from reference_kernels.gemm.tile_loop import tma_gemm
from reference_kernels.gemm.tma import Launch, descriptor, pair_descriptor, pair_layout, tma_ready
from reference_kernels.kernels.validate import check_activation, check_tensors, flatten_rows
from reference_kernels.tuning.pick import choose

CONFIGS = GATED_CONFIGS
"""The autotune configs (``triton.Config``); pass one as ``config=`` to force it."""


@triton.jit
def _gated_act_kernel(
    x_ptr,
    wg_ptr,
    wu_ptr,
    bg_ptr,
    bu_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_gn,
    stride_gk,
    stride_un,
    stride_uk,
    stride_bg,
    stride_bu,
    stride_om,
    stride_on,
    HAS_BIAS_GATE: tl.constexpr,
    HAS_BIAS_UP: tl.constexpr,
    ACTIVATION: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    OUT_16BIT: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
    EVEN_K: tl.constexpr,
):
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)

    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    g_ptrs = wg_ptr + offs_k[:, None] * stride_gk + cols[None, :] * stride_gn
    u_ptrs = wu_ptr + offs_k[:, None] * stride_uk + cols[None, :] * stride_un

    acc_g = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    acc_u = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            bg = tl.load(g_ptrs)
            bu = tl.load(u_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            bg = tl.load(g_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
            bu = tl.load(u_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc_g = tl.dot(a, bg, acc_g, input_precision=DOT_PRECISION)
        acc_u = tl.dot(a, bu, acc_u, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        g_ptrs += BLOCK_K * stride_gk
        u_ptrs += BLOCK_K * stride_uk

    if HAS_BIAS_GATE:
        acc_g = acc_g + tl.load(bg_ptr + cols * stride_bg).to(tl.float32)[None, :]
    if HAS_BIAS_UP:
        acc_u = acc_u + tl.load(bu_ptr + cols * stride_bu).to(tl.float32)[None, :]
    h = apply_activation(acc_g, ACTIVATION, OUT_16BIT) * acc_u

    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _gated_act_tma_kernel(
    x_desc,
    w_desc,
    bg_ptr,
    bu_ptr,
    out,
    workspace,
    counters,
    M,
    N,
    K,
    stride_bg,
    stride_bu,
    stride_om,
    dp_tiles,
    splits,
    HAS_BIAS_GATE: tl.constexpr,
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
    UP_FIRST: tl.constexpr,
):
    # The TMA form of _gated_act_kernel: the tile loop and split tail of gemm.tile_loop with one
    # descriptor over both weights (gemm.tile_loop.accumulate) and two accumulators per tile.
    tma_gemm(
        x_desc, w_desc, bg_ptr, bu_ptr, out, workspace, counters, M, N, K, stride_bg, stride_bu, stride_om,
        dp_tiles, splits, HAS_BIAS_GATE, HAS_BIAS_UP, ACTIVATION, DOT_PRECISION, OUT_16BIT, BLOCK_M, BLOCK_N,
        BLOCK_K, GROUP_M, PERSISTENT, TMA_STORE, SPLIT_TAIL, GATED=True, UP_FIRST=UP_FIRST,
    )


_kernel = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(_gated_act_kernel)


def gated_act(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
    activation: str = "silu",
    *,
    allow_tf32: bool = False,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """``act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)`` in one Triton kernel.

    Args:
        x: (..., K) float16, bfloat16 or float32; leading dims are flattened into M rows.
        w_gate, w_up: (N, K) each, same dtype and device (``gate_proj.weight``,
            ``up_proj.weight``); any strides.
        b_gate, b_up: (N,) or None each.
        activation: ``"silu"`` (SwiGLU, the default), ``"gelu_tanh"`` or ``"gelu"`` (GeGLU);
            ``"relu"`` and ``"none"`` (bilinear) also work.
        allow_tf32: float32 inputs multiply in TF32 (operands rounded to a 10-bit mantissa);
            the default is IEEE fp32 FMA.
        config: a ``triton.Config`` (one of :data:`CONFIGS`) to run instead of the tuned pick
            (:func:`reference_kernels.tuning.pick.choose`). A TMA config runs the TMA kernel when the
            inputs allow descriptors (sm_90+, contiguous rows, 16-byte aligned rows and base) and
            w_gate and w_up are two tensors of one stride that read as one (2, N, K) tensor
            (separate weights, the halves of a merged gate_up weight or its interleaved rows:
            reference_kernels.gemm.tma.pair_layout), else the pointer kernel with the same tiles.

    Returns:
        (..., N) tensor of x.dtype; both products and the epilogue in fp32, one rounding.
        M = 0 or N = 0 gives an empty tensor without a launch. Forward only: the result carries
        no autograd history.

    Raises:
        TypeError: a non-tensor argument, an unsupported or mixed dtype, a malformed ``config``
            (configs.launch_kwargs). ValueError also for a ``config`` with bad values (BLOCK
            sizes, warps, stages) or whose pipeline does not fit the shared memory of x's GPU in
            x's dtype (configs.check_forced), and when no config fits it at all
            (configs.candidates).
        ValueError: wrong ranks, a K or N mismatch between x, w_gate, w_up and the biases,
            tensors on different devices, a CPU tensor without TRITON_INTERPRET=1, an unknown
            activation.
    """
    check_activation(activation, ACTIVATIONS)
    K, N = check_tensors(x, (("w_gate", w_gate), ("w_up", w_up)), (("b_gate", b_gate), ("b_up", b_up)))
    x2 = flatten_rows(x)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M > 0 and N > 0:
        _launch(x2, w_gate, w_up, b_gate, b_up, out, M, N, K, activation, allow_tf32, config)
    return out.view(*x.shape[:-1], N)


def _launch(x, w_gate, w_up, b_gate, b_up, out, M, N, K, activation, allow_tf32, config) -> None:
    """Run the kernel into ``out`` with ``config``, or with the config ``choose`` picks when None
    (TMA kernel where the tensors allow and the config asks for it, else the pointer kernel)."""
    meta = dict(
        HAS_BIAS_GATE=b_gate is not None,
        HAS_BIAS_UP=b_up is not None,
        ACTIVATION=activation,
        DOT_PRECISION="tf32" if (allow_tf32 or x.dtype != torch.float32) else "ieee",
        OUT_16BIT=x.dtype != torch.float32,
    )
    tma = tma_ready(x, w_gate, w_up, out) and pair_layout(w_gate, w_up) is not None
    bg, bu, sbg, sbu = _bias_args(b_gate, b_up, out)
    args = (x, w_gate, w_up, bg, bu, sbg, sbu, out, M, N, K, meta)

    def run(cfg) -> None:
        if tma and uses_tma(cfg):
            _launch_tma(*args, cfg)
        else:
            _launch_tiles(*args, cfg)

    if config is None:
        config = choose("gated", GATED_CONFIGS, x, N, K, 2, tma, run)
    else:
        check_forced(config, x.element_size(), weights=2, target=targets.of_device(x.device))
    run(config)


def _bias_args(b_gate, b_up, out):
    """``(bg, bu, sbg, sbu)``: the bias pointers and strides the kernels take; ``out`` and 0 stand
    for a missing bias (any pointer: not read without HAS_BIAS_GATE / HAS_BIAS_UP)."""
    bg = b_gate if b_gate is not None else out
    bu = b_up if b_up is not None else out
    sbg = b_gate.stride(0) if b_gate is not None else 0
    sbu = b_up.stride(0) if b_up is not None else 0
    return bg, bu, sbg, sbu


def _launch_tma(x, w_gate, w_up, bg, bu, sbg, sbu, out, M, N, K, meta, cfg) -> None:
    """Launch the TMA kernel (descriptors, split-K workspace) with config ``cfg``."""
    kw = launch_kwargs(cfg)
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    sw = tma_switches(cfg)
    launch = Launch.of(x.device, M, N, K, bm, bn, bk, sw, parts=2)
    w_pair, up_first = pair_descriptor(w_gate, w_up, [bn, bk])
    _gated_act_tma_kernel[launch.grid](
        descriptor(x, [bm, bk]),
        w_pair,
        bg,
        bu,
        descriptor(out, [bm, bn]) if sw["TMA_STORE"] else out,
        launch.workspace,
        launch.counters,
        M,
        N,
        K,
        sbg,
        sbu,
        out.stride(0),
        launch.dp_tiles,
        launch.splits,
        UP_FIRST=up_first,
        **meta,
        **kw,
        **launch.switches,
    )


def _launch_tiles(x, w_gate, w_up, bg, bu, sbg, sbu, out, M, N, K, meta, cfg) -> None:
    """Launch the pointer kernel (any strides) with config ``cfg``, one program per output tile."""
    kw = launch_kwargs(cfg)
    _kernel[tile_grid](
        x,
        w_gate,
        w_up,
        bg,
        bu,
        out,
        M,
        N,
        K,
        x.stride(0),
        x.stride(1),
        w_gate.stride(0),
        w_gate.stride(1),
        w_up.stride(0),
        w_up.stride(1),
        sbg,
        sbu,
        out.stride(0),
        out.stride(1),
        **meta,
        **kw,
    )
