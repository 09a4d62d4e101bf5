"""Slow-shape search: Hypothesis looks over a spec's declared dims for the shape with the lowest
speedup over each provider, then shrinks it to the smallest shape that is as slow, for a ``bench=``
entry to add (``pytest --fusion-explore``; docs/timing-and-gate.md, "Slow-shape search").

    result = explore(spec, kernel, "float16", device="cuda", timer=timer, budget_s=60)
    print("\\n".join(result.lines()))

How it goes, within a time budget and a cap on new shapes:

1. **Search.** A Hypothesis run draws dims with the oracle's own strategy (``strategies.dims``:
   edge tiers and uniform values in the declared ranges, capped as the oracle caps them), times
   each new shape through the bench path (:func:`pytest_fusion.bench.api.bench_case`: checked on its
   inputs first, then timed against every provider) and steers with ``hypothesis.target`` towards
   a low speedup over each provider, for up to :data:`SEARCH_SHARE` of the budget.
2. **Re-measure.** Per provider, the :data:`CANDIDATES` shapes with the lowest speedup are timed
   :data:`REMEASURES` more times each; the worst is the one with the lowest median, and
   ``threshold = its median x (1 + margin)`` (:data:`EXPLORE_MARGIN`).
3. **Shrink.** The search runs again with the same seed: it replays the same shapes (timed once
   already, so free) and a shape counts as a failure when it is as slow as the worst, which makes
   Hypothesis shrink it to the smallest such shape. A candidate passes as "as slow" only when its
   first timing and the median of it and :data:`REMEASURES` re-timings are at most the threshold, so a
   lucky sample cannot move the search to a shape that is not slow; each shape's verdict is kept,
   so Hypothesis' replay of the shrunk shape sees the same answer.

New shapes are not free: each costs the oracle's check (a float64 golden), a fresh
``torch.compile`` of the reference (``measure.providers.make_compiled`` resets Dynamo and compiles
static shapes) and, for a kernel that tunes per shape (the reference kernels tune each untabled
power-of-two bucket once per machine, into their tuning cache), a tune. None of it is in a speedup
(the first call and the warm-up are outside the timed rounds, ``measure.timing.measure``), all of it
counts against the budget (wall time around each shape), and :attr:`ExploreResult.cold_s` sums the
first timed calls' seconds (the compiles; a kernel's own tune or JIT happens at its first call, in
the oracle's check before timing, inside the total but not in this figure).
"""

from __future__ import annotations

import dataclasses
import math
import statistics
import time
from typing import Any, Callable, Mapping

from hypothesis import HealthCheck, Phase, given, seed, settings, target

from pytest_fusion.bench.api import bench_case
from pytest_fusion.bench.timed_case import BenchSettings
from pytest_fusion.declare.spec import EXPLORE_BUDGET_S, EXPLORE_EXAMPLES, BenchCase, KernelSpec
from pytest_fusion.oracle.failures import FusionFailure
from pytest_fusion.property.examples import check_fits
from pytest_fusion.property.strategies import dims as dims_strategy

EXPLORE_MARGIN = 0.05
"""A shrink candidate is "as slow" as the worst when the median of its timings is at most the
worst's median x (1 + this): above what a median of 3 timings of one shape moved, and the gate's
own tolerance (docs/timing-and-gate.md, "Slow-shape search", its "Noise"). A shape's first timing
must also be under the threshold: a high first timing can only make the shrink keep a larger shape,
and a low one alone accepts nothing (the median decides).
Measure the GPU's figure before changing it: the worst shape's three timings are printed."""

_DEFAULT_SETTINGS = BenchSettings()
"""``explore``'s default bench settings (one frozen instance, as in ``bench.api``)."""

REMEASURES = 2
"""Extra timings of a shape before it counts as slow (its speedup: the median of all of them)."""

SEARCH_SHARE = 0.5
"""Share of the budget the search may use; the rest is kept for re-timing and shrinking, which
would otherwise get nothing whenever the search alone could use up the budget (on a GPU, where a
new shape's compile and tune take seconds)."""

CANDIDATES = 3
"""Shapes with the lowest first timing re-timed to choose the worst (see ``_worst``)."""


