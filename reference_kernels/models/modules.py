"""Fused MLP functions and nn.Modules that stand in for a model's own MLP blocks.

The modules hold the original model's projection layers themselves (same Parameter objects,
under the same attribute names), so weights are shared, never copied, and the model's
state_dict keys are unchanged after :func:`swap_mlps`. Forward only: the Triton kernels record
no autograd history, so use them under ``torch.no_grad()`` / ``torch.inference_mode()``.

Recognised blocks (duck-typed, transformers need not be installed):

- gated (Llama, Mistral, Qwen2, Gemma): ``gate_proj``, ``up_proj``, ``down_proj``, ``act_fn``.
- Linear-act-Linear (GPT-2): ``c_fc``, ``c_proj``, ``act`` (+ ``dropout``); GPT-2's Conv1D
  stores its weight (K, N), read through a transposed view. Also ``fc1``, ``fc2``,
  ``activation_fn`` (CLIP, ViT-style MLPs).
- BERT's intermediate (all-MiniLM): ``dense`` + ``intermediate_act_fn``; the output projection
  stays in BertOutput, fused with its residual LayerNorm there.
"""

from __future__ import annotations

from typing import Any, cast

import torch
import torch.nn as nn
import torch.nn.functional as F

from reference_kernels.kernels.gated_mlp import gated_act
from reference_kernels.kernels.linear_act import linear_act

DOWN_PROJECTIONS = ("torch", "triton")
"""How the down projection runs: ``torch`` (F.linear, cuBLAS) or ``triton`` (linear_act "none")."""

DEFAULT_DOWN = "torch"
"""Default down projection: cuBLAS, since the Triton one (linear_act "none") was not consistently
faster over the catalog's down projections (docs/reference-kernels.md, "The kernels")."""

_TANH_GELU_CLASSES = {
    "NewGELUActivation",
    "PytorchGELUTanh",
    "GELUTanh",
    "FastGELUActivation",
    "GELUPytorchTanh",
}
_ERF_GELU_CLASSES = {"GELUActivation"}
_SILU_CLASSES = {"SiLUActivation", "SiLU", "SwiGLU"}


def activation_name(act: Any) -> str:
    """The kernels' activation name for a model's activation module or function.

    nn.SiLU -> "silu"; nn.GELU() -> "gelu"; nn.GELU(approximate="tanh") -> "gelu_tanh";
    nn.ReLU -> "relu"; nn.Identity -> "none"; transformers' GELUActivation -> "gelu",
    NewGELUActivation / PytorchGELUTanh / GELUTanh / FastGELUActivation -> "gelu_tanh"
    (matched by class name); F.silu, F.gelu, F.relu functions likewise.

    Raises:
        ValueError: an activation the kernels do not compute (the message names its class).
    """
    if isinstance(act, nn.GELU):
        return "gelu_tanh" if act.approximate == "tanh" else "gelu"
    if isinstance(act, nn.SiLU):
        return "silu"
    if isinstance(act, nn.ReLU):
        return "relu"
    if isinstance(act, nn.Identity):
        return "none"
    fn_names = {F.silu: "silu", F.gelu: "gelu", F.relu: "relu", torch.relu: "relu"}
    if not isinstance(act, nn.Module) and act in fn_names:
        return fn_names[act]
    cls = type(act).__name__
    if cls in _TANH_GELU_CLASSES:
        return "gelu_tanh"
    if cls in _ERF_GELU_CLASSES:
        return "gelu"
    if cls in _SILU_CLASSES:
        return "silu"
    raise ValueError(
        f"unsupported activation {cls} ({act!r}): the fused kernels compute relu, gelu (erf), "
        "gelu_tanh and silu"
    )


def _bias(layer: nn.Module) -> torch.Tensor | None:
    return cast("torch.Tensor | None", layer.bias)


def _weight_nk(layer: nn.Module) -> torch.Tensor:
    """A projection's weight as (N, K) = (out, in). transformers' Conv1D stores (in, out): a
    transposed view is returned, which the kernels read through its strides (no copy)."""
    w = cast(torch.Tensor, layer.weight)
    return w.t() if type(layer).__name__ == "Conv1D" else w


def _linear(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor | None, down: str) -> torch.Tensor:
    if down == "triton":
        return linear_act(x, w, b, "none")
    return F.linear(x, w, b)


def _check_down(down: str) -> str:
    if down not in DOWN_PROJECTIONS:
        raise ValueError(f"down must be one of {DOWN_PROJECTIONS}, got {down!r}")
    return down


