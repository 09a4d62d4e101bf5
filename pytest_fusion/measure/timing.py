"""The interleaved measurement loop (:func:`measure`); the timers live in ``measure.timers``, the
input-set rotation and the recompute check in ``measure.recompute``.

:func:`measure` runs warm-up, then rounds in which every provider is timed once, the order rotated
by one each round, so that slow drift (clocks, temperature) hits every provider alike: at least
``rounds`` of them, and more until each provider's samples add up to ``min_time_s`` (at most
``max_rounds``), so that a microsecond kernel's median rests on as much measured time as a
millisecond kernel's.

The rounds and their time floor, and the one timing method per case: ``measure.rounds``.

Fresh values (``inputs``): before every sample the next input set is copied into the bound
inputs, outside the timed span and for every provider alike (a kernel that writes into its
inputs, ``InputSets.refresh``, also gets them restored after the warm-up and host-latency calls,
and before the verified call); a timer whose ``prepare`` takes
``between`` (:class:`CpuTimer`) gets the copy before every call of a sample instead. After the
rounds, the kernel runs ``VERIFIED_CALLS`` times more (graph replays on a GPU, single calls
elsewhere), each on the next input set from set 1 (never first the one present at capture or at
the first call), and ``verify`` judges their outputs (when the timer's calls ran the kernel at
all: a test's fake timer may return times without calling it).
"""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.measure.power import PowerMonitor
from pytest_fusion.measure.recompute import (
    VERIFIED_CALLS,
    InputSets,
    check_plain,
)
from pytest_fusion.measure.rounds import Rotation, prepare_all, rotation_start, run_rounds
from pytest_fusion.measure.timers import (
    GRAPH_METHOD,
    Timer,
)

DEFAULT_ROUNDS = 30
"""Minimum rounds per case: 30 paired samples put a bootstrap interval of a median ratio within
about +/-1% on CUDA-graph timings (docs/timing-and-gate.md, "Graph replay"). Fast kernels get more,
up to ``max_rounds``, until each provider has ``min_time_s`` of samples (:func:`measure`)."""

DEFAULT_WARMUP = 5
"""Untimed warm-up calls per provider after its cold-start call."""

DEFAULT_MIN_TIME_S = 0.05
"""Seconds of summed samples each provider gets at least (:func:`measure`): 50 ms, so that a
microsecond kernel's median rests on as much measured time as a slower one's
(docs/timing-and-gate.md, "Rounds and their cost"). Triton's do_bench (rep=100 ms) and
pytest-benchmark (--benchmark-min-time) size repetitions by time too."""

DEFAULT_MAX_ROUNDS = 1000
"""Cap on the rounds :data:`DEFAULT_MIN_TIME_S` can lead to. Cost on a GPU, per round and
provider (an estimate, not a timed run): one L2 flush (a 256 MB read: >= 0.056 ms at the H200's
4.8 TB/s), one graph replay, one event sync: ~0.1-0.2 ms of host time, so
1000 rounds of 3 providers take ~0.5 s per decode case; the paired bootstrap over them adds a
fraction of a second per provider (docs/timing-and-gate.md, "Rounds and their cost")."""


@dataclasses.dataclass
class ProviderTiming:
    """Raw timing of one provider.

    Attributes:
        samples_ms: one time per round, in ms, in round order.
        cold_start_s: seconds of the very first call (JIT, autotune, torch.compile), synchronized.
        host_ms: median wall time of a synchronized eager call, launch overhead included, in ms.
        peak_bytes: peak device memory of one call above what was allocated before it.
        method: how ``samples_ms`` were taken (``cuda-graph-clean-l2``, ``cuda-sync-clean-l2``,
            ``perf_counter``...).
        note: why the method fell back, when it did.
    """

    samples_ms: list[float]
    cold_start_s: float
    host_ms: float
    peak_bytes: int | None
    method: str
    note: str = ""


