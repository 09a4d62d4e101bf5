"""Cold start: the seconds of a bench case's first calls in fresh processes, and the gate's rule
on the kernel's growth against the figures stored in the baseline file.

The figures (``plugin.cold_start`` measures them; ``BenchRecord.cold_start``, the entry's
``cold_start``): per provider ``{"cold_s", "warm_s"}``, the first call in a fresh process with
empty Triton and Inductor caches (cold: compile, autotune) and in the next fresh process, whose
caches the first filled (warm: what every later process pays). The rule judges the kernel's two
figures alone: eager's and torch.compile's first calls move with torch, not with the kernel
under test, and are stored for the reader. Pure functions: no torch, no I/O.

A figure fails when it exceeds the stored one by more than the tolerance (``--fusion-cold-start-
tolerance``, default :data:`COLD_START_TOLERANCE`) and by more than :data:`COLD_START_FLOOR_S`.
"""

from __future__ import annotations

from typing import Any, Mapping

COLD_START_TOLERANCE = 0.25
"""Default fraction a cold or warm start may grow past the stored one: a first call is one sample
(no rounds, no interval), of a compile whose seconds move with the machine's load, so the bar is
far looser than the speedups' 5%."""

COLD_START_FLOOR_S = 1.0
"""Seconds a figure may grow whatever the tolerance: a warm start of a few tenths of a second
doubles with a page-cache miss or a busy CPU, which is no regression a user meets."""

GATED = "kernel"
"""The provider whose figures the rule judges."""

FIGURES = ("cold_s", "warm_s")

UNSTORED_NOTE = (
    "cold start not judged for cases whose baseline entry has no cold-start figure (saved without "
    "--fusion-cold-start); --fusion-save --fusion-cold-start records it"
)


def cold_start_verdict(
    now: Mapping[str, Mapping[str, float]] | None, *, stored: Mapping[str, Any] | None,
    tolerance: float = COLD_START_TOLERANCE, floor_s: float = COLD_START_FLOOR_S,
) -> tuple[list[str], list[str]]:
    """``(reasons, notes)`` of the rule on the :data:`GATED` provider's figures: a reason for each of
    ``cold_s``/``warm_s`` above ``stored * (1 + tolerance)`` and ``stored + floor_s``; a note of
    any growth short of that; :data:`UNSTORED_NOTE` when only ``now`` has the figures; nothing
    when ``now`` has none (not measured)."""
    mine = (now or {}).get(GATED)
    if not mine:
        return [], []
    then = (stored or {}).get(GATED)
    if not then:
        return [], [UNSTORED_NOTE]
    reasons, notes = [], []
    for fig in FIGURES:
        if mine.get(fig) is None or then.get(fig) is None:
            continue
        s, base = float(mine[fig]), float(then[fig])
        if s <= base:
            continue
        limit = max(base * (1 + tolerance), base + floor_s)
        what = "cold start (empty Triton and Inductor caches)" if fig == "cold_s" else "warm start"
        text = f"kernel {what} {s:.3g} s, stored {base:.3g} s"
        if s > limit:
            reasons.append(f"{text}: above {limit:.3g} s (+{tolerance:.0%}, at least +{floor_s:g} s); "
                           "re-save with --fusion-save --fusion-cold-start if intended")
        else:
            notes.append(f"{text} (fails above {limit:.3g} s)")
    return reasons, notes
