"""The performance gate: pure functions from measured and stored speedups to a verdict.

No I/O, no torch, no pytest. :class:`CaseGate` is a bench case's gate: it checks the tolerance
(the one place it is checked) and its :meth:`CaseGate.apply` computes the verdict of one
measurement, which the bench, the re-measure decision (:func:`needs_remeasure`) and a replay read.
The rule, for each provider ``p`` with a stored speedup ``S_p`` and a measured one ``s_p``
(``measure.stats.Speedup``) and a tolerance ``tol`` in [0, 1):

- **regression**: fail when ``s_p < S_p * (1 - tol)``, where ``S_p`` is the stored interval's
  low end when the file has one (:func:`stored_threshold`: the stored run's own spread). Exactly
  at the threshold passes. (A relative slack of :data:`EDGE_EPS` absorbs the last-bit rounding of
  ``S_p * (1 - tol)`` so that "at the threshold" means what it says.)
- **re-measure before failing**: a first measurement too noisy to judge or save, or whose verdict
  finds a speedup below a threshold or floor (:func:`needs_remeasure`), does not stand: the
  caller measures again in a fresh provider order with :data:`REMEASURE_FACTOR` times the rounds
  and judges that one, so variation between moments of a run (a neighbour's burst on a shared
  runner) must recur to fail a case.
- **got slower**: an interval wholly below the threshold fails as a regression however wide it is
  (:func:`wholly_below`); width alone never hides a slowdown.
- **not comparable**: a stored entry timed by another method (:func:`method_mismatch`) fails,
  naming both, like a reshaped one.
- **review**: a speedup above :data:`SUSPECT_FACTOR` times the stored one passes but is listed
  for a reviewer (:func:`suspicious`).
- **another build**: in the environment the entry was saved in, a torch.compile provider timed
  faster than its stored time is another build of the same code, not a faster baseline: the
  stored speedup is re-based onto this run's build, so the kernel's own time is what is judged
  (:func:`rebase_builds`). With torch, Triton, CUDA, the driver or the device changed, a faster
  compile is a faster baseline and fails as one.
- **floor**: fail when ``s_p < min_speedup[p]`` whatever the baseline.
- **noise**: a gated provider whose 95% interval is wider than the tolerance,
  ``(high - low) / s_p > tol``, cannot be judged; the caller re-measures with more rounds
  (:data:`REMEASURE_FACTOR` times) and, if still too wide, fails with that reason
  (:func:`noise_reasons`). The gate never passes a case because it was noisy.
- **new**: no stored entry: reported as new and passed, unless ``strict``.
- **not comparable**: a stored entry none of whose providers was timed in this run, or a run that
  timed no provider besides the kernel, fails: nothing was judged, and passing it would let a
  kernel of any speed through (:func:`not_comparable`).
- **reshaped**: a stored entry whose ``dims`` differ from this run's (the case was edited under
  the same name, or the file was) is not compared at all: the case fails, naming both dims and
  telling the user to re-save. Failing rather than noting it is deliberate: gating is the point of
  a bench run, and a regression hidden behind a stale entry is the failure the gate exists to
  prevent (``--fusion-save`` in the same run stores the new dims, so the next run passes).

A regression message says which side moved, with both times then and now. With two or more
providers gated the speedups decide (a slower kernel lowers every speedup; a faster baseline only
its own): the kernel is blamed when every provider's speedup fell beyond the tolerance, else the
provider. With one provider only absolute times can decide: kernel time now / then above 1 against
provider time now / then below 1, whichever moved further (log scale) -- weaker, since a machine's
speed drifts between runs, and the message says so (see :func:`blame`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from pytest_fusion.declare.spec import check_tolerance, compile_mode_of
from pytest_fusion.gate.comparable import (
    StoredCase,
    StoredProvider,
    dims_mismatch,
    method_checked,
    method_mismatch,
    not_comparable,
)
from pytest_fusion.measure.stats import Speedup
from pytest_fusion.measure.timers import GRAPH_METHOD, SYNC_METHOD

EDGE_EPS = 1e-9
"""Relative slack at the threshold (far below any timer's resolution)."""

REMEASURE_FACTOR = 4
"""A too-noisy case is re-measured with this many times the rounds: a bootstrap interval narrows
about as 1/sqrt(rounds), so 4x rounds halves its width."""

ENV_KEYS = ("device", "capability", "driver", "cuda", "torch", "triton", "method", "power_limit_w",
            "sm_clock_max_mhz")
"""Environment fields whose difference from the baseline's is shown beside a verdict (a note,
not a failure: a lower power limit slows a power-bound case, and the note says why)."""

SUSPECT_FACTOR = 2.0
"""A speedup above this many times the stored one is listed for a reviewer to confirm: a real
optimisation rarely doubles a tuned kernel's speedup, while a kernel that skips work (a cached
result, a dropped epilogue the oracle's shapes missed) does (docs/timing-and-gate.md, "Review")."""

BUILD_ENV_KEYS = ("device", "capability", "driver", "cuda", "torch", "triton", "method")
"""What decides the code torch.compile builds and how it is timed: where each of these is
recorded for the stored entry and equals this run's, a compile provider timed faster than its
stored time is another build of the same code (:func:`rebase_builds`)."""


@dataclasses.dataclass(frozen=True)
class Verdict:
    """Outcome of :func:`verdict`.

    Attributes:
        status: ``"pass"``, ``"fail"`` or ``"new"`` (no baseline; passes unless strict).
        reasons: why it failed, one line per broken rule (empty unless ``status == "fail"``).
        notes: information that does not fail the case (environment differences...).
        compared: the run was held to a stored entry of its dims and method sharing a provider
            (what rules on other stored figures, such as accuracy drift, may also judge).
        timing_only: it failed, and only on timing: speedups below their thresholds or floors,
            or intervals too noisy to judge (not a case without comparable providers, dims or
            method, nor a new case under ``strict``), so another process may not reproduce it.
        shortfalls: the speedups behind ``reasons`` that fell below their floor or threshold,
            one short line each (floors first): what another measurement could change
            (:func:`needs_remeasure`).
    """

    status: str
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    compared: bool = False
    timing_only: bool = False
    shortfalls: tuple[str, ...] = ()

    @property
    def failed(self) -> bool:
        return self.status == "fail"


def threshold(stored_speedup: float, tolerance: float) -> float:
    """Lowest passing speedup: ``stored_speedup * (1 - tolerance)``."""
    return stored_speedup * (1.0 - tolerance)


def below_threshold(speedup: float, limit: float) -> bool:
    """True when ``speedup`` is below ``limit`` (a :func:`threshold`) by more than the relative
    :data:`EDGE_EPS`: the gate's one below-threshold comparison, so a speedup at the limit passes."""
    return speedup < limit * (1.0 - EDGE_EPS)


def stored_threshold(then: StoredProvider, tolerance: float) -> float:
    """Lowest passing speedup against a stored provider: the stored interval's low end (its
    spread at save time, when known and below the speedup) times ``1 - tolerance``. Taking the low
    end lets a run judge against what the stored run could not tell apart from its median."""
    base = then.low if then.low is not None and 0 < then.low <= then.speedup else then.speedup
    return threshold(base, tolerance)


def wholly_below(measured: Speedup, limit: float) -> bool:
    """True when the whole 95% interval lies below ``limit``: a slowdown however wide it is."""
    return below_threshold(measured.high, limit)


GPU_METHODS = frozenset({GRAPH_METHOD, SYNC_METHOD})
"""Timing methods of a GPU, where a compile provider is the fastest of several builds
(``bench.timed_case.default_compile_builds``). On the CPU Inductor's code is not tuned by timing,
so a faster compile time there is the machine's speed moving between runs, not another build, and
re-basing onto it would pass a slower kernel (docs/timing-and-gate.md, "The gate")."""


def same_build_env(stored_env: Mapping[str, Any], env: Mapping[str, Any] | None) -> bool:
    """Whether every :data:`BUILD_ENV_KEYS` field is recorded in both and equal (an entry saved
    before a field was recorded is not known to match)."""
    if env is None:
        return False
    return all(k in stored_env and k in env and stored_env[k] == env[k] for k in BUILD_ENV_KEYS)


def rebase_builds(
    stored: StoredCase | None,
    measured: Mapping[str, Speedup],
    *,
    env: Mapping[str, Any] | None,
    tolerance: float,
) -> tuple[StoredCase | None, list[str]]:
    """``stored`` with each compile provider timed faster now than stored re-based onto this
    run's time, when the environment that builds and times it is unchanged
    (:func:`same_build_env`); and a note for each provider whose speedup only passes re-based.

    Why: a compile provider's time is that of the fastest of its independent builds
    (``bench.timed_case.GPU_COMPILE_BUILDS``), and builds of one reference in one environment
    differ, so a save that kept a slow build stores a high speedup over compile, and a later run
    that keeps a fast one would read "compile got faster" and fail an unchanged kernel
    (docs/timing-and-gate.md, "The gate"). The fastest build known is then this run's; re-based
    onto it, the stored speedup is the stored kernel time over this run's build time, so the
    comparison holds the kernel's own time to its stored time, with the stored interval and the
    tolerance as before (its low end scales with the speedup).

    Only for a case timed on a GPU (:data:`GPU_METHODS`): the CPU builds one compile of a
    reference, so there is no other build to explain a faster time.

    It only relaxes: a re-based threshold is lower than the stored one, a provider timed slower
    than stored is left as stored, and a kernel slower than its stored time by more than the
    tolerance still fails (blamed on the kernel). A reference edited so that torch.compile makes
    it faster, eager not, reads as another build too: re-save after editing a reference.
    """
    if stored is None or not same_build_env(stored.env, env) or (env or {}).get("method") not in GPU_METHODS:
        return stored, []
    providers = dict(stored.providers)
    notes = []
    for p, then in stored.providers.items():
        now = measured.get(p)
        if compile_mode_of(p) is None or now is None or not 0 < now.provider_ms < then.ms:
            continue
        scale = now.provider_ms / then.ms
        providers[p] = dataclasses.replace(
            then,
            speedup=then.speedup * scale,
            low=None if then.low is None else then.low * scale,
            high=None if then.high is None else then.high * scale,
            rebased_ms=now.provider_ms,
        )
        raw = stored_threshold(then, tolerance)
        passes_rebased = not below_threshold(now.speedup, stored_threshold(providers[p], tolerance))
        if below_threshold(now.speedup, raw) and passes_rebased:
            kernel_then = paired_kernel_ms(then, stored)
            notes.append(
                f"{p} timed {now.provider_ms:.4g} ms against {then.ms:.4g} ms stored, in the same "
                f"environment: another build of the same code, so the stored speedup {then.speedup:.3f} "
                f"is re-based onto this run's build ({providers[p].speedup:.3f}) and the kernel's own time "
                f"is judged: {now.kernel_ms:.4g} ms (was {kernel_then:.4g} ms, "
                f"{_pct(now.kernel_ms, kernel_then)}); not re-based, {now.speedup:.3f} < {raw:.3f} "
                f"would have failed"
            )
    return dataclasses.replace(stored, providers=providers), notes


def suspicious(
    measured: Mapping[str, Speedup], stored: StoredCase | None, factor: float = SUSPECT_FACTOR
) -> list[str]:
    """One line per provider whose speedup exceeds ``factor`` times the stored one, for review."""
    if stored is None:
        return []
    out = []
    for p, then in stored.providers.items():
        if p in measured and then.speedup > 0 and measured[p].speedup > factor * then.speedup:
            out.append(
                f"review: speedup over {p} {measured[p].speedup:.3f} is "
                f"{measured[p].speedup / then.speedup:.1f}x the stored {then.speedup:.3f} "
                f"(> {factor:g}x): confirm the kernel still does all its work before saving"
            )
    return out


def gated_providers(
    measured: Mapping[str, Speedup], stored: StoredCase | None, min_speedup: Mapping[str, float]
) -> list[str]:
    """Providers whose speedup the gate judges: those with a stored speedup or a floor."""
    names = set(min_speedup)
    if stored is not None:
        names |= set(stored.providers)
    return [p for p in measured if p in names]


def noise_reasons(
    measured: Mapping[str, Speedup], providers: list[str], tolerance: float, rounds: int | None = None
) -> list[str]:
    """One line per gated provider whose interval is wider than ``tolerance`` (empty: judgeable)."""
    after = f" after {rounds} rounds" if rounds else ""
    return [f"too noisy to judge: {_too_wide(p, measured[p], tolerance)}{after}"
            for p in too_noisy(measured, providers, tolerance)]


def too_noisy(measured: Mapping[str, Speedup], providers: list[str], tolerance: float) -> list[str]:
    """The providers among ``providers`` whose 95% interval is wider than ``tolerance``."""
    return [p for p in providers if measured[p].rel_width > tolerance]


def _too_wide(provider: str, s: Speedup, tolerance: float) -> str:
    """``"speedup over eager 1.900, 95% interval [1.7, 2.1] is 21.1% wide > tolerance 5.0%"``."""
    return (f"speedup over {provider} {s.speedup:.3f}, 95% interval [{s.low:.3f}, {s.high:.3f}] is "
            f"{_wider_than(s.rel_width, tolerance)}")


PAIRING_RTOL = 0.01
"""A stored provider whose paired kernel time (``StoredProvider.kernel_ms``) differs from its
entry's ``kernel_ms`` by more than this fraction was kept by a later save that did not time it;
the file's rounding to 5 significant digits moves the two apart by at most 1e-4."""


def older_pairing(then: StoredProvider, stored: StoredCase) -> bool:
    """Whether ``then``'s stored speedup was measured against another kernel time than ``stored``'s
    own: a provider that a save with fewer providers kept (``baselines.store.merge_entry``). Its
    speedup still holds the kernel to that older time, which is what the gate wants, but with the
    entry's kernel time a regression reads backwards, blaming the baseline for a slower kernel
    (docs/timing-and-gate.md, "Blame from absolute times")."""
    return not math.isclose(then.kernel_ms, stored.kernel_ms, rel_tol=PAIRING_RTOL)


def paired_kernel_ms(then: StoredProvider, stored: StoredCase) -> float:
    """The stored kernel time (ms) that ``then``'s speedup holds the kernel to: the entry's own
    ``kernel_ms``, or for a provider kept from an older save (:func:`older_pairing`) the time
    its speedup was measured against."""
    return then.kernel_ms if older_pairing(then, stored) else stored.kernel_ms


def _wider_than(width: float, tolerance: float) -> str:
    """``"5.3% wide > tolerance 5.0%"``, with as many decimals (up to 3) as it takes for the two
    to read different: a width of 5.04% printed as "5.0% wide > tolerance 5.0%"."""
    digits = next((d for d in (1, 2) if f"{width:.{d}%}" != f"{tolerance:.{d}%}"), 3)
    return f"{width:.{digits}%} wide > tolerance {tolerance:.{digits}%}"


def _pct(now: float, then: float) -> str:
    return f"{(now / then - 1.0):+.1%}"


def blame(provider: str, now: Speedup, stored: StoredCase, others_held: bool | None = None) -> str:
    """Which side moved for a regression against ``provider``, with both times then and now.

    Args:
        others_held: with two or more providers gated, whether the speedups over the *other*
            providers stayed within tolerance. True: only this provider moved, so the baseline got
            faster. False: every speedup fell by at least the tolerance, so the kernel got slower.
            None (one provider): decided from the absolute times, whichever moved further in the
            harmful direction on a log scale; the machine's own speed drifts between runs
            (docs/timing-and-gate.md, "Blame from absolute times"), so the message says it was
            judged from absolute times, and a faster baseline read so asks to rule out a slower
            kernel before a re-save.
            Ignored for a provider re-based onto this run's build (:func:`rebase_builds`): its
            change is not counted, so the kernel got slower. Ignored too for a provider whose
            stored speedup was timed against an older kernel (:func:`older_pairing`): judged from
            absolute times, against that kernel time.
    """
    then = stored.providers[provider]
    older = older_pairing(then, stored)
    kernel_then = then.kernel_ms if older else stored.kernel_ms  # paired_kernel_ms
    k_ratio = now.kernel_ms / kernel_then
    p_ratio = now.provider_ms / then.ms
    if older:
        others_held = None  # the other speedups say nothing of the kernel this one was timed with
    if then.rebased_ms is not None:
        # This run's build is faster than the stored one: not counted (rebase_builds).
        kernel_side = True
        how = f" (the stored speedup re-based onto this run's faster {provider} build)"
    elif others_held is None:
        kernel_side = math.log(k_ratio) >= -math.log(p_ratio)
        basis = "judged from absolute times"
        if older:
            basis += (f": the stored speedup over {provider} was measured against the kernel at "
                      f"{kernel_then:.4g} ms, and a later save that did not time {provider} kept it "
                      f"beside its own kernel time, {stored.kernel_ms:.4g} ms")
        if not kernel_side:
            # Every time moves with the machine's speed: docs/timing-and-gate.md, "Blame from absolute times".
            basis += "; absolute times" if older else ", which"
            basis += " move with the machine's speed between runs: rule out a slower kernel before re-saving"
        how = f" ({basis})"
    else:
        kernel_side = not others_held
        how = (
            " (the speedups over the other providers held)"
            if others_held
            else " (the speedups over every provider fell)"
        )
    side = "the kernel got slower" if kernel_side else f"the baseline ({provider}) got faster"
    return (
        f"{side}{how}: kernel {now.kernel_ms:.4g} ms (was {kernel_then:.4g} ms, "
        f"{_pct(now.kernel_ms, kernel_then)}), "
        f"{provider} {now.provider_ms:.4g} ms (was {then.ms:.4g} ms, {_pct(now.provider_ms, then.ms)})"
    )


def env_differences(*, stored_env: Mapping[str, Any], current_env: Mapping[str, Any]) -> list[str]:
    """``"torch 2.11.0 -> 2.13.0"`` for each :data:`ENV_KEYS` field that differs."""
    return [
        f"{k} {stored_env.get(k)} -> {current_env.get(k)}"
        for k in ENV_KEYS
        if k in stored_env and k in current_env and stored_env.get(k) != current_env.get(k)
    ]


def below_floors(measured: Mapping[str, Speedup], floors: Mapping[str, float]) -> dict[str, float]:
    """``{provider: floor}`` of the providers whose speedup is below their ``min_speedup`` floor."""
    return {p: floor for p, floor in floors.items() if measured[p].speedup < floor}


def regression_reasons(
    measured: Mapping[str, Speedup], stored: StoredCase, tol: float, noisy: bool
) -> dict[str, str]:
    """``{provider: reason}`` for each provider whose speedup fell below its stored threshold,
    blaming the side that moved (:func:`blame`); ``noisy``: only intervals wholly below their
    threshold count."""
    both = [p for p in stored.providers if p in measured]
    limits = {p: stored_threshold(stored.providers[p], tol) for p in both}
    fell = {p for p in both if below_threshold(measured[p].speedup, limits[p])}
    reasons = {}
    for p in both:
        # However wide, an interval wholly below the threshold says the kernel got slower, never "too noisy".
        if p not in fell or (noisy and not wholly_below(measured[p], limits[p])):
            continue
        s, then = measured[p], stored.providers[p]
        # Only speedups timed against the same kernel run say which side moved (older_pairing).
        others = [q for q in both if q != p and not older_pairing(stored.providers[q], stored)]
        held = None if not others else not all(q in fell for q in others)
        base = (
            f"stored {then.speedup:.3f}"
            if limits[p] == threshold(then.speedup, tol)
            else f"stored interval's low end {then.low:.3f} (speedup {then.speedup:.3f})"
        )
        if then.rebased_ms is not None:
            base = "re-based " + base
        reasons[p] = (
            f"speedup over {p} {s.speedup:.3f} [{s.low:.3f}, {s.high:.3f}] < "
            f"{limits[p]:.3f} = {base} x (1 - {tol:g}); " + blame(p, s, stored, held)
        )
    return reasons


def _timed_floors(
    min_speedup: Mapping[str, float] | None, measured: Mapping[str, Speedup]
) -> dict[str, float]:
    """``min_speedup`` as a dict; ValueError when it names a provider that was not timed."""
    floors = dict(min_speedup or {})
    missing = sorted(set(floors) - set(measured))
    if missing:
        raise ValueError(
            f"min_speedup names provider(s) {missing} that were not timed (timed: {sorted(measured)})"
        )
    return floors


def _cannot_judge(stored: StoredCase, dims: Mapping[str, int] | None, method: str | None) -> str | None:
    """Why ``stored``'s speedups are not held against this run (measured at other dims, or timed
    by another method), or None when they are."""
    return dims_mismatch(stored.dims, dims) or method_mismatch(stored, method)


def _new_case(
    reasons: list[str], shortfalls: list[str], *, strict: bool, recordable: bool, where: str,
    timing_only: bool,
) -> Verdict:
    """The verdict of a case with no stored entry: new (a note), or failed (``reasons``, which
    rest on timing alone when ``timing_only``), or failed under ``strict``."""
    notes = []
    if strict:
        reasons = [*reasons, f"no baseline for this case in {where} (--fusion-strict)"]
    elif recordable:
        notes.append(f"new case: no baseline in {where}; --fusion-save records it")
    else:
        notes.append(f"new case: no baseline in {where}; too noisy for --fusion-save to record it")
    failed = bool(reasons)
    return Verdict(
        "fail" if failed else "new", tuple(reasons), tuple(notes), timing_only=failed and timing_only,
        shortfalls=tuple(shortfalls),
    )


def verdict(
    measured: Mapping[str, Speedup],
    stored: StoredCase | None,
    *,
    tolerance: float,
    min_speedup: Mapping[str, float] | None = None,
    strict: bool = False,
    noisy: list[str] | None = None,
    env: Mapping[str, Any] | None = None,
    where: str = "the baseline file",
    dims: Mapping[str, int] | None = None,
    recordable: bool = True,
    method: str | None = None,
) -> Verdict:
    """Apply the module's rule to one case.

    Args:
        measured: ``{provider: Speedup}`` of this run.
        stored: the baseline entry, or None when the case has none.
        tolerance: fraction in [0, 1), checked where it entered the gate (:class:`CaseGate`).
        min_speedup: ``{provider: floor}``.
        strict: a case with no baseline fails instead of passing as new.
        noisy: the :func:`noise_reasons` left after re-measuring; any makes the case fail.
        env: this run's environment, compared with ``stored.env``.
        where: the baseline file, named in messages.
        dims: this run's sizes, compared with ``stored.dims`` (module docstring, "reshaped").
        recordable: False when ``--fusion-save`` would refuse this measurement (an ungated
            provider too noisy): a new case's note then says so instead of promising a save.
        method: this case's timing method; a stored entry of another is not compared
            (:func:`method_mismatch`), a failure.

    Raises:
        ValueError: a floor named for a provider that was not measured.
    """
    tol = tolerance
    floors = _timed_floors(min_speedup, measured)
    reasons: list[str] = list(noisy or [])
    shortfalls: list[str] = []
    nothing = not_comparable(measured, stored)
    if nothing:
        reasons.append(nothing)
    if not noisy:
        broken = below_floors(measured, floors)
        for p, floor in broken.items():
            reasons.append(f"speedup over {p} {measured[p].speedup:.3f} is below min_speedup {floor:.3f}")
            shortfalls.append(f"speedup over {p} {measured[p].speedup:.3f} < min_speedup {floor:g}")
    if stored is None:
        return _new_case(reasons, shortfalls, strict=strict, recordable=recordable, where=where,
                         timing_only=not (nothing or strict))
    notes: list[str] = []
    reshaped = _cannot_judge(stored, dims, method)
    if reshaped:
        reasons.append(reshaped)
    else:
        if not noisy:
            untimed = [p for p in stored.providers if p not in measured]
            notes += [f"provider {p} is in the baseline but was not timed" for p in untimed]
        fell = regression_reasons(measured, stored, tol, bool(noisy))
        reasons += fell.values()
        shortfalls += [f"speedup over {p} {measured[p].speedup:.3f} < threshold "
                       f"{stored_threshold(stored.providers[p], tol):.3f}" for p in fell]
    if env is not None:
        diffs = env_differences(stored_env=stored.env, current_env=env)
        if diffs:
            notes.append("baseline environment differs: " + ", ".join(diffs))
    comparable = not (nothing or reshaped)
    return Verdict(
        "fail" if reasons else "pass", tuple(reasons), tuple(notes), compared=comparable,
        timing_only=bool(reasons) and comparable, shortfalls=tuple(shortfalls),
    )


@dataclasses.dataclass(frozen=True)
class CaseVerdict:
    """What :meth:`CaseGate.apply` finds in one measurement of a case: the rule's :class:`Verdict`,
    with what the gate learnt on the way to it.

    Attributes:
        verdict: the rule's verdict (:func:`verdict`).
        stored: the entry as judged: compile builds re-based (:func:`rebase_builds`); None: no entry.
        env: the environment the measurement ran in, with its timing method (what the re-base compared).
        notes: every note, in order: ungated providers too noisy to save, re-based builds, the verdict's own.
        noisy: an interval was wider than the tolerance, gated or not: ``--fusion-save`` refuses the
            measurement (a noisy baseline loosens every later gate).
        review: :func:`suspicious`'s lines.
        too_wide: one short line per provider whose interval is wider than the tolerance, gated or
            not, in measured order (a gated one wholly below its threshold is a slowdown instead).
    """

    verdict: Verdict
    stored: StoredCase | None
    env: Mapping[str, Any]
    notes: tuple[str, ...] = ()
    noisy: bool = False
    review: tuple[str, ...] = ()
    too_wide: tuple[str, ...] = ()


def needs_remeasure(case: CaseVerdict) -> str | None:
    """Why a first measurement may not stand as ``case`` judged it, read from its verdict (None: it
    may): an interval wider than the tolerance (every provider's: each is what ``--fusion-save``
    would store), else a gated speedup the verdict found below its floor or threshold. The caller
    measures again in a fresh order, with more rounds, and judges that measurement, so a burst of
    load on a shared runner during one case's rounds needs to recur to fail it."""
    return next(iter((*case.too_wide, *case.verdict.shortfalls)), None)


@dataclasses.dataclass(frozen=True)
class CaseGate:
    """What one bench case is gated against and by: where a tolerance enters the gate, checked once.

    Attributes:
        stored: the case's baseline entry, None when it has none.
        tolerance: a fraction in [0, 1) (:func:`~pytest_fusion.declare.spec.check_tolerance`).
        min_speedup: ``{provider: floor}``; the floor of a provider not timed is not checked.
        strict: a case with no baseline fails instead of passing as new.
        env: this run's environment: compared with the entry's and deciding the re-base
            (:func:`rebase_builds`); None: not compared.
        where: the baseline file, named in messages.
        dims: the case's sizes, compared with the entry's (None: not compared).

    Raises:
        FusionUsageError (a ValueError): a bad tolerance.
    """

    stored: StoredCase | None
    tolerance: float
    min_speedup: Mapping[str, float] = dataclasses.field(default_factory=dict)
    strict: bool = False
    env: Mapping[str, Any] | None = None
    where: str = "the baseline file"
    dims: Mapping[str, int] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "tolerance", check_tolerance(self.tolerance))

    def apply(
        self,
        measured: Mapping[str, Speedup],
        *,
        method: str | None,
        rounds: int | None = None,
        recorded_env: Mapping[str, Any] | None = None,
    ) -> CaseVerdict:
        """The gate's verdict on one measurement: the stored entry's compile builds re-based where
        this run's environment is the entry's (:func:`rebase_builds`), every interval checked for
        noise (a gated provider too noisy fails the case, an ungated one keeps it from being
        saved), and :func:`verdict` on the rest.

        Args:
            measured: ``{provider: Speedup}`` of the measurement.
            method: its timing method (None: unknown, not compared with the entry's).
            rounds: its rounds, named in a noise reason.
            recorded_env: the environment a record already carries, used in place of ``env``
                when the gate has none.
        """
        tol = self.tolerance
        floors = {p: v for p, v in self.min_speedup.items() if p in measured}
        run_env = {**dict(self.env or recorded_env or {}), **({"method": method} if method else {})}
        stored, rebased = rebase_builds(self.stored, measured, env=run_env, tolerance=tol)
        gated = gated_providers(measured, stored, floors)
        limits = {}
        if stored is not None and not _cannot_judge(stored, self.dims, method_checked(stored, method)):
            limits = {p: stored_threshold(then, tol) for p, then in stored.providers.items()}
        # A gated interval wholly below a threshold the verdict applies is a slowdown, not noise.
        judged = [p for p in gated if not (p in limits and wholly_below(measured[p], limits[p]))]
        ungated = [p for p in measured if p not in gated]
        noisy = noise_reasons(measured, judged, tol, rounds=rounds)
        unsaveable = noise_reasons(measured, ungated, tol, rounds=rounds)
        v = verdict(
            measured, stored, tolerance=tol, min_speedup=floors, strict=self.strict, noisy=noisy,
            env=self.env, where=self.where, dims=self.dims, recordable=not unsaveable,
            method=method_checked(stored, method),
        )
        unsaved = [f"{r} (not gated; a baseline saved from it would be as noisy, so --fusion-save will not "
                   f"store it)" for r in unsaveable]
        wide = set(too_noisy(measured, [*judged, *ungated], tol))
        return CaseVerdict(
            v, stored, run_env, notes=(*unsaved, *rebased, *v.notes), noisy=bool(noisy or unsaveable),
            review=tuple(suspicious(measured, stored)),
            too_wide=tuple(_too_wide(p, measured[p], tol) for p in measured if p in wide),
        )
