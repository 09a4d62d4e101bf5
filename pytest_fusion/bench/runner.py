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
from pytest_fusion.bench import peaks as _peaks
from pytest_fusion.bench import timing
from pytest_fusion.bench.stats import Speedup, check_times, gbps, median, speedup_interval, tflops
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


def derived_sets(inputs: Sequence[Any], count: int = timing.INPUT_SETS - 1, seed: int = 0) -> list[list[Any]]:
    """``count`` further input sets for a case given only one: each floating tensor's values
    shuffled (a seeded permutation of its elements), so every value and its distribution (signs,
    scale) stay as the caller made them while each element changes; other inputs are kept.
    A marker case draws its sets from its own strategy instead (the plugin passes ``input_sets``)."""
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


def _verifier(kernel: Callable[..., Any], reference: Callable[..., Any], sets: "timing.InputSets",
              constants: Mapping[str, Any]) -> Callable[[int, Any], None]:
    """``verify`` for :func:`timing.measure`: the timed output against golden on the same set."""

    def verify(index: int, timed: Any) -> None:
        timed = [t.detach().clone() for t in timing._flat(timed)]
        values = sets.sets[index]
        fresh = kernel(*[v.clone() if hasattr(v, "clone") else v for v in values], **constants)
        golden = reference(*[v.clone() if hasattr(v, "clone") else v for v in values], **constants)
        timing.check_recomputed(timed, fresh, golden, index)

    return verify


