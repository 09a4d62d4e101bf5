"""The plain-Python bench and gate: time one bench case against its providers, judge it.

    from pytest_fusion import bench_case, make_spec
    spec = make_spec(linear_gelu, inputs={...}, dims={...}, bench={"decode": dict(M=1, K=4096, N=14336)})
    record = bench_case(spec, fused_linear_gelu, "decode", "float16", stored=None)
    assert record.status != "fail", record.reasons

The plugin's bench items, the ``fusion.bench`` fixture call and reference_kernels' tuner all go
through :func:`bench_case`; :func:`judge` applies the gate (``pytest_fusion.gate.rule``) to a record.

Honesty checks of :func:`bench_case`: the kernel's timed output on a rotated input set must match
golden (``measure.recompute.NotRecomputed``, a ValueError: "output not recomputed during timing");
every timing must be positive, finite and >= ``measure.stats.MIN_SAMPLE_MS`` (a ValueError); a
throughput beyond ``peaks`` by more than the margins of ``measure.peaks`` fails the case as
implausible (``record.implausible``; never saved; ``measure.peak_bound``).
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.bench.timed_case import BenchSettings, CaseTiming, speedups, time_case
from pytest_fusion.declare.spec import DEFAULT_TOLERANCE, BenchCase, FusionUsageError, KernelSpec
from pytest_fusion.gate.comparable import StoredCase
from pytest_fusion.gate.drift import Accuracy, drift_verdict, usage
from pytest_fusion.gate.rule import CaseGate
from pytest_fusion.machine.devices import default_device, device_slug
from pytest_fusion.measure import cold_l2, power
from pytest_fusion.measure.peak_bound import rate_against_peaks
from pytest_fusion.measure.recompute import INPUT_SETS, derived_sets
from pytest_fusion.measure.record import BenchRecord, ProviderResult
from pytest_fusion.measure.stats import gbps, median, tflops
from pytest_fusion.measure.timers import Timer, default_timer, process_clock_threads_note

_DEFAULT_SETTINGS = BenchSettings()
"""``bench_case``'s default settings (one frozen instance, as a default argument would be)."""


def _tensors(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _tensors(o)]
    return [out] if hasattr(out, "nbytes") else []


def default_bytes(inputs: Sequence[Any], output: Any) -> float:
    """Bytes one call must move at least: every input and output read or written once."""
    return float(sum(int(t.nbytes) for t in _tensors(list(inputs)) + _tensors(output)))


def _find_case(spec: KernelSpec, case: BenchCase | str) -> BenchCase:
    if isinstance(case, BenchCase):
        return case
    for c in spec.bench:
        if c.name == case:
            return c
    raise FusionUsageError(
        f"no bench case {case!r} in the spec (cases: {', '.join(c.name for c in spec.bench)})"
    )


def _inputs(spec: KernelSpec, case: BenchCase, *, dtype: str, device: str, seed: int = 0) -> list[Any]:
    """The case's inputs: ``seed`` (0 for the timed ones; 1, 2... for the further input sets,
    drawn like the first), contiguous."""
    from pytest_fusion.oracle.tensors import Case, make_inputs

    drawn = Case(dims=dict(case.dims), dtype=dtype, layouts={}, seed=seed)
    return list(make_inputs(spec, drawn, device).values())


def _case_inputs(
    spec: KernelSpec, kernel: Callable[..., Any], bench: BenchCase, *, dtype: str, device: str,
    inputs: Sequence[Any] | None, input_sets: Sequence[Sequence[Any]] | None,
) -> tuple[Sequence[Any], Sequence[Sequence[Any]], Accuracy | None]:
    """The timed inputs, the further input sets (:func:`bench_case`'s ``inputs`` and
    ``input_sets``, drawn or derived where None) and the kernel's use of its error budget on the
    timed inputs: drawn inputs are checked by the oracle first (passed ones are not: None), a
    forward + backward case's gradients with them (and only there)."""
    accuracy = None
    if inputs is None:
        from pytest_fusion.oracle.case import check_inputs, describe_case
        from pytest_fusion.oracle.tensors import Case

        inputs = _inputs(spec, bench, dtype=dtype, device=device)
        # A kernel wrong at this shape must not be timed, let alone saved as a baseline.
        context = describe_case(Case(dict(bench.dims), dtype, {}, 0), spec)
        found, _ = check_inputs(spec, kernel, inputs, context=context, backward=bench.backward)
        accuracy = usage(found)
        if input_sets is None:
            input_sets = [_inputs(spec, bench, dtype=dtype, device=device, seed=k)
                          for k in range(1, INPUT_SETS)]
    if input_sets is None:
        input_sets = derived_sets(inputs)
    return inputs, input_sets, accuracy


