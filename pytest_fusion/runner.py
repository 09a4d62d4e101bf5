"""The plain-Python bench and gate: time one bench case against its providers, judge it.

    from pytest_fusion import bench_case, make_spec
    spec = make_spec(linear_gelu, inputs={...}, dims={...}, bench={"decode": dict(M=1, K=4096, N=14336)})
    record = bench_case(spec, fused_linear_gelu, "decode", "float16", stored=None)
    assert record.status != "fail", record.reasons

The plugin's bench items, the ``fusion.bench`` fixture call and reference_kernels' tuner all go
through :func:`bench_case`; :func:`judge` applies the gate (``pytest_fusion.gate``) to a record.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion import gate
from pytest_fusion.bench import peaks as _peaks
from pytest_fusion.bench import providers as _providers
from pytest_fusion.bench import recompute, timing
from pytest_fusion.bench.record import BenchRecord, ProviderResult
from pytest_fusion.bench.stats import Speedup, check_times, gbps, median, speedup_interval, tflops
from pytest_fusion.bench.timing import (
    DEFAULT_MAX_ROUNDS,
    DEFAULT_MIN_TIME_S,
    DEFAULT_ROUNDS,
    DEFAULT_WARMUP,
    InputSets,
    ProviderTiming,
    Timer,
    default_timer,
    measure,
)
from pytest_fusion.devices import default_device, device_slug
from pytest_fusion.gate import StoredCase
from pytest_fusion.spec import DEFAULT_TOLERANCE, BenchCase, FusionUsageError, KernelSpec

__all__ = [
    "DEFAULT_ROUNDS",
    "DEFAULT_WARMUP",
    "BenchSettings",
    "bench_case",
    "default_bytes",
    "derived_sets",
    "judge",
]


@dataclasses.dataclass(frozen=True)
class BenchSettings:
    """Run-wide bench settings (the plugin fills them from its configuration).

    ``rounds`` is the minimum; ``min_time_s`` (seconds of samples per provider) and
    ``max_rounds`` size the rest, as in :func:`pytest_fusion.bench.timing.measure`. ``max_rounds``
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
    A spec's case drawn by :func:`bench_case` draws its sets from its own strategy instead."""
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


def _verifier(
    kernel: Callable[..., Any], reference: Callable[..., Any], sets: InputSets, constants: Mapping[str, Any]
) -> Callable[[int, Any], None]:
    """``verify`` for :func:`timing.measure`: the timed output against golden on the same set."""

    def fresh(values: Sequence[Any]) -> list[Any]:
        return [v.clone() if hasattr(v, "clone") else v for v in values]

    def verify(index: int, timed: Any) -> None:
        timed = [t.detach().clone() for t in recompute._flat(timed)]
        values = sets.sets[index]
        again = kernel(*fresh(values), **constants)
        golden = reference(*fresh(values), **constants)
        timing.check_recomputed(timed, again, golden, index)

    return verify


def _speedups(timings: Mapping[str, ProviderTiming]) -> dict[str, Speedup]:
    for name, t in timings.items():
        check_times(name, t.samples_ms)
    k = timings["kernel"].samples_ms
    return {name: speedup_interval(k, t.samples_ms) for name, t in timings.items() if name != "kernel"}


def _find_case(spec: KernelSpec, case: BenchCase | str) -> BenchCase:
    if isinstance(case, BenchCase):
        return case
    for c in spec.bench:
        if c.name == case:
            return c
    raise FusionUsageError(
        f"no bench case {case!r} in the spec (cases: {', '.join(c.name for c in spec.bench)})"
    )


def _inputs(spec: KernelSpec, case: BenchCase, dtype: str, device: str, seed: int = 0) -> list[Any]:
    """The case's inputs: ``seed`` (0 for the timed ones; 1, 2... for the further input sets,
    drawn like the first), contiguous."""
    from pytest_fusion.tensors import Case, make_inputs

    drawn = Case(dims=dict(case.dims), dtype=dtype, layouts={}, seed=seed)
    return list(make_inputs(spec, drawn, device).values())


