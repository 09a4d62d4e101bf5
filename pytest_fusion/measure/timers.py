"""Timers: a *timer* turns a zero-argument call into a callable that runs it once and returns
milliseconds.

- :class:`CudaGraphTimer` (CUDA): the call is captured once into a ``torch.cuda.CUDAGraph``; each
  sample reads a 256 MB buffer to flush the L2 cache, which leaves it clean (outside the timed
  span, :meth:`CudaGraphTimer.flush_l2`), then records CUDA events around one graph replay only.
  Replay removes the host's launch overhead from GPU time, and moves far less between repeats
  than a plain launch's median (docs/timing-and-gate.md, "Graph replay"). When capture fails (a
  call that syncs, allocates in a way capture forbids, or nests its own graphs) it falls back to
  the host clock around a plain call between device-wide synchronisations (:data:`SYNC_METHOD`), and
  :func:`pytest_fusion.measure.timing.measure` then times every provider of the case that way.
- :class:`CpuTimer`: ``time.perf_counter`` (or ``time.process_time``, :data:`CPU_CLOCKS`) around a
  calibrated number of calls.

Tests and users can supply their own timer through the ``pytest_fusion_make_timer`` hook.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol

L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Bytes read between timed GPU runs (:meth:`CudaGraphTimer.flush_l2`); triton.testing.do_bench
zeroes the same 256 MB, which exceeds the L2 of any current GPU (H100/H200: 50 MB; B200: 126 MB)."""

GRAPH_METHOD = "cuda-graph-clean-l2"
"""The method of :class:`CudaGraphTimer`'s replays. The name says the L2 is flushed clean: entries
saved by the earlier flush, a memset (method ``cuda-graph``), timed the write-back of the L2's
dirty lines inside every span, so the gate does not compare the two (``comparable.method_mismatch``)."""

SYNC_METHOD = "cuda-sync-clean-l2"
"""The method of :meth:`CudaGraphTimer.prepare_synced`'s host-clock samples (``cuda-sync`` with the
memset flush, before)."""

CPU_MIN_SAMPLE_S = 2e-4
"""A CPU sample repeats the call until it lasts at least this long (0.2 ms), so that
perf_counter's resolution (< 1 us on Linux) stays below 1% of a sample."""


