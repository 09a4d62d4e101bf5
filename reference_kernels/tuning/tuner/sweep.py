"""Step 2 of the tuner: every candidate config of every sweep case timed against eager, by
pytest-fusion's own timing (``bench.timing.measure``) and, for the longest keys, back to back and
in benchmark mode."""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
import traceback
from typing import TYPE_CHECKING, Any, Callable, Collection, Mapping, Sequence

from reference_kernels.tuning.tuner.cases import KernelCall, SweepCase, case_setup, sweep_cases
from reference_kernels.tuning.tuner.correctness import Row, _dtype
from reference_kernels.tuning.tuner.regimes import time_benchmark_mode, time_sustained

if TYPE_CHECKING:
    import torch
    import triton

    from pytest_fusion.measure.timers import Timer
    from reference_kernels.gemm.targets import Target

Shown = dict[str, tuple[float, float]]
"""``{config name: (kernel ms, eager ms)}`` of the regime that decided a key."""

Regime = tuple[
    Mapping[str, KernelCall], KernelCall, Sequence[Any], Mapping[str, Any], "Timer", int, bool, bool
]
"""benchmark_rerank's settings: kernels, reference, inputs, constants, timer, passes, compile_ok, smoke."""

INTERLEAVED_MIN_ROUNDS = 15
INTERLEAVED_MIN_TIME_S = 0.06
INTERLEAVED_MAX_ROUNDS = 200
"""Interleaved rounds per candidate: >= 15, and enough for ~60 ms of samples of the fastest, at
most 200 (decode kernels of ~5 us get 200 rounds, 1 ms of samples each); 3 in a smoke run."""


def interleaved_medians(
    calls: Mapping[str, Callable[[], Any]], timer: Timer, smoke: bool, rounds: int | None = None
) -> tuple[dict[str, float], int]:
    """Median ms of each call over interleaved rounds (``bench.timing.measure``, the plugin's
    round loop: one replay of each per round, the order rotated every round), and the rounds run."""
    from pytest_fusion.measure.stats import median
    from pytest_fusion.measure.timing import measure

    if smoke:
        t = measure(calls, timer, rounds=3, warmup=0)
    elif rounds is not None:
        t = measure(calls, timer, rounds=rounds, warmup=0)
    else:
        t = measure(
            calls,
            timer,
            rounds=INTERLEAVED_MIN_ROUNDS,
            warmup=0,
            min_time_s=INTERLEAVED_MIN_TIME_S,
            max_rounds=INTERLEAVED_MAX_ROUNDS,
        )
    return {n: median(v.samples_ms) for n, v in t.items()}, len(next(iter(t.values())).samples_ms)


