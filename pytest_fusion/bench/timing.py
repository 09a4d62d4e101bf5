"""Timers and the interleaved measurement loop.

A *timer* turns a zero-argument call into a callable that runs it once and returns milliseconds:

- :class:`CudaGraphTimer` (CUDA): the call is captured once into a ``torch.cuda.CUDAGraph``; each
  sample zeroes a 256 MB buffer to flush the L2 cache (outside the timed span), then records CUDA
  events around one graph replay only. Replay removes the host's launch overhead from GPU time: on
  an H200 (issue 4) a do_bench median moved +/-5% across five repeats, graph replay 1%. When
  capture fails (a call that syncs, allocates in a way capture forbids, or nests its own graphs)
  it falls back to the host clock around a plain call between device-wide synchronisations
  (``cuda-sync``), and :func:`measure` then times every provider of the case that way.
- :class:`CpuTimer`: ``time.perf_counter`` (or ``time.process_time``, :data:`CPU_CLOCKS`) around a
  calibrated number of calls.

Tests and users can supply their own timer through the ``pytest_fusion_make_timer`` hook.
:func:`measure` runs warm-up, then rounds in which every provider is timed once, the order rotated
by one each round, so that slow drift (clocks, temperature) hits every provider alike: at least
``rounds`` of them, and more until each provider's samples add up to ``min_time_s`` (at most
``max_rounds``), so that a microsecond kernel's median rests on as much measured time as a
millisecond kernel's.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
import time
from typing import Any, Callable, Mapping, Protocol, Sequence

L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Bytes zeroed between timed GPU runs; triton.testing.do_bench uses the same 256 MB, which
exceeds the L2 of any current GPU (H100/H200: 50 MB; B200: 126 MB)."""

DEFAULT_ROUNDS = 30
"""Minimum rounds per case: 30 paired samples put a bootstrap interval of a median ratio within
about +/-1% on CUDA-graph timings (issue 4: replay moves 1% run to run). Fast kernels get more,
up to ``max_rounds``, until each provider has ``min_time_s`` of samples (:func:`measure`)."""

DEFAULT_WARMUP = 5
"""Untimed warm-up calls per provider after its cold-start call."""

DEFAULT_MIN_TIME_S = 0.05
"""Seconds of summed samples each provider gets at least (:func:`measure`): 50 ms. With a fixed
30 rounds an 8 us decode kernel's median rested on 0.24 ms of GPU time, a 10 ms prefill kernel's
on 300 ms; on an H200 (five back-to-back runs of 12 cases) the only speedups
that left +-2% of their median were two of the 8 us gpt2-M1 case (-3.1%, -2.2%). Triton's
do_bench (rep=100 ms) and pytest-benchmark (--benchmark-min-time) size repetitions by time too."""

DEFAULT_MAX_ROUNDS = 1000
"""Cap on the rounds :data:`DEFAULT_MIN_TIME_S` can lead to. Cost on a GPU, per round and
provider (an estimate, not a timed run): one L2 flush (256 MB memset: >= 0.056 ms at the H200's
4.8 TB/s, ~0.08 ms in practice), one graph replay, one event sync: ~0.1-0.2 ms of host time, so
1000 rounds of 3 providers take ~0.5 s per decode case (the reference suite has ~30). The paired
bootstrap over 1000 rounds adds 0.15 s per provider (2000 resamples; measured on the 2-core CPU
machine, 2026-11-29; 0.48 s at 4000 rounds, the cap of a re-measure)."""

CPU_MIN_SAMPLE_S = 2e-4
"""A CPU sample repeats the call until it lasts at least this long (0.2 ms), so that
perf_counter's resolution (< 1 us on Linux) stays below 1% of a sample."""


class Timer(Protocol):
    """What :func:`measure` needs from a timer (see module docstring)."""

    method: str

    def prepare(self, name: str, fn: Callable[[], Any]) -> Callable[[], float]:
        """A callable that runs ``fn`` once (or a calibrated number of times) and returns ms."""

    def sync(self) -> None:
        """Wait for queued device work (no-op on the CPU)."""

    def peak_memory(self, name: str, fn: Callable[[], Any]) -> int | None:
        """Peak device bytes allocated by one call of ``fn``, or None when not measurable."""


