"""Step 1 of the tuner: every config of the reference kernels checked against a float64 golden,
in a process pool (which also fills Triton's disk cache for the sweep)."""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing as mp
import sys
import time
from typing import TYPE_CHECKING, Any, Generator, Iterable, Sequence

if TYPE_CHECKING:
    import torch
    import triton

    from reference_kernels.gemm.targets import Target

Row = dict[str, Any]
"""One check row: kernel, config index, dtype, shape, ``ok`` and the errors, or ``skipped``."""

Task = tuple[str, int, str, tuple[str, ...]]
"""One check task: (kernel, config index, device, dtypes)."""

FLOOR = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}
"""Relative error a kernel may always reach: a few ulps at unit scale (fp16 2^-10, bf16 2^-7)."""

ODD_SHAPES = ((1, 257, 131), (37, 1000, 523), (300, 129, 77), (300, 1000, 520))
"""(M, K, N) not multiples of any tile; K = 129 and 257 leave one element in the last K tile.
The last has rows of 16-byte multiples in every dtype, so TMA configs run their descriptor kernel
(with tails in M, N and K, which the descriptors zero-fill and clip)."""


def _dtype(name: str) -> torch.dtype:
    import torch

    return getattr(torch, name)


def _rel(out: torch.Tensor, gold: torch.Tensor) -> float:
    d = out.double() - gold
    return (d.norm() / gold.norm().clamp_min(1e-300)).item()


def check_config(task: Task) -> tuple[list[Row], float]:
    """Worker: run one (kernel, config index) at the odd shapes in each dtype, and once at an
    aligned shape (bf16/fp16) so Triton's disk cache holds the compile the timing phase needs.
    A dtype in which the device is offered the config only with fewer pipeline stages
    (runnable_form: where no config fits as it is) checks that form, its rows naming it; one in
    which it is not offered at all is skipped."""
    import torch

    from reference_kernels.gemm import configs as C
    from reference_kernels.gemm import targets

    kernel, idx, device, dtypes = task
    cfgs = C.LINEAR_CONFIGS if kernel == "linear" else C.GATED_CONFIGS
    cfg = cfgs[idx]
    weights = 1 if kernel == "linear" else 2
    target = targets.of_device(torch.device(device))
    rows: list[Row] = []
    gen = torch.Generator(device="cpu").manual_seed(1000 + idx)
    t0 = time.time()
    for di, dt in enumerate(dtypes):
        itemsize = _dtype(dt).itemsize
        run = runnable_form(cfg, itemsize, weights, target, C.offered(cfgs, itemsize, weights, target))
        if run is None:
            fit = C.fits(cfg, itemsize, weights, target)
            why = f"not run on {target.name}" if fit else "does not fit shared memory"
            rows.append(dict(kernel=kernel, config=idx, dtype=dt, skipped=why))
            continue
        for si, shape in enumerate(ODD_SHAPES):
            row = _check_shape(kernel, idx, run, device, dt, di, si, shape, gen)
            rows.append(row if run is cfg else dict(row, name=C.config_name(run)))
    if device == "cuda":
        rows += _aligned_warmup(kernel, idx, cfg, device, target)
    return rows, time.time() - t0


def runnable_form(
    cfg: triton.Config, itemsize: int, weights: int, target: Target, offered: Sequence[triton.Config]
) -> triton.Config | None:
    """The form in which ``target`` runs ``cfg`` for inputs of ``itemsize`` bytes: ``cfg``
    itself where its pipeline fits, else it with fewer stages (configs.shallower); None unless
    that form is among the configs ``offered`` there (configs.offered, configs.candidates)."""
    from reference_kernels.gemm import configs as C

    form = cfg if C.fits(cfg, itemsize, weights, target) else C.shallower(cfg, itemsize, weights, target)
    return form if form is not None and C.config_name(form) in {C.config_name(c) for c in offered} else None


