"""Which config a kernel call runs: the committed tuned table first, tuning at run time second.

Autotuning in every process (as ``triton.autotune`` does) lets a call run a different config
from one process to the next whenever two configs time within the tuner's noise of each other;
on an H200 that moved one case's kernel time by 57% between two
benchmark runs, which a speedup gate reads as a regression. So the pick is data: a table per
device, ``reference_kernels/tuned/<device>.json``, written by ``python3 -m reference_kernels.tune``
from a timing run of every candidate, keyed on the kernel, the dtype, the power-of-two buckets
of M, N and K, and whether the TMA path can run.

A call whose key the table lacks is tuned once per process (each candidate timed by
``triton.testing.do_bench``), which brings the cross-process drift back for that key, unless
``REFERENCE_KERNELS_AUTOTUNE=0``, which runs the first candidate instead (for correctness runs
that draw a new bucket on nearly every example). That is every call on a GPU without a table
(only ``nvidia-h200.json`` is committed), and on the H200 every call outside what its table was
tuned on: the catalog shapes of reference_kernels.shapes in bf16 and fp16 with contiguous inputs
(the TMA path). fp32, strided inputs (the pointer path) and other shape buckets tune at run time.
For stable picks on another GPU or other shapes, run ``python3 -m reference_kernels.tune`` there and
commit its table. A table entry naming a config that is not a candidate (a stale table) is
ignored with a RuntimeWarning.
"""

from __future__ import annotations

import functools
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import triton

from pytest_fusion import devices
from reference_kernels import targets
from reference_kernels.configs import INTERPRET, INTERPRETER_CONFIG, bucket, candidates, config_name

AUTOTUNE = os.environ.get("REFERENCE_KERNELS_AUTOTUNE", "1") not in ("", "0")
"""Whether a key missing from the tuned table is tuned at run time (see module docstring)."""

TABLE_DIR = Path(__file__).with_name("tuned")
"""Where the tuned tables live, one JSON file per device slug."""


def device_slug(device: torch.device) -> str:
    """``"nvidia-h200"`` for an NVIDIA H200 (pytest-fusion's rule, ``devices.device_slug``, so
    tuned/ and baselines/ name a device alike); ``"cpu"`` off CUDA (the interpreter)."""
    if device.type != "cuda":
        return device.type
    return _slug(device.index or 0)


@functools.cache
def _slug(index: int) -> str:
    return devices.device_slug(f"cuda:{index}")


def table_key(kernel: str, dtype: torch.dtype, M: int, N: int, K: int, tma: bool) -> str:
    """The tuned table's key of a call, e.g. ``gated/bfloat16/M8192/N4096/K1024/tma``."""
    dt = str(dtype).removeprefix("torch.")
    return f"{kernel}/{dt}/M{bucket(M)}/N{bucket(N)}/K{bucket(K)}/{'tma' if tma else 'pointer'}"


@functools.cache
def load_table(slug: str) -> dict[str, str]:
    """``{key: config name}`` of ``tuned/<slug>.json``; empty when the file is missing.

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
            inputs allow the TMA path (_tma.tma_ready).
        run: launches the kernel with a given config (used only when tuning at run time).

    Returns:
        The table's pick; else the fastest candidate, tuned once per process; else (tuning off)
        the first candidate (configs.candidates for x's device). :data:`INTERPRETER_CONFIG`
        under the interpreter.

    Raises:
        ValueError: no config fits the device's shared memory (configs.candidates).
    """
    if INTERPRET:
        return INTERPRETER_CONFIG
    M = x.shape[0]
    slug = device_slug(x.device)
    key = table_key(kernel, x.dtype, M, N, K, tma)
    pick: triton.Config | None = _resolved.get((slug, key))
    if pick is not None:
        return pick
    cands = candidates(configs, M, x.element_size(), weights, tma, targets.of_device(x.device))
    name = load_table(slug).get(key)
    pick = next((c for c in cands if config_name(c) == name), None)
    if name is not None and pick is None:
        warnings.warn(
            f"tuned table {slug}.json: {key} names {name!r}, which is not a candidate "
            f"config; {'tuning instead' if AUTOTUNE else 'running the first candidate'}",
            RuntimeWarning,
            stacklevel=3,
        )
    if pick is None:
        pick = min(cands, key=lambda c: _time_ms(run, c)) if AUTOTUNE else cands[0]
    _resolved[(slug, key)] = pick
    return pick
