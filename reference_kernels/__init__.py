"""Reference fused MLP kernels in Triton, their eager references, modules and real shapes; and
kernels beyond the MLP (``norms``, ``softmax``, ``rotary``, ``int8_linear``), each with its
eager reference.

Importing this package imports Triton kernels: set ``TRITON_INTERPRET=1`` before the import to
run them on the CPU under the Triton interpreter.
"""

from reference_kernels._epilogue import ACTIVATIONS
from reference_kernels.configs import GATED_CONFIGS, LINEAR_CONFIGS
from reference_kernels.eager import gated_act_eager, gated_mlp_eager, linear_act_eager, mlp_eager
from reference_kernels.gated_mlp import gated_act
from reference_kernels.int8_linear import int8_linear, int8_linear_eager
from reference_kernels.linear_act import linear_act
from reference_kernels.modules import (
    FusedGatedMLP,
    FusedLinearAct,
    FusedMLP,
    activation_name,
    gated_mlp,
    mlp,
    swap_mlps,
)
from reference_kernels.norms import add_rms_norm, add_rms_norm_eager
from reference_kernels.rotary import rotary_, rotary_eager
from reference_kernels.softmax import softmax, softmax_eager

__all__ = [
    "ACTIVATIONS",
    "GATED_CONFIGS",
    "LINEAR_CONFIGS",
    "FusedGatedMLP",
    "FusedLinearAct",
    "FusedMLP",
    "activation_name",
    "add_rms_norm",
    "add_rms_norm_eager",
    "gated_act",
    "gated_act_eager",
    "gated_mlp",
    "gated_mlp_eager",
    "int8_linear",
    "int8_linear_eager",
    "linear_act",
    "linear_act_eager",
    "mlp",
    "mlp_eager",
    "rotary_",
    "rotary_eager",
    "softmax",
    "softmax_eager",
    "swap_mlps",
]
