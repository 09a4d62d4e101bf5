"""The device's measured peaks: matmul TFLOP/s per dtype and copy GB/s, for "% of peak" and for
the bounds a timing must respect to be believed (:func:`implausible`).

Measured, not taken from a datasheet: a large square matmul in the dtype and a large
device-to-device copy, each timed with the run's timer (best of :data:`PEAK_SAMPLES`). The plugin
keeps the result per device and dtype in pytest's ``config.cache`` and for the session, so it is
measured once (once per session when pytest runs with ``-p no:cacheprovider``). The first
measurement is kept: one taken again right after a GEMM that held the GPU at its power cap reads
low (docs/timing-and-gate.md, "The peaks").

The copy is an elementwise kernel (``torch.neg(src, out=dst)``), not ``dst.copy_(src)``: captured in
a CUDA graph, ``copy_`` becomes a memcpy node that the driver runs on a copy engine, slower than a
kernel's copy (docs/timing-and-gate.md, "The peaks").
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping, Protocol

from pytest_fusion.measure.timers import Timer

FLOPS_MARGIN = 0.30
"""A kernel's TFLOP/s may exceed the measured matmul peak in its compute dtype by this fraction
before it is implausible. The measured figure is torch.mm at 8192^3, below the datasheet's dense
peak by a ratio of about 1.26, so 30% above the measurement is above anything the tensor cores can
do (docs/timing-and-gate.md, "The peaks")."""

BANDWIDTH_MARGIN = 0.15
"""A kernel's GB/s may exceed the measured copy (or read) bandwidth by this fraction: the measured
copy is below the datasheet's bandwidth by a ratio of about 1.14 (docs/timing-and-gate.md, "The
peaks"). Only on a GPU, where the L2 is flushed before each timed replay; a CPU's caches
are not flushed, so a small case there runs from cache far above DRAM bandwidth and is not
bounded."""

READ_MOSTLY_FRACTION = 0.125
"""A kernel whose outputs are at most this fraction of the bytes it moves counts as read-mostly
(a reduction, a norm's statistics, a GEMV's weight stream): it is bounded by the larger of the
measured read bandwidth (a sum over the buffer) and the copy's, since a read-only stream may run
faster than a copy that must also write. Which one a kernel is follows from its output bytes, known after the
call, so nothing needs declaring."""

PEAK_COOLDOWN_S = 1.0
"""Idle seconds before re-measuring peaks that may have read low: a GPU held at its power cap by a
long GEMM clocks down, and the peaks measured next read low (docs/timing-and-gate.md, "The
peaks"); an idle second lets the clocks recover."""

PEAK_SAMPLES = 5
GPU_MATMUL_N = 8192
"""8192^3: 1.1 TFLOP per call, long enough (> 1 ms on an H200) to reach the tensor-core peak."""
GPU_COPY_BYTES = 1 << 30
CPU_MATMUL_N = 512
CPU_COPY_BYTES = 1 << 26


def measure_peaks(device: str, dtype: str, timer: Timer) -> dict[str, float]:
    """``{"tflops": matmul TFLOP/s in dtype, "gbps": copy GB/s, "read_gbps": read GB/s}`` on
    ``device``, plus ``"tflops_tf32"`` for float32 on a GPU (the matmul with TF32 allowed).

    The copy counts its bytes twice (read and write), as STREAM's copy kernel does; the read is a
    sum over the same buffer, counted once. On the CPU ``tflops`` is the faster of a float32 and a
    ``dtype`` matmul (CPU kernels often compute low precision in float32, and torch's CPU float16
    matmul is far slower than float32: a bound from it alone would fail honest kernels; a CPU with
    bf16 matrix units runs bf16 faster than float32).
    """
    import torch

    from pytest_fusion.measure.stats import gbps, tflops

    dt = getattr(torch, dtype)
    gpu = str(device).startswith("cuda")
    n = GPU_MATMUL_N if gpu else CPU_MATMUL_N
    nbytes = GPU_COPY_BYTES if gpu else CPU_COPY_BYTES
    dts = [dt] if gpu else list(dict.fromkeys([torch.float32, dt]))
    mats = [(torch.randn(n, n, device=device).to(d), torch.randn(n, n, device=device).to(d)) for d in dts]
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    def matmul(a: Any, b: Any) -> Callable[[], Any]:
        return lambda: torch.mm(a, b)

    mms = [timer.prepare("peak-matmul", matmul(a, b)) for a, b in mats]
    cp = timer.prepare("peak-copy", lambda: torch.neg(src, out=dst))  # an SM kernel (module docstring)
    rd = timer.prepare("peak-read", lambda: torch.sum(src))
    mm_ms = min(mm() for mm in mms for _ in range(PEAK_SAMPLES))
    cp_ms = min(cp() for _ in range(PEAK_SAMPLES))
    rd_ms = min(rd() for _ in range(PEAK_SAMPLES))
    out = {
        "tflops": tflops(2.0 * n**3, mm_ms),
        "gbps": gbps(2.0 * nbytes, cp_ms),
        "read_gbps": gbps(float(nbytes), rd_ms),
    }
    if gpu and dt == torch.float32:
        before = torch.backends.cuda.matmul.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = True
        try:
            a, b = mats[0]
            tf = timer.prepare("peak-matmul-tf32", lambda: torch.mm(a, b))
            out["tflops_tf32"] = tflops(2.0 * n**3, min(tf() for _ in range(PEAK_SAMPLES)))
        finally:
            torch.backends.cuda.matmul.allow_tf32 = before
    return out


class Cache(Protocol):
    """What :func:`cached_peaks` needs of a cache across runs (pytest's ``config.cache`` is one)."""

    def get(self, key: str, default: Any) -> Any: ...

    def set(self, key: str, value: Any) -> None: ...


def cached_peaks(cache: Cache | None, timer: Timer, *, slug: str, device: str, dtype: str,
                 memo: dict[tuple[str, str], dict[str, float]] | None = None,
                 remeasure: bool = False) -> dict[str, float]:
    """:func:`measure_peaks` through ``cache`` (or None), keyed by device slug, dtype and timer
    method. ``memo``, a dict the caller keeps for its session, answers every repeat first, so that
    a run without a ``cache`` measures once too. Returns a fresh dict each call.

    ``remeasure``: the kept peaks may have read low (a timing exceeded them): wait
    :data:`PEAK_COOLDOWN_S`, measure again and keep the larger of old and new per figure."""
    # v3: v2 entries lack read_gbps and tflops_tf32
    key = f"pytest_fusion/peaks-v3/{slug}"
    sub = f"{dtype}/{getattr(timer, 'method', 'timer')}"
    if memo is not None and (key, sub) in memo and not remeasure:
        return dict(memo[key, sub])
    stored: Mapping[str, Any] = cache.get(key, {}) if cache is not None else {}
    if sub in stored and not remeasure:
        value = dict(stored[sub])
    else:
        old = dict(memo[key, sub]) if memo is not None and (key, sub) in memo else dict(stored.get(sub, {}))
        if remeasure:
            timer.sync()
            time.sleep(PEAK_COOLDOWN_S)
        value = measure_peaks(device, dtype, timer)
        value = {k: max(v, old.get(k, 0.0)) for k, v in value.items()}
        if cache is not None:
            cache.set(key, {**stored, sub: value})
    if memo is not None:
        memo[key, sub] = value
    return dict(value)


def implausible(
    tflops: float | None,
    gbps: float | None,
    peaks: Mapping[str, float],
    *,
    read_mostly: bool,
    fp32_precision: str = "ieee",
    bound_bandwidth: bool = True,
) -> list[str]:
    """One line per figure beyond the device's physics (empty: plausible).

    Args:
        tflops, gbps: the kernel's measured throughput (None: not known).
        peaks: :func:`measure_peaks`' figures.
        read_mostly: outputs <= :data:`READ_MOSTLY_FRACTION` of the bytes: bounded by the larger
            of ``read_gbps`` and ``gbps`` (a sum is not the fastest possible reader either).
        fp32_precision: the kernel's declared float32 matmul precision (the marker's
            ``fp32_precision``): ``"tf32"`` bounds a float32 case by ``tflops_tf32`` where it was
            measured (a GPU), ``"ieee"`` by ``tflops``. TF32 is opt-in, as in torch: an undeclared
            float32 kernel timed at the TF32 rate fails as implausible.
        bound_bandwidth: False on a device whose caches are not flushed between timed calls (CPU).
    """
    out = []
    flops_key = "tflops_tf32" if fp32_precision == "tf32" and peaks.get("tflops_tf32") else "tflops"
    peak_f = peaks.get(flops_key)
    if tflops is not None and peak_f and tflops > peak_f * (1.0 + FLOPS_MARGIN):
        out.append(f"implausible: {tflops:.4g} TFLOP/s is {tflops / peak_f:.0%} of the measured matmul peak "
                   f"({flops_key} {peak_f:.4g} TFLOP/s; allowed up to {1 + FLOPS_MARGIN:.0%})")
    bw_key = "read_gbps" if read_mostly and peaks.get("read_gbps", 0.0) > peaks.get("gbps", 0.0) else "gbps"
    peak_b = peaks.get(bw_key)
    if bound_bandwidth and gbps is not None and peak_b and gbps > peak_b * (1.0 + BANDWIDTH_MARGIN):
        what = "read" if bw_key == "read_gbps" else "copy"
        out.append(f"implausible: {gbps:.4g} GB/s is {gbps / peak_b:.0%} of the measured {what} bandwidth "
                   f"({peak_b:.4g} GB/s; allowed up to {1 + BANDWIDTH_MARGIN:.0%})")
    return out
