"""Activation functions applied in a GEMM epilogue, on the fp32 accumulator, in Triton.

One concern: the math of each activation, written so that its non-finite values match PyTorch's
float64 results (the golden reference): act(+inf) = +inf and act(-inf) = NaN for gelu, gelu_tanh
and silu; relu(-inf) = 0; NaN stays NaN everywhere.
"""

from __future__ import annotations

import triton
import triton.language as tl

ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
"""Activation names the kernels accept.

- ``none``: identity.
- ``relu``: max(x, 0), NaN kept.
- ``gelu``: x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2)), as ``F.gelu(x)``.
- ``gelu_tanh``: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as ``F.gelu(x, approximate="tanh")``.
- ``silu``: x * sigmoid(x), as ``F.silu``.
"""


@triton.jit
def apply_activation(x, ACTIVATION: tl.constexpr):
    """``ACTIVATION`` (one of :data:`ACTIVATIONS`) applied elementwise to the fp32 tile ``x``."""
    if ACTIVATION == "relu":
        # tl.maximum leaves NaN handling unspecified; the comparison keeps NaN as F.relu does.
        return tl.where(x < 0.0, 0.0, x)
    elif ACTIVATION == "gelu":
        # 1 / sqrt(2)
        return 0.5 * x * (1.0 + tl.math.erf(x * 0.7071067811865476))
    elif ACTIVATION == "gelu_tanh":
        # 0.5 (1 + tanh(u)) = sigmoid(2u): one exp instead of a tanh, and the same non-finite
        # results (x = -inf gives -inf * 0 = NaN, as torch in float64). 2 sqrt(2 / pi) below.
        return x * tl.sigmoid(1.5957691216057308 * (x + 0.044715 * x * x * x))
    elif ACTIVATION == "silu":
        return x * tl.sigmoid(x)
    else:
        return x
