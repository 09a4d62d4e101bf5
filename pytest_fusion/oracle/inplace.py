"""In-place kernels: the inputs a spec lets a kernel write into (``fused_kernel(mutates=...)``).

Real rotary-embedding and fused add + RMSNorm kernels (vLLM's ``rotary_embedding`` and
``fused_add_rms_norm``) write their results into their inputs and return None. The oracle
accepts that when the spec names those inputs in ``mutates``:

- outputs: what the kernel returns; when it returns None, the final values of the ``mutates``
  inputs, in ``mutates`` order (:func:`with_outputs`). The reference is read the same way, on
  copies, so an out-of-place eager reference that returns the new q and k serves an in-place
  kernel that overwrites q and k;
- each kernel call gets its own copy of every ``mutates`` input (:func:`fresh_copies`: the whole
  allocation, guard bands and layout gaps included), so the second call sees the values the first
  one saw, and a write outside the copy's elements is still an out-of-bounds write;
- a write into an input not named in ``mutates`` still fails (:mod:`pytest_fusion.oracle.hygiene`).

While timing, the bench reloads the inputs' values before every sample (``bench.recompute``), so
a kernel that overwrites its inputs never compounds its own results across rounds.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

from pytest_fusion.declare.spec import KernelSpec
from pytest_fusion.oracle.golden import as_tuple
from pytest_fusion.oracle.tensors import storage_bytes


def positions(spec: KernelSpec) -> tuple[int, ...]:
    """Indices, in call order, of the inputs ``spec.mutates`` names, in ``mutates`` order."""
    names = list(spec.inputs)
    return tuple(names.index(n) for n in spec.mutates)


def with_outputs(
    fn: Callable[..., Any], mutated: Sequence[int], copy: bool = False
) -> Callable[..., tuple[Any, ...]]:
    """``fn`` returning its outputs as a tuple: what it returns, or, when it returns None, its
    arguments at ``mutated`` after the call. ``copy``: call it on copies of those arguments (for
    the reference, whose golden run would otherwise write into an integer input it shares)."""

    def call(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
        args_ = list(args)
        if copy:
            for i in mutated:
                if isinstance(args_[i], torch.Tensor):
                    args_[i] = args_[i].clone()
        out = fn(*args_, **kwargs)
        if out is None:
            return tuple(args_[i] for i in mutated)
        return as_tuple(out)

    call.__name__ = getattr(fn, "__name__", "kernel")
    return call


def replica(t: torch.Tensor) -> torch.Tensor:
    """A copy of ``t`` in a copy of its whole allocation: same shape, strides and storage offset,
    guard bands and layout gaps holding the same bytes (what the hygiene checks compare)."""
    block = storage_bytes(t).clone()
    out = torch.empty(0, dtype=t.dtype, device=t.device)
    return out.set_(block.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def fresh_copies(inputs: Sequence[Any], mutated: Sequence[int]) -> list[Any]:
    """``inputs`` with each tensor at ``mutated`` replaced by its :func:`replica`."""
    return [replica(t) if i in mutated and isinstance(t, torch.Tensor) else t for i, t in enumerate(inputs)]