def _timed(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    timer: Timer,
    settings: BenchSettings,
    tol: float,
    input_sets: Sequence[Sequence[Any]],
    stored: StoredCase | None,
) -> tuple[Any, dict[str, ProviderTiming], list[str], bool]:
    """Build the providers and measure them, rotating through ``input_sets`` and verifying the
    kernel's timed output (``timing.measure``). A first measurement that may not fail the case as
    it stands (``gate.needs_remeasure``: an interval wider than the tolerance, or a gated speedup
    below its threshold or floor) is taken again in the reverse provider order with
    ``gate.REMEASURE_FACTOR`` times the rounds, the time floor and the cap (so about that many
    times the samples whichever of the three decided), and only that one is returned; the last
    item says whether it was."""
    built = _providers.make_providers(
        kernel,
        spec.reference,
        inputs,
        constants=spec.constants,
        extras=spec.providers,
        requested=settings.providers,
        compile_mode=settings.compile_mode,
        warmup=settings.warmup,
    )
    sets = InputSets(inputs, input_sets)
    verify = _verifier(kernel, spec.reference, sets, dict(spec.constants))
    timings = measure(
        built.calls,
        timer,
        rounds=settings.rounds,
        warmup=settings.warmup,
        min_time_s=settings.min_time_s,
        max_rounds=settings.round_cap,
        cold_start=built.cold_start_s,
        inputs=sets,
        verify=verify,
    )
    speedups = _speedups(timings)
    notes = [
        f"min_speedup for {p} not checked: {p} was not timed" for p in spec.min_speedup if p not in speedups
    ]
    floors = {p: v for p, v in spec.min_speedup.items() if p in speedups}
    # Every provider is checked for noise, gated or not: each is what --fusion-save would store.
    remeasured = gate.needs_remeasure(speedups, stored, list(speedups), tol, floors)
    if remeasured:
        factor = gate.REMEASURE_FACTOR
        cold = {n: t.cold_start_s for n, t in timings.items()}
        timings = measure(
            built.calls,
            timer,
            rounds=settings.rounds * factor,
            warmup=0,
            min_time_s=settings.min_time_s * factor,
            max_rounds=settings.round_cap * factor,
            cold_start=cold,
            inputs=sets,
            verify=verify,
            order=list(reversed(built.calls)),
        )
        notes.append(
            f"re-measured with {len(timings['kernel'].samples_ms)} rounds in reverse provider order: "
            "the first measurement was too noisy or below a threshold"
        )
    recompiles = built.recompiles_since_warmup()
    if recompiles:
        built.notes["compile"] = "; ".join(
            x for x in (built.notes.get("compile", ""), f"{recompiles} recompile(s) during timing") if x
        )
    return built, timings, notes, remeasured


def _record(
    kernel_id: str,
    case: BenchCase,
    dtype: str,
    slug: str,
    built: Any,
    timings: Mapping[str, ProviderTiming],
    nbytes: float | None,
    notes: list[str],
    remeasured: bool,
) -> BenchRecord:
    speedups = _speedups(timings)
    provs: dict[str, ProviderResult] = {}
    for name, t in timings.items():
        s = speedups.get(name)
        provs[name] = ProviderResult(
            median_ms=median(t.samples_ms),
            samples_ms=list(t.samples_ms),
            host_ms=t.host_ms,
            cold_start_s=t.cold_start_s,
            peak_bytes=t.peak_bytes,
            method=t.method,
            speedup=None if s is None else s.speedup,
            low=None if s is None else s.low,
            high=None if s is None else s.high,
            note="; ".join(x for x in (t.note, built.notes.get(name, "")) if x),
        )
    notes = notes + [f"{name}: {note}" for name, note in built.notes.items() if name not in provs]
    kernel_ms = provs["kernel"].median_ms
    flops = case.flops
    return BenchRecord(
        kernel=kernel_id,
        case=case.name,
        dtype=dtype,
        dims=dict(case.dims),
        device=slug,
        providers=provs,
        rounds=len(timings["kernel"].samples_ms),
        flops=flops,
        bytes=nbytes,
        tflops=None if flops is None else tflops(flops, kernel_ms),
        gbps=None if nbytes is None else gbps(nbytes, kernel_ms),
        notes=notes,
        method=timings["kernel"].method,
        remeasured=remeasured,
    )