@dataclasses.dataclass
class ProviderTiming:
    """Raw timing of one provider.

    Attributes:
        samples_ms: one time per round, in ms, in round order.
        cold_start_s: seconds of the very first call (JIT, autotune, torch.compile), synchronized.
        host_ms: median wall time of a synchronized eager call, launch overhead included, in ms.
        peak_bytes: peak device memory of one call above what was allocated before it.
        method: how ``samples_ms`` were taken (``cuda-graph``, ``cuda-sync``, ``perf_counter``...).
        note: why the method fell back, when it did.
    """

    samples_ms: list[float]
    cold_start_s: float
    host_ms: float
    peak_bytes: int | None
    method: str
    note: str = ""


CPU_CLOCKS = {"wall": time.perf_counter, "process": time.process_time}
"""CPU clocks: ``wall`` (``time.perf_counter``: elapsed time, what a caller waits) and ``process``
(``time.process_time``: CPU seconds of all the process's threads; a preempted process accrues
none, so it holds still on a shared, oversubscribed CI runner, but it sums threads, so a
multi-threaded kernel's parallel speedup does not show). Twenty gate runs of an unchanged
1.5 ms single-thread linear+GELU with two baseline providers, on a shared 2-core CPU machine: at a
load average of 5, per-sample CV 0.021 with ``process`` and 0.690 with ``wall``; the gate passed
20/20 with ``process`` but 5/20 with ``wall`` (the other 15 failed as too noisy to judge); at a
load of 4.3 both clocks gave 20/20.
Caveat: OpenMP workers that spin while waiting burn process time; with 2 torch threads on that
loaded machine a 256^3 matmul that takes 0.18 ms once read 24.5 ms of process time per call
(tests/test_bench_plugin.py, real-CPU gate test, same day). Use ``process`` with one thread."""


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
        and ``between()`` (new input values, :class:`InputSets`) runs before it, outside the
        clock, so that a kernel that replays a cached result meets fresh values on every call.
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
    """GPU time by CUDA-graph replay with the L2 flushed before each replay (module docstring)."""

    method = "cuda-graph"

    def __init__(self, device: str = "cuda") -> None:
        import torch

        self.torch = torch
        self.device = torch.device(device)
        self.flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device=self.device)

    def sync(self) -> None:
        self.torch.cuda.synchronize(self.device)

    def _events(self, launch: Callable[[], Any]) -> float:
        torch = self.torch
        start = torch.cuda.Event(enable_timing=True)
        end = torch.cuda.Event(enable_timing=True)
        self.flush.zero_()
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

            replay.method = "cuda-graph"  # type: ignore[attr-defined]
            replay.graph = graph  # type: ignore[attr-defined]  # keeps its memory pool alive
            return replay
        except Exception as exc:  # capture is best effort; the fallback is recorded
            self.sync()
            plain = self.prepare_synced(name, fn)
            plain.note = f"graph capture failed ({type(exc).__name__}: {str(exc)[:120]})"  # type: ignore[attr-defined]
            return plain

    def prepare_synced(self, name: str, fn: Callable[[], Any]) -> Callable[[], float]:
        """Host clock around one plain call between two device-wide synchronisations (method
        ``cuda-sync``): work the call puts on any stream is inside the span, which events on the
        current stream would miss (issue 18), and so is the host's launch overhead. The timing of
        every provider of a case whenever one provider cannot be captured (:func:`measure`)."""
        torch = self.torch

        def synced() -> float:
            self.flush.zero_()
            torch.cuda.synchronize(self.device)
            t0 = time.perf_counter()
            fn()
            torch.cuda.synchronize(self.device)
            return (time.perf_counter() - t0) * 1e3

        synced.method = "cuda-sync"  # type: ignore[attr-defined]
        return synced

    def peak_memory(self, name: str, fn: Callable[[], Any]) -> int | None:
        torch = self.torch
        self.sync()
        before = torch.cuda.memory_allocated(self.device)
        torch.cuda.reset_peak_memory_stats(self.device)
        fn()
        self.sync()
        return int(torch.cuda.max_memory_allocated(self.device) - before)


INPUT_SETS = 3
"""Input sets a case rotates through while it is timed (:class:`InputSets`): the original values
and two more. Two would do to defeat a cached result; the third keeps a kernel from passing by
alternating between two cached results."""

RECOMPUTE_SLACK = 4.0
"""How much larger than a fresh call's error against golden the timed output's may be: the same
kernel on the same values differs only by its own nondeterminism (atomics), while a stale output
computed from other values is off by the size of the values themselves (relative error ~1)."""

