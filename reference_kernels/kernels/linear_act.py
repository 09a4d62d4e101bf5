"""Fused linear + bias + activation: one Triton GEMM with the activation in its epilogue.

out = act(x @ weight.T + bias), accumulated in fp32 and rounded once to x.dtype, so the
pre-activation never goes to memory (eager PyTorch writes it, reads it back, writes the result).
"""

from __future__ import annotations

import torch
import triton

from reference_kernels.gemm.configs import LINEAR_CONFIGS
from reference_kernels.kernels.dispatch import run_gemm

CONFIGS = LINEAR_CONFIGS
"""The autotune configs (``triton.Config``); pass one as ``config=`` to force it."""


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
    return run_gemm(x, (("weight", weight),), (("bias", bias),), activation, allow_tf32, config)
