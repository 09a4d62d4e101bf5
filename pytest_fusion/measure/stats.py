"""Speedup statistics over timing rounds: medians and a paired bootstrap confidence interval.

Plain numpy, no torch. Times are in milliseconds.

The interval method: a *paired, seeded percentile bootstrap over rounds*. Round ``r`` timed
every provider once (interleaved, see ``measure.timing``), so the
kernel's and a provider's samples of one round share that round's machine state (clocks,
temperature, neighbours). Each bootstrap resample draws round indices with replacement and
keeps the pairs together, then takes ``median(provider) / median(kernel)`` over the drawn rounds;
the 2.5th and 97.5th percentiles of :data:`BOOTSTRAP_RESAMPLES` such ratios bound the 95%
interval (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13). The seed is fixed
so that the same samples always give the same interval.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Sequence

import numpy as np

BOOTSTRAP_RESAMPLES = 2000
"""Resamples per interval; 2000 puts the percentile's own Monte-Carlo error well below 1%."""

BOOTSTRAP_SEED = 0
CONFIDENCE = 0.95

MIN_SAMPLE_MS = 1e-5
"""Smallest believable time of one call, in ms (10 ns): below a Python function call (~50 ns) and
a GPU kernel launch (~2 us), so a timer reporting less is broken or faked
(docs/timing-and-gate.md, "Broken timers")."""


def check_times(name: str, samples_ms: Sequence[float]) -> None:
    """Raise ValueError naming ``name`` unless every sample is finite and >= :data:`MIN_SAMPLE_MS`.

    Args:
        name: the provider, named in the message.
        samples_ms: per-round times in ms.
    """
    bad = [t for t in samples_ms if not (math.isfinite(t) and t >= MIN_SAMPLE_MS)]
    if bad:
        raise ValueError(
            f"{name}: {len(bad)} of {len(samples_ms)} timings are not positive, finite and >= "
            f"{MIN_SAMPLE_MS:g} ms (first: {bad[0]!r} ms); the timer is broken, nothing is judged or saved")


@dataclasses.dataclass(frozen=True)
class Speedup:
    """Speedup of the kernel over one provider.

    Attributes:
        speedup: ``provider_ms / kernel_ms`` of the medians; > 1 means the kernel is faster.
        low, high: bounds of the 95% paired bootstrap interval of ``speedup``.
        kernel_ms, provider_ms: the medians, in ms.
    """

    speedup: float
    low: float
    high: float
    kernel_ms: float
    provider_ms: float

    @property
    def rel_width(self) -> float:
        """Interval width as a fraction of the speedup: ``(high - low) / speedup``."""
        return (self.high - self.low) / self.speedup if self.speedup > 0 else math.inf


def median(samples: Sequence[float]) -> float:
    """Median of ``samples``; raises ValueError when there are none."""
    if len(samples) == 0:
        raise ValueError("median of no samples")
    return float(np.median(np.asarray(samples, dtype=np.float64)))


def speedup_interval(
    kernel_ms: Sequence[float],
    provider_ms: Sequence[float],
    *,
    resamples: int = BOOTSTRAP_RESAMPLES,
    seed: int = BOOTSTRAP_SEED,
    confidence: float = CONFIDENCE,
) -> Speedup:
    """Speedup ``median(provider_ms) / median(kernel_ms)`` with its paired bootstrap interval.

    Args:
        kernel_ms, provider_ms: per-round times in ms, the same length; sample ``r`` of each was
            taken in round ``r``.
        resamples, seed, confidence: bootstrap settings (module docstring).

    Raises:
        ValueError: lengths differ, no samples, or a time is not positive and finite.
    """
    k = np.asarray(kernel_ms, dtype=np.float64)
    p = np.asarray(provider_ms, dtype=np.float64)
    if k.shape != p.shape or k.ndim != 1 or k.size == 0:
        raise ValueError(f"need two equal, non-empty series of round times, got {k.shape} and {p.shape}")
    if not (np.all(np.isfinite(k)) and np.all(np.isfinite(p)) and np.all(k > 0) and np.all(p > 0)):
        raise ValueError("round times must be positive and finite (ms)")
    k_med, p_med = float(np.median(k)), float(np.median(p))
    point = p_med / k_med
    if k.size == 1:
        return Speedup(point, point, point, k_med, p_med)
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, k.size, size=(resamples, k.size))
    ratios = np.median(p[idx], axis=1) / np.median(k[idx], axis=1)
    alpha = (1.0 - confidence) / 2.0
    low, high = np.quantile(ratios, [alpha, 1.0 - alpha])
    # The point estimate lies inside its own interval by construction of the report, even when
    # the resampled medians all land on one side of it (possible with very few rounds).
    return Speedup(point, float(min(low, point)), float(max(high, point)), k_med, p_med)


def tflops(flops: float, ms: float) -> float:
    """Throughput in TFLOP/s of ``flops`` floating-point operations done in ``ms`` milliseconds."""
    return flops / (ms * 1e-3) / 1e12


def gbps(nbytes: float, ms: float) -> float:
    """Bandwidth in GB/s (1e9 bytes/s) of ``nbytes`` moved in ``ms`` milliseconds."""
    return nbytes / (ms * 1e-3) / 1e9