RECOMPUTE_FLOOR = 1e-2
"""Relative error against golden (max abs error / max abs golden) always accepted: far above any
dtype's rounding of a recomputed result (bf16: 4e-3 per op), far below a stale one's (~1)."""


class NotRecomputed(ValueError):
    """The kernel's output during timing did not follow its inputs (it replays a cached result)."""


class InputSets:
    """Fresh values for the tensors a case's providers were bound to.

    ``buffers`` are the very tensors the provider calls read (captured into CUDA graphs by
    address); :meth:`load` copies set ``i`` into them in place, outside any timed span. Set 0 is a
    copy of the buffers' values at construction, the values the providers were built, warmed and
    captured with. Non-tensor inputs (and tensors without a matching value) are left alone.

    Args:
        buffers: the inputs, in the order the providers take them.
        extra: further input sets, each shaped like ``buffers`` (tensors of the same shapes).

    Raises:
        ValueError: a set of another length, or a tensor of another shape.
    """

    def __init__(self, buffers: Sequence[Any], extra: Sequence[Sequence[Any]] = ()) -> None:
        self.buffers = list(buffers)
        self.sets: list[list[Any]] = [[_clone(b) for b in self.buffers]]
        for k, values in enumerate(extra):
            values = list(values)
            if len(values) != len(self.buffers):
                raise ValueError(
                    f"input set {k + 1} has {len(values)} inputs, the case has {len(self.buffers)}"
                )
            for b, v in zip(self.buffers, values, strict=True):
                if hasattr(b, "copy_") and tuple(getattr(v, "shape", ())) != tuple(b.shape):
                    raise ValueError(f"input set {k + 1}: shape {tuple(getattr(v, 'shape', ()))} "
                                     f"differs from the case's {tuple(b.shape)}")
            self.sets.append(values)
        self.current = 0

    def __len__(self) -> int:
        return len(self.sets)

    def load(self, i: int) -> None:
        """Copy set ``i % len(self)`` into the buffers (no-op when it is already there)."""
        i %= len(self.sets)
        if i == self.current:
            return
        for b, v in zip(self.buffers, self.sets[i], strict=True):
            if hasattr(b, "copy_") and hasattr(v, "shape"):
                b.detach().copy_(v)
        self.current = i

    def advance(self) -> None:
        """Load the next set."""
        self.load(self.current + 1)


def _clone(x: Any) -> Any:
    return x.detach().clone() if hasattr(x, "clone") else x


def _flat(out: Any) -> list[Any]:
    if isinstance(out, (tuple, list)):
        return [t for o in out for t in _flat(o)]
    return [out] if hasattr(out, "shape") else []


def relative_error(out: Any, golden: Any) -> float:
    """``max |out - golden| / max |golden|`` over all output tensors, in float32 on their device
    (a 8192 x 14336 output would take 0.9 GB per copy in float64 on the host), inf on a shape
    mismatch or a non-finite difference where golden is finite."""
    import torch

    a, g = _flat(out), _flat(golden)
    if len(a) != len(g):
        return math.inf
    err, scale = 0.0, 0.0
    for x, y in zip(a, g, strict=True):
        if tuple(x.shape) != tuple(y.shape):
            return math.inf
        x64, y64 = x.detach().to(torch.float32), y.detach().to(device=x.device, dtype=torch.float32)
        finite = torch.isfinite(y64)
        if finite.any():
            diff = (x64 - y64)[finite].abs()
            err = max(err, float(diff.max()) if diff.numel() else 0.0)
            if not math.isfinite(err):
                return math.inf
            scale = max(scale, float(y64[finite].abs().max()))
    return err / scale if scale > 0 else err


def check_recomputed(timed: Any, fresh: Any, golden: Any, set_index: int) -> None:
    """Raise :class:`NotRecomputed` unless ``timed`` (the output of a timed call on input set
    ``set_index``) is as close to ``golden`` as ``fresh`` (the kernel called afresh on copies of
    that set): within :data:`RECOMPUTE_SLACK` times its error, or :data:`RECOMPUTE_FLOOR`."""
    e_timed, e_fresh = relative_error(timed, golden), relative_error(fresh, golden)
    if e_timed > max(RECOMPUTE_SLACK * e_fresh, RECOMPUTE_FLOOR):
        raise NotRecomputed(
            f"output not recomputed during timing: after input set {set_index} was copied into the "
            f"timed inputs, the kernel's output is off golden by {e_timed:.3g} (relative, max abs), a "
            f"fresh call on the same values by {e_fresh:.3g}; a kernel that returns a result cached "
            f"from earlier inputs is timed doing nothing (its timing is not judged or saved)")