def bench_case(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    case: BenchCase | str,
    dtype: str,
    *,
    stored: StoredCase | None = None,
    settings: BenchSettings = BenchSettings(),
    inputs: Sequence[Any] | None = None,
    device: str | None = None,
    kernel_id: str | None = None,
    timer: Timer | None = None,
    peaks: Mapping[str, float] | None = None,
    env: Mapping[str, Any] | None = None,
    where: str = "the baseline file",
    slug: str | None = None,
    input_sets: Sequence[Sequence[Any]] | None = None,
    compute_dtype: str | None = None,
    remeasure_peaks: Callable[[], Mapping[str, float]] | None = None,
) -> BenchRecord:
    """Time ``kernel`` against eager, torch.compile and the spec's extra providers on one bench
    case, and gate its speedups against ``stored`` (:func:`judge`).

    Args:
        spec: from :func:`~pytest_fusion.spec.make_spec`; its reference, constants, providers,
            min_speedup and tolerance apply. Its ``flops``/``bytes`` were evaluated per case when
            the spec was made (``BenchCase.flops``, ``BenchCase.bytes``).
        case: one of ``spec.bench`` (or its name).
        dtype: the test dtype, e.g. ``"float16"``.
        stored: the case's baseline entry (``baselines.stored_case``), None when it has none.
        inputs: the tensors, passed positionally; default: drawn from the spec (seed 0, contiguous)
            and checked once by the oracle before timing.
        device: default ``spec.device``, else cuda when visible, else cpu; ``slug`` names it in the
            record (default :func:`pytest_fusion.devices.device_slug`).
        kernel_id: the record's kernel name (the plugin passes the test's node id).
        timer: default :func:`pytest_fusion.bench.timing.default_timer` of the device.
        peaks: ``bench.peaks.measure_peaks``' figures of the device (``{"tflops"}`` alone on a
            CPU), for percent of peak and the plausibility bound.
        env: this run's environment (``baselines.current_env``), stored and compared.
        input_sets: further values for ``inputs`` (each a sequence shaped like it) rotated through
            while timing (``timing.InputSets``); default: drawn like the inputs with seeds 1 and 2
            when ``inputs`` is None, else :func:`derived_sets`.
        compute_dtype: ``"ieee"`` holds a float32 kernel to the IEEE peak (default: the TF32 peak
            bounds float32 on a GPU; ``bench.peaks.implausible``).
        remeasure_peaks: returns peaks measured again; called once when the throughput exceeds
            ``peaks`` (they may have read low), before the case fails as implausible.

    Honesty checks (issue 18): the kernel's timed output on a rotated input set must match golden
    (``timing.NotRecomputed``, a ValueError: "output not recomputed during timing"); every timing
    must be positive, finite and >= ``stats.MIN_SAMPLE_MS`` (a ValueError); a throughput beyond
    ``peaks`` by more than the margins of ``bench.peaks`` fails the case as implausible
    (``record.implausible``; never saved).

    Returns:
        The judged :class:`~pytest_fusion.bench.record.BenchRecord`; ``rounds`` counts the rounds
        actually run (after any re-measure).

    Raises:
        pytest_fusion.oracle.FusionFailure: the kernel fails its correctness check on the
            drawn inputs (not timed).
        ValueError: a bad tolerance, rounds, min_time_s, max_rounds, provider or compile mode.
            Provider errors propagate.
    """
    bench = _find_case(spec, case)
    device = default_device(device or spec.device)
    if inputs is None:
        from pytest_fusion.oracle import check_inputs, describe_case
        from pytest_fusion.tensors import Case

        inputs = _inputs(spec, bench, dtype, device)
        # A kernel wrong at this shape must not be timed, let alone saved as a baseline.
        check_inputs(spec, kernel, inputs, context=describe_case(Case(dict(bench.dims), dtype, {}, 0)))
        if input_sets is None:
            input_sets = [_inputs(spec, bench, dtype, device, seed=k) for k in range(1, timing.INPUT_SETS)]
    if input_sets is None:
        input_sets = derived_sets(inputs)
    tol = gate.check_tolerance(settings.tolerance if spec.tolerance is None else spec.tolerance)
    timer = timer or default_timer(device)
    built, timings, notes, remeasured = _timed(spec, kernel, inputs, timer, settings, tol, input_sets, stored)
    out_bytes = default_bytes([], built.calls["kernel"]())
    nbytes = bench.bytes.get(dtype)
    if nbytes is None:
        nbytes = default_bytes(inputs, []) + out_bytes
    rec = _record(
        kernel_id or str(getattr(kernel, "__name__", "kernel")),
        bench,
        dtype,
        slug or device_slug(device),
        built,
        timings,
        nbytes,
        notes,
        remeasured,
    )
    if peaks:
        if rec.tflops is not None and peaks.get("tflops"):
            rec.pct_peak_flops = 100.0 * rec.tflops / peaks["tflops"]
        if rec.gbps is not None and peaks.get("gbps"):
            rec.pct_peak_bw = 100.0 * rec.gbps / peaks["gbps"]
    rec = judge(
        rec, stored, tolerance=tol, min_speedup=spec.min_speedup, strict=settings.strict, env=env, where=where
    )
    if peaks:
        on_gpu = any(getattr(getattr(t, "device", None), "type", "cpu") == "cuda" for t in inputs)
        read_mostly = out_bytes <= _peaks.READ_MOSTLY_FRACTION * float(nbytes or 0)
        _bound_by_peaks(rec, peaks, remeasure_peaks, read_mostly, compute_dtype, on_gpu)
    return rec


