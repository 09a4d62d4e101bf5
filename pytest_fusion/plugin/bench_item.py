"""One bench case of a test timed and gated: a ``fused_kernel`` bench item or a ``fusion.bench``
call, through the plain API (:func:`pytest_fusion.bench.api.bench_case`) under the device's memory
admission and timing lock, with the session's baselines, environment, timer and peaks
(:class:`~pytest_fusion.plugin.bench_session.BenchSession`); a failure on timing alone is replayed
in a fresh process (:mod:`pytest_fusion.plugin.replay`) before it is reported; with
``--fusion-cold-start`` its first calls are timed in fresh processes too
(:mod:`pytest_fusion.plugin.cold_start`).

torch loads only when a case runs.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any, Callable, Sequence

import pytest

from pytest_fusion.declare.spec import BenchCase, FusionUsageError, KernelSpec
from pytest_fusion.plugin import bench_session, progress

if TYPE_CHECKING:
    from pytest_fusion.measure.record import BenchRecord
    from pytest_fusion.measure.timers import Timer


@dataclasses.dataclass(frozen=True)
class BenchCall:
    """One case to time for a test item: its spec and kernel, the case and dtype, the device, the
    key of its baseline entry (a test id) and its inputs (None: drawn from the spec)."""

    item: pytest.Item
    spec: KernelSpec
    kernel: Callable[..., Any]
    case: BenchCase
    dtype: str
    device: str
    kernel_id: str
    inputs: Sequence[Any] | None = None


def bench(
    item: pytest.Item, spec: KernelSpec, kernel: Callable[..., Any], case: BenchCase, dtype: str, device: str,
    *, inputs: Sequence[Any] | None = None, kernel_id: str | None = None,
) -> BenchRecord:
    """Time and gate one case on ``device`` (:func:`pytest_fusion.bench.api.bench_case`) under the
    device's lock, record it on ``item`` for the session and fail the test when the gate failed.

    ``kernel_id`` keys the case's baseline entry: the test id (``store.test_id_of_node``; the
    marker's items pass it), default ``item.nodeid`` (a ``fusion.bench`` call).

    Raises:
        pytest.fail.Exception: a bad baseline file, the kernel failing its correctness check
            on the bench inputs (not timed), bad bench arguments, the device's timing lock held
            by another process beyond ``--fusion-lock-timeout`` (not timed), or the gate's
            reasons (of a fresh process when the failure rested on timing alone,
            :mod:`pytest_fusion.plugin.replay`), or the kernel's cold or warm start grown past the
            stored one (``--fusion-cold-start``, :mod:`pytest_fusion.gate.cold_start`).
    """
    from pytest_fusion.measure.record import USER_PROPERTY
    from pytest_fusion.plugin import cold_start, replay

    session = bench_session.start(item.config)
    first = cold_start.FirstCall(kernel, device) if cold_start.in_child() else None
    call = BenchCall(item, spec, first or kernel, case, dtype, device, kernel_id or item.nodeid, inputs)
    rec, failure = _timed_case(session, call)
    if first is not None and rec is not None:
        rec = cold_start.with_first_call(rec, first)
    if failure or rec is None:  # pytest.fail outside the except clauses: no "During handling of ..." repeat
        pytest.fail(failure, pytrace=False)
    if replay.should_replay(session.cfg, rec):  # after the device lock is released: the child takes it
        session.replays += 1
        if session.replays <= replay.MAX_REPLAYS:
            rec = replay.replay(session.config, session.cfg, item, rec)
        else:
            rec.notes.append(
                f"not replayed in a fresh process: {replay.MAX_REPLAYS} cases already were in this "
                "process (pytest_fusion.plugin.replay.MAX_REPLAYS); so many failures are more likely a "
                "regression"
            )
    if session.cfg.cold_start:  # after the device lock is released: the children take it
        rec = _with_cold_start(session, call, rec)
    item.user_properties.append((USER_PROPERTY, rec.to_dict()))
    if rec.status == "fail":
        reasons = "".join(f"\n  {r}" for r in rec.reasons)
        pytest.fail(f"{call.kernel_id} [{case.name}-{dtype}] failed the performance gate:{reasons}",
                    pytrace=False)
    return rec


def _with_cold_start(session: bench_session.BenchSession, call: BenchCall, rec: BenchRecord) -> BenchRecord:
    """``rec`` with the case's cold and warm start from fresh processes, gated against its stored
    entry's (:func:`pytest_fusion.plugin.cold_start.with_cold_start`)."""
    from pytest_fusion.baselines import store
    from pytest_fusion.machine.devices import device_slug
    from pytest_fusion.plugin import cold_start

    entries = session.stored(device_slug(call.device))
    stored = store.stored_case(entries, kernel=call.kernel_id, case=call.case.name, dtype=call.dtype)
    return cold_start.with_cold_start(session.config, session.cfg, call.item, rec, stored)


