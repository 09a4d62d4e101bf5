"""The reference's three runs on one case's inputs, which the oracle compares a kernel against.

Policy (docs/oracle.md#the-error-budget):

- golden: the reference run on the inputs upcast to float64;
- eager: the reference run in the test dtype, on a copy of the inputs, under :func:`ieee_precision`
  (IEEE fp32 matmul and convolution, no reduced-precision reductions, whatever the process set),
  so a process that lowered its own precision does not lower the bar;
- magnitude ``m``: the reference run in float64 on the inputs' absolute values. For a linear layer
  it is ``sum_k |x_k w_k| + |b|`` at each output element, the scale of a dot product's rounding
  error (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch

# Process-wide precision switches, through the fp32_precision API only (torch >= 2.9): mixing it
# with the legacy allow_tf32 / set_float32_matmul_precision API makes torch raise on the next read
# of a legacy flag. (backend module path, attribute) pairs; absent ones are skipped.
_FP32_PRECISION_LEAVES = (
    "cuda.matmul",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)
_REDUCED_PRECISION_FLAGS = (
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "cuda.matmul.allow_fp16_accumulation",
    "cpu.allow_fp16_reduced_precision_reduction",
)


def _backend(path: str) -> Any:
    obj: Any = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@contextlib.contextmanager
def ieee_precision() -> Iterator[None]:
    """Run the body with IEEE fp32 matmul and convolution (no TF32, no bf16 passes on oneDNN) and
    no reduced-precision reductions in fp16/bf16 GEMMs, whatever the process set; every setting is
    restored afterwards, also when the body raises.

    Uses ``torch.backends.<backend>.<op>.fp32_precision = "ieee"`` (torch >= 2.9) and the
    ``allow_*_reduced_precision_reduction`` / ``allow_fp16_accumulation`` flags where this torch has
    them; never the legacy ``allow_tf32`` / ``set_float32_matmul_precision``, whose mixing with the
    new API torch rejects.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for path in _FP32_PRECISION_LEAVES:
            leaf = _backend(path)
            if leaf is not None and hasattr(leaf, "fp32_precision"):
                saved.append((leaf, "fp32_precision", leaf.fp32_precision))
                leaf.fp32_precision = "ieee"
        for flag in _REDUCED_PRECISION_FLAGS:
            owner_path, name = flag.rsplit(".", 1)
            owner = _backend(owner_path)
            try:
                value = getattr(owner, name)
            except (AttributeError, RuntimeError):
                continue
            if isinstance(value, bool):
                saved.append((owner, name, value))
                setattr(owner, name, False)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


def as_tuple(out: Any) -> tuple[Any, ...]:
    """A reference's or kernel's return value as a tuple of outputs (a single output: a 1-tuple)."""
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def upcast(t: Any) -> Any:
    """Floating tensors to float64; anything else unchanged (integer weights stay integers)."""
    if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
        return t.detach().to(torch.float64)
    return t


def magnitudes(t: Any) -> Any:
    """|t| upcast like :func:`upcast`: the inputs of the magnitude run."""
    t = upcast(t)
    return t.abs() if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.is_signed()) else t


def run_reference(
    reference: Callable[..., Any], inputs: Sequence[Any], constants: Mapping[str, Any]
) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """golden (float64), eager (test dtype, under :func:`ieee_precision`, on copies of the inputs)
    and magnitude (float64 on |inputs|) outputs of ``reference``, each as a tuple."""
    golden = as_tuple(reference(*[upcast(t) for t in inputs], **constants))
    with ieee_precision():
        eager = as_tuple(
            reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs], **constants)
        )
    scale = as_tuple(reference(*[magnitudes(t) for t in inputs], **constants))
    return golden, eager, scale
