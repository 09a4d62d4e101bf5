"""One bench case's providers built and measured (``measure.timing.measure``), and measured again
once when the gate says the first measurement may not stand (``gate.needs_remeasure``), with the
run-wide settings (:class:`BenchSettings`) that size both."""

from __future__ import annotations

import dataclasses
import statistics
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.declare.spec import DEFAULT_TOLERANCE, KernelSpec, compile_mode_of
from pytest_fusion.gate.rule import REMEASURE_FACTOR, CaseGate, needs_remeasure
from pytest_fusion.measure import providers as _providers
from pytest_fusion.measure.power import PowerMonitor
from pytest_fusion.measure.recompute import InputSets, golden_verifier
from pytest_fusion.measure.stats import Speedup, check_times, speedup_interval
from pytest_fusion.measure.timers import Timer
from pytest_fusion.measure.timing import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MIN_TIME_S,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    ProviderTiming,
    measure,
)
from pytest_fusion.oracle import inplace


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """Run-wide bench settings (the plugin fills them from its configuration).

    ``rounds`` is the minimum; ``min_time_s`` (seconds of samples per provider) and
    ``max_rounds`` size the rest, as in :func:`pytest_fusion.measure.timing.measure`. ``max_rounds``
    None means :data:`DEFAULT_MAX_ROUNDS`, or ``rounds`` when that is larger (:attr:`round_cap`,
    the one place that rule is written).
    """

    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    min_time_s: float = DEFAULT_MIN_TIME_S
    max_rounds: int | None = None
    providers: tuple[str, ...] | None = None
    compile_mode: str = "default"
    tolerance: float = DEFAULT_TOLERANCE
    strict: bool = False
    compile_builds: int | None = None
    """Independent torch.compile builds per compile provider, the fastest timed (None:
    :func:`default_compile_builds`)."""

    @property
    def round_cap(self) -> int:
        """The most rounds the time floor may lead to (see the class docstring)."""
        return max(DEFAULT_MAX_ROUNDS, self.rounds) if self.max_rounds is None else self.max_rounds


@dataclasses.dataclass
class CaseTiming:
    """What :func:`time_case` returns: the providers as built, their timings (the re-measure's when
    there was one), the notes for the record, whether the case was re-measured, and the SM clock,
    power and throttle state over the returned timings' rounds (``PowerMonitor.result``; None
    without a monitor)."""

    built: _providers.Providers
    timings: dict[str, ProviderTiming]
    notes: list[str]
    remeasured: bool
    power: dict[str, Any] | None = None


def speedups(timings: Mapping[str, ProviderTiming]) -> dict[str, Speedup]:
    """Each baseline provider's speedup interval over the kernel, paired by round; ValueError on a
    sample no timer can produce (``stats.check_times``)."""
    for name, t in timings.items():
        check_times(name, t.samples_ms)
    k = timings["kernel"].samples_ms
    return {name: speedup_interval(k, t.samples_ms) for name, t in timings.items() if name != "kernel"}


