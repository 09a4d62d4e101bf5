"""The tuner's ranking regimes beyond the interleaved rounds (``sweep.interleaved_medians``):
back to back at the power cap (:func:`time_sustained`) and benchmark mode itself
(:func:`time_benchmark_mode`)."""

from __future__ import annotations

import functools
import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, Sequence

if TYPE_CHECKING:
    from pytest_fusion.measure.stats import Speedup
    from pytest_fusion.measure.timers import Timer


def phase_order(providers: Iterable[str], eager_every: int) -> list[str]:
    """Back-to-back phases of ``providers`` (names, one of them "eager"): eager first, again after
    every ``eager_every`` others and last, so that drift over the run shows in eager's phases."""
    others = [n for n in providers if n != "eager"]
    order = ["eager"]
    for i, n in enumerate(others):
        order.append(n)
        if (i + 1) % eager_every == 0 or i + 1 == len(others):
            order.append("eager")
    return order


def time_sustained(
    prepared: Mapping[str, Callable[[], float]], seconds: float, eager_every: int = 2
) -> dict[str, float]:
    """Median ms of each prepared provider replayed back to back for ``seconds``, over the phase's
    second half; eager first, again after every ``eager_every`` configs and last, its phases'
    median kept.

    For GEMMs of several ms, which run at the GPU's power cap when held: interleaved one-replay
    rounds of many candidates share one power budget and rank them wrongly. This is not benchmark
    mode's regime either (kernel, eager and torch.compile in turn), so the fastest few here are
    ranked again there (time_benchmark_mode); why both: docs/reference-kernels.md,
    "The power cap and the tuner's rankings"."""
    phases: dict[str, list[float]] = {n: [] for n in prepared}
    for n in phase_order(prepared, eager_every):
        times: list[float] = []
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < seconds or len(times) < 2:
            times.append(prepared[n]())
        phases[n].append(statistics.median(times[len(times) // 2 :]))
    return {n: statistics.median(v) for n, v in phases.items()}


def time_benchmark_mode(
    kernels: Mapping[str, Callable[..., Any]],
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    constants: Mapping[str, Any],
    timer: Timer,
    passes: int = 2,
    compile_ok: bool = True,
    smoke: bool = False,
) -> dict[str, Speedup]:
    """Each kernel's speedup over eager as benchmark mode measures it: for every kernel in turn,
    pytest-fusion's own ``measure`` over the bench case's providers (the kernel, ``eager`` =
    ``reference`` and, with ``compile_ok``, ``torch.compile(reference)``, built once), with the
    plugin's default rounds, warm-up and time floor (pytest_fusion.bench.api.BenchSettings), and the
    speedup as
    the gate computes it (bench.stats.speedup_interval: median eager / median kernel, paired
    bootstrap interval).

    For the longest keys, where the tuner's other regimes disagree with benchmark mode by more
    than the candidates differ (time_sustained's docstring). ``passes`` repeats the whole series,
    every other pass in reverse order, so that no kernel is always measured first or last; a
    kernel's rounds of all passes are pooled into one interval.

    Args:
        kernels: ``{name: call}``, each taking ``(*inputs, **constants)`` like ``reference``.
        smoke: 3 rounds and no time floor (CPU, interpreter).

    Returns:
        ``{name: bench.stats.Speedup}`` over eager, in the order of ``kernels``.
    """
    from pytest_fusion.bench.timed_case import BenchSettings as Settings
    from pytest_fusion.measure.providers import make_providers
    from pytest_fusion.measure.stats import speedup_interval
    from pytest_fusion.measure.timing import measure

    s = Settings(rounds=3, min_time_s=0.0) if smoke else Settings()
    names = list(kernels)
    built = make_providers(
        kernels[names[0]],
        reference,
        inputs,
        constants=constants,
        requested=("eager", "compile") if compile_ok else ("eager",),
        warmup=s.warmup,
    )
    pooled: dict[str, tuple[list[float], list[float]]] = {n: ([], []) for n in names}
    for p in range(passes):
        for n in names if p % 2 == 0 else names[::-1]:
            kernel: Callable[[], Any] = functools.partial(kernels[n], *inputs, **constants)
            calls = dict(built.calls, kernel=kernel)  # kernel stays first
            t = measure(
                calls,
                timer,
                rounds=s.rounds,
                warmup=s.warmup,
                min_time_s=s.min_time_s,
                max_rounds=s.round_cap,
                cold_start=built.cold_start_s,
            )
            pooled[n][0].extend(t["kernel"].samples_ms)
            pooled[n][1].extend(t["eager"].samples_ms)
    return {n: speedup_interval(k, e) for n, (k, e) in pooled.items()}
