"""One bench case's result, as a JSON-safe record that crosses pytest-xdist and feeds every report.

Times in ms, cold start in s, memory in bytes, throughput in TFLOP/s and GB/s.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Mapping

from pytest_fusion.measure.stats import Speedup

USER_PROPERTY = "pytest_fusion_bench"
"""Key of the record in ``item.user_properties`` (which pytest-xdist sends to the controller)."""


@dataclasses.dataclass
class ProviderResult:
    """Timing of one provider in one case.

    Attributes:
        median_ms: median GPU (or CPU) time over rounds, ms.
        samples_ms: per-round times, ms.
        host_ms: median synchronized call time incl. launch overhead, ms.
        cold_start_s: first call, s (JIT, autotune, torch.compile).
        peak_bytes: peak device memory of one call, bytes (None on the CPU).
        method: ``cuda-graph-clean-l2``, ``cuda-sync-clean-l2`` (``measure.timers``), ``perf_counter``,
            ``process_time`` or a custom timer's name.
        speedup, low, high: kernel's speedup over this provider and its 95% interval (None for
            the kernel itself).
        note: fallbacks (capture failed, compile fell back to eager, recompiles).
    """

    median_ms: float
    samples_ms: list[float]
    host_ms: float
    cold_start_s: float
    peak_bytes: int | None
    method: str
    speedup: float | None = None
    low: float | None = None
    high: float | None = None
    note: str = ""

    def speedup_obj(self, kernel_ms: float) -> Speedup | None:
        if self.speedup is None:
            return None
        low, high = self.low or self.speedup, self.high or self.speedup
        return Speedup(self.speedup, low, high, kernel_ms, self.median_ms)


@dataclasses.dataclass
class BenchRecord:
    """Result of one bench item ``<kernel>[bench-<case>-<dtype>]``.

    Attributes:
        kernel: the test id (``baselines.store.test_id_of_node``: the node id without
            pytest-fusion's own parameter), e.g. ``tests/test_mlp.py::test_linear_gelu``.
        case, dtype, dims: the bench case.
        device: device slug of the baseline file (``nvidia-h200``, a CPU model's slug).
        providers: ``{"kernel": ..., "eager": ..., ...}``.
        rounds: timed rounds (after any re-measure).
        flops, bytes: work of one call (None when unknown); tflops, gbps of the kernel;
            pct_peak_flops, pct_peak_bw: percent of the device's measured peaks.
        status: gate verdict ``pass``/``fail``/``new``; reasons, notes: see ``gate.Verdict``.
        env: environment (device, capability, driver, cuda, torch, triton, method, date, commit).
        noisy: an interval stayed wider than the tolerance after re-measuring (never saved;
            it fails the case only for a gated provider).
        method: the one timing method of every provider of the case (``cuda-graph-clean-l2``,
            ``cuda-sync-clean-l2`` when a provider could not be captured, ``perf_counter``...).
        implausible: the throughput exceeded the device's physics (never saved; fails the case).
        review: speedups far above the stored ones, listed in the summary for a reviewer.
        remeasured: the first measurement would have failed and was taken again in a fresh order.
        replayable: the verdict is a failure on timing alone (a speedup below its threshold or
            floor, or too noisy to judge; ``gate.Verdict.timing_only``), which another process may
            not reproduce: the plugin runs it again in a fresh one (``pytest_fusion.plugin.replay``).
        accuracy: ``{"budget_used", "ulps"}`` of the oracle's check of the timed inputs
            (``drift.Accuracy``), None when the inputs were passed in (not checked).
        power: SM clock (MHz), power draw (W) and throttle state over the timed rounds
            (``measure.power.summarize``: ``capped`` lists ``power``/``thermal``/``slowdown`` when
            the device held its clock down), or ``{"recorded": False, "why": ...}`` (a CPU, no
            ``nvidia-ml-py``); None for a record made before it was recorded.
        l2: ``{"l2_bytes", "flush_bytes", "cold"}``: the timer's L2 flush against the device's
            L2 size, bytes, and whether it is larger (``measure.cold_l2``; also in ``env``); None
            for a timer without a flush (the CPU's) or a record made before it was recorded.
        cold_start: ``{provider: {"cold_s", "warm_s"}}``, seconds of the first call in a fresh
            process with empty Triton and Inductor caches and in the next one (``--fusion-cold-start``,
            ``plugin.cold_start``); None when not measured.
    """

    kernel: str
    case: str
    dtype: str
    dims: dict[str, int]
    device: str
    providers: dict[str, ProviderResult]
    rounds: int
    flops: float | None = None
    bytes: float | None = None
    tflops: float | None = None
    gbps: float | None = None
    pct_peak_flops: float | None = None
    pct_peak_bw: float | None = None
    status: str = "new"
    reasons: list[str] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, Any] = dataclasses.field(default_factory=dict)
    noisy: bool = False
    method: str = ""
    implausible: list[str] = dataclasses.field(default_factory=list)
    review: list[str] = dataclasses.field(default_factory=list)
    remeasured: bool = False
    accuracy: dict[str, float | None] | None = None
    power: dict[str, Any] | None = None
    replayable: bool = False
    l2: dict[str, Any] | None = None
    cold_start: dict[str, dict[str, float]] | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.kernel, self.case, self.dtype)

    @property
    def kernel_ms(self) -> float:
        return self.providers["kernel"].median_ms

    def speedups(self) -> dict[str, Speedup]:
        out = {}
        for name, p in self.providers.items():
            s = p.speedup_obj(self.kernel_ms)
            if s is not None:
                out[name] = s
        return out

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON types only (str, float, int, list, dict, None): pytest-xdist's execnet
        refuses subclasses such as numpy.float64 or torch's TorchVersion."""
        return json.loads(json.dumps(dataclasses.asdict(self)))

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> BenchRecord:
        d = dict(d)
        d["providers"] = {k: ProviderResult(**v) for k, v in d["providers"].items()}
        return cls(**d)
