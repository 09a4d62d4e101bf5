"""Check every config of the reference kernels, time each candidate at the real MLP shapes, and
write the tuned table the kernels read (reference_kernels/tuning.py).

One script for one GPU lease (see notes/KERNELS.md for the runs and their numbers):

1. correctness: every config of linear_act and gated_act, forced one by one, in float16, bfloat16
   and float32 (configs that fit shared memory), at odd shapes (M, K, N not tile multiples, one
   transposed weight) and one shape with 16-byte rows so TMA configs run their descriptor
   kernel, against a float64 golden; the kernel's relative Frobenius error must stay within 2x
   eager's own error (or a floor per dtype). Configs compile in a process pool, which also fills
   Triton's disk cache for the sweep (compiles dominate a cold run).
2. sweep: at every real shape of reference_kernels.shapes (up projections; tokens 1..8192; bf16
   and fp16) every candidate config (configs.candidates) and eager PyTorch are timed in
   interleaved rounds by pytest-fusion's own GPU timer (CUDA-graph replay, L2 flushed before each
   replay); the fastest config per tuning key becomes the table's pick. Keys whose eager time
   reaches ``--sustained-ms`` are ranked again with each provider replayed back to back
   (time_sustained), and the ``--bench-top`` fastest there by their speedup over eager in
   benchmark mode itself (time_benchmark_mode), the regime the gate judges. A config that failed
   any check (wrong result, compile error, crashed or hung worker) is never timed.
3. the table: ``$OUT/<device>.json`` (copy it to reference_kernels/tuned/ to commit it), then the
   whole seed GeGLU MLP timed with the new picks against eager and torch.compile.

Writes ``$OUT/tune_kernels.json`` (saved after every shape, so a timeout keeps what finished).
``--smoke`` runs the same code on the CPU under the Triton interpreter at tiny shapes.
``--cases REGEX --base-table TABLE`` checks and times only some cases and keeps the table's
other picks (the table records which keys it re-timed).

    python3 bench_scripts/tune_kernels.py            # on the H200
    python3 bench_scripts/tune_kernels.py --cases '^llama3-70b-M8192$' \
        --base-table reference_kernels/tuned/nvidia-h200.json
    TRITON_INTERPRET=1 python3 bench_scripts/tune_kernels.py --smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLOOR = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}
"""Relative error a kernel may always reach: a few ulps at unit scale (fp16 2^-10, bf16 2^-7)."""

ODD_SHAPES = ((1, 257, 131), (37, 1000, 523), (300, 129, 77), (300, 1000, 520))
"""(M, K, N) not multiples of any tile; K = 129 and 257 leave one element in the last K tile.
The last has rows of 16-byte multiples in every dtype, so TMA configs run their descriptor kernel
(with tails in M, N and K, which the descriptors zero-fill and clip)."""


def _dtype(name):
    import torch

    return getattr(torch, name)


def _rel(out, gold):
    d = (out.double() - gold)
    return (d.norm() / gold.norm().clamp_min(1e-300)).item()


def check_config(task):
    """Worker: run one (kernel, config index) at the odd shapes in each dtype, and once at an
    aligned shape (bf16/fp16) so Triton's disk cache holds the compile the timing phase needs."""
    import torch

    from reference_kernels import configs as C
    from reference_kernels import eager
    from reference_kernels.gated_mlp import gated_act
    from reference_kernels.linear_act import linear_act

    kernel, idx, device, dtypes = task
    cfgs = C.LINEAR_CONFIGS if kernel == "linear" else C.GATED_CONFIGS
    cfg = cfgs[idx]
    weights = 1 if kernel == "linear" else 2
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(1000 + idx)
    acts = ("gelu_tanh", "silu", "gelu", "relu", "none")
    t0 = time.time()
    for di, dt in enumerate(dtypes):
        torch_dt = _dtype(dt)
        if not C.fits(cfg, torch_dt.itemsize, weights):  # forcing it raises ValueError (configs.check_forced)
            rows.append(dict(kernel=kernel, config=idx, dtype=dt, skipped="does not fit shared memory"))
            continue
        for si, (M, K, N) in enumerate(ODD_SHAPES):
            act = acts[(si + di + idx) % len(acts)]
            x = torch.randn(M, K, generator=gen).to(device, torch_dt)
            w1 = (torch.randn(N, K, generator=gen) / K**0.5).to(device, torch_dt)
            w2 = (torch.randn(K, N, generator=gen) / K**0.5).to(device, torch_dt).t()  # transposed
            b = torch.randn(N, generator=gen).to(device, torch_dt)
            try:
                if kernel == "linear":
                    w = w2 if si == 1 else w1  # transposed: the pointer kernel
                    out = linear_act(x, w, b, act, config=cfg)
                    gold = eager.linear_act_eager(x.double(), w.double(), b.double(), act)
                    eag = eager.linear_act_eager(x, w, b, act)
                else:
                    bg = b if si != 2 else None
                    wu = w2 if si != 3 else w2.contiguous()  # one transposed weight, except for TMA
                    out = gated_act(x, w1, wu, bg, None, act, config=cfg)
                    gold = eager.gated_act_eager(x.double(), w1.double(), wu.double(),
                                                 None if bg is None else bg.double(), None, act)
                    eag = eager.gated_act_eager(x, w1, wu, bg, None, act)
                if device == "cuda":
                    torch.cuda.synchronize()
                k_err, e_err = _rel(out, gold), _rel(eag, gold)
                ok = bool(torch.isfinite(out).all()) and k_err <= max(2 * e_err, FLOOR[dt])
                rows.append(dict(kernel=kernel, config=idx, dtype=dt, M=M, K=K, N=N, act=act,
                                 kernel_rel=k_err, eager_rel=e_err, ok=ok))
            except Exception as exc:  # noqa: BLE001 - a failing config is a result, not a crash
                rows.append(dict(kernel=kernel, config=idx, dtype=dt, M=M, K=K, N=N, act=act,
                                 ok=False, error=f"{type(exc).__name__}: {exc}"[:400]))
    if device == "cuda":
        # aligned warm-up compiles: M = 1 (specialised) or a multiple of 16, K a multiple of 256
        Ms = [1, 16, 128] if cfg.kwargs["BLOCK_M"] == 16 else [128, 1024]
        try:
            for dt in ("bfloat16", "float16"):
                torch_dt = _dtype(dt)
                for M in Ms:
                    x = torch.randn(M, 512, device=device, dtype=torch_dt)
                    w = torch.randn(256, 512, device=device, dtype=torch_dt)
                    b = torch.randn(256, device=device, dtype=torch_dt)
                    if kernel == "linear":
                        for act, bias in (("gelu", b), ("gelu_tanh", b), ("none", None)):
                            linear_act(x, w, bias, act, config=cfg)
                    else:
                        for act in ("silu", "gelu_tanh"):
                            gated_act(x, w, w, None, None, act, config=cfg)
            torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - a config that does not compile is a failed row
            rows.append(dict(kernel=kernel, config=idx, dtype=dt, M=M, K=512, N=256, ok=False,
                             error=f"aligned warm-up: {type(exc).__name__}: {exc}"[:400]))
    return rows, time.time() - t0


