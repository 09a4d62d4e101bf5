"""Fused linear + bias + activation: one Triton GEMM with the activation in its epilogue.

out = act(x @ weight.T + bias), accumulated in fp32 and rounded once to x.dtype, so the
pre-activation never goes to memory (eager PyTorch writes it, reads it back, writes the result).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from reference_kernels.gemm import targets
from reference_kernels.gemm.configs import LINEAR_CONFIGS, check_forced, launch_kwargs, tma_switches, uses_tma
from reference_kernels.gemm.epilogue import ACTIVATIONS, apply_activation
from reference_kernels.gemm.schedule import grouped_tile, tile_grid
from reference_kernels.gemm.tile_loop import tma_gemm
from reference_kernels.gemm.tma import Launch, descriptor, tma_ready
from reference_kernels.kernels.validate import check_activation, check_tensors, flatten_rows
from reference_kernels.tuning.pick import choose

CONFIGS = LINEAR_CONFIGS
"""The autotune configs (``triton.Config``); pass one as ``config=`` to force it."""


@triton.jit
def _linear_act_kernel(
    x_ptr,
    w_ptr,
    b_ptr,
    out_ptr,
    M,
    N,
    K,
    stride_xm,
    stride_xk,
    stride_wn,
    stride_wk,
    stride_b,
    stride_om,
    stride_on,
    HAS_BIAS: tl.constexpr,
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
    # Rows past M / N are wrapped onto valid ones so the loads need no M/N mask; their results
    # are dropped by the store mask. int64 row offsets: M x stride may pass 2**31 elements.
    rows = (offs_m % M).to(tl.int64)
    cols = (offs_n % N).to(tl.int64)
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rows[:, None] * stride_xm + offs_k[None, :] * stride_xk
    w_ptrs = w_ptr + offs_k[:, None] * stride_wk + cols[None, :] * stride_wn

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        if EVEN_K:
            a = tl.load(x_ptrs)
            b = tl.load(w_ptrs)
        else:
            k_left = K - k * BLOCK_K
            a = tl.load(x_ptrs, mask=offs_k[None, :] < k_left, other=0.0)
            b = tl.load(w_ptrs, mask=offs_k[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        x_ptrs += BLOCK_K * stride_xk
        w_ptrs += BLOCK_K * stride_wk

    if HAS_BIAS:
        bias = tl.load(b_ptr + cols * stride_b).to(tl.float32)
        acc = acc + bias[None, :]
    acc = apply_activation(acc, ACTIVATION, OUT_16BIT)

    out_ptrs = out_ptr + offs_m.to(tl.int64)[:, None] * stride_om + offs_n[None, :] * stride_on
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < N)
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _linear_act_tma_kernel(
    x_desc,
    w_desc,
    b_ptr,
    out,
    workspace,
    counters,
    M,
    N,
    K,
    stride_b,
    stride_om,
    dp_tiles,
    splits,
    HAS_BIAS: tl.constexpr,
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
):
    # The TMA form of _linear_act_kernel: the tile loop and split tail of gemm.tile_loop with one
    # weight descriptor and one accumulator (b_ptr and stride_b stand in for the unused up bias).
    tma_gemm(
        x_desc, w_desc, b_ptr, b_ptr, out, workspace, counters, M, N, K, stride_b, stride_b, stride_om,
        dp_tiles, splits, HAS_BIAS, False, ACTIVATION, DOT_PRECISION, OUT_16BIT, BLOCK_M, BLOCK_N, BLOCK_K,
        GROUP_M, PERSISTENT, TMA_STORE, SPLIT_TAIL, GATED=False, UP_FIRST=False,
    )


_kernel = triton.heuristics({"EVEN_K": lambda a: a["K"] % a["BLOCK_K"] == 0})(_linear_act_kernel)


def linear_act(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None = None,
    activation: str = "none",
    *,
    allow_tf32: bool = False,
    config: triton.Config | None = None,
) -> torch.Tensor:
    """``act(x @ weight.T + bias)`` in one Triton kernel (F.linear followed by the activation).

    Args:
        x: (..., K) float16, bfloat16 or float32; leading dims are flattened into M rows.
        weight: (N, K), same dtype and device, as ``nn.Linear.weight`` stores it. Any strides:
            a transposed view of a (K, N) buffer (GPT-2's Conv1D) is read in place.
        bias: (N,) or None.
        activation: one of ``"none"``, ``"relu"``, ``"gelu"`` (erf), ``"gelu_tanh"``, ``"silu"``.
        allow_tf32: float32 inputs multiply in TF32 on the tensor cores (operands rounded to a
            10-bit mantissa, 2^-11 relative each); the default is IEEE fp32 FMA.
        config: a ``triton.Config`` (one of :data:`CONFIGS`) to run instead of the tuned pick
            (:func:`reference_kernels.tuning.pick.choose`). A TMA config runs the TMA kernel when the
            inputs allow descriptors (sm_90+, contiguous rows, 16-byte aligned rows and base),
            else the pointer kernel with the same tiles.

    Returns:
        (..., N) tensor of x.dtype: fp32 accumulation, bias and activation in fp32, one rounding.
        M = 0 or N = 0 gives an empty tensor without a launch. Forward only: the result carries
        no autograd history. Strided inputs are read through their strides; only an x of
        rank > 2 whose leading dims cannot merge is copied once.

    Raises:
        TypeError: a non-tensor argument, a dtype other than float16/bfloat16/float32, mixed
            dtypes, or a malformed ``config`` (configs.launch_kwargs). ValueError also for a
            ``config`` with bad values (BLOCK sizes, warps, stages) or whose pipeline does not
            fit the shared memory of x's GPU in x's dtype (configs.check_forced), and when no
            config fits it at all (configs.candidates).
        ValueError: wrong ranks, x.shape[-1] != weight.shape[1], bias not (N,), tensors on
            different devices, a CPU tensor without TRITON_INTERPRET=1, an unknown activation.
    """
    check_activation(activation, ACTIVATIONS)
    K, N = check_tensors(x, (("weight", weight),), (("bias", bias),))
    x2 = flatten_rows(x)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M > 0 and N > 0:
        _launch(x2, weight, bias, out, M, N, K, activation, allow_tf32, config)
    return out.view(*x.shape[:-1], N)


def _launch(x, weight, bias, out, M, N, K, activation, allow_tf32, config) -> None:
    meta = dict(
        HAS_BIAS=bias is not None,
        ACTIVATION=activation,
        DOT_PRECISION="tf32" if (allow_tf32 or x.dtype != torch.float32) else "ieee",
        OUT_16BIT=x.dtype != torch.float32,
    )
    tma = tma_ready(x, weight, out)
    b = bias if bias is not None else out  # any pointer: not read without HAS_BIAS
    sb = bias.stride(0) if bias is not None else 0

    def run(cfg) -> None:
        kw = launch_kwargs(cfg)
        if tma and uses_tma(cfg):
            bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
            sw = tma_switches(cfg)
            launch = Launch.of(x.device, M, N, K, bm, bn, bk, sw, parts=1)
            _linear_act_tma_kernel[launch.grid](
                descriptor(x, [bm, bk]),
                descriptor(weight, [bn, bk]),
                b,
                descriptor(out, [bm, bn]) if sw["TMA_STORE"] else out,
                launch.workspace,
                launch.counters,
                M,
                N,
                K,
                sb,
                out.stride(0),
                launch.dp_tiles,
                launch.splits,
                **meta,
                **kw,
                **launch.switches,
            )
        else:
            _kernel[tile_grid](
                x,
                weight,
                b,
                out,
                M,
                N,
                K,
                x.stride(0),
                x.stride(1),
                weight.stride(0),
                weight.stride(1),
                sb,
                out.stride(0),
                out.stride(1),
                **meta,
                **kw,
            )

    if config is None:
        config = choose("linear", LINEAR_CONFIGS, x, N, K, 1, tma, run)
    else:
        check_forced(config, x.element_size(), weights=1, target=targets.of_device(x.device))
    run(config)
