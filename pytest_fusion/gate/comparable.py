"""A stored baseline entry as the gate sees it (:class:`StoredCase`, :class:`StoredProvider`),
and whether it can judge this run at all: each check returns the failure reason (a stored entry
timed by another method, measured at other dims, or sharing no provider with this run) or None.
Pure functions, as :mod:`pytest_fusion.gate.rule`, which applies them.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from pytest_fusion.measure.stats import Speedup
from pytest_fusion.measure.timers import CPU_CLOCKS

DEFAULT_METHOD = "cuda-graph"
"""The timing method of a stored entry whose environment names none (files saved before the
method was recorded were all timed by CUDA-graph replay)."""

CPU_CLOCK_OF_METHOD = {clock.__name__: name for name, clock in CPU_CLOCKS.items()}
"""The ``--fusion-cpu-clock`` value behind each method a CPU timing records (its clock's name)."""

MEMSET_FLUSH_METHODS = frozenset({"cuda-graph", "cuda-sync"})
"""The GPU methods of the timer's earlier L2 flush, a 256 MB memset, which timed the write-back of
the L2's dirty lines inside every span (``measure.timers.GRAPH_METHOD`` says why)."""


@dataclasses.dataclass(frozen=True)
class StoredProvider:
    """One provider of a stored case: its median time (ms), the kernel's speedup over it, and the
    speedup's stored 95% interval (None when the file has none)."""

    ms: float
    speedup: float
    low: float | None = None
    high: float | None = None
    rebased_ms: float | None = None
    """Set by ``gate.rule.rebase_builds``: the speedup and its interval are re-based onto this
    run's (faster) time of the provider, in ms; ``ms`` stays the stored time."""

    @property
    def kernel_ms(self) -> float:
        """The kernel's median (ms) that this speedup was measured against: ``speedup`` is
        provider ms / kernel ms of the medians, so the file holds it as ``ms / speedup`` (to its
        5 significant digits). The entry's own ``kernel_ms`` unless a later save that did not
        time this provider kept it (``baselines.store.merge_entry``): then that of the older kernel."""
        return (self.ms if self.rebased_ms is None else self.rebased_ms) / self.speedup


@dataclasses.dataclass(frozen=True)
class StoredCase:
    """A baseline entry: the kernel's median ms, each provider's, and the environment it ran in."""

    kernel_ms: float
    providers: Mapping[str, StoredProvider]
    env: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    dims: Mapping[str, int] | None = None
    """The sizes the entry was measured at (None: not recorded, not checked)."""
    accuracy: Mapping[str, Any] | None = None
    """``{"budget_used", "ulps"}`` of the kernel that was saved (``drift.Accuracy``; None: the
    entry predates the figure, and its case is gated on speed alone)."""
    cold_start: Mapping[str, Any] | None = None
    """``{provider: {"cold_s", "warm_s"}}`` of the kernel that was saved (``gate.cold_start``; None:
    saved without ``--fusion-cold-start``)."""


def method_mismatch(stored: StoredCase | None, method: str | None) -> str | None:
    """The reason a stored entry timed by another method cannot judge this run (None: same
    method, or either unknown). A missing stored method means :data:`DEFAULT_METHOD`."""
    if stored is None or method is None:
        return None
    then = str(stored.env.get("method") or DEFAULT_METHOD)
    if then == method:
        return None
    why = (
        "its L2 flush was a memset whose write-back fell inside every timed span; this run's flush "
        "leaves the L2 clean" if then in MEMSET_FLUSH_METHODS and method not in MEMSET_FLUSH_METHODS
        else "speedups taken with different clocks or synchronisation differ by more than a regression"
    )
    clock = CPU_CLOCK_OF_METHOD.get(then)
    fix = (f"run with --fusion-cpu-clock={clock} to compare against it, or re-save it with --fusion-save"
           if clock and method in CPU_CLOCK_OF_METHOD else "re-save it with --fusion-save")
    return f"not comparable: the baseline entry was timed by {then}, this run by {method} ({why}); {fix}"


def method_checked(stored: StoredCase | None, method: str | None) -> str | None:
    """``method`` as the gate checks it against ``stored`` (:func:`method_mismatch`): None for a
    stored case with no environment at all (built by hand, not read from a file), which says
    nothing of its method; a file's entry always has one, and lacking "method" there means
    :data:`DEFAULT_METHOD`."""
    return method if stored is None or stored.env else None


def dims_mismatch(stored_dims: Mapping[str, int] | None, dims: Mapping[str, int] | None) -> str | None:
    """The reason a stored entry measured at ``stored_dims`` cannot judge a case run at ``dims``,
    or None when they agree (or either is unknown)."""
    if stored_dims is None or dims is None or dict(stored_dims) == dict(dims):
        return None

    def show(d: Mapping[str, int]) -> str:
        return "{" + ", ".join(f"{k}={v}" for k, v in sorted(d.items())) + "}"

    return (
        f"the baseline entry was measured at dims {show(stored_dims)} but this case now runs at "
        f"{show(dims)}: not compared (a reshaped case judged against another shape's speedups would "
        f"hide or invent regressions); re-save it with --fusion-save"
    )


def not_comparable(measured: Mapping[str, Speedup], stored: StoredCase | None) -> str | None:
    """The failure reason when this run's speedups cannot be judged against ``stored`` at all, or
    None when at least one provider can.

    ``measured`` empty (``--fusion-providers kernel``): no speedup exists to judge, stored entry
    or not. ``stored`` with providers, none of them in ``measured``: the gate has nothing to
    compare (a baseline of eager only, a run timing compile only). A stored entry with no
    providers (written before saves refused them) compares nothing either.
    """
    if not measured:
        return (
            "not comparable: no provider was timed beside the kernel, so there is no speedup to "
            "gate; time at least one of eager, compile or the marker's providers (--fusion-providers)"
        )
    if stored is None:
        return None
    if any(p in measured for p in stored.providers):
        return None
    have = ", ".join(sorted(stored.providers)) or "none"
    return (
        f"not comparable: the baseline has speedups over {have}, this run timed "
        f"{', '.join(sorted(measured))}; time one of the stored providers (--fusion-providers), "
        f"or re-save the case with --fusion-save"
    )