@dataclasses.dataclass
class Worst:
    """The slowest shape found for one provider: ``dims``, the median ``speedup`` of ``samples``
    (each timing's speedup), where the search first found it (``found``, ``found_speedup``) and
    whether it was shrunk (else ``why_not`` says why) and whether the time budget cut the shrink
    short (``cut``)."""

    provider: str
    dims: dict[str, int]
    speedup: float
    samples: list[float]
    found: dict[str, int]
    found_speedup: float
    shrunk: bool = False
    why_not: str = ""
    cut: bool = False

    def how(self) -> str:
        """How ``dims`` came from ``found``: shrunk, not shrunk and why, or cut by the budget."""
        if not self.shrunk:
            return f"not shrunk: {self.why_not}"
        cut = "; the time budget ran out while shrinking" if self.cut else ""
        if self.found == self.dims:
            return f"no smaller shape as slow found{cut}"
        return f"shrunk from {_dims_text(self.found)} ({self.found_speedup:.3f}x){cut}"

    def bench_entry(self) -> str:
        """A ready-to-paste marker argument, e.g. ``bench={"explore-M100-K1-N1": dict(M=100, K=1, N=1)}``."""
        name = "explore-" + "-".join(f"{k}{v}" for k, v in self.dims.items())
        args = ", ".join(f"{k}={v}" for k, v in self.dims.items())
        return f'bench={{"{name}": dict({args})}}'


@dataclasses.dataclass
class ExploreResult:
    """What :func:`explore` found: the worst shape per provider, the new shapes timed, seconds spent,
    the budget, whether it ran out (the search's share or the whole), the first-call seconds of the
    timed shapes (compiles, tunes, JIT), a correctness failure at a drawn shape, if any (the search
    stops there), and notes on the budget for the terminal."""

    worst: dict[str, Worst]
    shapes: int
    seconds: float
    budget_s: float
    out_of_budget: bool
    cold_s: float
    margin: float
    failure: str | None = None
    notes: list[str] = dataclasses.field(default_factory=list)

    def lines(self) -> list[str]:
        """The terminal lines: a header, then per provider its worst shape and bench entry."""
        head = (f"{self.shapes} shape(s) timed in {self.seconds:.1f} s of a {self.budget_s:g} s budget "
                f"({self.cold_s:.1f} s of it first timed calls, e.g. compiles; in no speedup)")
        out = [head]
        out += self.notes
        if self.failure:
            first = self.failure.splitlines()[0] if self.failure.strip() else self.failure
            out.append(f"stopped: the kernel fails its correctness check at a drawn shape: {first}")
        for w in self.worst.values():
            timings = ", ".join(f"{s:.3f}" for s in w.samples)
            out.append(f"vs {w.provider}: worst {w.speedup:.3f}x at {_dims_text(w.dims)} "
                       f"(median of {timings}; {w.how()}; margin {self.margin:.0%})")
            out.append(f"  {w.bench_entry()}")
        return out


def _dims_text(dims: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in dims.items())


class _Slow(Exception):
    """Raised inside the shrink run for a shape as slow as the worst (Hypothesis shrinks it)."""


@dataclasses.dataclass
class _Search:
    """The search's state: one timing function, the budget, the cap on new shapes, the timings and
    verdicts kept per shape (so that every replay of a shape sees the same numbers)."""

    time_shape: Callable[[dict[str, int]], dict[str, float]]
    deadline: float
    margin: float
    # {shape: its timings' speedups per provider, first timing first}; {(shape, provider): slow?}
    timings: dict[tuple[tuple[str, int], ...], list[dict[str, float]]] = dataclasses.field(
        default_factory=dict)
    verdicts: dict[tuple[Any, str], bool] = dataclasses.field(default_factory=dict)
    shapes: int = 0
    cap_left: int = 0
    out_of_budget: bool = False
    failure: str | None = None
    error: Exception | None = None

    def _timed(self, dims: dict[str, int]) -> dict[str, float] | None:
        """One more timing of ``dims``' speedups, or None when the budget, a failure or (for a
        shape not timed yet) the cap on new shapes stops it."""
        key = tuple(dims.items())
        new = key not in self.timings
        if self.failure or (new and self.cap_left <= 0):
            return None
        if time.monotonic() >= self.deadline:
            self.out_of_budget = True
            return None
        try:
            speeds = self.time_shape(dims)
        except FusionFailure as exc:
            self.failure = str(exc)
            return None
        except Exception as exc:  # raised after the Hypothesis run, which would shrink it by timing
            self.error, self.failure = exc, f"{type(exc).__name__}: {exc}"
            return None
        if new:
            self.shapes += 1
            self.cap_left -= 1
        self.timings.setdefault(key, []).append(speeds)
        return speeds

    def first(self, dims: dict[str, int]) -> dict[str, float] | None:
        """The first timing of ``dims`` (timed now when new)."""
        runs = self.timings.get(tuple(dims.items()))
        return runs[0] if runs else self._timed(dims)

    def median(self, dims: dict[str, int], provider: str) -> tuple[float, list[float]] | None:
        """The median speedup over ``provider`` of ``dims``' first timing and :data:`REMEASURES`
        more (timed now where missing), and the timings' speedups; None when they could not all
        be taken."""
        runs = self.timings.get(tuple(dims.items()), [])
        while len(runs) < 1 + REMEASURES:
            if self._timed(dims) is None:
                return None
            runs = self.timings[tuple(dims.items())]
        found = [r[provider] for r in runs if provider in r]
        return (statistics.median(found), found) if len(found) == len(runs) else None

    def slow(self, dims: dict[str, int], provider: str, threshold: float) -> bool:
        """Whether ``dims`` is as slow as the worst over ``provider``: its first timing and the
        median of its re-timings at most ``threshold`` (decided once per shape)."""
        key = (tuple(dims.items()), provider)
        if key not in self.verdicts:
            first = self.first(dims)
            judged = None if first is None or first.get(provider, threshold + 1) > threshold else (
                self.median(dims, provider))
            self.verdicts[key] = judged is not None and judged[0] <= threshold
        return self.verdicts[key]


