"""A bench record held against the device's measured peaks (``measure.peaks``): its percent of
peak, and the implausibility bound that fails a throughput the device cannot produce."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.measure import peaks as _peaks
from pytest_fusion.measure.record import BenchRecord


def percent_of_peak(rec: BenchRecord, peaks: Mapping[str, float] | None) -> None:
    """Nothing; sets ``rec``'s percent of the peak TFLOP/s and GB/s where both figures exist."""
    if peaks:
        if rec.tflops is not None and peaks.get("tflops"):
            rec.pct_peak_flops = 100.0 * rec.tflops / peaks["tflops"]
        if rec.gbps is not None and peaks.get("gbps"):
            rec.pct_peak_bw = 100.0 * rec.gbps / peaks["gbps"]


def above_peak(rec: BenchRecord) -> bool:
    """Whether ``rec`` claims more than 100% of a measured peak (TFLOP/s or GB/s)."""
    return any(pct is not None and pct > 100.0 for pct in (rec.pct_peak_flops, rec.pct_peak_bw))


def rate_against_peaks(
    rec: BenchRecord,
    peaks: Mapping[str, float],
    *,
    remeasure_peaks: Callable[[], Mapping[str, float]] | None,
    fp32_precision: str,
    inputs: Sequence[Any],
    out_bytes: float,
    nbytes: float,
) -> None:
    """Set ``rec``'s percent of the device's peaks and fail it as implausible when its throughput
    exceeds them beyond the margins of ``measure.peaks.implausible``.

    A figure above 100% of ``peaks`` means either that the kernel beats the device's own reference
    op (a read-mostly stream beating the copy, a GEMM beating torch.mm at 8192^3) or that the
    peaks read low: they are measured once and kept per device and dtype (``measure.peaks``), and
    a GPU just held at its power cap measures low (docs/timing-and-gate.md, "The peaks"). So such
    a record gets ``remeasure_peaks()`` (when given) and both its percentages and
    the bound use what it returns.
    ``inputs`` place the case on a GPU or not; ``out_bytes`` of the ``nbytes`` a call moves are
    written (a read-mostly kernel may beat the copy peak, ``measure.peaks.READ_MOSTLY_FRACTION``)."""
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

    percent_of_peak(rec, peaks)
    bad = check(peaks)
    if (bad or above_peak(rec)) and remeasure_peaks is not None:
        peaks = remeasure_peaks()
        percent_of_peak(rec, peaks)
        bad = check(peaks)
    if bad:
        rec.implausible = bad
        rec.status = "fail"
        rec.replayable = False  # a timing the device cannot produce is one in any process
        rec.reasons.extend(f"{r}: a timing the device cannot produce (not saved)" for r in bad)
