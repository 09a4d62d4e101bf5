"""Eager PyTorch references for the fused kernels: what each kernel must compute.

Plain ``torch.nn.functional`` calls in the input dtype, so a fused_kernel test can run them in
float64 (the golden reference) and in the test dtype (eager's own error). Signatures mirror the
fused functions: tensors positionally, the activation as a keyword.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

ACTIVATION_FNS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "none": lambda t: t,
    "relu": F.relu,
    "gelu": F.gelu,
    "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
    "silu": F.silu,
}
"""Activation name -> the PyTorch function the kernels' epilogue reproduces."""


def _act(activation: str) -> Callable[[torch.Tensor], torch.Tensor]:
    try:
        return ACTIVATION_FNS[activation]
    except KeyError:
        raise ValueError(
            f"activation must be one of {', '.join(map(repr, ACTIVATION_FNS))}, got {activation!r}"
        ) from None


def linear_act_eager(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None, activation: str = "none"
) -> torch.Tensor:
    """``act(F.linear(x, weight, bias))``: x (..., K), weight (N, K), bias (N,) -> (..., N)."""
    return _act(activation)(F.linear(x, weight, bias))


def gated_act_eager(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor,
    b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, activation: str = "silu",
) -> torch.Tensor:
    """``act(F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)``: (..., K) -> (..., N)."""
    return _act(activation)(F.linear(x, w_gate, b_gate)) * F.linear(x, w_up, b_up)


def mlp_eager(
    x: torch.Tensor, w_in: torch.Tensor, b_in: torch.Tensor | None, w_out: torch.Tensor,
    b_out: torch.Tensor | None = None, activation: str = "gelu_tanh",
) -> torch.Tensor:
    """Linear-act-Linear MLP (GPT-2, BERT): x (..., H), w_in (I, H), b_in (I,), w_out (H, I),
    b_out (H,) -> (..., H)."""
    return F.linear(_act(activation)(F.linear(x, w_in, b_in)), w_out, b_out)


def gated_mlp_eager(
    x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, w_down: torch.Tensor,
    b_gate: torch.Tensor | None = None, b_up: torch.Tensor | None = None, b_down: torch.Tensor | None = None,
    activation: str = "silu",
) -> torch.Tensor:
    """Gated MLP (Llama, Gemma): ``down(act(gate(x)) * up(x))``; x (..., H), w_gate and w_up
    (I, H), w_down (H, I) -> (..., H)."""
    return F.linear(gated_act_eager(x, w_gate, w_up, b_gate, b_up, activation), w_down, b_down)