def mlp(
    x: torch.Tensor,
    w_in: torch.Tensor,
    b_in: torch.Tensor | None,
    w_out: torch.Tensor,
    b_out: torch.Tensor | None = None,
    activation: str = "gelu_tanh",
    *,
    down: str = DEFAULT_DOWN,
) -> torch.Tensor:
    """Linear-act-Linear MLP: ``act(x @ w_in.T + b_in) @ w_out.T + b_out``, the first GEMM with
    its activation fused (:func:`linear_act`).

    x (..., H), w_in (I, H), b_in (I,) or None, w_out (H, I), b_out (H,) or None -> (..., H);
    float16 / bfloat16 / float32. Raises as :func:`linear_act` does, and ValueError for an
    unknown ``down``.
    """
    h = linear_act(x, w_in, b_in, activation)
    return _linear(h, w_out, b_out, _check_down(down))


def gated_mlp(
    x: torch.Tensor,
    w_gate: torch.Tensor,
    w_up: torch.Tensor,
    w_down: torch.Tensor,
    b_gate: torch.Tensor | None = None,
    b_up: torch.Tensor | None = None,
    b_down: torch.Tensor | None = None,
    activation: str = "silu",
    *,
    down: str = DEFAULT_DOWN,
) -> torch.Tensor:
    """Gated MLP: ``(act(x @ w_gate.T + b_gate) * (x @ w_up.T + b_up)) @ w_down.T + b_down``,
    gate and up in one kernel (:func:`gated_act`), then the down projection.

    x (..., H), w_gate and w_up (I, H), w_down (H, I), biases or None -> (..., H). Raises as
    :func:`gated_act` does, and ValueError for an unknown ``down``.
    """
    h = gated_act(x, w_gate, w_up, b_gate, b_up, activation)
    return _linear(h, w_down, b_down, _check_down(down))


class FusedLinearAct(nn.Module):
    """``act(layer(x))`` in one kernel; e.g. BERT's intermediate (dense + GELU).

    Holds ``layer`` (an nn.Linear or Conv1D, shared) under ``name``.
    """

    def __init__(self, layer: nn.Module, activation: str, *, name: str = "dense") -> None:
        super().__init__()
        self._layer_name = name
        self.add_module(name, layer)
        self.activation = activation

    @classmethod
    def from_module(cls, block: nn.Module) -> FusedLinearAct:
        """From a block with ``dense`` and ``intermediate_act_fn`` (BertIntermediate)."""
        if not (hasattr(block, "dense") and hasattr(block, "intermediate_act_fn")):
            raise ValueError(f"{type(block).__name__} has no dense + intermediate_act_fn pair")
        return cls(cast(nn.Module, block.dense), activation_name(block.intermediate_act_fn), name="dense")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        layer = getattr(self, self._layer_name)
        return linear_act(x, _weight_nk(layer), layer.bias, self.activation)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}"