def _failed(task, error):
    kernel, idx = task[:2]
    return [dict(kernel=kernel, config=idx, ok=False, error=error[:400])], 0.0


def _kill(pool):
    """Stop a pool without waiting for its workers: a hung worker holds the GPU and would make
    shutdown(wait=True) wait forever."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def check_all(tasks, workers, timeout_s):
    """Yield check_config's (rows, seconds) for every task, in a spawn process pool, one task per
    worker process (a CUDA error that sticks to a context cannot fail the configs after it).

    Every way a task can fail ends as a failed row for its config, never as the end of the run:
    an exception in check_config; a worker that dies (a compiler crash), which breaks the whole
    pool, after which the tasks left unfinished run again one per fresh single-process pool so
    that the one that crashes is named; and the deadline, ``timeout_s`` for the whole check
    including those reruns, after which unfinished tasks fail and their workers are killed."""
    deadline = time.monotonic() + timeout_s
    unfinished = yield from _run_pool(tasks, workers, deadline, timeout_s)
    for task in unfinished:
        if (yield from _run_pool([task], 1, deadline, timeout_s)):
            yield _failed(task, "worker crashed")


def _run_pool(tasks, workers, deadline, timeout_s):
    """check_all's pool: yields each task's rows or failed row, returns the tasks a broken pool
    left unfinished."""
    pool = cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"), max_tasks_per_child=1)
    futures = {pool.submit(check_config, t): t for t in tasks}
    unfinished = []
    try:
        for fut in cf.as_completed(futures, timeout=max(0.0, deadline - time.monotonic())):
            try:
                yield fut.result()
            except cf.process.BrokenProcessPool:
                unfinished.append(futures[fut])
            except Exception as exc:  # noqa: BLE001 - check_config's own code failed
                yield _failed(futures[fut], f"{type(exc).__name__}: {exc}")
    except cf.TimeoutError:
        for fut, task in futures.items():
            if not fut.done():
                yield _failed(task, f"not done within the {timeout_s:.0f} s check")
    finally:
        if all(f.done() for f in futures):
            pool.shutdown(wait=True)
        else:
            _kill(pool)
    return unfinished


def rejected_configs(correctness):
    """``{(kernel, config name)}`` of configs with a failing or crashed check row: the sweep
    never times them, so a config that computes wrongly can never become a pick."""
    from reference_kernels import configs as C

    out = set()
    for r in correctness:
        if r.get("ok") is False:
            cfgs = C.LINEAR_CONFIGS if r["kernel"] == "linear" else C.GATED_CONFIGS
            out.add((r["kernel"], C.config_name(cfgs[r["config"]])))
    return out


def resume_refusal(resumed, now, configs):
    """Why a run's JSON cannot be resumed by this process (its meta ``now``, its config names
    ``configs``), or None.

    A run of some cases (``--cases``) is not resumed: it is short, run it again. Its check rows
    name configs by index, so the config lists must be the same (by name); its torch, Triton,
    device and ranking regimes (meta ``regimes``: the keys ranked back to back and in benchmark
    mode) too, or one table would mix rankings; and every config must have check rows unless
    the run skipped the check, since a config without rows would be timed unchecked (a run cut
    in its check)."""
    first = resumed.get("meta", {})
    if "base_table" in first:
        return "it timed only some cases (--cases): run them again instead"
    mismatch = {k: (first.get(k), now.get(k)) for k in ("torch", "triton", "device", "regimes")
                if first.get(k) != now.get(k)}
    if mismatch:
        return f"its run had other versions, device or ranking regimes: {mismatch}"
    if resumed.get("configs") != configs:
        return "its run had other configs (or did not record them): resume only with the code it ran"
    if "--skip-check" not in first.get("argv", []):
        checked = {(r["kernel"], r["config"]) for r in resumed.get("correctness", [])}
        unchecked = [f"{k}:{name}" for k, names in configs.items()
                     for i, name in enumerate(names) if (k, i) not in checked]
        if unchecked:
            return f"its check did not finish: no rows for {', '.join(unchecked[:5])}" + (
                f" and {len(unchecked) - 5} more" if len(unchecked) > 5 else "")
    return None


class Recorder:
    def __init__(self, path):
        self.path = path
        self.data = {"meta": {}, "correctness": [], "timing": [], "errors": []}

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)


def sweep_cases(smoke):
    """(kernel, case, M, K, N, activation, bias) of every projection in the catalog at its token
    counts: each model's up projection (gated or plain), then its down projection (linear, no
    activation, K = intermediate, N = hidden), which the MLP modules run with ``down="triton"``
    (the default, ``"torch"``, is cuBLAS)."""
    from reference_kernels import shapes

    for s in shapes.CATALOG:
        for m in s.tokens:
            M, H, I = (min(m, 40), 48, 80) if smoke else (m, s.hidden, s.intermediate)
            yield ("gated" if s.kind == "gated" else "linear"), f"{s.slug}-M{m}", M, H, I, s.activation, s.bias
    for s in shapes.CATALOG:
        for m in s.tokens:
            M, H, I = (min(m, 40), 48, 80) if smoke else (m, s.hidden, s.intermediate)
            yield "linear", f"{s.slug}-down-M{m}", M, I, H, "none", s.bias


def rounds_for(ms, smoke):
    """Interleaved rounds per candidate: >= 15, and enough for ~60 ms of samples of the fastest,
    at most 200 (decode kernels of ~5 us get 200 rounds, 1 ms of samples each)."""
    if smoke:
        return 3
    return int(min(200, max(15, 60.0 / max(ms, 1e-3))))


def time_interleaved(prepared, rounds):
    """Median ms of each prepared provider over ``rounds`` rounds of one replay each, the order
    rotated every round so that no provider always follows the same one."""
    names = list(prepared)
    samples = {n: [] for n in names}
    for r in range(rounds):
        shift = r % len(names)
        for n in names[shift:] + names[:shift]:
            samples[n].append(prepared[n]())
    return {n: statistics.median(v) for n, v in samples.items()}


def phase_order(providers, eager_every):
    """Back-to-back phases of ``providers`` (names, one of them "eager"): eager first, again after
    every ``eager_every`` others and last, so that drift over the run shows in eager's phases."""
    others = [n for n in providers if n != "eager"]
    order = ["eager"]
    for i, n in enumerate(others):
        order.append(n)
        if (i + 1) % eager_every == 0 or i + 1 == len(others):
            order.append("eager")
    return order


