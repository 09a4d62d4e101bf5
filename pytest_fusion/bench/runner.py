"""Measure one bench case, re-measure it when too noisy, judge it, and return its record.

Plain Python over ``timing``, ``stats``, ``providers`` and ``gate``; the pytest layer
(``bench_plugin``) only gathers the arguments and turns a failed verdict into a test failure.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion import gate
from pytest_fusion.bench import providers as _providers
from pytest_fusion.bench.record import BenchRecord, ProviderResult
from pytest_fusion.bench.stats import Speedup, gbps, median, speedup_interval, tflops
from pytest_fusion.bench.timing import DEFAULT_MAX_ROUNDS, DEFAULT_MIN_TIME_S, ProviderTiming, Timer, measure

DEFAULT_ROUNDS = 30
"""Minimum rounds per case: 30 paired samples put a bootstrap interval of a median ratio within
about +/-1% on CUDA-graph timings (issue 4: replay moves 1% run to run). Fast kernels get more,
up to ``max_rounds``, until each provider has ``min_time_s`` of samples (``timing.measure``)."""
DEFAULT_WARMUP = 5


@dataclasses.dataclass(frozen=True)
class Settings:
    """Run-wide bench settings (the plugin fills them from options; see ``bench_plugin``).

    ``rounds`` is the minimum; ``min_time_s`` (seconds of samples per provider) and
    ``max_rounds`` size the rest, as in :func:`pytest_fusion.bench.timing.measure`. ``max_rounds``
    None means :data:`DEFAULT_MAX_ROUNDS`, or ``rounds`` when that is larger (:attr:`round_cap`).
    """

    rounds: int = DEFAULT_ROUNDS
    warmup: int = DEFAULT_WARMUP
    min_time_s: float = DEFAULT_MIN_TIME_S
    max_rounds: int | None = None
    providers: tuple[str, ...] | None = None
    compile_mode: str = "default"
    tolerance: float = 0.05
    strict: bool = False

    @property
    def round_cap(self) -> int:
        """The most rounds the time floor may lead to (see the class docstring)."""
        return max(DEFAULT_MAX_ROUNDS, self.rounds) if self.max_rounds is None else self.max_rounds


def _tensors(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [out] if hasattr(out, "nbytes") else []


def default_bytes(inputs: Sequence[Any], output: Any) -> float:
    """Bytes one call must move at least: every input and output read or written once."""
    return float(sum(int(t.nbytes) for t in _tensors(list(inputs)) + _tensors(output)))


def _speedups(timings: Mapping[str, ProviderTiming]) -> dict[str, Speedup]:
    k = timings["kernel"].samples_ms
    return {name: speedup_interval(k, t.samples_ms) for name, t in timings.items() if name != "kernel"}


def run_case(
    *,
    kernel_id: str,
    case: str,
    dtype: str,
    dims: Mapping[str, int],
    device_slug: str,
    kernel: Callable[..., Any],
    reference: Callable[..., Any],
    inputs: Sequence[Any],
    timer: Timer,
    settings: Settings,
    constants: Mapping[str, Any] | None = None,
    baselines: Mapping[str, Callable[..., Any]] | None = None,
    flops: float | None = None,
    nbytes: float | None = None,
    min_speedup: Mapping[str, float] | None = None,
    tolerance: float | None = None,
    stored: gate.StoredCase | None = None,
    peaks: Mapping[str, float] | None = None,
    env: Mapping[str, Any] | None = None,
    where: str = "the baseline file",
) -> BenchRecord:
    """Time ``kernel`` against its providers on ``inputs`` and gate the speedups.

    Args:
        kernel_id, case, dtype, dims: identify the case (the record's key is the first three).
        inputs: the tensors, passed positionally; ``constants`` by keyword.
        flops, nbytes: work of one call; ``nbytes`` None means :func:`default_bytes`.
        tolerance: this kernel's tolerance (None: ``settings.tolerance``).
        stored: the case's baseline entry; peaks: ``{"tflops", "gbps"}`` of the device.

    A case too noisy to judge is re-measured with ``gate.REMEASURE_FACTOR`` times the rounds,
    the time floor and the cap, so it gets about that many times the samples of the first
    measurement whichever of the three decided it.

    Returns:
        The :class:`BenchRecord`, its ``status`` set by ``gate.judge``; ``rounds`` is the number
        of rounds actually run (after any re-measure). Its ``noisy`` is set when any provider's
        interval is still wider than the tolerance after the re-measure: a gated one also fails
        the case, an ungated one (a new case's) only keeps ``--fusion-save`` from storing it.

    Raises:
        ValueError: a bad tolerance, rounds, min_time_s, max_rounds, provider or compile mode.
            Provider errors propagate.
    """
    tol = gate.check_tolerance(settings.tolerance if tolerance is None else tolerance)
    built = _providers.make_providers(
        kernel, reference, inputs,
        constants=constants, baselines=baselines, requested=settings.providers,
        compile_mode=settings.compile_mode, warmup=settings.warmup,
    )
    timings = measure(built.calls, timer, rounds=settings.rounds, warmup=settings.warmup,
                      min_time_s=settings.min_time_s, max_rounds=settings.round_cap,
                      cold_start=built.cold_start_s)
    rounds = len(timings["kernel"].samples_ms)
    speedups = _speedups(timings)
    floors = {p: v for p, v in (min_speedup or {}).items() if p in speedups}
    notes = [f"min_speedup for {p} not checked: {p} was not timed" for p in (min_speedup or {}) if p not in speedups]
    gated = gate.gated_providers(speedups, stored, floors)
    # Every provider is checked for noise, gated or not: each is what --fusion-save would store
    # (a new case, or a provider new to a stored case), and a noisy baseline loosens every later
    # gate. Only gated providers can fail the case on noise; the others only keep it from a save.
    ungated = [p for p in speedups if p not in gated]
    if gate.noise_reasons(speedups, gated + ungated, tol):
        factor = gate.REMEASURE_FACTOR
        cold = {n: t.cold_start_s for n, t in timings.items()}
        timings = measure(built.calls, timer, rounds=settings.rounds * factor, warmup=0,
                          min_time_s=settings.min_time_s * factor, max_rounds=settings.round_cap * factor,
                          cold_start=cold)
        rounds = len(timings["kernel"].samples_ms)
        speedups = _speedups(timings)
        notes.append(f"re-measured with {rounds} rounds: the first interval was wider than the tolerance")
    recompiles = built.recompiles_since_warmup()
    if recompiles:
        built.notes["compile"] = "; ".join(
            x for x in (built.notes.get("compile", ""), f"{recompiles} recompile(s) during timing") if x)
    noisy = gate.noise_reasons(speedups, gated, tol, rounds=rounds)
    unsaveable = gate.noise_reasons(speedups, ungated, tol, rounds=rounds)
    notes.extend(f"{r} (not gated; a baseline saved from it would be as noisy, so --fusion-save will not store it)"
                 for r in unsaveable)
    verdict = gate.judge(speedups, stored, tolerance=tol, min_speedup=floors, strict=settings.strict,
                         noisy=noisy, env=env, where=where, dims=dims, recordable=not unsaveable)

    provs: dict[str, ProviderResult] = {}
    for name, t in timings.items():
        s = speedups.get(name)
        note = "; ".join(x for x in (t.note, built.notes.get(name, "")) if x)
        provs[name] = ProviderResult(
            median_ms=median(t.samples_ms), samples_ms=list(t.samples_ms), host_ms=t.host_ms,
            cold_start_s=t.cold_start_s, peak_bytes=t.peak_bytes, method=t.method,
            speedup=None if s is None else s.speedup, low=None if s is None else s.low,
            high=None if s is None else s.high, note=note,
        )
    for name, note in built.notes.items():
        if name not in provs:
            notes.append(f"{name}: {note}")
    kernel_ms = provs["kernel"].median_ms
    if nbytes is None:
        nbytes = default_bytes(inputs, built.calls["kernel"]())
    rec = BenchRecord(
        kernel=kernel_id, case=case, dtype=dtype, dims=dict(dims), device=device_slug,
        providers=provs, rounds=rounds, flops=flops, bytes=nbytes,
        tflops=None if flops is None else tflops(flops, kernel_ms),
        gbps=gbps(nbytes, kernel_ms),
        status=verdict.status, reasons=list(verdict.reasons), notes=notes + list(verdict.notes),
        env=dict(env or {}), noisy=bool(noisy or unsaveable),  # noisy records are never saved
    )
    if peaks:
        if rec.tflops is not None and peaks.get("tflops"):
            rec.pct_peak_flops = 100.0 * rec.tflops / peaks["tflops"]
        if rec.gbps is not None and peaks.get("gbps"):
            rec.pct_peak_bw = 100.0 * rec.gbps / peaks["gbps"]
    return rec