class Timer(Protocol):
    """What :func:`~pytest_fusion.measure.timing.measure` needs from a timer (see module docstring)."""

    method: str

    def prepare(self, name: str, fn: Callable[[], Any]) -> Callable[[], float]:
        """A callable that runs ``fn`` once (or a calibrated number of times) and returns ms."""

    def sync(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def peak_memory(self, name: str, fn: Callable[[], Any]) -> int | None:
        """Peak device bytes allocated by one call of ``fn``, or None when not measurable."""


CPU_CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
"""CPU clocks: ``wall`` (``time.perf_counter``: elapsed time, what a caller waits) and ``process``
(``time.process_time``: CPU seconds of all the process's threads; a preempted process accrues
none, so it holds still on a shared, oversubscribed CI runner, but it sums threads, so a
multi-threaded kernel's parallel speedup does not show, and OpenMP workers that spin while
waiting burn it). Use ``process`` with one thread (docs/timing-and-gate.md, "CPU clocks")."""


class CpuTimer:
    """CPU timing; a sample is the mean of a calibrated number of calls (>= ``min_sample_s``).

    Args:
        clock: a key of :data:`CPU_CLOCKS`.

    Raises:
        ValueError: an unknown clock.
    """

    def __init__(self, min_sample_s: float = CPU_MIN_SAMPLE_S, clock: str = "wall") -> None:
        if clock not in CPU_CLOCKS:
            raise ValueError(f"unknown CPU clock {clock!r}; choose from {', '.join(CPU_CLOCKS)}")
        self.min_sample_s = min_sample_s
        self.clock = CPU_CLOCKS[clock]
        self.method = self.clock.__name__  # perf_counter or process_time

    def sync(self) -> None:
        pass

    def prepare(
        self, name: str, fn: Callable[[], Any], between: Callable[[], Any] | None = None
    ) -> Callable[[], float]:
        """As :meth:`Timer.prepare`; with ``between``, every call of a sample is timed on its own
        and ``between()`` (new input values, :class:`~pytest_fusion.measure.recompute.InputSets`)
        runs before it, outside the clock, so that a kernel that replays a cached result meets
        fresh values on every call.
        A sample then sums per-call clock readings: two extra clock reads per call (~0.1 us with
        ``perf_counter``), for every provider alike."""
        clock = self.clock
        number = 1
        while True:
            t0 = clock()
            for _ in range(number):
                fn()
            elapsed = clock() - t0
            if elapsed >= self.min_sample_s or number >= 1 << 20:
                break
            number *= 2

        def run() -> float:
            t0 = clock()
            for _ in range(number):
                fn()
            return (clock() - t0) * 1e3 / number

        def run_between() -> float:
            assert between is not None
            total = 0.0
            for _ in range(number):
                between()
                t0 = clock()
                fn()
                total += clock() - t0
            return total * 1e3 / number

        if between is not None:
            run = run_between
        run.method = self.method  # type: ignore[attr-defined]
        return run

    def peak_memory(self, name: str, fn: Callable[[], Any]) -> int | None:
        return None


class CudaGraphTimer:
    """GPU time by CUDA-graph replay with the L2 flushed before each replay (module docstring).
    ``flush_bytes``: the bytes each flush reads, held against the device's L2 by
    ``measure.cold_l2``."""

    method = GRAPH_METHOD

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.flush = torch.zeros(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)
        self.flush_bytes = self.flush.numel() * self.flush.element_size()

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def flush_l2(self) -> None:
        """Nothing; queues a read of :data:`L2_FLUSH_BYTES` on the current stream, which evicts
        what the last call left in the L2 (its dirty lines written back during the read) and
        leaves the L2 holding clean lines of the buffer, so the next call meets cold data and no
        write-back of another kernel's lines.

        A memset flush (triton.testing.do_bench's) leaves up to the L2's size of dirty lines, and
        their write-back falls inside the next timed span (docs/timing-and-gate.md, "How it is
        timed")."""
        self.flush.sum()

    def _events(self, launch: Callable[[], Any]) -> float:
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        self.flush_l2()
        start.record()
        launch()
        end.record()
        end.synchronize()
        return float(start.elapsed_time(end))

    def prepare(self, name: str, fn: Callable[[], Any]) -> Callable[[], float]:
        torch = self.torch
        try:
            # Warm on a side stream first, as torch.cuda.graphs' docs require before capture, and
            # capture on that same stream: library handles (cuBLAS/cuBLASLt workspaces) are cached
            # per stream, and one created lazily mid-capture makes capture fail
            # (pytorch PR 187745 made make_graphed_callables do the same).
            stream = torch.cuda.Stream(self.device)
            stream.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(stream):
                for _ in range(2):
                    fn()
            torch.cuda.current_stream(self.device).wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                fn()
            self.sync()

            def replay() -> float:
                return self._events(graph.replay)

            replay.method = GRAPH_METHOD  # type: ignore[attr-defined]
            replay.graph = graph  # type: ignore[attr-defined]  # keeps its memory pool alive
            return replay
        except Exception as exc:  # capture is best effort; the fallback is recorded
            self.sync()
            plain = self.prepare_synced(name, fn)
            plain.note = f"graph capture failed ({type(exc).__name__}: {str(exc)[:120]})"  # type: ignore[attr-defined]
            return plain

    def prepare_synced(self, name: str, fn: Callable[[], Any]) -> Callable[[], float]:
        """Host clock around one plain call between two device-wide synchronisations (method
        :data:`SYNC_METHOD`, the L2 flushed before each): work the call puts on any stream is
        inside the span, which events on the current stream would miss, and so is the
        host's launch overhead. The timing of every provider of a case whenever one provider
        cannot be captured (:func:`~pytest_fusion.measure.timing.measure`)."""
        torch = self.torch

        def synced() -> float:
            self.flush_l2()
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(self.device)
            return (time.perf_counter() - t0) * 1e3

        synced.method = SYNC_METHOD  # type: ignore[attr-defined]
        return synced

    def peak_memory(self, name: str, fn: Callable[[], Any]) -> int | None:
        torch = self.torch
        self.sync()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        fn()
        self.sync()
        return int(torch.cuda.max_memory_allocated(self.device) - before)


def process_clock_threads_note(method: str) -> str:
    """A note for a record timed by ``time.process_time`` while torch runs more than one intra-op
    thread (``torch.get_num_threads()``): that clock sums every thread's CPU time, so a kernel's
    time scales with the thread count and its samples with the threads' contention; else ``""``."""
    if method != "process_time":
        return ""
    import torch

    threads = torch.get_num_threads()
    if threads <= 1:
        return ""
    return (f"the process clock summed the CPU time of torch's {threads} intra-op threads: time on one "
            f"(torch.set_num_threads(1) in a conftest.py, OMP_NUM_THREADS=1), or use the wall clock")


def default_timer(device: str, cpu_clock: str = "wall") -> Timer:
    """The timer for ``device``: :class:`CudaGraphTimer` for ``cuda[:i]``, else
    :class:`CpuTimer` with ``cpu_clock``."""
    if str(device).startswith("cuda"):
        return CudaGraphTimer(device)
    return CpuTimer(clock=cpu_clock)