def _timed_case(session: bench_session.BenchSession, call: BenchCall) -> tuple[BenchRecord | None, str]:
    """``(record, "")``, or ``(None, the failure's message)`` for a case not timed or not gated
    (:func:`bench`'s Raises), from :func:`~pytest_fusion.bench.api.bench_case` under the device's lock."""
    from pytest_fusion.baselines import store
    from pytest_fusion.bench.api import bench_case
    from pytest_fusion.machine.devices import device_lock, device_slug
    from pytest_fusion.machine.locks import LockTimeout
    from pytest_fusion.measure.recompute import INPUT_SETS
    from pytest_fusion.oracle import memory
    from pytest_fusion.oracle.failures import FusionFailure

    item, case, dtype, device = call.item, call.case, call.dtype, call.device
    say = progress.of(item.config)
    session.started += 1
    of_all = f" of {session.bench_items}" if session.bench_items >= session.started else ""
    say.case(f"bench case {session.started}{of_all}: {item.nodeid}")

    def told(line: str) -> None:
        say(f"{item.nodeid}: {line}")

    slug = device_slug(device)
    timer = session.timer(device)
    where = store.baseline_path(session.baseline_dir, slug)
    # The failures are returned, not raised here: pytest.fail inside an except clause prints the
    # message again under "During handling of the above exception, another exception occurred".
    drawn = call.inputs is None
    need = memory.bench_bytes(call.spec, case, dtype, device, input_sets=INPUT_SETS) if drawn else 0
    try:
        # memory first, then the timing lock: a worker never queues for memory holding the lock
        with memory.admitted(device, need, holder=item.nodeid, notify=say), \
                device_lock(device, timeout=session.cfg.lock_timeout_s, holder=item.nodeid, notify=told):
            try:
                entries = session.stored(slug)
                stored = store.stored_case(entries, kernel=call.kernel_id, case=case.name, dtype=dtype)
                peaks, remeasure = _peaks_for(session, case, dtype=dtype, device=device, slug=slug,
                                              timer=timer)
                rec = bench_case(
                    call.spec, call.kernel, case, dtype, stored=stored, settings=session.settings(),
                    inputs=call.inputs, device=device, kernel_id=call.kernel_id, timer=timer, peaks=peaks,
                    remeasure_peaks=remeasure, env=session.env(device, timer.method), where=str(where),
                    slug=slug, notify=told,
                )
            except FusionFailure as exc:
                why = f"the kernel fails its correctness check at bench case {case.name!r}"
                return None, f"not timed: {why}\n{exc}"
            except FusionUsageError as exc:  # a bad baseline file
                return None, str(exc)
            except ValueError as exc:
                return None, f"{item.nodeid}: {exc}"
    except LockTimeout as exc:  # only the wait raises it: the body catches its own errors above
        return None, f"{item.nodeid}: not timed: {exc}"
    return rec, ""


def _peaks_for(
    session: bench_session.BenchSession, case: BenchCase, *, dtype: str, device: str, slug: str, timer: Timer
) -> tuple[dict[str, float] | None, Callable[[], dict[str, float]] | None]:
    """The device's measured peaks that bound the case, and a function measuring them again
    (``bench_case``'s ``remeasure_peaks``); ``(None, None)`` when nothing bounds it.

    The peaks of a device and dtype are measured again at most once per session: the kept figures
    are the larger of both measurements, the second taken after an idle second
    (``measure.peaks.cached_peaks``), so a third would only repeat it for every later case that
    beats the device's own reference op.

    Every GPU case is bounded (its bytes default to inputs + outputs). On the CPU only a declared
    FLOP count, by the float32 matmul peak (``{"tflops"}`` alone): a CPU's caches are not flushed
    between timed calls, so its bandwidth is no bound (``measure.peaks``)."""
    gpu = device.startswith("cuda")
    if not gpu and case.flops is None:
        return None, None
    from pytest_fusion.measure import peaks

    def measured(again: bool = False) -> dict[str, float]:
        again = again and (slug, dtype) not in session.peaks_remeasured
        if again:
            session.peaks_remeasured.add((slug, dtype))
        p = peaks.cached_peaks(getattr(session.config, "cache", None), timer, slug=slug, device=device,
                               dtype=dtype, memo=session.peaks, remeasure=again)
        return p if gpu else {"tflops": p["tflops"]}

    return measured(), lambda: measured(True)