def time_case(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    input_sets: Sequence[Sequence[Any]],
    timer: Timer,
    settings: BenchSettings,
    gate: CaseGate,
    monitor: PowerMonitor | None = None,
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None = None,
    notify: Callable[[str], None] | None = None,
) -> CaseTiming:
    """Build the providers (each compile provider the fastest of ``settings.compile_builds``
    independent builds, :func:`_keep_fastest_builds`) and measure them, rotating through
    ``input_sets`` and verifying the kernel's timed output (``timing.measure``); a kernel with
    ``spec.mutates`` gets its input values restored before every sample (``InputSets.refresh``).
    A first measurement that may not stand as ``gate`` judges it (``gate.needs_remeasure`` of its
    ``gate.apply``: an interval wider than the tolerance, or a gated speedup below its threshold
    or floor) is taken again in the reverse provider order with ``gate.REMEASURE_FACTOR`` times
    the rounds, the time floor and the cap (so about that many times the samples whichever of the
    three decided), and only that one is returned, with ``remeasured`` set. ``monitor`` samples
    each measurement's rounds; the power figures returned are the returned timings'
    (``measure.power``). ``wrap``: what each provider's function becomes before it is timed
    (``make_providers``; a forward + backward case's
    :func:`pytest_fusion.oracle.backward.forward_backward`); the kernel's timed output is then
    verified against the wrapped reference. ``notify``: called with a line when the re-measure
    starts (it takes about ``gate.REMEASURE_FACTOR`` times the first measurement)."""
    kernel, sets, verify = _verified_kernel(spec, kernel, inputs, input_sets=input_sets, wrap=wrap)
    built = _providers.make_providers(
        kernel, spec.reference, inputs, constants=spec.constants, extras=spec.providers,
        requested=settings.providers, compile_mode=settings.compile_mode, warmup=settings.warmup, wrap=wrap,
        compile_builds=settings.compile_builds or default_compile_builds(inputs),
    )
    _keep_fastest_builds(built, timer, settings, sets)
    timings = measure(
        built.calls, timer, rounds=settings.rounds, warmup=settings.warmup, min_time_s=settings.min_time_s,
        max_rounds=settings.round_cap, cold_start=built.cold_start_s, inputs=sets, verify=verify,
        monitor=monitor,
    )
    found = speedups(timings)
    notes = [
        f"min_speedup for {p} not checked: {p} was not timed" for p in spec.min_speedup if p not in found
    ]
    first_verdict = gate.apply(found, method=timings["kernel"].method)
    reason = needs_remeasure(first_verdict)
    remeasured = reason is not None
    if remeasured:
        if notify is not None:
            kind = "too noisy to judge" if first_verdict.too_wide else "below its threshold"
            notify(remeasure_line(settings, len(timings["kernel"].samples_ms), kind))
        timings = _remeasure(built, timer, settings, timings, sets, verify, monitor)
        notes.append(
            f"re-measured with {len(timings['kernel'].samples_ms)} rounds in reverse provider order: "
            f"the first measurement had {reason}"
        )
    _note_recompiles(built)
    return CaseTiming(built, timings, notes, remeasured, None if monitor is None else monitor.result())


def remeasure_sizes(settings: BenchSettings) -> tuple[int, float, int]:
    """The re-measure's minimum rounds, time floor (seconds of samples per provider) and round cap:
    :data:`REMEASURE_FACTOR` times each of ``settings``' (``rounds``, ``min_time_s``,
    :attr:`~BenchSettings.round_cap`), so about that many times the samples whichever decided."""
    f = REMEASURE_FACTOR
    return settings.rounds * f, settings.min_time_s * f, settings.round_cap * f


def remeasure_line(settings: BenchSettings, first_rounds: int, why: str) -> str:
    """The line said as a re-measure starts: why (``why``: "too noisy to judge" or "below its
    threshold"), how many rounds the first measurement took, and the rounds the re-measure will
    take (:func:`remeasure_sizes`)."""
    f = REMEASURE_FACTOR
    low, floor_s, cap = remeasure_sizes(settings)
    if floor_s > 0:
        plan = (f"{f}x each of the minimum rounds, time floor and round cap: at least {low} rounds, more "
                f"until every provider's samples sum to {floor_s:g} s, at most {cap}")
    else:
        plan = f"{f}x the minimum rounds: {low} rounds, with no time floor"
    return (f"re-measuring with {f}x the rounds in reverse provider order: the first measurement "
            f"({first_rounds} rounds) was {why}; {plan}")


GPU_COMPILE_BUILDS = 2
"""Independent torch.compile builds per compile provider on a GPU. Inductor autotunes its
generated Triton kernels by timing them, so two builds of one reference can differ, and a save that
stored a slow build would fail later runs as "compile got faster"; the fastest of two is a slow one
only when both are (docs/timing-and-gate.md, "Compile builds"). When a save kept a slow build all
the same, the gate judges a faster build in the same environment by the kernel's own time
(``gate.rule.rebase_builds``)."""

BUILD_SPREAD_NOTE = 0.02
"""Builds whose medians differ by more than this fraction of the fastest get a note naming them."""