def forward_backward_wrap(
    spec: KernelSpec, inputs: Sequence[Any]
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """What a forward + backward case (``BenchCase.backward``) times in place of each provider's
    function ``fn``: ``fn`` with its floating inputs requiring grad, then ``torch.autograd.grad``
    (:func:`pytest_fusion.oracle.backward.forward_backward`), with one fixed set of upstream gradients
    drawn as the oracle draws them for seed 0, shaped by the reference's outputs on ``inputs``."""
    import torch

    from pytest_fusion.oracle.backward import floating_inputs, forward_backward, upstream_gradients
    from pytest_fusion.oracle.golden import as_tuple

    with torch.no_grad():
        outputs = as_tuple(spec.reference(*inputs, **spec.constants))
    grads, wanted = upstream_gradients(outputs, seed=0), floating_inputs(inputs)
    return lambda fn: forward_backward(fn, grads, wanted)


def _bytes_moved(bench: BenchCase, dtype: str, *, inputs: Sequence[Any], output: Any) -> tuple[float, float]:
    """Bytes one call moves (the case's figure, else every input and output once), and the
    output's bytes."""
    out_bytes = default_bytes([], output)
    nbytes = bench.bytes.get(dtype)
    return (default_bytes(inputs, []) + out_bytes if nbytes is None else nbytes), out_bytes


def _record(
    timed: CaseTiming, *, kernel_id: str, case: BenchCase, dtype: str, slug: str, nbytes: float | None,
) -> BenchRecord:
    """The unjudged record of ``timed``: each provider's median, samples and speedup interval, and
    the kernel's throughput (its percent of the peaks: ``peak_bound.rate_against_peaks``)."""
    built, timings = timed.built, timed.timings
    intervals = speedups(timings)
    provs: dict[str, ProviderResult] = {}
    for name, t in timings.items():
        s = intervals.get(name)
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
    notes = timed.notes + [f"{name}: {note}" for name, note in built.notes.items() if name not in provs]
    capped = power.capped_note(timed.power)
    threads = process_clock_threads_note(timings["kernel"].method)
    if threads:
        warnings.warn(threads, stacklevel=2)
        notes.append(threads)
    kernel_ms = provs["kernel"].median_ms
    flops = case.flops
    rec = BenchRecord(
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
        notes=notes + ([capped] if capped else []),
        method=timings["kernel"].method,
        remeasured=timed.remeasured,
        power=timed.power,
    )
    return rec


def bench_case(
    spec: KernelSpec, kernel: Callable[..., Any], case: BenchCase | str, dtype: str, *,
    stored: StoredCase | None = None, settings: BenchSettings = _DEFAULT_SETTINGS,
    inputs: Sequence[Any] | None = None, device: str | None = None, kernel_id: str | None = None,
    timer: Timer | None = None, peaks: Mapping[str, float] | None = None,
    env: Mapping[str, Any] | None = None, where: str = "the baseline file", slug: str | None = None,
    input_sets: Sequence[Sequence[Any]] | None = None,
    remeasure_peaks: Callable[[], Mapping[str, float]] | None = None,
    notify: Callable[[str], None] | None = None,
) -> BenchRecord:
    """Time ``kernel`` against eager, torch.compile and the spec's extra providers on one bench
    case, and gate its speedups against ``stored`` (:func:`judge`), with the honesty checks of the
    module docstring.

    Args:
        spec: from :func:`~pytest_fusion.declare.spec.make_spec`; its reference, constants, providers,
            min_speedup, tolerance and fp32_precision (the peak bounding a float32 case) apply.
            Its ``flops``/``bytes`` were evaluated per case when the spec was made
            (``BenchCase.flops``, ``BenchCase.bytes``).
        case: one of ``spec.bench`` (or its name); a forward + backward case
            (``BenchCase.backward``, the ``<case>-fwdbwd`` twins of ``backward=True``) times each
            provider's forward + backward (:func:`forward_backward_wrap`).
        dtype: the test dtype, e.g. ``"float16"``.
        stored: the case's baseline entry (``baselines.store.stored_case``), None when it has none.
        inputs: the tensors, passed positionally; default: drawn from the spec (seed 0, contiguous)
            and checked once by the oracle before timing.
        device: default ``spec.device``, else cuda when visible, else cpu; ``slug`` names it in the
            record (default :func:`pytest_fusion.machine.devices.device_slug`).
        kernel_id: the record's kernel name (the plugin passes the test's node id).
        timer: default :func:`pytest_fusion.measure.timing.default_timer` of the device.
        peaks: ``measure.peaks.measure_peaks``' figures of the device (``{"tflops"}`` alone on a
            CPU), for percent of peak and the plausibility bound.
        env: this run's environment (``baselines.environment.current_env``), stored and compared.
        input_sets: further values for ``inputs`` (each a sequence shaped like it) rotated through
            while timing (``timing.InputSets``); default: drawn like the inputs with seeds 1 and 2
            when ``inputs`` is None, else :func:`derived_sets`.
        remeasure_peaks: returns peaks measured again; called once when the throughput is above
            100% of ``peaks`` (they may have read low): the record's percent of peak and the
            plausibility bound then use what it returns (``peak_bound.rate_against_peaks``).
        notify: called with a line as long work the caller should hear about starts: a
            re-measure (``bench.timed_case.time_case``); the plugin prints it.

    Returns:
        The judged :class:`~pytest_fusion.measure.record.BenchRecord`; ``rounds`` counts the rounds
        actually run (after any re-measure); ``power`` holds the SM clock, power draw and throttle
        state over them (``measure.power``; a capped case gets a note, not a failure); ``l2``
        whether the timer's L2 flush exceeds the device's L2 (``measure.cold_l2``; a flush that
        does not gets a note and an ``L2NotCold`` warning, not a failure).

    Raises:
        pytest_fusion.oracle.case.FusionFailure: the kernel fails its correctness check on the
            drawn inputs (not timed).
        ValueError: a bad tolerance, rounds, min_time_s, max_rounds, provider or compile mode.
            Provider errors propagate.
    """
    bench = _find_case(spec, case)
    device = default_device(device or spec.device)
    inputs, input_sets, accuracy = _case_inputs(
        spec, kernel, bench, dtype=dtype, device=device, inputs=inputs, input_sets=input_sets
    )
    tolerance = settings.tolerance if spec.tolerance is None else spec.tolerance
    gate = CaseGate(stored, tolerance, min_speedup=spec.min_speedup, strict=settings.strict, env=env,
                    where=where, dims=bench.dims)
    wrap = forward_backward_wrap(spec, inputs) if bench.backward else None
    timer = timer or default_timer(device)
    timed = time_case(spec, kernel, inputs, input_sets=input_sets, timer=timer, settings=settings, gate=gate,
                      monitor=power.open_monitor(device), wrap=wrap, notify=notify)
    nbytes, out_bytes = _bytes_moved(bench, dtype, inputs=inputs, output=timed.built.calls["kernel"]())
    name = kernel_id or str(getattr(kernel, "__name__", "kernel"))
    rec = _record(timed, kernel_id=name, case=bench, dtype=dtype, slug=slug or device_slug(device),
                  nbytes=nbytes)
    rec.accuracy = None if accuracy is None else accuracy.to_dict()
    rec = _with_cold_l2(_gated(rec, gate), timer, device)
    if peaks:
        rate_against_peaks(rec, peaks, remeasure_peaks=remeasure_peaks, fp32_precision=spec.fp32_precision,
                           inputs=inputs, out_bytes=out_bytes, nbytes=nbytes)
    return rec


def _with_cold_l2(rec: BenchRecord, timer: Timer, device: str) -> BenchRecord:
    """``rec`` with its timer's L2 flush held against the device's L2 (``measure.cold_l2``):
    ``l2``, its ``env`` fields and, for a flush no larger than the L2, a note (and a warning)."""
    state = cold_l2.check(timer, device)
    if state is None:
        return rec
    note = state.note()
    return dataclasses.replace(rec, l2=state.to_dict(), env={**rec.env, **state.env()},
                               notes=rec.notes + ([note] if note else []))


def judge(
    record: BenchRecord, stored: StoredCase | None, *, tolerance: float = DEFAULT_TOLERANCE,
    min_speedup: Mapping[str, float] | None = None, strict: bool = False,
    env: Mapping[str, Any] | None = None, where: str = "the baseline file",
) -> BenchRecord:
    """Gate ``record``'s speedups against ``stored`` (``gate.CaseGate.apply``) and return it judged.

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
    gate = CaseGate(stored, tolerance, min_speedup=dict(min_speedup or {}), strict=strict, env=env,
                    where=where, dims=record.dims)
    return _gated(record, gate)


def _gated(record: BenchRecord, gate: CaseGate) -> BenchRecord:
    """A copy of ``record`` judged by ``gate`` (:meth:`~pytest_fusion.gate.rule.CaseGate.apply`) and by
    the accuracy-drift rule (``gate.drift``): status, reasons, notes, env, noisy, review, replayable."""
    case = gate.apply(record.speedups(), method=record.method or None, rounds=record.rounds,
                      recorded_env=record.env)
    v, stored = case.verdict, case.stored
    # Accuracy drift is judged where the speed gate compared the case with its stored entry.
    drifted, drift_notes = (
        drift_verdict(Accuracy.from_dict(record.accuracy), stored=Accuracy.from_dict(stored.accuracy))
        if v.compared and stored is not None
        else ([], [])
    )
    return dataclasses.replace(
        record,
        status="fail" if drifted else v.status,
        reasons=list(v.reasons) + drifted,
        notes=record.notes + list(case.notes) + drift_notes,
        env=dict(case.env),
        noisy=case.noisy,
        review=list(case.review),
        replayable=v.timing_only and not drifted,
    )