def _check_shape(
    kernel: str,
    idx: int,
    cfg: triton.Config,
    device: str,
    dt: str,
    di: int,
    si: int,
    shape: tuple[int, int, int],
    gen: torch.Generator,
) -> Row:
    """The row of one odd shape (ODD_SHAPES[si]) in dtype ``dt``: the kernel's relative error
    against the float64 golden within twice eager's (or the dtype's FLOOR), or the error raised."""
    import torch

    from reference_kernels.kernels import eager
    from reference_kernels.kernels.gated_mlp import gated_act
    from reference_kernels.kernels.linear_act import linear_act

    M, K, N = shape
    torch_dt = _dtype(dt)
    acts = ("gelu_tanh", "silu", "gelu", "relu", "none")
    act = acts[(si + di + idx) % len(acts)]
    x = torch.randn(M, K, generator=gen).to(device, torch_dt)
    w1 = (torch.randn(N, K, generator=gen) / K**0.5).to(device, torch_dt)
    w2 = (torch.randn(K, N, generator=gen) / K**0.5).to(device, torch_dt).t()  # transposed
    b = torch.randn(N, generator=gen).to(device, torch_dt)
    where = dict(kernel=kernel, config=idx, dtype=dt, M=M, K=K, N=N, act=act)
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
            gold = eager.gated_act_eager(
                x.double(), w1.double(), wu.double(), None if bg is None else bg.double(), None, act
            )
            eag = eager.gated_act_eager(x, w1, wu, bg, None, act)
        if device == "cuda":
            torch.cuda.synchronize()
        k_err, e_err = _rel(out, gold), _rel(eag, gold)
        ok = bool(torch.isfinite(out).all()) and k_err <= max(2 * e_err, FLOOR[dt])
        return dict(where, kernel_rel=k_err, eager_rel=e_err, ok=ok)
    except Exception as exc:  # noqa: BLE001 - a failing config is a result, not a crash
        return dict(where, ok=False, error=f"{type(exc).__name__}: {exc}"[:400])


def _aligned_warmup(kernel: str, idx: int, cfg: triton.Config, device: str, target: Target) -> list[Row]:
    """Compile ``cfg`` (in the form ``target`` runs it, runnable_form) at aligned shapes in
    bf16/fp16 (for the sweep's disk cache); ``[]``, or the failed row of a config that does not
    compile there."""
    import torch

    from reference_kernels.gemm import configs as C
    from reference_kernels.kernels.gated_mlp import gated_act
    from reference_kernels.kernels.linear_act import linear_act

    cfgs = C.LINEAR_CONFIGS if kernel == "linear" else C.GATED_CONFIGS
    weights = 1 if kernel == "linear" else 2
    # aligned warm-up compiles: M = 1 (specialised) or a multiple of 16, K a multiple of 256
    Ms = [1, 16, 128] if cfg.kwargs["BLOCK_M"] == 16 else [128, 1024]
    run = None
    try:
        for dt in ("bfloat16", "float16"):
            torch_dt = _dtype(dt)
            offered = C.offered(cfgs, torch_dt.itemsize, weights, target)
            run = runnable_form(cfg, torch_dt.itemsize, weights, target, offered)
            if run is None:
                continue
            for M in Ms:
                x = torch.randn(M, 512, device=device, dtype=torch_dt)
                w = torch.randn(256, 512, device=device, dtype=torch_dt)
                b = torch.randn(256, device=device, dtype=torch_dt)
                if kernel == "linear":
                    for act, bias in (("gelu", b), ("gelu_tanh", b), ("none", None)):
                        linear_act(x, w, bias, act, config=run)
                else:
                    for act in ("silu", "gelu_tanh"):
                        gated_act(x, w, w, None, None, act, config=run)
        torch.cuda.synchronize()
    except Exception as exc:  # noqa: BLE001 - a config that does not compile is a failed row
        return [
            dict(
                kernel=kernel,
                config=idx,
                **({} if run is None or run is cfg else {"name": C.config_name(run)}),
                dtype=dt,
                M=M,
                K=512,
                N=256,
                ok=False,
                error=f"aligned warm-up: {type(exc).__name__}: {exc}"[:400],
            )
        ]
    return []