def _bound_by_peaks(
    rec: BenchRecord,
    peaks: Mapping[str, float],
    remeasure_peaks: Callable[[], Mapping[str, float]] | None,
    read_mostly: bool,
    compute_dtype: str | None,
    on_gpu: bool,
) -> None:
    """Fail ``rec`` as implausible when its throughput exceeds ``peaks`` beyond the margins of
    ``bench.peaks.implausible``, after measuring the peaks once more (they may have read low)."""

    def check(p: Mapping[str, float]) -> list[str]:
        return _peaks.implausible(
            rec.tflops,
            rec.gbps,
            p,
            read_mostly=read_mostly,
            compute_dtype=compute_dtype,
            bound_bandwidth=on_gpu,
        )

    bad = check(peaks)
    if bad and remeasure_peaks is not None:
        bad = check(remeasure_peaks())
    if bad:
        rec.implausible = bad
        rec.status = "fail"
        rec.reasons.extend(f"{r}: a timing the device cannot produce (not saved)" for r in bad)


def judge(
    record: BenchRecord,
    stored: StoredCase | None,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    min_speedup: Mapping[str, float] | None = None,
    strict: bool = False,
    env: Mapping[str, Any] | None = None,
    where: str = "the baseline file",
) -> BenchRecord:
    """Gate ``record``'s speedups against ``stored`` (``gate.judge``) and return it judged.

    Sets ``status``, ``reasons``, ``noisy`` and ``review`` (``gate.suspicious``) and appends the
    verdict's notes. The threshold is the stored interval's low end when the file has one
    (``gate.stored_threshold``); a gated interval wholly below it fails as a slowdown however wide
    (``gate.wholly_below``); a stored entry timed by another method than ``record.method`` is not
    comparable (``gate.method_mismatch``; a ``stored`` without any ``env`` is not checked). Every provider's
    interval is checked for noise: a gated provider (stored, or with a floor) too noisy fails the
    case; an ungated one only marks the record ``noisy``, which keeps ``--fusion-save`` from
    storing it (a noisy baseline loosens every later gate).

    Raises:
        ValueError: a bad tolerance.
    """
    tol = gate.check_tolerance(tolerance)
    speedups = record.speedups()
    floors = {p: v for p, v in (min_speedup or {}).items() if p in speedups}
    gated = gate.gated_providers(speedups, stored, floors)
    ungated = [p for p in speedups if p not in gated]
    limits = {p: gate.stored_threshold(then, tol) for p, then in (stored.providers.items() if stored else ())}
    # A gated interval wholly below its threshold is a slowdown, not noise (gate.wholly_below).
    judged = [p for p in gated if not (p in limits and gate.wholly_below(speedups[p], limits[p]))]
    noisy = gate.noise_reasons(speedups, judged, tol, rounds=record.rounds)
    unsaveable = gate.noise_reasons(speedups, ungated, tol, rounds=record.rounds)
    method = record.method or None
    # A stored case with no environment at all (built by hand, not read from a file) says nothing
    # of its method; a file's entry always has one, and lacking "method" there means cuda-graph.
    compared_method = method if stored is None or stored.env else None
    verdict = gate.judge(
        speedups,
        stored,
        tolerance=tol,
        min_speedup=floors,
        strict=strict,
        noisy=noisy,
        env=env,
        where=where,
        dims=record.dims,
        recordable=not unsaveable,
        method=compared_method,
    )
    notes = [
        f"{r} (not gated; a baseline saved from it would be as noisy, so --fusion-save will not store it)"
        for r in unsaveable
    ]
    return dataclasses.replace(
        record,
        status=verdict.status,
        reasons=list(verdict.reasons),
        notes=record.notes + notes + list(verdict.notes),
        env={**dict(env or record.env), **({"method": method} if method else {})},
        noisy=bool(noisy or unsaveable),
        review=gate.suspicious(speedups, stored),
    )