def _run(
    search: _Search, strategy: Any, seed_: int, max_examples: int,
    fail: Callable[[dict[str, int]], bool] | None = None,
) -> dict[str, int] | None:
    """One Hypothesis run over ``strategy`` (same seed, same examples every time): each shape's first
    timing steers it (``target``: minus the speedup, one label per provider); with ``fail``, the
    shrunk shape ``fail`` held for (None when none did)."""
    run_settings = settings(
        max_examples=max_examples,
        deadline=None,
        database=None,  # a search is not a failure to replay in the next run
        derandomize=False,  # the explicit seed below, so the shrink run replays the search
        phases=(Phase.generate, Phase.target, Phase.shrink),
        suppress_health_check=list(HealthCheck),
        print_blob=False,
        report_multiple_bugs=False,
    )

    @seed(seed_)
    @run_settings
    @given(dims=strategy)
    def explore_shapes(dims: dict[str, int]) -> None:
        speeds = search.first(dims)
        if speeds is None:
            return
        for provider in sorted(speeds):
            target(-speeds[provider], label=f"speedup over {provider}")
        if fail is not None and fail(dims):
            raise _Slow(dims)

    try:
        explore_shapes()
    except _Slow as exc:
        return dict(exc.args[0])
    return None


def _worst(search: _Search, provider: str) -> tuple[dict[str, int], float, tuple[float, list[float]] | None]:
    """Among the :data:`CANDIDATES` shapes with the lowest first timing over ``provider``, the one
    with the lowest median after re-timing (re-timing several keeps one lucky first timing from
    choosing it): its dims, first timing and (median, timings), the last None when out of budget."""
    firsts = sorted((runs[0][provider], k) for k, runs in search.timings.items() if provider in runs[0])
    best: tuple[dict[str, int], float, tuple[float, list[float]] | None] | None = None
    for first, key in firsts[:CANDIDATES]:
        judged = search.median(dict(key), provider)
        if best is None or (judged is not None and (best[2] is None or judged[0] < best[2][0])):
            best = (dict(key), first, judged)
    assert best is not None  # the caller asks only for providers with a timing
    return best


def _shrink(search: _Search, strategy: Any, seed_: int, max_examples: int, provider: str) -> Worst:
    """The worst shape over ``provider`` among those timed, re-timed, then shrunk (module docstring)."""
    found, first, judged = _worst(search, provider)
    if judged is None:
        why = ("the kernel failed at a drawn shape" if search.failure
               else "out of time budget before it was re-timed")
        return Worst(provider, found, first, [first], found, first, why_not=why)
    threshold = judged[0] * (1 + search.margin)
    search.verdicts[(tuple(found.items()), provider)] = True  # its median is the reference
    shrunk = _run(search, strategy, seed_, max_examples, fail=lambda d: search.slow(d, provider, threshold))
    if shrunk is None:
        why = "out of time budget" if search.out_of_budget else "the shrink run's replay did not reach it"
        return Worst(provider, found, judged[0], judged[1], found, first, why_not=why)
    # Hypothesis shrinks its choice sequence, not the dims' sizes: of every shape judged as slow,
    # report the one with the fewest elements (a shrunk shape's sizes may grow).
    slow = [dict(k) for (k, p), v in search.verdicts.items() if p == provider and v]
    shrunk = min([shrunk, *slow], key=lambda d: (math.prod(d.values()), tuple(d.values())))
    speedup, samples = search.median(shrunk, provider) or judged
    return Worst(provider, shrunk, speedup, samples, found, first, shrunk=True, cut=search.out_of_budget)