def _speedups(timings: Mapping[str, ProviderTiming]) -> dict[str, Speedup]:
    for name, t in timings.items():
        check_times(name, t.samples_ms)
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
    input_sets: Sequence[Sequence[Any]] | None = None,
    compute_dtype: str | None = None,
    remeasure_peaks: Callable[[], Mapping[str, float]] | None = None,
) -> BenchRecord:
    """Time ``kernel`` against its providers on ``inputs`` and gate the speedups.

    Args:
        kernel_id, case, dtype, dims: identify the case (the record's key is the first three).
        inputs: the tensors, passed positionally; ``constants`` by keyword.
        flops, nbytes: work of one call; ``nbytes`` None means :func:`default_bytes`.
        tolerance: this kernel's tolerance (None: ``settings.tolerance``).
        stored: the case's baseline entry; peaks: ``bench.peaks.measure_peaks``' figures.
        input_sets: further values for ``inputs`` (each a sequence shaped like it) rotated
            through while timing (``timing.InputSets``); None: :func:`derived_sets`.
        compute_dtype: ``"ieee"`` to hold a float32 kernel to the IEEE peak (default: the TF32
            peak bounds float32 on a GPU; ``bench.peaks.implausible``).
        remeasure_peaks: returns peaks measured again; called once when the throughput exceeds
            ``peaks`` (they may have read low), before the case fails as implausible.

    Honesty checks (issue 18): the kernel's output on a rotated input set must match golden
    ("output not recomputed during timing", a ValueError); every timing must be positive, finite
    and >= ``stats.MIN_SAMPLE_MS`` (a ValueError); a throughput beyond ``peaks`` by more than the
    margins of ``bench.peaks`` fails the case as implausible (``record.implausible``, never saved).

    A case too noisy to judge, or one that would fail (``gate.needs_remeasure``), is re-measured
    in the reverse provider order with ``gate.REMEASURE_FACTOR`` times the rounds, the time floor
    and the cap, so it gets about that many times the samples of the first measurement whichever
    of the three decided it; the re-measure alone is judged.

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
    sets = timing.InputSets(inputs, derived_sets(inputs) if input_sets is None else input_sets)
    verify = _verifier(kernel, reference, sets, dict(constants or {}))
    timings = measure(built.calls, timer, rounds=settings.rounds, warmup=settings.warmup,
                      min_time_s=settings.min_time_s, max_rounds=settings.round_cap,
                      cold_start=built.cold_start_s, inputs=sets, verify=verify)
    rounds = len(timings["kernel"].samples_ms)
    speedups = _speedups(timings)
    floors = {p: v for p, v in (min_speedup or {}).items() if p in speedups}
    notes = [f"min_speedup for {p} not checked: {p} was not timed" for p in (min_speedup or {}) if p not in speedups]
    gated = gate.gated_providers(speedups, stored, floors)
    # Every provider is checked for noise, gated or not: each is what --fusion-save would store
    # (a new case, or a provider new to a stored case), and a noisy baseline loosens every later
    # gate. Only gated providers can fail the case on noise; the others only keep it from a save.
    ungated = [p for p in speedups if p not in gated]
    remeasured = gate.needs_remeasure(speedups, stored, gated + ungated, tol, floors)
    if remeasured:
        factor = gate.REMEASURE_FACTOR
        cold = {n: t.cold_start_s for n, t in timings.items()}
        timings = measure(built.calls, timer, rounds=settings.rounds * factor, warmup=0,
                          min_time_s=settings.min_time_s * factor, max_rounds=settings.round_cap * factor,
                          cold_start=cold, inputs=sets, verify=verify, order=list(reversed(built.calls)))
        rounds = len(timings["kernel"].samples_ms)
        speedups = _speedups(timings)
        notes.append(f"re-measured with {rounds} rounds in reverse provider order: the first measurement "
                     f"was too noisy or below a threshold")
    method = timings["kernel"].method
    recompiles = built.recompiles_since_warmup()
    if recompiles:
        built.notes["compile"] = "; ".join(
            x for x in (built.notes.get("compile", ""), f"{recompiles} recompile(s) during timing") if x)
    limits = {p: gate.stored_threshold(then, tol) for p, then in (stored.providers.items() if stored else ())}
    # A gated interval wholly below its threshold is a slowdown, not noise (gate.wholly_below).
    noisy = gate.noise_reasons(speedups, [p for p in gated if not (p in limits and gate.wholly_below(speedups[p], limits[p]))],
                               tol, rounds=rounds)
    unsaveable = gate.noise_reasons(speedups, ungated, tol, rounds=rounds)
    notes.extend(f"{r} (not gated; a baseline saved from it would be as noisy, so --fusion-save will not store it)"
                 for r in unsaveable)
    verdict = gate.judge(speedups, stored, tolerance=tol, min_speedup=floors, strict=settings.strict,
                         noisy=noisy, env=env, where=where, dims=dims, recordable=not unsaveable,
                         method=method)
    review = gate.suspicious(speedups, stored)

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
    out_bytes = default_bytes([], built.calls["kernel"]())
    if nbytes is None:
        nbytes = default_bytes(inputs, []) + out_bytes
    rec = BenchRecord(
        kernel=kernel_id, case=case, dtype=dtype, dims=dict(dims), device=device_slug,
        providers=provs, rounds=rounds, flops=flops, bytes=nbytes,
        tflops=None if flops is None else tflops(flops, kernel_ms),
        gbps=gbps(nbytes, kernel_ms),
        status=verdict.status, reasons=list(verdict.reasons), notes=notes + list(verdict.notes),
        env={**dict(env or {}), "method": method}, noisy=bool(noisy or unsaveable),  # noisy records are never saved
        method=method, review=review, remeasured=remeasured,
    )
    if peaks:
        on_gpu = any(getattr(getattr(t, "device", None), "type", "cpu") == "cuda" for t in inputs)
        read_mostly = out_bytes <= _peaks.READ_MOSTLY_FRACTION * float(nbytes or 0)

        def check(p: Mapping[str, float]) -> list[str]:
            return _peaks.implausible(rec.tflops, rec.gbps, p, read_mostly=read_mostly,
                                      compute_dtype=compute_dtype, bound_bandwidth=on_gpu)

        bad = check(peaks)
        if bad and remeasure_peaks is not None:
            peaks = remeasure_peaks()
            bad = check(peaks)
        if bad:
            rec.implausible = bad
            rec.status = "fail"
            rec.reasons.extend(f"{r}: a timing the device cannot produce (not saved)" for r in bad)
        if rec.tflops is not None and peaks.get("tflops"):
            rec.pct_peak_flops = 100.0 * rec.tflops / peaks["tflops"]
        if rec.gbps is not None and peaks.get("gbps"):
            rec.pct_peak_bw = 100.0 * rec.gbps / peaks["gbps"]
    return rec