class FusedMLP(nn.Module):
    """Linear-act-Linear MLP (GPT-2, BERT-style) with the first GEMM's activation fused.

    Holds the model's two projection layers (shared) under their original names, so
    state_dict keys match the replaced block. ``dropout`` (a module or None) follows the output
    projection as in GPT2MLP.
    """

    def __init__(
        self,
        fc_in: nn.Module,
        fc_out: nn.Module,
        activation: str,
        *,
        names: tuple[str, str] = ("fc1", "fc2"),
        dropout: nn.Module | None = None,
        down: str = DEFAULT_DOWN,
    ) -> None:
        super().__init__()
        self._names = names
        self.add_module(names[0], fc_in)
        self.add_module(names[1], fc_out)
        self.dropout = dropout
        self.activation = activation
        self.down = _check_down(down)

    @classmethod
    def from_module(cls, block: nn.Module, *, down: str = DEFAULT_DOWN) -> FusedMLP:
        """From a GPT-2 MLP (``c_fc``, ``c_proj``, ``act``, ``dropout``) or an ``fc1``, ``fc2``,
        ``activation_fn`` block.

        Raises:
            ValueError: the block has neither layout, or an unsupported activation.
        """
        for a, b, act in (("c_fc", "c_proj", "act"), ("fc1", "fc2", "activation_fn"), ("fc1", "fc2", "act")):
            if hasattr(block, a) and hasattr(block, b) and hasattr(block, act):
                return cls(
                    getattr(block, a),
                    getattr(block, b),
                    activation_name(getattr(block, act)),
                    names=(a, b),
                    dropout=getattr(block, "dropout", None),
                    down=down,
                )
        raise ValueError(
            f"{type(block).__name__} is not a recognised Linear-act-Linear MLP "
            "(expected c_fc/c_proj/act or fc1/fc2/activation_fn)"
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        fc_in, fc_out = getattr(self, self._names[0]), getattr(self, self._names[1])
        h = linear_act(x, _weight_nk(fc_in), fc_in.bias, self.activation)
        y = _linear(h, _weight_nk(fc_out), fc_out.bias, self.down)
        return self.dropout(y) if self.dropout is not None else y

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, down={self.down!r}"


class FusedGatedMLP(nn.Module):
    """Gated MLP (Llama, Mistral, Qwen2: SwiGLU; Gemma: GeGLU) with gate and up in one kernel.

    Holds ``gate_proj``, ``up_proj``, ``down_proj`` (shared nn.Linear layers).
    """

    def __init__(
        self,
        gate_proj: nn.Module,
        up_proj: nn.Module,
        down_proj: nn.Module,
        activation: str = "silu",
        *,
        down: str = DEFAULT_DOWN,
    ) -> None:
        super().__init__()
        self.gate_proj, self.up_proj, self.down_proj = gate_proj, up_proj, down_proj
        self.activation = activation
        self.down = _check_down(down)

    @classmethod
    def from_module(cls, block: nn.Module, *, down: str = DEFAULT_DOWN) -> FusedGatedMLP:
        """From a block with ``gate_proj``, ``up_proj``, ``down_proj`` and ``act_fn``
        (LlamaMLP, MistralMLP, Qwen2MLP, GemmaMLP).

        Raises:
            ValueError: a missing attribute, or an unsupported activation.
        """
        missing = [a for a in ("gate_proj", "up_proj", "down_proj", "act_fn") if not hasattr(block, a)]
        if missing:
            raise ValueError(f"{type(block).__name__} is not a gated MLP: missing {', '.join(missing)}")
        g, u, d = (cast(nn.Module, getattr(block, a)) for a in ("gate_proj", "up_proj", "down_proj"))
        return cls(g, u, d, activation_name(block.act_fn), down=down)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        g, u, d = self.gate_proj, self.up_proj, self.down_proj
        h = gated_act(x, _weight_nk(g), _weight_nk(u), _bias(g), _bias(u), self.activation)
        return _linear(h, _weight_nk(d), _bias(d), self.down)

    def extra_repr(self) -> str:
        return f"activation={self.activation!r}, down={self.down!r}"


_FUSED = (FusedLinearAct, FusedMLP, FusedGatedMLP)


def _fuse(block: nn.Module, down: str) -> nn.Module | None:
    """The fused replacement of ``block``, or None when it is no recognised MLP."""
    if isinstance(block, _FUSED):
        return None
    if all(hasattr(block, a) for a in ("gate_proj", "up_proj", "down_proj", "act_fn")):
        return FusedGatedMLP.from_module(block, down=down)
    if (hasattr(block, "c_fc") and hasattr(block, "c_proj") and hasattr(block, "act")) or (
        hasattr(block, "fc1")
        and hasattr(block, "fc2")
        and (hasattr(block, "activation_fn") or hasattr(block, "act"))
    ):
        return FusedMLP.from_module(block, down=down)
    if hasattr(block, "dense") and hasattr(block, "intermediate_act_fn"):
        return FusedLinearAct.from_module(block)
    return None


def swap_mlps(model: nn.Module, *, strict: bool = True, down: str = DEFAULT_DOWN) -> int:
    """Replace every recognised MLP block inside ``model`` by its fused module, in place.

    Weights are shared (the fused modules hold the original layers). ``model`` itself is not
    replaced, only its descendants.

    Args:
        strict: raise on a recognised block with an unsupported activation; with False such a
            block is left as it is.
        down: down projection of the replacements (see :data:`DOWN_PROJECTIONS`).

    Returns:
        The number of blocks replaced.

    Raises:
        ValueError: (strict) a recognised block whose activation the kernels do not compute.
    """
    _check_down(down)
    count = 0
    for parent in list(model.modules()):
        if isinstance(parent, _FUSED):
            continue
        for name, child in list(parent.named_children()):
            try:
                fused = _fuse(child, down)
            except ValueError:
                if strict:
                    raise
                fused = None
            if fused is not None:
                setattr(parent, name, fused)
                count += 1
    return count
