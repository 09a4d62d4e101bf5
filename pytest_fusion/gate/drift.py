"""Accuracy drift: how much of its error budget a bench case's kernel used, and the gate's rule on
its growth against the figure stored in the baseline file.

The figure (``budget_used``) is the worst ``abs_error / budget`` over every floating-point output
of the oracle's check of the case's timed inputs (``bench.api.bench_case`` draws them and checks
them once before timing), with the worst error in ulps of the output dtype beside it. A passing kernel
has ``budget_used <= 1``; a retune to a config with another summation order, or a cheaper
activation, raises it long before it reaches 1, and the gate fails the case when it grows past
:data:`DRIFT_FACTOR` times the stored figure. Pure functions: no torch, no I/O.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Iterable, Mapping

DRIFT_FACTOR = 1.5
"""A case fails when its ``budget_used`` exceeds this many times the stored one (or
:data:`DRIFT_FLOOR`, whichever is larger): above what the figure of an unchanged kernel with a
random summation order moved, below the 2x of a kernel whose error doubles
(docs/timing-and-gate.md, "Accuracy drift")."""

DRIFT_FLOOR = 0.01
"""Stored figures below this fraction of the budget are judged against it instead: a kernel that
rounds exactly like golden stores ~0, and any later last-bit difference would be an infinite
"growth" while still using a hundredth of the budget; below it a figure's spread from one summation
order to another is of errors too small to matter (docs/timing-and-gate.md, "Accuracy drift")."""

UNSTORED_NOTE = (
    "accuracy drift not judged for cases whose baseline entry has no accuracy figure (saved before "
    "it was recorded); --fusion-save records it"
)
"""The note of a case stored without the figure (the summary shows it once, not per case)."""


@dataclasses.dataclass(frozen=True)
class Accuracy:
    """How much of its error budget a kernel used on one bench case.

    Attributes:
        budget_used: worst ``abs_error / budget`` over the outputs (0 = exact, 1 = at the budget).
        ulps: worst error in ulps of the output dtype (None when no output reports one).
    """

    budget_used: float
    ulps: float | None = None

    def to_dict(self) -> dict[str, float | None]:
        return {"budget_used": self.budget_used, "ulps": self.ulps}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> Accuracy | None:
        """None for None (a record or entry without the figure)."""
        if d is None:
            return None
        ulps = d.get("ulps")
        return cls(float(d["budget_used"]), None if ulps is None else float(ulps))


def usage(comparisons: Iterable[Any]) -> Accuracy | None:
    """The :class:`Accuracy` of ``budget.Comparison`` objects (one per output and call); None
    when no output is floating point with a positive budget (integer outputs must be exact)."""
    ratios, ulps = [], []
    for c in comparisons:
        if c.abs_error is None or not c.budget:
            continue
        ratios.append(c.abs_error / c.budget)
        if c.ulps is not None:
            ulps.append(c.ulps)
    if not ratios:
        return None
    return Accuracy(max(ratios), max(ulps) if ulps else None)


def drift_verdict(
    now: Accuracy | None, *, stored: Accuracy | None, factor: float = DRIFT_FACTOR
) -> tuple[list[str], list[str]]:
    """``(reasons, notes)`` of the drift rule: a failure when ``now.budget_used`` exceeds
    ``factor`` times ``max(stored, DRIFT_FLOOR)``; a note of any growth short of that; the
    :data:`UNSTORED_NOTE` when only ``now`` has the figure; nothing when ``now`` has none."""
    if now is None:
        return [], []
    if stored is None:
        return [], [UNSTORED_NOTE]
    base = max(stored.budget_used, DRIFT_FLOOR)
    growth = now.budget_used / base
    if growth <= 1.0:
        return [], []
    ulps = (
        "" if now.ulps is None or stored.ulps is None
        else f"; worst error {now.ulps:.3g} ulps (was {stored.ulps:.3g})"
    )
    floor = f" (taken as the floor {DRIFT_FLOOR:g})" if stored.budget_used < DRIFT_FLOOR else ""
    text = (
        f"the kernel used {now.budget_used:.2f} of its error budget, {growth:.1f}x the stored "
        f"{stored.budget_used:.2f}{floor}{ulps}"
    )
    if growth > factor:
        return [
            f"accuracy drift: {text} (> {factor:g}x, still inside the budget: a retune to another "
            f"summation order or a cheaper activation?); re-save with --fusion-save if intended"
        ], []
    return [], [f"accuracy: {text} (fails past {factor:g}x)"]
