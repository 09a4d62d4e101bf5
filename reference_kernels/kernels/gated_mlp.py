"""Gated MLP projections in one Triton kernel: act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up).

Both GEMMs share one pass over x (two fp32 accumulators per program, each x tile loaded once) and
the gate product happens in the epilogue, so neither projection goes to memory: eager PyTorch
writes gate and up (2 x M x N), reads them for the activation and the product, writes again.
SwiGLU is ``activation="silu"`` (Llama, Mistral, Qwen), GeGLU ``"gelu_tanh"`` (Gemma) or ``"gelu"``.
"""

from __future__ import annotations

import torch
import triton

from reference_kernels.gemm.configs import GATED_CONFIGS
from reference_kernels.kernels.dispatch import run_gemm

CONFIGS = GATED_CONFIGS
"""The autotune configs (``triton.Config``); pass one as ``config=`` to force it."""


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
    weights = (("w_gate", w_gate), ("w_up", w_up))
    return run_gemm(x, weights, (("b_gate", b_gate), ("b_up", b_up)), activation, allow_tf32, config)