def measure(
    providers: Mapping[str, Callable[[], Any]], timer: Timer, *, rounds: int, warmup: int,
    min_time_s: float = 0.0, max_rounds: int = DEFAULT_MAX_ROUNDS, host_calls: int = 5,
    cold_start: Mapping[str, float] | None = None, inputs: InputSets | None = None,
    verify: Callable[[Sequence[tuple[int, Any]]], None] | None = None, order: Sequence[str] | None = None,
    monitor: PowerMonitor | None = None,
) -> dict[str, ProviderTiming]:
    """Time every provider in interleaved rounds: at least ``rounds``, more to reach ``min_time_s``
    (the rules: this module's docstring and ``measure.rounds``').

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
        verify: called with ``[(set index, a copy of the kernel's output of a timed call on that
            set), ...]``, :data:`VERIFIED_CALLS` consecutive calls; raises to reject the
            measurement (see :func:`check_recomputed`). Needs ``inputs`` with >= 2 sets.
        order: the rotation's starting order of the provider names (None: ``providers``' order);
            a re-measure passes another so that it is not a replay of the first one's sequence.
        monitor: samples SM clock, power and throttle state over the timed rounds
            (``measure.power``); its span is the rounds alone, every provider's.

    Returns:
        ``{name: ProviderTiming}`` in the order of ``providers``; every ``samples_ms`` has the
        length of the rounds actually run.

    Raises:
        ValueError: rounds < 1, warmup < 0, min_time_s negative or not finite, or
            max_rounds < rounds. Exceptions from a provider or ``verify`` propagate.
    """
    _check_round_args(rounds, warmup, min_time_s, max_rounds)
    names = list(providers)
    if inputs is not None:
        inputs.load(0)
    kept = _KeptCalls(providers)
    cold = _cold_start_and_warm(kept.calls, timer, warmup, cold_start)
    _restore(inputs)
    host = _host_latency_ms(kept.calls, timer, host_calls)
    peaks = {name: timer.peak_memory(name, kept.calls[name]) for name in names}
    _restore(inputs)
    rotation = Rotation(inputs, timer)
    prepared, notes = prepare_all(kept.calls, timer, rotation)
    start = rotation_start(order, names)
    with monitor or PowerMonitor(None) as span:
        ran_before = dict(kept.ran)
        samples = run_rounds(prepared, start, rounds, min_time_s * 1e3, max_rounds, rotation, span.tick)
    if verify is not None and inputs is not None and len(inputs) > 1 and "kernel" in prepared:
        ran_in_rounds = kept.ran["kernel"] > ran_before["kernel"]
        _verify_kernel(kept, prepared["kernel"], timer, inputs, verify, rotation, ran_in_rounds)
    if inputs is not None:
        inputs.load(0)
    return {
        name: ProviderTiming(samples_ms=samples[name], cold_start_s=cold[name], host_ms=host[name],
                             peak_bytes=peaks[name], method=getattr(prepared[name], "method", timer.method),
                             note=notes[name])
        for name in names
    }


def _restore(inputs: InputSets | None) -> None:
    """Nothing; reloads the current input set when the kernel writes into its inputs
    (``InputSets.refresh``), so that the warm-up calls' results never become the next calls'
    inputs (a rotary kernel rotating its own output a dozen times); a no-op otherwise."""
    if inputs is not None and inputs.refresh:
        inputs.load(inputs.current)


def _check_round_args(rounds: int, warmup: int, min_time_s: float, max_rounds: int) -> None:
    """Nothing; raises ValueError on a bad count of rounds or warm-up calls, or a bad time floor."""
    if rounds < 1 or warmup < 0:
        raise ValueError(f"need rounds >= 1 and warmup >= 0, got rounds={rounds}, warmup={warmup}")
    if not math.isfinite(min_time_s) or min_time_s < 0:
        raise ValueError(f"min_time_s must be a finite number of seconds >= 0, got {min_time_s!r}")
    if max_rounds < rounds:
        raise ValueError(f"max_rounds ({max_rounds}) must be >= rounds ({rounds})")