def default_compile_builds(inputs: Sequence[Any]) -> int:
    """:data:`GPU_COMPILE_BUILDS` when an input lives on a GPU, else 1: Inductor's CPU code is not
    autotuned by timing, so a second build would be the same code compiled again."""
    return GPU_COMPILE_BUILDS if any(getattr(x, "is_cuda", False) for x in inputs) else 1


def _keep_fastest_builds(
    built: _providers.Providers, timer: Timer, settings: BenchSettings, sets: InputSets
) -> None:
    """Nothing; each compile provider with further builds (``built.rivals``) becomes the build of
    the lowest median, each build timed alone with the settings' rounds, time floor and cap, one
    warm-up call and no output check (as in the case's measurement, only the kernel's output is
    checked). Builds more than
    :data:`BUILD_SPREAD_NOTE` apart are named in the provider's note."""
    for name, rivals in built.rivals.items():
        builds = [built.calls[name], *rivals]
        medians = [
            statistics.median(measure(
                {name: call}, timer, rounds=settings.rounds, warmup=1, min_time_s=settings.min_time_s,
                max_rounds=settings.round_cap, cold_start={name: 0.0}, inputs=sets,
            )[name].samples_ms)
            for call in builds
        ]
        best = min(range(len(builds)), key=medians.__getitem__)
        built.calls[name] = builds[best]
        if max(medians) > medians[best] * (1 + BUILD_SPREAD_NOTE):
            figures = ", ".join(f"{m:.4g}" for m in medians)
            _providers.add_note(
                built.notes, name, f"fastest of {len(builds)} independent builds kept (medians {figures} ms)"
            )


def _verified_kernel(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    *,
    input_sets: Sequence[Sequence[Any]],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] | None,
) -> tuple[Callable[..., Any], InputSets, Callable[[Sequence[tuple[int, Any]]], None]]:
    """The kernel as timed (an in-place kernel returning its mutated inputs, :mod:`pytest_fusion.
    inplace`), the input sets to rotate (restored before every sample for an in-place kernel) and
    the check of its timed output against the (wrapped) reference's golden."""
    mutated = inplace.positions(spec)
    reference = spec.reference
    if mutated:
        kernel = inplace.with_outputs(kernel, mutated)
        reference = inplace.with_outputs(spec.reference, mutated, copy=True)
    sets = InputSets(inputs, input_sets, refresh=bool(mutated))
    same = wrap or (lambda fn: fn)
    return kernel, sets, golden_verifier(same(kernel), same(reference), sets, dict(spec.constants))


def _remeasure(
    built: _providers.Providers,
    timer: Timer,
    settings: BenchSettings,
    first: Mapping[str, ProviderTiming],
    sets: InputSets,
    verify: Callable[[Sequence[tuple[int, Any]]], None],
    monitor: PowerMonitor | None,
) -> dict[str, ProviderTiming]:
    """The second measurement: ``gate.REMEASURE_FACTOR`` times the rounds, floor and cap
    (:func:`remeasure_sizes`), no warm-up, the first one's cold starts, the providers in reverse
    order."""
    rounds, min_time_s, max_rounds = remeasure_sizes(settings)
    cold = {n: t.cold_start_s for n, t in first.items()}
    return measure(
        built.calls,
        timer,
        rounds=rounds,
        warmup=0,
        min_time_s=min_time_s,
        max_rounds=max_rounds,
        cold_start=cold,
        inputs=sets,
        verify=verify,
        order=list(reversed(built.calls)),
        monitor=monitor,
    )


def _note_recompiles(built: _providers.Providers) -> None:
    """Nothing; adds to each compile provider's note how often Dynamo recompiled during timing
    (its counter is per process, so a recompile cannot be told apart between two compile modes)."""
    recompiles = built.recompiles_since_warmup()
    if not recompiles:
        return
    for name in built.calls:
        if compile_mode_of(name) is not None:
            _providers.add_note(built.notes, name, f"{recompiles} recompile(s) during timing")