def _failed(task: Task, error: str) -> tuple[list[Row], float]:
    kernel, idx = task[:2]
    return [dict(kernel=kernel, config=idx, ok=False, error=error[:400])], 0.0


def _kill(pool: cf.ProcessPoolExecutor) -> None:
    """Stop a pool without waiting for its workers: a hung worker holds the GPU and would make
    shutdown(wait=True) wait forever."""
    for proc in list((getattr(pool, "_processes", None) or {}).values()):
        proc.kill()
    pool.shutdown(wait=False, cancel_futures=True)


def _spawn_pool(workers: int) -> cf.ProcessPoolExecutor:
    """A pool of ``workers`` spawned processes, each retired after one task (a CUDA error that
    sticks to a context cannot fail the tasks after it). Python 3.10's ProcessPoolExecutor has no
    ``max_tasks_per_child`` (3.11): there a worker runs tasks until the pool shuts down."""
    spawn = mp.get_context("spawn")
    if sys.version_info >= (3, 11):
        return cf.ProcessPoolExecutor(max_workers=workers, mp_context=spawn, max_tasks_per_child=1)
    return cf.ProcessPoolExecutor(max_workers=workers, mp_context=spawn)  # pragma: no cover - 3.10


def check_all(
    tasks: Sequence[Task], workers: int, timeout_s: float
) -> Generator[tuple[list[Row], float], None, None]:
    """Yield check_config's (rows, seconds) for every task, in a spawn process pool, one task per
    worker process on Python 3.11+ (:func:`_spawn_pool`).

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


def _run_pool(
    tasks: Sequence[Task], workers: int, deadline: float, timeout_s: float
) -> Generator[tuple[list[Row], float], None, list[Task]]:
    """check_all's pool: yields each task's rows or failed row, returns the tasks a broken pool
    left unfinished."""
    pool = _spawn_pool(workers)
    futures = {pool.submit(check_config, t): t for t in tasks}
    unfinished: list[Task] = []
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


def rejected_configs(correctness: Iterable[Row]) -> set[tuple[str, str]]:
    """``{(kernel, config name)}`` of configs with a failing or crashed check row: the sweep
    never times them, so a config that computes wrongly can never become a pick."""
    from reference_kernels.gemm import configs as C

    out = set()
    for r in correctness:
        if r.get("ok") is False:
            cfgs = C.LINEAR_CONFIGS if r["kernel"] == "linear" else C.GATED_CONFIGS
            # "name": the form with fewer stages that was checked (check_config)
            out.add((r["kernel"], r.get("name") or C.config_name(cfgs[r["config"]])))
    return out


def resume_refusal(
    resumed: dict[str, Any], now: dict[str, Any], configs: dict[str, list[str]]
) -> str | None:
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
    mismatch = {
        k: (first.get(k), now.get(k))
        for k in ("torch", "triton", "device", "regimes")
        if first.get(k) != now.get(k)
    }
    if mismatch:
        return f"its run had other versions, device or ranking regimes: {mismatch}"
    if resumed.get("configs") != configs:
        return "its run had other configs (or did not record them): resume only with the code it ran"
    if "--skip-check" not in first.get("argv", []):
        checked = {(r["kernel"], r["config"]) for r in resumed.get("correctness", [])}
        unchecked = [
            f"{k}:{name}"
            for k, names in configs.items()
            for i, name in enumerate(names)
            if (k, i) not in checked
        ]
        if unchecked:
            return f"its check did not finish: no rows for {', '.join(unchecked[:5])}" + (
                f" and {len(unchecked) - 5} more" if len(unchecked) > 5 else ""
            )
    return None