class Recorder:
    """A run's record (``data``: meta, configs, correctness, timing, picks, errors), saved to
    ``path`` as JSON, atomically, whenever :meth:`save` is called."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.data: dict[str, Any] = {"meta": {}, "correctness": [], "timing": [], "errors": []}

    def save(self) -> None:
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)


def bind(fn: KernelCall, inputs: Sequence[Any], constants: Mapping[str, Any]) -> Callable[[], Any]:
    """A zero-argument call of ``fn(*inputs, **constants)``."""
    return lambda: fn(*inputs, **constants)


def runnable_candidates(
    kernel: str,
    M: int,
    tdt: torch.dtype,
    cfgs: Sequence[triton.Config],
    weights: int,
    tma: bool,
    target: Target,
    rejected: Collection[tuple[str, str]],
    make: Callable[[triton.Config], KernelCall],
    bound: Callable[[KernelCall], Callable[[], Any]],
    timer: Timer,
) -> tuple[dict[str, KernelCall], dict[str, str]]:
    """``({config name: kernel}, {config name: error})``: the candidates on ``target`` (a
    targets.Target) not rejected by the check, each called once (compiled outside the timing);
    one that cannot run loses."""
    from reference_kernels.gemm import configs as C

    cands = [
        c
        for c in C.candidates(cfgs, M, tdt.itemsize, weights, tma, target)
        if (kernel, C.config_name(c)) not in rejected
    ]
    errors: dict[str, str] = {}
    kernels: dict[str, KernelCall] = {}
    for c in cands:
        fn = make(c)
        try:
            bound(fn)()  # compile outside the timing
            timer.sync()
            kernels[C.config_name(c)] = fn
        except Exception as exc:  # noqa: BLE001 - a config that cannot run loses
            errors[C.config_name(c)] = f"{type(exc).__name__}: {exc}"[:300]
    return kernels, errors


def benchmark_rerank(
    row: Row, ranked: list[str], shown: Shown, bench_top: int, regime: Regime, errors: dict[str, str]
) -> tuple[list[str], Shown]:
    """The ``bench_top`` fastest back to back ranked again by their speedup over eager in benchmark
    mode (:func:`time_benchmark_mode`); ``(ranked, shown)`` unchanged when that fails (noted in
    ``errors``: the back-to-back ranking stands)."""
    kernels, reference, inputs, constants, timer, bench_passes, compile_ok, smoke = regime
    top = ranked[:bench_top]
    try:
        sp = time_benchmark_mode(
            {n: kernels[n] for n in top}, reference, inputs, constants, timer, bench_passes, compile_ok, smoke
        )
    except Exception as exc:  # noqa: BLE001 - the back-to-back ranking stands
        errors["benchmark mode"] = f"{type(exc).__name__}: {exc}"[:300]
        return ranked, shown
    row["benchmark_mode"] = {
        n: dict(speedup=v.speedup, low=v.low, high=v.high, kernel_ms=v.kernel_ms, eager_ms=v.provider_ms)
        for n, v in sp.items()
    }
    row["regime"] = "benchmark"
    ranked = sorted(top, key=lambda n: -sp[n].speedup)
    return ranked, {n: (sp[n].kernel_ms, sp[n].provider_ms) for n in ranked}


def pick_of(row: Row, ranked: list[str], shown: Shown, runner: str | None) -> dict[str, Any]:
    """The table's entry of a key: ms, eager_ms and runner_up_ms come from the regime that decided
    (benchmark mode: its medians, kernel and eager timed together)."""
    pick = dict(
        config=ranked[0],
        ms=shown[ranked[0]][0],
        eager_ms=shown[ranked[0]][1],
        runner_up=runner,
        runner_up_ms=shown[runner][0] if runner else None,
        case=row["case"],
        regime=row["regime"],
    )
    if "benchmark_mode" in row:
        pick["benchmark_mode"] = row["benchmark_mode"]
    return pick


def print_row(
    row: Row,
    dt: str,
    kernel: str,
    ranked: list[str],
    shown: Shown,
    runner: str | None,
    speedup: float,
    rounds: int,
    errors: dict[str, str],
) -> None:
    """The console line of a timed key (and its benchmark-mode speedups, when ranked there)."""
    print(
        f"{row['case']:18s} {dt:8s} {kernel:6s} {row['regime'][:5]} best {ranked[0]:32s} "
        f"{shown[ranked[0]][0]:.4f} ms  eager {shown[ranked[0]][1]:.4f} ms  x{speedup:.3f}  "
        f"next {runner or '-'} {shown[runner][0] if runner else float('nan'):.4f}  "
        f"({rounds} rounds, {row['secs']} s)" + (f"  ERR {errors}" if errors else ""),
        flush=True,
    )
    if "benchmark_mode" in row:
        print(
            "    benchmark mode, speedup over eager: "
            + ", ".join(
                f"{n} {v['speedup']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                for n, v in row["benchmark_mode"].items()
            ),
            flush=True,
        )


@dataclasses.dataclass(frozen=True)
class SweepRun:
    """A sweep's settings (run_sweep's arguments) and its timer, the same for every case."""

    device: str
    smoke: bool
    timer: Timer
    rejected: Collection[tuple[str, str]]
    sustained_ms: float
    sustained_s: float
    bench_top: int
    bench_passes: int
    compile_ok: bool


def time_case(
    run: SweepRun, kernel: str, case: str, M: int, K: int, N: int, act: str, bias: bool, dt: str
) -> tuple[Row, list[str], Shown]:
    """One sweep case timed in ``dt``: its timing row, its candidates ranked fastest first, and
    ``{name: (kernel ms, eager ms)}`` of the regime that decided (interleaved, sustained or
    benchmark; run_sweep's docstring). The caller seeds torch."""
    import torch

    from reference_kernels.gemm import targets
    from reference_kernels.tuning import pick

    tdt = _dtype(dt)
    reference, inputs, cfgs, weights, make, tma = case_setup(kernel, M, K, N, bias, run.device, tdt)
    constants = {"activation": act}
    bound = functools.partial(bind, inputs=inputs, constants=constants)
    calls = {"eager": bound(reference)}
    target = targets.of_device(torch.device(run.device))
    kernels, errors = runnable_candidates(
        kernel, M, tdt, cfgs, weights, tma, target, run.rejected, make, bound, run.timer
    )
    calls.update({n: bound(fn) for n, fn in kernels.items()})
    med, rounds = interleaved_medians(calls, run.timer, run.smoke)
    row = dict(case=case, kernel=kernel, dtype=dt, M=M, K=K, N=N, rounds=rounds, errors=errors)
    row["regime"] = "interleaved"
    if med["eager"] >= run.sustained_ms:  # long GEMMs: ranked as they run, at the power cap
        row["interleaved_ms"] = med
        prepared = {name: run.timer.prepare(name, fn) for name, fn in calls.items()}
        med = time_sustained(prepared, run.sustained_s)
        row["regime"] = "sustained"
        del prepared  # their graphs' memory pools
    ranked = sorted((n for n in med if n != "eager"), key=lambda n: med[n])
    shown = {n: (med[n], med["eager"]) for n in ranked}  # (kernel ms, eager ms) of the deciding regime
    if row["regime"] == "sustained" and run.bench_top > 1 and len(ranked) > 1:
        regime = (
            kernels,
            reference,
            inputs,
            constants,
            run.timer,
            run.bench_passes,
            run.compile_ok,
            run.smoke,
        )
        ranked, shown = benchmark_rerank(row, ranked, shown, run.bench_top, regime, errors)
    # eager ms / kernel ms of the deciding regime (benchmark mode's: the gate's ratio of medians)
    speedup = shown[ranked[0]][1] / shown[ranked[0]][0]
    row.update(key=pick.table_key(kernel, tdt, M, N, K, tma), ms=med, best=ranked[0], speedup_eager=speedup)
    return row, ranked, shown


def record_case(rec: Recorder, run: SweepRun, replaceable: set[str], sweep_case: SweepCase, dt: str) -> None:
    """Time one sweep case (a sweep_cases tuple) in ``dt`` and record it: its row in
    ``rec.data["timing"]``, its key's pick unless already set (or set by a base table, the keys in
    ``replaceable``, which it removes), or the traceback in ``rec.data["errors"]``; saved either way."""
    import torch

    kernel, case, M, K, N, act, bias = sweep_case
    picks = rec.data["picks"]
    t0 = time.time()
    torch.manual_seed(0)
    try:
        row, ranked, shown = time_case(run, kernel, case, M, K, N, act, bias, dt)
        row["secs"] = round(time.time() - t0, 1)
        rec.data["timing"].append(row)
        runner = ranked[1] if len(ranked) > 1 else None
        if row["key"] not in picks or row["key"] in replaceable:
            replaceable.discard(row["key"])
            picks[row["key"]] = pick_of(row, ranked, shown, runner)
        rec.save()
        speedup, rounds, errors = row["speedup_eager"], row["rounds"], row["errors"]
        print_row(row, dt, kernel, ranked, shown, runner, speedup, rounds, errors)
    except Exception as exc:  # noqa: BLE001
        rec.data["errors"].append(dict(case=f"{kernel}-{case}-{dt}", error=traceback.format_exc()[-800:]))
        rec.save()
        print("ERROR", kernel, case, dt, exc, flush=True)
    finally:
        if run.device == "cuda":
            torch.cuda.empty_cache()


def run_sweep(
    rec: Recorder,
    device: str,
    smoke: bool,
    dtypes: Sequence[str],
    rejected: Collection[tuple[str, str]] = frozenset(),
    sustained_ms: float = 4.0,
    sustained_s: float = 1.2,
    cases: Collection[str] | None = None,
    replaceable: Collection[str] = frozenset(),
    bench_top: int = 4,
    bench_passes: int = 2,
    compile_ok: bool = True,
) -> None:
    """Time every candidate of every sweep case (or of those named in ``cases``, case_names)
    in ``dtypes``; append a row per case to ``rec.data["timing"]`` and set the pick of its key in
    ``rec.data["picks"]`` unless an earlier case of this run (or of the run it resumes) set it.
    Picks whose keys are in ``replaceable`` (a base table's) are replaced by this run's.

    Keys whose eager time reaches ``sustained_ms`` are ranked again back to back
    (time_sustained); then their ``bench_top`` fastest there are ranked by their speedup over
    eager in benchmark mode (time_benchmark_mode, ``bench_passes`` passes), and the pick is the
    best there (regime ``benchmark``; ``bench_top`` < 2 leaves the sustained ranking)."""
    from pytest_fusion.measure.timers import default_timer

    run = SweepRun(
        device=device,
        smoke=smoke,
        timer=default_timer(device),
        rejected=rejected,
        sustained_ms=sustained_ms,
        sustained_s=sustained_s,
        bench_top=bench_top,
        bench_passes=bench_passes,
        compile_ok=compile_ok,
    )
    rec.data.setdefault("picks", {})
    replaceable = set(replaceable)
    for dt in dtypes:
        done = {(r["case"], r["dtype"], r["kernel"]) for r in rec.data["timing"]}
        for kernel, case, M, K, N, act, bias in sweep_cases(smoke):
            if (case, dt, kernel) in done:  # timed by the run this one resumes
                continue
            if cases is not None and case not in cases:
                continue
            record_case(rec, run, replaceable, (kernel, case, M, K, N, act, bias), dt)
