"""Which config a kernel call runs: the committed tuned table first, then this machine's tuning
cache, then tuning at run time.

Autotuning in every process (as ``triton.autotune`` does) lets a call run a different config from
one process to the next whenever two configs time within the tuner's noise of each other, which a
speedup gate reads as a regression (docs/reference-kernels.md, "Tuning"). So the pick is data: a
table per device, ``reference_kernels/tuning/tables/<device>.json``, written by
``python3 -m reference_kernels.tune`` from a timing run of every candidate, keyed on the kernel,
the dtype, the power-of-two buckets of M, N and K, and whether the TMA path can run.

A call whose key the table lacks reads the tuning cache (:mod:`reference_kernels.tuning.cache`). A
key the cache lacks too is tuned once per machine: each candidate timed by
``triton.testing.do_bench`` under the device's timing lock (never beside another process's bench
timing on that GPU, never two tunes of one GPU at once), the cache read again once the lock is
held, and the pick written to the cache, where every later process and xdist worker reads it.
``REFERENCE_KERNELS_AUTOTUNE=0`` still reads the cache but tunes nothing: a key missing from both
runs the first candidate (for correctness runs that draw a new bucket on nearly every example). A
cache that cannot be read or written is warned of once, and tuning falls back to once per process.

The table misses every call on a GPU without a table (``nvidia-h200.json`` and
``nvidia-h100-80gb-hbm3.json`` are committed), and on those two every call outside what their tables
hold: the catalog shapes of reference_kernels.models.shapes in bf16 and fp16 with contiguous inputs
(the TMA path). fp32,
strided inputs (the pointer path) and other shape buckets come from the cache or are tuned.
Cached picks are stable on one machine, not across machines: for that, run
``python3 -m reference_kernels.tune`` on the GPU (or export the cache with ``--from-cache``) and
commit its table. A table or cache entry naming a config that is not a candidate (a stale table)
is ignored with a RuntimeWarning. Under the Triton interpreter nothing is read or tuned.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import triton

from pytest_fusion.machine import devices, locks
from reference_kernels.gemm import targets
from reference_kernels.gemm.configs import bucket, candidates, config_name, interpreter_config
from reference_kernels.gemm.targets import INTERPRET
from reference_kernels.tuning import cache

AUTOTUNE = os.environ.get("REFERENCE_KERNELS_AUTOTUNE", "1") not in ("", "0")
"""Whether a key missing from the tuned table is tuned at run time (see module docstring)."""

TABLE_DIR = Path(__file__).with_name("tables")
"""Where the tuned tables live, one JSON file per device slug (cache.device_slug)."""


def table_key(kernel: str, dtype: torch.dtype, M: int, N: int, K: int, tma: bool) -> str:
    """The tuned table's key of a call, e.g. ``gated/bfloat16/M8192/N4096/K1024/tma``."""
    dt = str(dtype).removeprefix("torch.")
    return f"{kernel}/{dt}/M{bucket(M)}/N{bucket(N)}/K{bucket(K)}/{'tma' if tma else 'pointer'}"