def explore(
    spec: KernelSpec, kernel: Callable[..., Any], dtype: str, *, device: str, timer: Any,
    settings_: BenchSettings = _DEFAULT_SETTINGS, budget_s: float = EXPLORE_BUDGET_S,
    max_shapes: int = EXPLORE_EXAMPLES, margin: float = EXPLORE_MARGIN, max_dim: int | None = None,
    max_elements: int | None = None, seed_: int = 0, kernel_id: str | None = None,
) -> ExploreResult:
    """Search ``spec``'s declared dims for the shape with the lowest speedup of ``kernel`` over each
    provider in ``dtype`` and shrink it (module docstring).

    Args:
        device, timer: where and how each shape is timed (``bench.api.bench_case``'s).
        settings_: the bench settings (rounds, time floor, warm-up, providers, compile mode).
        budget_s: seconds for the whole search, shrinks included (checked before each timing).
        max_shapes: most new shapes timed by the search, and again by the shrinks.
        margin: see :data:`EXPLORE_MARGIN`.
        max_dim, max_elements: the oracle's caps on drawn dims (``check.size_limits``).
        seed_: Hypothesis' seed (the same seed draws the same shapes).

    Returns:
        An :class:`ExploreResult`; a provider never timed has no entry in ``worst``.

    Raises:
        ValueError: bad settings, or a timer returning times no timer can produce.
        pytest_fusion.FusionUsageError: on a GPU, declared dims whose largest shape, which the search
            may draw, cannot fit there (:func:`~pytest_fusion.property.examples.check_fits`).
    """
    check_fits(spec, device, max_dim=max_dim, max_elements=max_elements)
    start = time.monotonic()
    cold = [0.0]

    def time_shape(dims: Mapping[str, int]) -> dict[str, float]:
        rec = bench_case(spec, kernel, BenchCase("explore", dict(dims), (dtype,)), dtype, settings=settings_,
                         device=device, timer=timer, kernel_id=kernel_id)
        cold[0] += sum(p.cold_start_s for p in rec.providers.values())
        return {p: r.speedup for p, r in rec.providers.items() if p != "kernel" and r.speedup is not None}

    search = _Search(time_shape, start + budget_s * SEARCH_SHARE, margin, cap_left=max_shapes)
    order = list(spec.dims)  # one key order per shape, the declaration's, for the kept timings
    strategy = dims_strategy(spec, max_dim=max_dim, max_elements=max_elements).map(
        lambda d: {s: d[s] for s in order})
    _run(search, strategy, seed_, max_shapes)
    if search.error is None:
        worst, notes = _shrink_all(search, strategy, seed_, max_shapes, start + budget_s, budget_s)
    if search.error is not None:
        raise search.error
    return ExploreResult(worst, search.shapes, time.monotonic() - start, budget_s, bool(notes), cold[0],
                         margin, search.failure, notes)


def _shrink_all(
    search: _Search, strategy: Any, seed_: int, max_shapes: int, deadline: float, budget_s: float
) -> tuple[dict[str, Worst], list[str]]:
    """After the search: each provider's worst, re-timed and shrunk (:func:`_shrink`) with a fresh
    cap on new shapes until ``deadline``, and notes on the budget (none when it sufficed)."""
    notes = []
    if search.out_of_budget:
        notes.append(f"the search stopped at its share of the budget ({SEARCH_SHARE:.0%})" if search.shapes
                     else f"ran out of the time budget ({budget_s:g} s) before timing any shape")
    providers = sorted({p for runs in search.timings.values() for p in runs[0]})
    search.cap_left, search.deadline, search.out_of_budget = max_shapes, deadline, False
    worst = {p: _shrink(search, strategy, seed_, max_shapes, p) for p in providers}
    if search.out_of_budget:
        notes.append(f"ran out of the time budget ({budget_s:g} s) re-timing and shrinking")
    return worst, notes
