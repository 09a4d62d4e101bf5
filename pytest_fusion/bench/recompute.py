"""Fresh inputs while timing, and the check that the kernel recomputed (issue 18).

A kernel that returns a result cached from earlier inputs would be timed doing nothing. So the
timed calls rotate through several input sets (:class:`InputSets`, copied into the very tensors the
providers read, outside the timed span), and after the rounds the kernel's output on one rotated
set is held against golden on that set (:func:`check_recomputed`, through :func:`golden_verifier`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

INPUT_SETS = 3
"""Input sets a case rotates through while it is timed (:class:`InputSets`): the original values
and two more. Two would do to defeat a cached result; the third keeps a kernel from passing by
alternating between two cached results."""

RECOMPUTE_SLACK = 4.0
"""How much larger than a fresh call's error against golden the timed output's may be: the same
kernel on the same values differs only by its own nondeterminism (atomics), while a stale output
computed from other values is off by the size of the values themselves (relative error ~1)."""

RECOMPUTE_FLOOR = 1e-2
"""Relative error against golden (max abs error / max abs golden) always accepted: far above any
dtype's rounding of a recomputed result (bf16: 4e-3 per op), far below a stale one's (~1)."""


class NotRecomputed(ValueError):
    """The kernel's output during timing did not follow its inputs (it replays a cached result)."""


class InputSets:
    """Fresh values for the tensors a case's providers were bound to.

    ``buffers`` are the very tensors the provider calls read (captured into CUDA graphs by
    address); :meth:`load` copies set ``i`` into them in place, outside any timed span. Set 0 is a
    copy of the buffers' values at construction, the values the providers were built, warmed and
    captured with. Non-tensor inputs (and tensors without a matching value) are left alone.

    Args:
        buffers: the inputs, in the order the providers take them.
        extra: further input sets, each shaped like ``buffers`` (tensors of the same shapes).
        refresh: the kernel writes into its inputs (a spec's ``mutates``): :meth:`load` copies
            the set in even when it is the one already there, so that every load restores the
            set's own values rather than what the last call left.

    Raises:
        ValueError: a set of another length, or a tensor of another shape.
    """

    def __init__(
        self, buffers: Sequence[Any], extra: Sequence[Sequence[Any]] = (), refresh: bool = False
    ) -> None:
        self.refresh = refresh
        self.buffers = list(buffers)
        self.sets: list[list[Any]] = [[_clone(b) for b in self.buffers]]
        for k, values in enumerate(extra):
            values = list(values)
            if len(values) != len(self.buffers):
                raise ValueError(
                    f"input set {k + 1} has {len(values)} inputs, the case has {len(self.buffers)}"
                )
            for b, v in zip(self.buffers, values, strict=True):
                if hasattr(b, "copy_") and tuple(getattr(v, "shape", ())) != tuple(b.shape):
                    raise ValueError(f"input set {k + 1}: shape {tuple(getattr(v, 'shape', ()))} "
                                     f"differs from the case's {tuple(b.shape)}")
            self.sets.append(values)
        self.current = 0

    def __len__(self) -> int:
        return len(self.sets)

    def load(self, i: int, force: bool = False) -> None:
        """Copy set ``i % len(self)`` into the buffers (no-op when it is already there, unless
        ``force`` or :attr:`refresh`: a kernel that writes into its inputs, as Liger's GLU
        backward does, leaves other values there)."""
        i %= len(self.sets)
        if i == self.current and not (force or self.refresh):
            return
        for b, v in zip(self.buffers, self.sets[i], strict=True):
            if hasattr(b, "copy_") and hasattr(v, "shape"):
                b.detach().copy_(v)
        self.current = i

    def advance(self) -> None:
        """Load the next set."""
        self.load(self.current + 1)


def _clone(x: Any) -> Any:
    return x.detach().clone() if hasattr(x, "clone") else x


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out] if hasattr(out, "shape") else []


def relative_error(out: Any, golden: Any) -> float:
    """``max |out - golden| / max |golden|`` over all output tensors, in float32 on their device
    (a 8192 x 14336 output would take 0.9 GB per copy in float64 on the host), inf on a shape
    mismatch or a non-finite difference where golden is finite."""
    import torch

    a, g = _flat(out), _flat(golden)
    if len(a) != len(g):
        return math.inf
    err, scale = 0.0, 0.0
    for x, y in zip(a, g, strict=True):
        if tuple(x.shape) != tuple(y.shape):
            return math.inf
        x64, y64 = x.detach().to(torch.float32), y.detach().to(device=x.device, dtype=torch.float32)
        finite = torch.isfinite(y64)
        if finite.any():
            diff = (x64 - y64)[finite].abs()
            err = max(err, float(diff.max()) if diff.numel() else 0.0)
            if not math.isfinite(err):
                return math.inf
            scale = max(scale, float(y64[finite].abs().max()))
    return err / scale if scale > 0 else err


def check_recomputed(timed: Any, fresh: Any, golden: Any, set_index: int) -> None:
    """Raise :class:`NotRecomputed` unless ``timed`` (the output of a timed call on input set
    ``set_index``) is as close to ``golden`` as ``fresh`` (the kernel called afresh on copies of
    that set): within :data:`RECOMPUTE_SLACK` times its error, or :data:`RECOMPUTE_FLOOR`."""
    e_timed, e_fresh = relative_error(timed, golden), relative_error(fresh, golden)
    if e_timed > max(RECOMPUTE_SLACK * e_fresh, RECOMPUTE_FLOOR):
        raise NotRecomputed(
            f"output not recomputed during timing: after input set {set_index} was copied into the "
            f"timed inputs, the kernel's output is off golden by {e_timed:.3g} (relative, max abs), a "
            f"fresh call on the same values by {e_fresh:.3g}; a kernel that returns a result cached "
            f"from earlier inputs is timed doing nothing (its timing is not judged or saved)")


def derived_sets(inputs: Sequence[Any], count: int = INPUT_SETS - 1, seed: int = 0) -> list[list[Any]]:
    """``count`` further input sets for a case given only one: each floating tensor's values
    shuffled (a seeded permutation of its elements), so every value and its distribution (signs,
    scale) stay as the caller made them while each element changes; other inputs are kept.
    A spec's case drawn by :func:`~pytest_fusion.runner.bench_case` draws its sets from its own
    strategy instead."""
    import torch

    out = []
    for k in range(count):
        g = torch.Generator().manual_seed(seed + 1 + k)
        row = []
        for t in inputs:
            if hasattr(t, "is_floating_point") and t.is_floating_point() and t.numel() > 1:
                perm = torch.randperm(t.numel(), generator=g).to(t.device)
                row.append(t.detach().reshape(-1)[perm].reshape(t.shape).clone())
            else:
                row.append(t)
        out.append(row)
    return out


def golden_verifier(
    kernel: Callable[..., Any], reference: Callable[..., Any], sets: InputSets, constants: Mapping[str, Any]
) -> Callable[[int, Any], None]:
    """``verify`` for :func:`~pytest_fusion.bench.timing.measure`: the timed output against golden
    on the same set."""

    def fresh(values: Sequence[Any]) -> list[Any]:
        return [v.clone() if hasattr(v, "clone") else v for v in values]

    def verify(index: int, timed: Any) -> None:
        timed = [t.detach().clone() for t in _flat(timed)]
        values = sets.sets[index]
        again = kernel(*fresh(values), **constants)
        golden = reference(*fresh(values), **constants)
        check_recomputed(timed, again, golden, index)

    return verify