@functools.cache
def load_table(slug: str) -> dict[str, str]:
    """``{key: config name}`` of ``tables/<slug>.json``; empty when the file is missing.

    Raises:
        ValueError: the file exists but is not a tuned table (named in the message).
    """
    path = TABLE_DIR / f"{slug}.json"
    if not path.exists():
        return {}
    try:
        data = json.loads(path.read_text())
        return {k: v["config"] for k, v in data["picks"].items()}
    except (ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{path} is not a tuned table ({type(exc).__name__}: {exc})") from exc


_resolved: dict[tuple[str, str], triton.Config] = {}
"""Configs already chosen in this process, by (device slug, table key): a call after the first
of its bucket costs one dict lookup, not a table read or a tuning run."""


def _time_ms(run: Callable[[triton.Config], Any], config: triton.Config) -> float:
    try:
        return triton.testing.do_bench(lambda: run(config), warmup=5, rep=25)
    except Exception as exc:  # noqa: BLE001 - a config that cannot run on this device loses
        warnings.warn(
            f"config {config_name(config)} failed while tuning: {type(exc).__name__}: {exc}",
            RuntimeWarning,
            stacklevel=3,
        )
        return math.inf


def _cached_or_tuned(
    device: torch.device, key: str, cands: Sequence[triton.Config], run: Callable[[triton.Config], Any]
) -> triton.Config:
    """The tuning cache's pick; else (AUTOTUNE) the fastest candidate, timed under the device's
    timing lock and written to the cache; else the first candidate."""
    try:
        path: Path | None
        path, parts = cache.cache_path(device)
    except (OSError, RuntimeError) as exc:  # Path.home() raises RuntimeError where there is no home
        cache.warn_once(f"no tuning cache ({type(exc).__name__}: {exc}); keys missing from the tuned table "
                        "are tuned once per process instead", once="cache_path")
        path, parts = None, {}
    name = cache.read_cache(path, parts).get(key) if path is not None else None
    pick = cache.candidate(cands, name)
    if name is not None and pick is None:
        cache.warn_once(f"tuning cache {path}: {key} names {name!r}, which is not a candidate config; "
                        f"{'tuning again' if AUTOTUNE else 'running the first candidate'}")
    if pick is not None:
        return pick
    if not AUTOTUNE:
        return cands[0]
    lock = contextlib.ExitStack()
    try:
        # Reentrant: a kernel's first call may come inside a bench case, which holds this lock. Taken
        # inside a memory admission (a check), never the other way round.
        lock.enter_context(devices.device_lock(
            str(device), timeout=locks.DEFAULT_TIMING_LOCK_TIMEOUT_S, holder=f"tuning {key}", reentrant=True
        ))
        shared = True
    except (locks.LockTimeout, OSError) as exc:
        cache.warn_once(f"tuning {key} without the device's timing lock ({type(exc).__name__}: {exc}); "
                        "its pick is kept by this process alone")
        shared = False
    with lock:
        if shared and path is not None:  # another process may have tuned the key while this one waited
            pick = cache.candidate(cands, cache.read_cache(path, parts).get(key))
            if pick is not None:
                return pick
        pick = min(cands, key=lambda c: _time_ms(run, c))
        return cache.store(path, parts, key, pick, cands) if shared and path is not None else pick


def choose(
    kernel: str,
    configs: Sequence[triton.Config],
    x: torch.Tensor,
    N: int,
    K: int,
    weights: int,
    tma: bool,
    run: Callable[[triton.Config], Any],
) -> triton.Config:
    """The config for a call of ``kernel`` (``"linear"`` or ``"gated"``) on x (M, K).

    Args:
        configs: the kernel's configs; ``weights``: weight tiles per K step (1 or 2), for the
            shared-memory check against x's device (targets.of_device); ``tma``: whether the
            inputs allow the TMA path (gemm.tma.tma_ready).
        run: launches the kernel with a given config (used only when tuning at run time).

    Returns:
        The table's pick; else the tuning cache's (:func:`reference_kernels.tuning.cache.cache_path`);
        else (:data:`AUTOTUNE`) the fastest candidate, tuned once per machine into the cache; else
        the first candidate (configs.candidates for x's device). Under the interpreter,
        ``configs.interpreter_config``'s pick. A table or cache entry naming a config that is not
        a candidate is ignored with a RuntimeWarning. Nothing about the cache raises: a cache that
        cannot be read or written is warned of once and tuning falls back to once per process.

    Raises:
        ValueError: no config fits the device's shared memory (configs.candidates).
    """
    M = x.shape[0]
    if INTERPRET:
        return interpreter_config(M, N, K)
    slug = cache.device_slug(x.device)
    key = table_key(kernel, x.dtype, M, N, K, tma)
    pick: triton.Config | None = _resolved.get((slug, key))
    if pick is not None:
        return pick
    cands = candidates(configs, M, x.element_size(), weights, tma, targets.of_device(x.device))
    name = load_table(slug).get(key)
    pick = cache.candidate(cands, name)
    if name is not None and pick is None:
        warnings.warn(
            f"tuned table {slug}.json: {key} names {name!r}, which is not a candidate config; using "
            f"the tuning cache or {'tuning instead' if AUTOTUNE else 'the first candidate'}",
            RuntimeWarning,
            stacklevel=3,
        )
    if pick is None:
        pick = _cached_or_tuned(x.device, key, cands, run)
    _resolved[(slug, key)] = pick
    return pick