def time_sustained(prepared, seconds, eager_every=2):
    """Median ms of each prepared provider replayed back to back for ``seconds``, over the phase's
    second half; eager first, again after every ``eager_every`` configs and last, its phases'
    median kept.

    For GEMMs of several ms, which run at the H200's power cap when held (nvidia-smi's clock
    event reason 0x4; in probe_power.py's phases SM clocks of 1380-1510 MHz for eager and the
    best configs, up to 1905 for slow ones). Interleaved one-replay rounds of many candidates
    share one power budget and ranked Llama-3-70B's gate/up at M = 8192 (fp16) wrongly: their
    pick ran 2% slower than eager back to back (docs/runs/2026-11-29f, power_fp16.log).

    This is not benchmark mode's regime either (kernel, eager and torch.compile in turn): here
    the top five configs sit within 1-2% of each other, and the bf16 pick of 2026-11-29 ran
    0.995x eager in benchmark mode while the runner-up ran 1.02x. Ranking by the paired ratio
    eager / config, tried instead, was worse: a config that slows its partner scores well
    (docs/runs/2026-11-29f, paired-*; notes/KERNELS.md, "Sixth lease")."""
    phases = {n: [] for n in prepared}
    for n in phase_order(prepared, eager_every):
        times, t0 = [], time.perf_counter()
        while time.perf_counter() - t0 < seconds or len(times) < 2:
            times.append(prepared[n]())
        phases[n].append(statistics.median(times[len(times) // 2:]))
    return {n: statistics.median(v) for n, v in phases.items()}


def time_benchmark_mode(kernels, reference, inputs, constants, timer, passes=2, compile_ok=True, smoke=False):
    """Each kernel's speedup over eager as benchmark mode measures it: for every kernel in turn,
    pytest-fusion's own ``measure`` over the bench case's providers (the kernel, ``eager`` =
    ``reference`` and, with ``compile_ok``, ``torch.compile(reference)``, built once), with the
    plugin's default rounds, warm-up and time floor (bench.runner.Settings), and the speedup as
    the gate computes it (bench.stats.speedup_interval: median eager / median kernel, paired
    bootstrap interval).

    For the longest keys, where the tuner's other regimes disagree with benchmark mode by more
    than the candidates differ (time_sustained's docstring). ``passes`` repeats the whole series,
    every other pass in reverse order, so that no kernel is always measured first or last; a
    kernel's rounds of all passes are pooled into one interval.

    Args:
        kernels: ``{name: call}``, each taking ``(*inputs, **constants)`` like ``reference``.
        smoke: 3 rounds and no time floor (CPU, interpreter).

    Returns:
        ``{name: bench.stats.Speedup}`` over eager, in the order of ``kernels``.
    """
    from pytest_fusion.bench.providers import make_providers
    from pytest_fusion.bench.runner import Settings
    from pytest_fusion.bench.stats import speedup_interval
    from pytest_fusion.bench.timing import measure

    s = Settings(rounds=3, min_time_s=0.0) if smoke else Settings()
    names = list(kernels)
    built = make_providers(kernels[names[0]], reference, inputs, constants=constants,
                           requested=("eager", "compile") if compile_ok else ("eager",), warmup=s.warmup)
    pooled = {n: ([], []) for n in names}
    for p in range(passes):
        for n in (names if p % 2 == 0 else names[::-1]):
            fn = kernels[n]
            calls = dict(built.calls, kernel=lambda fn=fn: fn(*inputs, **constants))  # kernel stays first
            t = measure(calls, timer, rounds=s.rounds, warmup=s.warmup, min_time_s=s.min_time_s,
                        max_rounds=s.round_cap, cold_start=built.cold_start_s)
            pooled[n][0].extend(t["kernel"].samples_ms)
            pooled[n][1].extend(t["eager"].samples_ms)
    return {n: speedup_interval(k, e) for n, (k, e) in pooled.items()}


def run_sweep(rec, device, smoke, dtypes, rejected=frozenset(), sustained_ms=4.0, sustained_s=1.2,
              cases=None, replaceable=frozenset(), bench_top=4, bench_passes=2, compile_ok=True):
    """Time every candidate of every sweep case (or of those named in ``cases``, case_names)
    in ``dtypes``; append a row per case to ``rec.data["timing"]`` and set the pick of its key in
    ``rec.data["picks"]`` unless an earlier case of this run (or of the run it resumes) set it.
    Picks whose keys are in ``replaceable`` (a base table's) are replaced by this run's.

    Keys whose eager time reaches ``sustained_ms`` are ranked again back to back
    (time_sustained); then their ``bench_top`` fastest there are ranked by their speedup over
    eager in benchmark mode (time_benchmark_mode, ``bench_passes`` passes), and the pick is the
    best there (regime ``benchmark``; ``bench_top`` < 2 leaves the sustained ranking)."""
    import torch

    from pytest_fusion.bench.timing import default_timer
    from reference_kernels import _tma, eager, tuning
    from reference_kernels import configs as C
    from reference_kernels.gated_mlp import gated_act
    from reference_kernels.linear_act import linear_act

    timer = default_timer(device)
    picks = rec.data.setdefault("picks", {})
    replaceable = set(replaceable)
    for dt in dtypes:
        tdt = _dtype(dt)
        done = {(r["case"], r["dtype"], r["kernel"]) for r in rec.data["timing"]}
        for kernel, case, M, K, N, act, bias in sweep_cases(smoke):
            if (case, dt, kernel) in done:  # timed by the run this one resumes
                continue
            if cases is not None and case not in cases:
                continue
            t0 = time.time()
            torch.manual_seed(0)
            try:
                x = torch.randn(M, K, device=device, dtype=tdt)
                if kernel == "gated":
                    wg = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
                    wu = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
                    out = torch.empty(M, N, device=device, dtype=tdt)
                    tma = _tma.tma_ready(x, wg, wu, out)
                    # the bench case's call: reference(*inputs, **constants) (tests/test_reference_kernels.py)
                    reference, inputs = eager.gated_act_eager, (x, wg, wu)
                    cfgs, weights = C.GATED_CONFIGS, 2
                    make = lambda c: (lambda x, w_gate, w_up, activation: gated_act(  # noqa: E731
                        x, w_gate, w_up, activation=activation, config=c))
                else:
                    w = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
                    b = torch.randn(N, device=device, dtype=tdt) if bias else None
                    out = torch.empty(M, N, device=device, dtype=tdt)
                    tma = _tma.tma_ready(x, w, out)
                    reference, inputs = eager.linear_act_eager, (x, w, b)
                    cfgs, weights = C.LINEAR_CONFIGS, 1
                    make = lambda c: (lambda x, weight, bias, activation: linear_act(  # noqa: E731
                        x, weight, bias, activation, config=c))
                constants = {"activation": act}
                bound = lambda fn: (lambda: fn(*inputs, **constants))  # noqa: E731
                calls = {"eager": bound(reference)}
                cands = [c for c in C.candidates(cfgs, M, tdt.itemsize, weights, tma)
                         if (kernel, C.config_name(c)) not in rejected]
                errors, kernels = {}, {}
                for c in cands:
                    fn = make(c)
                    try:
                        bound(fn)()  # compile outside the timing
                        timer.sync()
                        kernels[C.config_name(c)] = fn
                        calls[C.config_name(c)] = bound(fn)
                    except Exception as exc:  # noqa: BLE001 - a config that cannot run loses
                        errors[C.config_name(c)] = f"{type(exc).__name__}: {exc}"[:300]
                prepared = {name: timer.prepare(name, fn) for name, fn in calls.items()}
                est = min(prepared[n]() for n in prepared if n != "eager")
                rounds = rounds_for(est, smoke)
                med = time_interleaved(prepared, rounds)
                row = dict(case=case, kernel=kernel, dtype=dt, M=M, K=K, N=N, rounds=rounds, errors=errors,
                           regime="interleaved")
                if med["eager"] >= sustained_ms:  # long GEMMs: ranked as they run, at the power cap
                    row["interleaved_ms"] = med
                    med = time_sustained(prepared, sustained_s)
                    row["regime"] = "sustained"
                del prepared  # their graphs' memory pools
                ranked = sorted((n for n in med if n != "eager"), key=med.get)
                shown = {n: (med[n], med["eager"]) for n in ranked}  # (kernel ms, eager ms) of the deciding regime
                if row["regime"] == "sustained" and bench_top > 1 and len(ranked) > 1:
                    top = ranked[:bench_top]
                    try:
                        sp = time_benchmark_mode({n: kernels[n] for n in top}, reference, inputs, constants, timer,
                                                 bench_passes, compile_ok, smoke)
                    except Exception as exc:  # noqa: BLE001 - the back-to-back ranking stands
                        errors["benchmark mode"] = f"{type(exc).__name__}: {exc}"[:300]
                    else:
                        row["benchmark_mode"] = {n: dict(speedup=v.speedup, low=v.low, high=v.high,
                                                         kernel_ms=v.kernel_ms, eager_ms=v.provider_ms)
                                                 for n, v in sp.items()}
                        ranked = sorted(top, key=lambda n: -sp[n].speedup)
                        shown = {n: (sp[n].kernel_ms, sp[n].provider_ms) for n in ranked}
                        row["regime"] = "benchmark"
                # eager ms / kernel ms of the deciding regime (benchmark mode's: the gate's ratio of medians)
                speedup = shown[ranked[0]][1] / shown[ranked[0]][0]
                key = tuning.table_key(kernel, tdt, M, N, K, tma)
                row.update(key=key, ms=med, best=ranked[0], speedup_eager=speedup, secs=round(time.time() - t0, 1))
                rec.data["timing"].append(row)
                runner = ranked[1] if len(ranked) > 1 else None
                if key not in picks or key in replaceable:
                    replaceable.discard(key)
                    # ms, eager_ms and runner_up_ms come from the regime that decided (benchmark
                    # mode: its medians, kernel and eager timed together)
                    picks[key] = dict(config=ranked[0], ms=shown[ranked[0]][0], eager_ms=shown[ranked[0]][1],
                                      runner_up=runner, runner_up_ms=shown[runner][0] if runner else None,
                                      case=row["case"], regime=row["regime"])
                    if "benchmark_mode" in row:
                        picks[key]["benchmark_mode"] = row["benchmark_mode"]
                rec.save()
                print(f"{row['case']:18s} {dt:8s} {kernel:6s} {row['regime'][:5]} best {ranked[0]:32s} "
                      f"{shown[ranked[0]][0]:.4f} ms  eager {shown[ranked[0]][1]:.4f} ms  x{speedup:.3f}  "
                      f"next {runner or '-'} {shown[runner][0] if runner else float('nan'):.4f}  "
                      f"({rounds} rounds, {row['secs']} s)" + (f"  ERR {errors}" if errors else ""), flush=True)
                if "benchmark_mode" in row:
                    print("    benchmark mode, speedup over eager: " + ", ".join(
                        f"{n} {v['speedup']:.3f} [{v['low']:.3f}, {v['high']:.3f}]"
                        for n, v in row["benchmark_mode"].items()), flush=True)
                del calls, kernels
            except Exception as exc:  # noqa: BLE001
                rec.data["errors"].append(dict(case=f"{kernel}-{case}-{dt}", error=traceback.format_exc()[-800:]))
                rec.save()
                print("ERROR", kernel, case, dt, exc, flush=True)
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()


def write_table(rec, out_dir, device):
    """The tuned table (reference_kernels/tuning.py reads it): picks plus how they were made."""
    import torch

    from reference_kernels import tuning

    slug = tuning.device_slug(torch.device(device))
    table = dict(meta=dict(rec.data["meta"], note=(
        "written by bench_scripts/tune_kernels.py: per key the fastest candidate config by median "
        "CUDA-graph replay time (L2 flushed), candidates and eager interleaved in rounds; where eager "
        "took >= --sustained-ms, by median time with each replayed back to back (regime: sustained), "
        "then the --bench-top fastest there by speedup over eager in benchmark mode (regime: benchmark). "
        "With meta.base_table, only the keys in meta.retimed were timed by this run; the other picks are "
        "that table's")),
        picks=rec.data["picks"])
    path = os.path.join(out_dir, f"{slug}.json")
    with open(path, "w") as f:
        json.dump(table, f, indent=1, sort_keys=True)
    return path


def selected_configs(smoke, dtypes, cases):
    """``{(kernel, config index)}`` that the sweep may time for the cases named in ``cases``
    (case_names) in ``dtypes``: their candidates with and without the TMA path. The check of a
    ``--cases`` run covers only these."""
    from reference_kernels import configs as C

    out = set()
    for kernel, case, M, K, N, act, bias in sweep_cases(smoke):
        if case not in cases:
            continue
        cfgs, weights = (C.GATED_CONFIGS, 2) if kernel == "gated" else (C.LINEAR_CONFIGS, 1)
        for dt in dtypes:
            for tma in (True, False):
                for c in C.candidates(cfgs, M, _dtype(dt).itemsize, weights, tma):
                    out.add((kernel, cfgs.index(c)))
    return out


def case_names(smoke, cases):
    """Names of the sweep cases that the regex ``cases`` matches (re.search).

    Raises:
        SystemExit: an invalid regex, or one that matches no case (a run that times nothing
            would still write a whole table)."""
    import re

    try:
        pattern = re.compile(cases)
    except re.error as exc:
        raise SystemExit(f"--cases {cases!r}: not a regular expression ({exc})") from exc
    names = sorted({case for _, case, *_ in sweep_cases(smoke) if pattern.search(case)})
    if not names:
        raise SystemExit(f"--cases {cases!r} matches no sweep case (names look like llama3-70b-M8192, "
                         f"llama3-70b-down-M8192; anchor them: '^llama3-70b-M8192$')")
    return names


def base_table_refusal(base_meta, device):
    """Why a base table cannot be the start of this run's table on ``device`` (a device name as
    tune_kernels.json's meta records it), or None: its picks were timed on another device."""
    if base_meta.get("device") != device:
        return f"it was tuned on {base_meta.get('device')!r}, this run is on {device!r}"
    return None


def replaceable_keys(base_picks, names):
    """Keys of ``base_picks`` that a run of the cases ``names`` may replace: those whose pick
    was set by one of them. A key that several cases share keeps the pick of the case that set
    it (in a full run, the first), unless that case is re-timed too."""
    return {k for k, v in base_picks.items() if v.get("case") in names}


def load_base_table(path):
    """``(picks, meta)`` of a tuned table that a ``--cases`` run starts from.

    Raises:
        SystemExit: the file is not a tuned table (named, with what is wrong)."""
    try:
        with open(path) as f:
            data = json.load(f)
        picks, meta = data["picks"], data.get("meta", {})
        if not isinstance(picks, dict) or not all(isinstance(v, dict) and "config" in v for v in picks.values()):
            raise TypeError("picks is not {key: {config: ...}}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--base-table {path}: not a tuned table ({type(exc).__name__}: {exc})") from exc
    return picks, meta


def time_mlps(rec, device, smoke, compile_ok):
    """The whole seed GeGLU MLP (issue 3's aim) with the table's picks, against eager,
    torch.compile and (when installed) Liger-Kernel's GeGLU, by the same interleaved graph timer."""
    import torch

    from pytest_fusion.bench.timing import default_timer
    from reference_kernels import eager, shapes
    from reference_kernels.modules import gated_mlp

    timer = default_timer(device)
    tdt = torch.bfloat16 if not smoke else torch.float16
    M, H, I = (8192, 768, 3072) if not smoke else (8, 48, 80)
    torch.manual_seed(0)
    x = torch.randn(M, H, device=device, dtype=tdt)
    wg, wu = (torch.randn(I, H, device=device, dtype=tdt) / H**0.5 for _ in range(2))
    wd = torch.randn(H, I, device=device, dtype=tdt) / I**0.5
    calls = {
        "kernel": lambda: gated_mlp(x, wg, wu, wd, activation="gelu_tanh"),
        "eager": lambda: eager.gated_mlp_eager(x, wg, wu, wd, activation="gelu_tanh"),
    }
    try:  # Liger-Kernel's GeGLU between cuBLAS projections, as its LigerGEGLUMLP computes it
        if smoke:  # its kernel fails under the interpreter (a None block pointer offset)
            raise ImportError("not under the interpreter")
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        calls["liger"] = lambda: torch.nn.functional.linear(
            LigerGELUMulFunction.apply(torch.nn.functional.linear(x, wg), torch.nn.functional.linear(x, wu)), wd)
    except ImportError as exc:
        print(f"no Liger provider ({exc})", flush=True)
    if compile_ok:
        compiled = torch.compile(eager.gated_mlp_eager)
        calls["compile"] = lambda: compiled(x, wg, wu, wd, activation="gelu_tanh")
    for fn in calls.values():
        fn()
    timer.sync()
    prepared = {n: timer.prepare(n, fn) for n, fn in calls.items()}
    med = time_interleaved(prepared, 3 if smoke else 60)
    row = dict(case="seed-geglu-mlp", M=M, K=H, N=I, dtype=str(tdt), ms=med,
               flops=shapes.gated_mlp_flops(M, H, I),
               speedups={n: med[n] / med["kernel"] for n in med if n != "kernel"})
    rec.data["mlp"] = row
    rec.save()
    print("seed GeGLU MLP:", json.dumps(row), flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--workers", type=int, default=12, help="processes compiling/checking configs")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--check-timeout", type=float, default=300.0,
                    help="seconds the whole correctness check may take, reruns included; configs not done by then are rejected")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="sweep dtypes, comma-separated")
    ap.add_argument("--sustained-ms", type=float, default=4.0,
                    help="keys whose eager time (interleaved) reaches this many ms are ranked by sustained timing")
    ap.add_argument("--sustained-s", type=float, default=1.2, help="seconds per provider phase of the sustained timing")
    ap.add_argument("--resume", metavar="JSON",
                    help="a tune_kernels.json whose run was cut: keep its checks and timings, time "
                         "only the cases it did not reach, then write the table from both")
    ap.add_argument("--cases", metavar="REGEX",
                    help="time only the sweep cases whose name matches (re.search; anchor it, e.g. "
                         "'^llama3-70b-M8192$', or llama3-8b-M1 also matches -M16, -M128...); the check "
                         "covers only their candidates; needs --base-table")
    ap.add_argument("--base-table", metavar="JSON",
                    help="with --cases: a tuned table of this device whose picks the new table keeps, "
                         "except those set by the cases re-timed")
    ap.add_argument("--bench-top", type=int, default=4,
                    help="sustained keys: how many of the fastest back to back are ranked in benchmark mode (< 2: none)")
    ap.add_argument("--bench-passes", type=int, default=2, help="passes of the benchmark-mode ranking")
    args = ap.parse_args()
    if (args.cases is None) != (args.base_table is None):
        ap.error("--cases and --base-table go together: a table from some cases alone would drop every other key")
    if args.cases is not None and args.resume:
        ap.error("--cases cannot resume a run: re-run the cases (a few minutes)")
    if args.bench_passes < 1:
        ap.error("--bench-passes must be >= 1")
    base_picks, names = {}, None
    if args.base_table:
        names = case_names(args.smoke, args.cases)
        base_picks, base_meta = load_base_table(args.base_table)
    out_dir = os.environ.get("OUT", "/tmp")
    rec = Recorder(os.path.join(out_dir, "tune_kernels.json"))
    resumed = None
    if args.resume:
        with open(args.resume) as f:
            resumed = json.load(f)

    import torch
    import triton

    device = "cpu" if args.smoke else "cuda"
    rec.data["meta"] = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        torch=torch.__version__, triton=triton.__version__,
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        argv=sys.argv,
    )
    rec.data["meta"]["regimes"] = dict(sustained_ms=args.sustained_ms, sustained_s=args.sustained_s,
                                       bench_top=args.bench_top, bench_passes=args.bench_passes)
    if args.base_table:
        why = base_table_refusal(base_meta, rec.data["meta"]["device"])
        if why:
            raise SystemExit(f"--base-table {args.base_table}: {why}")
        # what the base table's picks came from, its own base table and re-timed keys included
        rec.data["meta"]["base_table"] = dict(
            path=args.base_table, keys=len(base_picks),
            **{k: base_meta.get(k) for k in ("date", "resumed", "regimes", "base_table", "retimed")})
    from reference_kernels import configs as C

    # the check rows name configs by index: these names say which
    rec.data["configs"] = {"linear": [C.config_name(c) for c in C.LINEAR_CONFIGS],
                           "gated": [C.config_name(c) for c in C.GATED_CONFIGS]}
    if resumed is not None:
        first = resumed["meta"]
        now = rec.data["meta"]
        why = resume_refusal(resumed, now, rec.data["configs"])
        if why:
            raise SystemExit(f"--resume {args.resume}: {why}")
        runs = first.get("resumed", [])
        rec.data = dict(resumed, meta=dict(first, resumed=(runs if isinstance(runs, list) else [runs]) + [now]))
        args.skip_check = True  # its checks stand: rejected_configs reads them
    rec.save()
    print(json.dumps(rec.data["meta"]), flush=True)

    if not args.skip_check:
        t0 = time.time()
        dtypes = ("float16", "float32") if args.smoke else ("float16", "bfloat16", "float32")
        tasks = [("linear", i, device, dtypes) for i in range(len(C.LINEAR_CONFIGS))]
        tasks += [("gated", i, device, dtypes) for i in range(len(C.GATED_CONFIGS))]
        if args.cases is not None:
            timed = selected_configs(args.smoke, ("float16",) if args.smoke else args.dtypes.split(","), names)
            tasks = [t for t in tasks if t[:2] in timed]
        for rows, secs in check_all(tasks, args.workers, args.check_timeout):
            rec.data["correctness"].extend(rows)
            rec.save()
            bad = [r for r in rows if r.get("ok") is False]
            r0 = rows[0]
            print(f"check {r0['kernel']:6s} config {r0['config']}: {len(rows)} rows, "
                  f"{len(bad)} failing, {secs:.1f}s" + (f"  FIRST FAIL {bad[0]}" if bad else ""), flush=True)
        n_bad = sum(1 for r in rec.data["correctness"] if r.get("ok") is False)
        n_ok = sum(1 for r in rec.data["correctness"] if r.get("ok") is True)
        print(f"correctness: {n_ok} passed, {n_bad} failed, "
              f"{sum(1 for r in rec.data['correctness'] if 'skipped' in r)} skipped in {time.time() - t0:.0f}s", flush=True)

    t0 = time.time()
    dtypes = ("float16",) if args.smoke else tuple(args.dtypes.split(","))
    rejected = rejected_configs(rec.data["correctness"])
    rec.data["rejected"] = sorted(f"{k}:{n}" for k, n in rejected)
    if rejected:
        print("not timed (failed the check):", ", ".join(rec.data["rejected"]), flush=True)
    if args.base_table:
        rec.data["picks"] = dict(base_picks)
    before = dict(rec.data.get("picks", {}))  # a pick this run sets is a new object
    run_sweep(rec, device, args.smoke, dtypes, rejected, args.sustained_ms, args.sustained_s,
              cases=names, replaceable=replaceable_keys(base_picks, names or ()), bench_top=args.bench_top,
              bench_passes=args.bench_passes, compile_ok=not (args.no_compile or args.smoke))
    if args.base_table:
        rec.data["meta"]["retimed"] = sorted(
            k for k, v in rec.data["picks"].items() if k not in before or v is not before[k])
        changed = {k: (before[k]["config"], v["config"]) for k, v in rec.data["picks"].items()
                   if k in before and before[k]["config"] != v["config"]}
        print(f"re-timed {len(rec.data['meta']['retimed'])} keys; picks changed: {changed or 'none'}", flush=True)
    path = write_table(rec, out_dir, device)
    print(f"sweep done in {time.time() - t0:.0f}s; table {path} ({len(rec.data['picks'])} keys)", flush=True)
    # the MLP timing reads the table from the package, as a user's process would
    from reference_kernels import tuning
    import shutil

    if not args.smoke:  # the interpreter ignores tables; keep a CPU smoke run out of the package
        tuning.TABLE_DIR.mkdir(exist_ok=True)
        shutil.copy(path, tuning.TABLE_DIR / os.path.basename(path))
        tuning.load_table.cache_clear()
    time_mlps(rec, device, args.smoke, compile_ok=not (args.no_compile or args.smoke))


if __name__ == "__main__":
    main()