def default_timer(device: str, cpu_clock: str = "wall") -> Timer:
    """The timer for ``device``: :class:`CudaGraphTimer` for ``cuda[:i]``, else
    :class:`CpuTimer` with ``cpu_clock``."""
    if str(device).startswith("cuda"):
        return CudaGraphTimer(device)
    return CpuTimer(clock=cpu_clock)


def _takes_between(timer: Timer) -> bool:
    try:
        return "between" in inspect.signature(timer.prepare).parameters
    except (TypeError, ValueError):
        return False


def measure(
    providers: Mapping[str, Callable[[], Any]],
    timer: Timer,
    *,
    rounds: int,
    warmup: int,
    min_time_s: float = 0.0,
    max_rounds: int = DEFAULT_MAX_ROUNDS,
    host_calls: int = 5,
    cold_start: Mapping[str, float] | None = None,
    inputs: InputSets | None = None,
    verify: Callable[[int, Any], None] | None = None,
    order: Sequence[str] | None = None,
) -> dict[str, ProviderTiming]:
    """Time every provider in interleaved rounds: at least ``rounds``, more to reach ``min_time_s``.

    The rule: run ``rounds`` rounds; then keep adding rounds (same rotation) while any provider's
    samples sum to less than ``min_time_s`` seconds, until ``max_rounds`` rounds are done. The
    sums are checked after every round (running totals, not a prediction from the first rounds'
    medians, which costs nothing more and follows a clock that drifts). At 50 ms and 1000 (the
    plugin's defaults) an 8 us kernel would need ~6000 rounds and gets 1000; a 10 ms one stays at
    ``rounds``. Every provider gets the same number of samples: the speedup interval pairs them by
    round (``bench.stats``).

    The floor counts the timer's sample values, i.e. measured time per call. On a GPU that is
    one graph replay per sample. :class:`CpuTimer` returns the mean of a calibrated batch of calls
    lasting >= 0.2 ms, so a CPU kernel faster than ``min_time_s / max_rounds`` runs to
    ``max_rounds`` rounds, each costing ~0.2 ms of wall time per provider (0.2 s per provider at
    the default 1000): the same rule on every device, bounded in cost, with no CUDA-only default.

    Fresh values (``inputs``): before every sample the next input set is copied into the bound
    inputs, outside the timed span and for every provider alike; a timer whose ``prepare`` takes
    ``between`` (:class:`CpuTimer`) gets the copy before every call of a sample instead. After the
    rounds, input set 1 (never the one present at capture or at the first call) is loaded, the
    kernel's prepared call runs once more, and ``verify(1, output)`` judges its output (when that
    call ran the kernel at all: a test's fake timer may return times without calling it).

    One method per case: when the timer's ``prepare`` falls back for some provider (its
    ``method`` differs from another's) and the timer has ``prepare_synced``, every provider is
    prepared with ``prepare_synced``, so that no speedup compares two clocks.

    Args:
        providers: ``{name: zero-argument call}``; the kernel first by convention.
        timer: see :class:`Timer`.
        rounds: minimum timed rounds (>= 1); each provider gives one sample per round.
        warmup: untimed calls of each provider after the first (cold-start) call.
        min_time_s: seconds (>= 0) of summed samples each provider must reach; 0 means exactly
            ``rounds`` rounds (see :data:`DEFAULT_MIN_TIME_S` for the plugin's default).
        max_rounds: most rounds the time floor may lead to (>= ``rounds``).
        host_calls: synchronized calls whose median is the host latency.
        cold_start: seconds already measured for a provider's first call (e.g. a torch.compile
            object warmed before this), used instead of timing a first call here.
        inputs: the input sets to rotate (None: the providers' fixed inputs).
        verify: called with (set index, the kernel's output of a timed call on that set); raises
            to reject the measurement (see :func:`check_recomputed`). Needs ``inputs`` with >= 2 sets.
        order: the rotation's starting order of the provider names (None: ``providers``' order);
            a re-measure passes another so that it is not a replay of the first one's sequence.

    Returns:
        ``{name: ProviderTiming}`` in the order of ``providers``; every ``samples_ms`` has the
        length of the rounds actually run.

    Raises:
        ValueError: rounds < 1, warmup < 0, min_time_s negative or not finite, or
            max_rounds < rounds. Exceptions from a provider or ``verify`` propagate.
    """
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    if not math.isfinite(min_time_s) or min_time_s < 0:
        raise ValueError(f"min_time_s must be a finite number of seconds >= 0, got {min_time_s!r}")
    if max_rounds < rounds:
        raise ValueError(f"max_rounds ({max_rounds}) must be >= rounds ({rounds})")
    names = list(providers)
    if inputs is not None:
        inputs.load(0)
    outputs: dict[str, Any] = {}
    ran = dict.fromkeys(names, 0)

    def keeping(name: str) -> Callable[[], Any]:
        fn = providers[name]

        def call() -> Any:
            out = outputs[name] = fn()
            ran[name] += 1
            return out

        return call

    calls = {name: keeping(name) for name in names}
    cold: dict[str, float] = dict(cold_start or {})
    for name in names:
        if name not in cold:
            timer.sync()
            t0 = time.perf_counter()
            calls[name]()
            timer.sync()
            cold[name] = time.perf_counter() - t0
        for _ in range(warmup):
            calls[name]()
    timer.sync()

    host: dict[str, float] = {}
    for name in names:
        samples_host = []
        for _ in range(max(1, host_calls)):
            t0 = time.perf_counter()
            calls[name]()
            timer.sync()
            samples_host.append((time.perf_counter() - t0) * 1e3)
        host[name] = sorted(samples_host)[len(samples_host) // 2]
    peaks = {name: timer.peak_memory(name, calls[name]) for name in names}

    rotating = [inputs is not None and len(inputs) > 1]
    per_call = rotating[0] and _takes_between(timer)

    def between() -> None:
        if rotating[0]:
            inputs.advance()  # type: ignore[union-attr]

    def prepare(name: str) -> Callable[[], float]:
        if per_call:
            return timer.prepare(name, calls[name], between=between)  # type: ignore[call-arg]
        return timer.prepare(name, calls[name])

    prepared = {name: prepare(name) for name in names}
    fallback_notes = {name: getattr(p, "note", "") for name, p in prepared.items()}
    methods = {getattr(p, "method", timer.method) for p in prepared.values()}
    synced = getattr(timer, "prepare_synced", None)
    forced = ""
    if len(methods) > 1 and synced is not None:
        fell = [n for n in names if getattr(prepared[n], "note", "")]
        forced = (f"every provider timed with device-wide synchronisation: {', '.join(fell) or 'a provider'} "
                  f"could not be captured")
        prepared = {name: synced(name, calls[name]) for name in names}
    start = list(order) if order is not None else names
    if sorted(start) != sorted(names):
        raise ValueError(f"order {list(start)} must name the providers {names}")
    samples: dict[str, list[float]] = {name: [] for name in names}
    total_ms = dict.fromkeys(names, 0.0)
    floor_ms = min_time_s * 1e3
    r = 0
    while r < rounds or (r < max_rounds and min(total_ms.values()) < floor_ms):
        shift = r % len(start)
        for name in start[shift:] + start[:shift]:
            if rotating[0] and not per_call:
                inputs.advance()  # type: ignore[union-attr]
            t = float(prepared[name]())
            samples[name].append(t)
            total_ms[name] += t
        r += 1
    if verify is not None and inputs is not None and len(inputs) > 1 and "kernel" in prepared:
        rotating[0] = False  # the verified call runs on set 1 only
        inputs.load(1)
        before = ran["kernel"]
        prepared["kernel"]()
        timer.sync()
        # A graph replay runs the captured kernel without calling into Python (``ran`` stays put)
        # and writes the output captured with it; a test's fake timer may report a time having
        # run nothing at all: only those are left unverified.
        replayed = getattr(prepared["kernel"], "method", timer.method) == "cuda-graph"
        if replayed or ran["kernel"] > before:
            verify(1, outputs["kernel"])
    if inputs is not None:
        inputs.load(0)
    return {
        name: ProviderTiming(
            samples_ms=samples[name],
            cold_start_s=cold[name],
            host_ms=host[name],
            peak_bytes=peaks[name],
            method=getattr(prepared[name], "method", timer.method),
            note="; ".join(x for x in (fallback_notes[name], forced) if x),
        )
        for name in names
    }
