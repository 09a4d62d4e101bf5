"""A bench record held against the device's measured peaks (``bench.peaks``): its percent of peak,
and the implausibility bound that fails a throughput the device cannot produce (issue 18)."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.bench import peaks as _peaks
from pytest_fusion.bench.record import BenchRecord


def percent_of_peak(rec: BenchRecord, peaks: Mapping[str, float] | None) -> None:
    """Nothing; sets ``rec``'s percent of the peak TFLOP/s and GB/s where both figures exist."""
    if peaks:
        if rec.tflops is not None and peaks.get("tflops"):
            rec.pct_peak_flops = 100.0 * rec.tflops / peaks["tflops"]
        if rec.gbps is not None and peaks.get("gbps"):
            rec.pct_peak_bw = 100.0 * rec.gbps / peaks["gbps"]


def bound_by_peaks(
    rec: BenchRecord,
    peaks: Mapping[str, float],
    remeasure_peaks: Callable[[], Mapping[str, float]] | None,
    fp32_precision: str,
    inputs: Sequence[Any],
    out_bytes: float,
    nbytes: float,
) -> None:
    """Fail ``rec`` as implausible when its throughput exceeds ``peaks`` beyond the margins of
    ``bench.peaks.implausible``, after measuring the peaks once more (they may have read low).
    ``inputs`` place the case on a GPU or not; ``out_bytes`` of the ``nbytes`` a call moves are
    written (a read-mostly kernel may beat the copy peak, ``bench.peaks.READ_MOSTLY_FRACTION``)."""
    on_gpu = any(getattr(getattr(t, "device", None), "type", "cpu") == "cuda" for t in inputs)
    read_mostly = out_bytes <= _peaks.READ_MOSTLY_FRACTION * float(nbytes or 0)

    def check(p: Mapping[str, float]) -> list[str]:
        return _peaks.implausible(
            rec.tflops,
            rec.gbps,
            p,
            read_mostly=read_mostly,
            fp32_precision=fp32_precision,
            bound_bandwidth=on_gpu,
        )

    bad = check(peaks)
    if bad and remeasure_peaks is not None:
        bad = check(remeasure_peaks())
    if bad:
        rec.implausible = bad
        rec.status = "fail"
        rec.reasons.extend(f"{r}: a timing the device cannot produce (not saved)" for r in bad)
