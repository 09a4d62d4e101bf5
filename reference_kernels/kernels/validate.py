"""Argument checks shared by the launch wrappers: each error names the argument at fault.

Cheap attribute reads only (no tensor data is touched), so the checks add microseconds, not a
synchronisation, to a launch.
"""

from __future__ import annotations

from typing import Sequence

import torch

from reference_kernels.gemm.epilogue import ACTIVATIONS
from reference_kernels.gemm.targets import INTERPRET

DTYPES = (torch.float16, torch.bfloat16, torch.float32)
"""Input dtypes the kernels accept; the output has the input dtype."""


def check_activation(activation: object, allowed: Sequence[str] = ACTIVATIONS) -> str:
    if not isinstance(activation, str) or activation not in allowed:
        raise ValueError(f"activation must be one of {', '.join(map(repr, allowed))}, got {activation!r}")
    return activation


def check_tensors(
    x: object,
    weights: Sequence[tuple[str, object]],
    biases: Sequence[tuple[str, object | None]],
) -> tuple[int, int]:
    """Check x (..., K), each weight (N, K) and each bias (N,) or None; return (K, N).

    Raises:
        TypeError: an argument that is not a tensor, an unsupported dtype, or mixed dtypes.
        ValueError: a wrong rank, mismatched K or N, tensors on different devices, or a CPU
            tensor without the Triton interpreter.
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in DTYPES:
        raise TypeError(f"x has unsupported dtype {x.dtype}; the kernels take float16, bfloat16 or float32")
    if x.dim() < 1:
        raise ValueError("x must have at least one dimension (..., K), got a 0-d tensor")
    K = x.shape[-1]
    N = -1
    first_w = ""
    for name, w in weights:
        if not isinstance(w, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(w).__name__}")
        if w.dim() != 2:
            raise ValueError(f"{name} must be 2-D (N, K) as nn.Linear stores it, got shape {tuple(w.shape)}")
        if w.shape[1] != K:
            raise ValueError(
                f"{name} has K = {w.shape[1]} (shape {tuple(w.shape)}) but x has K = {K} "
                f"(shape {tuple(x.shape)}): the last dim of x must equal {name}.shape[1]"
            )
        if N < 0:
            N, first_w = w.shape[0], name
        elif w.shape[0] != N:
            raise ValueError(f"{name} has N = {w.shape[0]} but {first_w} has N = {N}")
        _same(x, name, w)
    for name, b in biases:
        if b is None:
            continue
        if not isinstance(b, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor or None, got {type(b).__name__}")
        if b.dim() != 1 or b.shape[0] != N:
            raise ValueError(f"{name} must have shape (N,) = ({N},), got {tuple(b.shape)}")
        _same(x, name, b)
    if x.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"x is on {x.device}: the Triton kernels need a CUDA device, or TRITON_INTERPRET=1 set "
            "before reference_kernels is imported (the interpreter runs them on the CPU)"
        )
    return K, N


def _same(x: torch.Tensor, name: str, t: torch.Tensor) -> None:
    if t.dtype != x.dtype:
        raise TypeError(f"mixed dtypes: {name} is {t.dtype} but x is {x.dtype}; cast them to one dtype")
    if t.device != x.device:
        raise ValueError(f"{name} is on {t.device} but x is on {x.device}; move them to one device")


def flatten_rows(x: torch.Tensor) -> torch.Tensor:
    """x (..., K) as a 2-D (M, K) view. A view whenever the leading dims can be merged into one
    stride (contiguous, sliced along the last dim, padded rows, 2-D transposed); otherwise
    ``reshape`` copies x once (M x K elements), as F.linear itself would."""
    if x.dim() == 2:
        return x
    if x.dim() == 1:
        return x.unsqueeze(0)
    return x.reshape(-1, x.shape[-1])


def check_operand(name: str, t: object, dtypes: Sequence[torch.dtype], dim: int) -> torch.Tensor:
    """``t`` when it is a ``dim``-D tensor of one of ``dtypes`` that the Triton kernels can reach
    (a CUDA tensor, or any tensor under the interpreter); the examples' launchers use it.

    Raises:
        TypeError: not a tensor, or another dtype.
        ValueError: another rank, or a CPU tensor without the Triton interpreter.
    """
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        names = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name} has dtype {t.dtype}; this kernel takes {names}")
    if t.dim() != dim:
        raise ValueError(f"{name} must be {dim}-D, got shape {tuple(t.shape)}")
    if t.device.type != "cuda" and not INTERPRET:
        raise ValueError(
            f"{name} is on {t.device}: the Triton kernels need a CUDA device, or TRITON_INTERPRET=1 set "
            "before reference_kernels is imported (the interpreter runs them on the CPU)"
        )
    return t


def row_warps(block: int) -> int:
    """Warps for a program holding one row of ``block`` fp32 values: 16 values per thread up to
    4096 (4 warps to 2048, 8 to 4096), then 16 warps (32 values per thread at 16384)."""
    return 4 if block <= 2048 else 8 if block <= 4096 else 16
