"""The device's measured peaks: matmul TFLOP/s per dtype and copy GB/s, for "% of peak".

Measured, not taken from a datasheet: a large square matmul in the dtype and a large
device-to-device copy, each timed with the run's timer (best of :data:`PEAK_SAMPLES`). The plugin
keeps the result per device and dtype in pytest's ``config.cache`` and for the session, so it is
measured once (once per session when pytest runs with ``-p no:cacheprovider``). The first
measurement is kept: taken right after a GEMM that held the GPU at its power cap, it reads low
(H200, 2026-11-29: 11 of 114 records of a run without the cache, which measured again for every
case, had a copy peak of 3.8 TB/s against 4.2).

The copy is an elementwise kernel (``torch.neg(src, out=dst)``), not ``dst.copy_(src)``: captured in
a CUDA graph, ``copy_`` becomes a memcpy node that the driver runs on a copy engine. On an H200
the graph-replayed ``copy_`` moved 2.7 TB/s, the same
``copy_`` launched plainly and the graph-replayed ``neg`` 4.2 TB/s, so kernels were rated at up to
156% of the copy "peak".
"""

from __future__ import annotations

from typing import Any, Mapping

from pytest_fusion.bench.timing import Timer

PEAK_SAMPLES = 5
GPU_MATMUL_N = 8192
"""8192^3: 1.1 TFLOP per call, long enough (> 1 ms on an H200) to reach the tensor-core peak."""
GPU_COPY_BYTES = 1 << 30
CPU_MATMUL_N = 512
CPU_COPY_BYTES = 1 << 26


def measure_peaks(device: str, dtype: str, timer: Timer) -> dict[str, float]:
    """``{"tflops": matmul TFLOP/s in dtype, "gbps": copy GB/s}`` on ``device``.

    The copy counts its bytes twice (read and write), as STREAM's copy kernel does.
    """
    import torch

    from pytest_fusion.bench.stats import gbps, tflops

    dt = getattr(torch, dtype)
    gpu = str(device).startswith("cuda")
    n = GPU_MATMUL_N if gpu else CPU_MATMUL_N
    nbytes = GPU_COPY_BYTES if gpu else CPU_COPY_BYTES
    a = torch.randn(n, n, device=device).to(dt)
    b = torch.randn(n, n, device=device).to(dt)
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    mm = timer.prepare("peak-matmul", lambda: torch.mm(a, b))
    cp = timer.prepare("peak-copy", lambda: torch.neg(src, out=dst))  # an SM kernel (module docstring)
    mm_ms = min(mm() for _ in range(PEAK_SAMPLES))
    cp_ms = min(cp() for _ in range(PEAK_SAMPLES))
    return {"tflops": tflops(2.0 * n**3, mm_ms), "gbps": gbps(2.0 * nbytes, cp_ms)}


def cached_peaks(cache: Any, slug: str, device: str, dtype: str, timer: Timer,
                 memo: dict[tuple[str, str], dict[str, float]] | None = None) -> dict[str, float]:
    """:func:`measure_peaks` through ``cache`` (an object with ``get(key, default)``/``set``,
    e.g. ``config.cache``, or None), keyed by device slug, dtype and timer method. ``memo``, a
    dict the caller keeps for its session, answers every repeat first, so that a run without a
    ``cache`` measures once too. Returns a fresh dict each call."""
    # v2: entries under the old key timed a graph-captured copy_ (a copy engine), so they are not reused
    key = f"pytest_fusion/peaks-v2/{slug}"
    sub = f"{dtype}/{getattr(timer, 'method', 'timer')}"
    if memo is not None and (key, sub) in memo:
        return dict(memo[key, sub])
    stored: Mapping[str, Any] = cache.get(key, {}) if cache is not None else {}
    if sub in stored:
        value = dict(stored[sub])
    else:
        value = measure_peaks(device, dtype, timer)
        if cache is not None:
            cache.set(key, {**stored, sub: value})
    if memo is not None:
        memo[key, sub] = value
    return dict(value)
