"""The timed rounds of :func:`pytest_fusion.measure.timing.measure`: each provider's sample callable,
prepared by one method for the whole case, and the interleaved rounds, rotating input sets.

The rule: run ``rounds`` rounds; then keep adding rounds (same rotation) while any provider's
samples sum to less than ``min_time_s`` seconds, until ``max_rounds`` rounds are done. The
sums are checked after every round (running totals, not a prediction from the first rounds'
medians, which costs nothing more and follows a clock that drifts). At 50 ms and 1000 (the
plugin's defaults) an 8 us kernel would need ~6000 rounds and gets 1000; a 10 ms one stays at
``rounds``. Every provider gets the same number of samples: the speedup interval pairs them by
round (``measure.stats``).

The floor counts the timer's sample values, i.e. measured time per call. On a GPU that is
one graph replay per sample. :class:`~pytest_fusion.measure.timers.CpuTimer` returns the mean of a
calibrated batch of calls lasting >= 0.2 ms, so a CPU kernel faster than
``min_time_s / max_rounds`` runs to ``max_rounds`` rounds, each costing ~0.2 ms of wall time per
provider (0.2 s per provider at the default 1000): the same rule on every device, bounded in cost,
with no CUDA-only default.

One method per case: when the timer's ``prepare`` falls back for some provider (its
``method`` differs from another's) and the timer has ``prepare_synced``, every provider is
prepared with ``prepare_synced``, so that no speedup compares two clocks.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.measure.recompute import InputSets
from pytest_fusion.measure.timers import Timer


def _takes_between(timer: Timer) -> bool:
    try:
        return "between" in inspect.signature(timer.prepare).parameters
    except (TypeError, ValueError):
        return False


class Rotation:
    """Moves ``inputs`` to its next set before every sample, or, for a timer whose ``prepare``
    takes ``between`` (:attr:`per_call`), before every call of a sample; only while :attr:`active`."""

    def __init__(self, inputs: InputSets | None, timer: Timer) -> None:
        self.inputs = inputs
        self.active = inputs is not None and len(inputs) > 1
        self.per_call = self.active and _takes_between(timer)

    def between(self) -> None:
        """Nothing; loads the next input set (the per-call hook handed to the timer); while not
        :attr:`active`, reloads the current one for a kernel that writes into its inputs
        (``InputSets.refresh``: the verified call's batch must not compound its own results)."""
        if self.inputs is None:
            return
        if self.active:
            # Per call, the kernel's Python runs every time (no graph), so it could memoize by
            # value: each call's values are new (``InputSets.advance``).
            self.inputs.advance(vary=True)
        elif self.inputs.refresh:
            self.inputs.load(self.inputs.current)

    def before_sample(self) -> None:
        """Nothing; loads the next input set unless the timer does so per call."""
        if self.active and not self.per_call and self.inputs is not None:
            self.inputs.advance()


def prepare_all(
    calls: Mapping[str, Callable[[], Any]], timer: Timer, rotation: Rotation
) -> tuple[dict[str, Callable[[], float]], dict[str, str]]:
    """Each provider's prepared sample callable, and its note: its own fallback, and the switch of
    every provider to ``prepare_synced`` when their methods differ (one method per case)."""

    def prepare(name: str) -> Callable[[], float]:
        if rotation.per_call:
            return timer.prepare(name, calls[name], between=rotation.between)  # type: ignore[call-arg]
        return timer.prepare(name, calls[name])

    prepared = {name: prepare(name) for name in calls}
    fallback_notes = {name: getattr(p, "note", "") for name, p in prepared.items()}
    methods = {getattr(p, "method", timer.method) for p in prepared.values()}
    synced = getattr(timer, "prepare_synced", None)
    forced = ""
    if len(methods) > 1 and synced is not None:
        fell = [n for n in calls if getattr(prepared[n], "note", "")]
        forced = (f"every provider timed with device-wide synchronisation: {', '.join(fell) or 'a provider'} "
                  f"could not be captured")
        prepared = {name: synced(name, calls[name]) for name in calls}
    notes = {name: "; ".join(x for x in (fallback_notes[name], forced) if x) for name in calls}
    return prepared, notes


def rotation_start(order: Sequence[str] | None, names: list[str]) -> list[str]:
    """The providers' order in round 0 (``order``, else ``names``); ValueError unless it names
    each provider once."""
    start = list(order) if order is not None else names
    if sorted(start) != sorted(names):
        raise ValueError(f"order {list(start)} must name the providers {names}")
    return start


def run_rounds(
    prepared: Mapping[str, Callable[[], float]], start: list[str], rounds: int, floor_ms: float,
    max_rounds: int, rotation: Rotation, after_round: Callable[[], None] | None = None,
) -> dict[str, list[float]]:
    """Each provider's samples in ms, one per round: at least ``rounds``, more while a provider's
    sum is below ``floor_ms``, at most ``max_rounds`` (module docstring); ``after_round`` is
    called between rounds, outside every timed span (``measure.power``'s sampling)."""
    samples: dict[str, list[float]] = {name: [] for name in start}
    total_ms = dict.fromkeys(start, 0.0)
    r = 0
    while r < rounds or (r < max_rounds and min(total_ms.values()) < floor_ms):
        shift = r % len(start)
        for name in start[shift:] + start[:shift]:
            rotation.before_sample()
            t = float(prepared[name]())
            samples[name].append(t)
            total_ms[name] += t
        r += 1
        if after_round is not None:
            after_round()
    return samples
