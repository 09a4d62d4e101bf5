"""Reference fused MLP kernels in Triton, their eager references, modules and real shapes; and
kernels beyond the MLP (``norms``, ``softmax``, ``rotary``, ``int8_linear``), each with its
eager reference. The names below are the public API; ``python3 -m reference_kernels.tune`` runs
the tuner (docs/reference-kernels.md, "Tuning").

Importing this package imports Triton kernels: set ``TRITON_INTERPRET=1`` before the import to
run them on the CPU under the Triton interpreter.

Folders, lowest first. A module imports only from its own folder or from folders listed before it
(each folder's docstring says what lives there; tests/kernels/test_kernels_layout.py walks every import,
those inside functions too):

1. ``gemm``: the shared GEMM pieces: GPU targets, configs, epilogue, tile order, the pointer kernel, split
   tail, TMA, the TMA kernel's tile loop.
2. ``tuning``: the config a call runs: the tuning cache and the pick (the tables beside them, data).
3. ``kernels``: the Triton kernels with their launch wrappers and eager references.
4. ``models``: the catalog of real model shapes and the modules that swap a model's MLP blocks.
5. ``tuning.tuner``: the tuner, which checks and times every config and writes a tuned table.
"""

from reference_kernels.gemm.configs import GATED_CONFIGS, LINEAR_CONFIGS
from reference_kernels.gemm.epilogue import ACTIVATIONS
from reference_kernels.kernels.eager import gated_act_eager, gated_mlp_eager, linear_act_eager, mlp_eager
from reference_kernels.kernels.gated_mlp import gated_act
from reference_kernels.kernels.int8_linear import int8_linear, int8_linear_eager
from reference_kernels.kernels.linear_act import linear_act
from reference_kernels.kernels.norms import add_rms_norm, add_rms_norm_eager
from reference_kernels.kernels.rotary import rotary_, rotary_eager
from reference_kernels.kernels.softmax import softmax, softmax_eager
from reference_kernels.models.modules import (
    FusedGatedMLP,
    FusedLinearAct,
    FusedMLP,
    activation_name,
    gated_mlp,
    mlp,
    swap_mlps,
)

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
