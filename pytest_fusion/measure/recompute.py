"""Fresh inputs while timing, and the check that the kernel recomputed.

A kernel that returns a result cached from earlier inputs would be timed doing nothing. So the
timed calls rotate through several input sets (:class:`InputSets`, copied into the very tensors the
providers read, outside the timed span), and after the rounds :data:`VERIFIED_CALLS` consecutive
timed calls, each on the next set, are held against golden on their set (:func:`check_recomputed`,
through :func:`golden_verifier`): every one must be as close as the kernel's best, so a kernel
stale on every other call (or every third) fails too.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping, Sequence

INPUT_SETS = 3
"""Input sets a case rotates through while it is timed (:class:`InputSets`): the original values
and two more. Two would do to defeat a cached result; the third keeps a kernel from passing by
alternating between two cached results."""

VERIFIED_CALLS = INPUT_SETS + 1
"""Consecutive timed calls verified after the rounds, on sets 1, 2, 0, 1: a kernel stale on one
call in k is caught for k up to this many, where one verified call may fall on a fresh one
(docs/timing-and-gate.md, "Fresh inputs and the recompute check")."""

RECOMPUTE_SLACK = 4.0
"""How much larger than the kernel's best error against golden (the least over the verified calls
and a fresh call on copies) each verified output's may be: the same kernel on the same values
differs only by its own nondeterminism (atomics), while a stale output computed from other values
is off by the size of the values themselves (relative error ~1). The best, not the fresh call's
alone: a kernel stale on alternate calls makes its fresh call the stale one when the parity falls
so, and a stale error as the scale would let every stale output through."""

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
        self.loads = 0
        self.varied = False

    def __len__(self) -> int:
        return len(self.sets)

    def load(self, i: int, force: bool = False, shift: int = 0) -> None:
        """Copy set ``i % len(self)`` into the buffers (no-op when it is already there, unless
        ``force`` or :attr:`refresh`: a kernel that writes into its inputs, as Liger's GLU
        backward does, leaves other values there; or the last load was rolled). ``shift``: each
        floating tensor's values rolled by that many places (flattened order, :meth:`advance`)."""
        import torch

        i %= len(self.sets)
        if i == self.current and not (force or self.refresh or self.varied or shift):
            return
        rolled = False
        for b, v in zip(self.buffers, self.sets[i], strict=True):
            if hasattr(b, "copy_") and hasattr(v, "shape"):
                if shift and v.is_floating_point() and v.numel() > 1:
                    v, rolled = torch.roll(v, shift % v.numel()), True
                b.detach().copy_(v)
        self.current, self.varied = i, rolled

    def advance(self, vary: bool = False) -> None:
        """Load the next set; with ``vary``, its floating tensors' values rolled by the count of
        varied loads so far.

        Why (the CPU timer's per-call loads vary): a kernel that memoizes its result by the input
        values (a checksum of a few elements) returns the right result for each of three fixed
        sets without computing it. Rolled, set ``i``'s values come back in the same places only
        after as many loads as the tensor has elements, so such a memo would have to hold that many
        results (docs/timing-and-gate.md, "Fresh inputs and the recompute check")."""
        shift = 0
        if vary:
            shift, self.loads = self.loads, self.loads + 1
        self.load(self.current + 1, shift=shift)


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


def check_recomputed(timed_errors: Sequence[tuple[int, float]], fresh_error: float) -> None:
    """Raise :class:`NotRecomputed` unless every timed output's error is within
    :data:`RECOMPUTE_SLACK` times the kernel's best (the least of ``fresh_error``, a call on copies
    of the first verified set, and the timed errors), or :data:`RECOMPUTE_FLOOR`.

    Args:
        timed_errors: ``(input set, relative error against that set's golden)`` of each verified
            timed call, in call order (:func:`relative_error`).
        fresh_error: the kernel called afresh on copies of the first verified set, against golden.
    """
    best = min([fresh_error, *(e for _, e in timed_errors)])
    allowed = max(RECOMPUTE_SLACK * best, RECOMPUTE_FLOOR)
    for k, (index, err) in enumerate(timed_errors, 1):
        if err > allowed:
            raise NotRecomputed(
                f"output not recomputed during timing: after input set {index} was copied into the "
                f"timed inputs, the kernel's output is off golden by {err:.3g} (relative, max abs; timed "
                f"call {k} of {len(timed_errors)} verified), its best call by {best:.3g}; a kernel that "
                f"returns a result cached from earlier inputs is timed doing nothing (its timing is not "
                f"judged or saved)")


class SubclassOutput(NotRecomputed):
    """The kernel returned a ``torch.Tensor`` subclass, whose values may be made when first read."""


def check_plain(out: Any) -> None:
    """Raise :class:`SubclassOutput` when an output tensor is a ``torch.Tensor`` subclass: its
    values can be computed when something first reads them, after the timed span, so its timing
    measures nothing (docs/timing-and-gate.md, "Fresh inputs and the recompute check")."""
    import torch

    for t in _flat(out):
        if isinstance(t, torch.Tensor) and type(t) is not torch.Tensor:
            raise SubclassOutput(
                f"output not timeable: the kernel returned a {type(t).__name__} (a torch.Tensor "
                f"subclass), whose values may be computed when first read, after the timed span; "
                f"benchmark a kernel that returns plain tensors")


def derived_sets(inputs: Sequence[Any], count: int = INPUT_SETS - 1, seed: int = 0) -> list[list[Any]]:
    """``count`` further input sets for a case given only one: each floating tensor's values
    shuffled (a seeded permutation of its elements), so every value and its distribution (signs,
    scale) stay as the caller made them while each element changes; other inputs are kept.
    A spec's case drawn by :func:`~pytest_fusion.bench.api.bench_case` draws its sets from its own
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
) -> Callable[[Sequence[tuple[int, Any]]], None]:
    """``verify`` for :func:`~pytest_fusion.measure.timing.measure`: each timed output (``(set index,
    outputs)`` pairs, in call order) against golden on its set, and a fresh call on copies of the
    first set (:func:`check_recomputed`)."""

    def fresh(values: Sequence[Any]) -> list[Any]:
        return [v.clone() if hasattr(v, "clone") else v for v in values]

    def verify(timed: Sequence[tuple[int, Any]]) -> None:
        goldens: dict[int, Any] = {}  # one reference call per set (the verified calls revisit set 1)

        def golden(index: int) -> Any:
            if index not in goldens:
                goldens[index] = reference(*fresh(sets.sets[index]), **constants)
            return goldens[index]

        errors = [(index, relative_error(out, golden(index))) for index, out in timed]
        first = timed[0][0]
        again = kernel(*fresh(sets.sets[first]), **constants)
        check_recomputed(errors, relative_error(again, golden(first)))

    return verify
