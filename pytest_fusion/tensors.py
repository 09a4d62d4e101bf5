"""Build a kernel's input tensors from a drawn case: dims, dtype, layouts and one seed.

Tensors are made from the seed on the target device (never element by element through
Hypothesis), so a case is reproducible from its printed fields alone.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

import torch

from pytest_fusion.spec import KernelSpec, Tensor

SPECIAL_VALUES = (float("nan"), float("inf"), float("-inf"), -0.0)

AMPLITUDES = {"float16": (1.0, 30.0, 2.0**14), "bfloat16": (1.0, 30.0), "float32": (1.0, 30.0)}
"""Standard deviations the activations (the first floating input) are drawn with, per test dtype.

1: unit-variance activations; 30: activations of tens, as real models' hidden states reach
(a GeGLU gate past about 10.5 is where an unclamped tanh of exponentials overflows);
2**14 (float16 only): outputs of a unit-gain layer reach the neighbourhood of float16's largest
finite value 65504 (3.5 standard deviations is 57344), where overflow handling shows."""


@dataclasses.dataclass(frozen=True)
class Case:
    """One drawn test case. Every field is printed on failure and suffices to rebuild the inputs.

    Attributes:
        dims: size of each shape symbol, e.g. ``{"M": 17, "K": 1, "N": 63}``.
        dtype: test dtype name (``"float16"``, ``"bfloat16"``, ``"float32"``).
        layouts: memory layout of each tensor input (see ``spec.LAYOUTS``).
        seed: seed of the torch generator the values are drawn from.
        special: whether NaN, +-inf and -0.0 were planted in the inputs.
        amplitude: standard deviation of the first floating input (the activations), one of
            :data:`AMPLITUDES`; 1 for bench inputs.
    """

    dims: Mapping[str, int]
    dtype: str
    layouts: Mapping[str, str]
    seed: int
    special: bool = False
    amplitude: float = 1.0

    def as_dict(self) -> dict[str, Any]:
        return {
            "dims": dict(self.dims),
            "dtype": self.dtype,
            "layouts": dict(self.layouts),
            "seed": self.seed,
            "special": self.special,
            "amplitude": self.amplitude,
        }


def torch_dtype(name: str) -> torch.dtype:
    """``"bfloat16"`` -> ``torch.bfloat16``; raises ValueError for an unknown name."""
    dt = getattr(torch, name.replace("torch.", ""), None)
    if not isinstance(dt, torch.dtype):
        raise ValueError(f"unknown torch dtype {name!r}")
    return dt


def shape_of(tensor: Tensor, dims: Mapping[str, int]) -> tuple[int, ...]:
    return tuple(dims[s] if isinstance(s, str) else int(s) for s in tensor.shape)


def value_scale(name: str, tensor: Tensor, dims: Mapping[str, int], first: bool, amplitude: float = 1.0) -> float:
    """Standard deviation of ``name``'s values (see :class:`spec.Tensor`); ``amplitude`` scales the
    first input (the activations) unless the tensor fixes its own ``scale``."""
    if tensor.scale is not None:
        return tensor.scale
    if not first and "K" in tensor.shape and "K" in dims:
        return 1.0 / math.sqrt(dims["K"])
    return amplitude if first else 1.0


def _strided_storage(shape: tuple[int, ...], layout: str, dtype: torch.dtype, device: str) -> torch.Tensor:
    """An uninitialised tensor of ``shape`` laid out in memory as ``layout`` describes."""
    if layout == "contiguous" or not shape:
        return torch.empty(shape, dtype=dtype, device=device)
    if layout == "transposed":
        if len(shape) < 2:
            return torch.empty(shape, dtype=dtype, device=device)
        swapped = (*shape[:-2], shape[-1], shape[-2])
        return torch.empty(swapped, dtype=dtype, device=device).transpose(-1, -2)
    if layout == "offset":
        flat = torch.empty(math.prod(shape) + 1, dtype=dtype, device=device)
        return flat[1:].view(shape)
    if layout == "padded":
        if len(shape) == 1:
            return torch.empty(shape[0] * 2, dtype=dtype, device=device)[::2]
        padded = (*shape[:-1], shape[-1] + 3)
        return torch.empty(padded, dtype=dtype, device=device)[..., : shape[-1]]
    raise ValueError(f"unknown layout {layout!r}")


def make_inputs(spec: KernelSpec, case: Case, device: str) -> dict[str, torch.Tensor]:
    """The kernel's tensor inputs for ``case``, in the spec's order, on ``device``.

    Floating inputs are normal with :func:`value_scale` standard deviation (the first one scaled by
    ``case.amplitude``), drawn in float32, clamped to their dtype's finite range and rounded once
    to it; integer inputs are uniform in [-8, 8]. With ``case.special``,
    ``1 + numel // 1024`` elements of each tensor that allows it become NaN, +inf, -inf or -0.0:
    sparse enough that most outputs of a GEMM (where one NaN spoils a whole row) stay finite.
    Values are written into the storage layout after drawing, so the layout never changes a value.

    Raises:
        ValueError: an unknown layout or dtype name.
    """
    gen = torch.Generator(device="cpu").manual_seed(case.seed)
    test_dtype = torch_dtype(case.dtype)
    out: dict[str, torch.Tensor] = {}
    for i, (name, tensor) in enumerate(spec.inputs.items()):
        shape = shape_of(tensor, case.dims)
        dtype = torch_dtype(tensor.dtype) if tensor.dtype else test_dtype
        if dtype.is_floating_point:
            values = torch.randn(shape, generator=gen, dtype=torch.float32)
            values *= value_scale(name, tensor, case.dims, first=(i == 0), amplitude=case.amplitude)
            big = torch.finfo(dtype).max
            values.clamp_(-big, big)
            if case.special and tensor.special and values.numel():
                n_special = 1 + values.numel() // 1024
                where = torch.randint(values.numel(), (n_special,), generator=gen)
                which = torch.randint(len(SPECIAL_VALUES), (n_special,), generator=gen)
                flat = values.view(-1)
                flat[where] = torch.tensor(SPECIAL_VALUES, dtype=torch.float32)[which]
        else:
            values = torch.randint(-8, 9, shape, generator=gen, dtype=torch.int64)
        storage = _strided_storage(shape, case.layouts.get(name, "contiguous"), dtype, device)
        storage.copy_(values.to(dtype))
        out[name] = storage
    return out