class _KeptCalls:
    """The providers' calls (:attr:`calls`), each keeping its last output (:attr:`outputs`) and
    counting its runs (:attr:`ran`), so that the kernel's timed output can be verified."""

    def __init__(self, providers: Mapping[str, Callable[[], Any]]) -> None:
        self.outputs: dict[str, Any] = {}
        self.ran = dict.fromkeys(providers, 0)
        self.calls = {name: self._keeping(name, fn) for name, fn in providers.items()}

    def _keeping(self, name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        """``fn`` wrapped to record its output and count its call."""

        def call() -> Any:
            out = self.outputs[name] = fn()
            self.ran[name] += 1
            return out

        return call


def _cold_start_and_warm(
    calls: Mapping[str, Callable[[], Any]], timer: Timer, warmup: int, cold_start: Mapping[str, float] | None
) -> dict[str, float]:
    """Seconds of each provider's first, synchronized call (or ``cold_start``'s figure), after
    which each is called ``warmup`` times more."""
    cold: dict[str, float] = dict(cold_start or {})
    for name, call in calls.items():
        if name not in cold:
            timer.sync()
            t0 = time.perf_counter()
            call()
            timer.sync()
            cold[name] = time.perf_counter() - t0
        for _ in range(warmup):
            call()
    timer.sync()
    return cold


def _host_latency_ms(
    calls: Mapping[str, Callable[[], Any]], timer: Timer, host_calls: int
) -> dict[str, float]:
    """Each provider's median wall time in ms over ``host_calls`` (>= 1) synchronized calls."""
    host: dict[str, float] = {}
    for name, call in calls.items():
        samples_host = []
        for _ in range(max(1, host_calls)):
            t0 = time.perf_counter()
            call()
            timer.sync()
            samples_host.append((time.perf_counter() - t0) * 1e3)
        host[name] = sorted(samples_host)[len(samples_host) // 2]
    return host


def _verify_kernel(
    kept: _KeptCalls, kernel: Callable[[], float], timer: Timer, inputs: InputSets,
    verify: Callable[[Sequence[tuple[int, Any]]], None], rotation: Rotation, ran_in_rounds: bool,
) -> None:
    """Nothing; runs the kernel :data:`VERIFIED_CALLS` times more, on input sets 1, 2, 0, 1 (never
    first the one present at capture or at the first call), and hands each call's set and a copy
    of its output to ``verify`` (which raises to reject the measurement). A subclass output fails
    first (``check_plain``).

    A CUDA graph is verified by replaying it (its output is the captured one, which replays
    overwrite). Other timers time plain calls, several to a sample on the CPU, so each verified
    call is one plain call: the output of a sample's last call alone would miss a kernel stale on
    alternate calls whenever a sample holds an even number of them. A timer whose samples ran
    nothing in the rounds (``ran_in_rounds`` false: a test's fake timer) leaves the kernel
    unverified."""
    rotation.active = False  # each verified call runs on the set loaded for it
    replayed = getattr(kernel, "method", timer.method) == GRAPH_METHOD
    if not (replayed or ran_in_rounds):
        return
    call = kernel if replayed else kept.calls["kernel"]
    timed = []
    for k in range(VERIFIED_CALLS):
        index = (1 + k) % len(inputs)
        inputs.load(index, force=True)
        call()
        timer.sync()
        out = kept.outputs["kernel"]
        check_plain(out)
        timed.append((index, _copy_outputs(out)))  # a replay writes the next one into the same tensors
    verify(timed)


def _copy_outputs(out: Any) -> Any:
    """A copy of a call's output tensors (nested tuples and lists as lists), other values as they are."""
    if isinstance(out, (tuple, list)):
        return [_copy_outputs(o) for o in out]
    return out.detach().clone() if hasattr(out, "detach") else out
