"""Which config a kernel call runs: the committed tuned table first, then this machine's tuning
cache, then tuning at run time.

Autotuning in every process (as ``triton.autotune`` does) lets a call run a different config
from one process to the next whenever two configs time within the tuner's noise of each other;
on an H200 that moved one case's kernel time by 57% between two
benchmark runs, which a speedup gate reads as a regression. So the pick is data: a table per
device, ``reference_kernels/tuned/<device>.json``, written by ``python3 -m reference_kernels.tune``
from a timing run of every candidate, keyed on the kernel, the dtype, the power-of-two buckets
of M, N and K, and whether the TMA path can run.

A call whose key the table lacks reads the tuning cache, one directory per user and machine
(:func:`cache_dir`: ``$REFERENCE_KERNELS_TUNING_CACHE``, else
``$XDG_CACHE_HOME/pytest-fusion/tuning``, else ``~/.cache/pytest-fusion/tuning``). A key the cache
lacks too is tuned once per machine: each candidate timed by ``triton.testing.do_bench`` under
the device's timing lock (never beside another process's bench timing on that GPU, never two
tunes of one GPU at once), the cache read again once the lock is held, and the pick written to the
cache, where every later process and xdist worker reads it (GPUs of one model share a file: the
pick written first stands). The cache has one file per fingerprint
(:func:`cache_path`): the Triton version, the device's name and compute capability and a hash of
the kernels' sources (:data:`KERNEL_SOURCES`); a change to any starts a new, empty file. Delete
the directory to tune again. ``REFERENCE_KERNELS_AUTOTUNE=0`` still reads the cache but tunes
nothing: a key missing from both runs the first candidate (for correctness runs that draw a new
bucket on nearly every example). A cache that cannot be read or written is warned of once, and
tuning falls back to once per process; a cache file that is not JSON or of another schema is read
as empty (with a RuntimeWarning naming it) and rewritten at the next tune.

The table misses every call on a GPU without a table (only ``nvidia-h200.json`` is committed),
and on the H200 every call outside what its table was tuned on: the catalog shapes of
reference_kernels.shapes in bf16 and fp16 with contiguous inputs (the TMA path). fp32, strided
inputs (the pointer path) and other shape buckets come from the cache or are tuned. Cached picks are stable on
one machine, not across machines: for that, run ``python3 -m reference_kernels.tune`` on the GPU
(or export the cache with ``--from-cache``) and commit its table. A table or cache entry naming a
config that is not a candidate (a stale table) is ignored with a RuntimeWarning. Under the Triton
interpreter nothing is read or tuned.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import math
import os
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import triton

from pytest_fusion.machine import atomic, devices, locks
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


CACHE_ENV = "REFERENCE_KERNELS_TUNING_CACHE"
"""Environment variable naming the tuning cache's directory (see :func:`cache_dir`)."""

CACHE_SCHEMA = 1
"""The tuning cache files' format; a file of another schema is read as empty (and warned of)."""

KERNEL_SOURCES: tuple[Path, ...] = tuple(
    Path(__file__).with_name(f"{name}.py")
    for name in (
        "gated_mlp", "linear_act", "_tma", "_split_tail", "_epilogue", "_schedule", "_validate", "configs",
        "targets",
    )
)
"""The modules that define the tuned kernels and their configs: gated_mlp.py and linear_act.py and
what they import from reference_kernels (this module aside). Their hash is part of the cache's
fingerprint, so a changed kernel is tuned again."""

CACHE_LOCK_TIMEOUT_S = 60.0
"""Seconds a write of the cache waits for another process's: a read-merge-write of one small JSON
file, so only a stopped process holds it that long (the write is then skipped, with a warning)."""

_warned: set[str] = set()
"""Cache warnings given in this process: each is given once, not at every call that meets it."""


def _warn_once(message: str, once: str = "") -> None:
    """Warn ``message`` unless this process gave the warning ``once`` (default: the message) already."""
    if (once or message) not in _warned:
        _warned.add(once or message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def cache_dir() -> Path:
    """The tuning cache's directory, shared by every process of this user on the machine:
    ``$REFERENCE_KERNELS_TUNING_CACHE`` when set, else ``$XDG_CACHE_HOME/pytest-fusion/tuning``,
    else ``~/.cache/pytest-fusion/tuning`` (a relative ``XDG_CACHE_HOME`` is ignored, as the XDG
    Base Directory specification says)."""
    env = os.environ.get(CACHE_ENV)
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    base = Path(xdg) if os.path.isabs(xdg) else Path.home() / ".cache"
    return base / "pytest-fusion" / "tuning"


@functools.cache
def kernel_source_hash() -> str:
    """SHA-256 (hex) over the names and bytes of :data:`KERNEL_SOURCES`, read once per process."""
    h = hashlib.sha256()
    for path in KERNEL_SOURCES:
        h.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


@functools.cache
def _cuda_identity(index: int) -> tuple[str, str]:
    major, minor = torch.cuda.get_device_capability(index)
    return torch.cuda.get_device_name(index), f"{major}.{minor}"


def fingerprint_parts(device: torch.device) -> dict[str, str]:
    """What a tuning cache entry depends on: the Triton version, the device's name and compute
    capability (``"-"`` off CUDA) and :func:`kernel_source_hash`; any change starts a new cache."""
    name, capability = _cuda_identity(device.index or 0) if device.type == "cuda" else (device.type, "-")
    return {
        "triton": triton.__version__,
        "device": name,
        "capability": capability,
        "kernel_source": kernel_source_hash(),
    }


def fingerprint(parts: dict[str, str]) -> str:
    """SHA-256 (hex) of ``parts`` (:func:`fingerprint_parts`) as sorted JSON."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def cache_path(device: torch.device) -> tuple[Path, dict[str, str]]:
    """``(file, fingerprint parts)`` of ``device``'s tuning cache:
    ``<cache_dir>/<device slug>-<fingerprint[:16]>.json``, one file per fingerprint."""
    parts = fingerprint_parts(device)
    return cache_dir() / f"{device_slug(device)}-{fingerprint(parts)[:16]}.json", parts


def read_cache(path: Path, parts: dict[str, str]) -> dict[str, str]:
    """``{key: config name}`` of the cache file ``path``; empty when it is missing. A file that is
    not JSON, of another :data:`CACHE_SCHEMA` or fingerprint, or unreadable is read as empty with a
    RuntimeWarning naming it (the next tune rewrites it); nothing is raised."""
    try:
        text = path.read_text(encoding="utf8")
    except (FileNotFoundError, NotADirectoryError):  # no cache yet (or none can be made: warned at the write)
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        _warn_once(f"tuning cache {path} could not be read ({type(exc).__name__}: {exc}); read as empty",
                   once=f"read {path}")
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        data, why = None, f"not JSON: {exc}"
    else:
        why = _cache_problem(data, parts)
    if why:
        _warn_once(f"tuning cache {path} is not a tuning cache of this fingerprint ({why}); read as empty, "
                   "rewritten at the next tune", once=f"read {path}")
        return {}
    return dict(data["picks"])


def _cache_problem(data: Any, parts: dict[str, str]) -> str:
    """What makes ``data`` (a cache file's JSON) not a cache of ``parts``' fingerprint; ``""``: nothing."""
    if not isinstance(data, dict):
        return "not a JSON object"
    if data.get("schema") != CACHE_SCHEMA:
        return f"schema {data.get('schema')!r}, not {CACHE_SCHEMA}"
    if data.get("fingerprint") != fingerprint(parts):
        return "another fingerprint"
    picks = data.get("picks")
    if not isinstance(picks, dict) or not all(isinstance(v, str) for v in picks.values()):
        return "picks is not {key: config name}"
    return ""


def _store(path: Path, parts: dict[str, str], key: str, pick: triton.Config,
           cands: Sequence[triton.Config]) -> triton.Config:
    """Add ``key: pick`` to the cache file and return the key's pick: one another process wrote
    first (a candidate) wins, so that every process runs the same config. A cache that cannot be
    written is warned of once; ``pick`` is then returned, kept by this process alone."""
    try:  # filelock's Timeout is an OSError
        path.parent.mkdir(parents=True, exist_ok=True)
        with locks.path_lock(path, timeout=CACHE_LOCK_TIMEOUT_S):
            picks = read_cache(path, parts)
            first = _candidate(cands, picks.get(key))
            if first is not None:
                return first
            picks[key] = config_name(pick)
            atomic.remove_stale_temps(path)
            data = {"schema": CACHE_SCHEMA, "fingerprint": fingerprint(parts), "parts": parts, "picks": picks}
            atomic.replace_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        _warn_once(f"tuning cache {path} could not be written ({type(exc).__name__}: {exc}); keys missing "
                   "from the tuned table are tuned once per process instead", once=f"write {path}")
    return pick


def _candidate(cands: Sequence[triton.Config], name: str | None) -> triton.Config | None:
    return next((c for c in cands if config_name(c) == name), None)


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
        path, parts = cache_path(device)
    except (OSError, RuntimeError) as exc:  # Path.home() raises RuntimeError where there is no home
        _warn_once(f"no tuning cache ({type(exc).__name__}: {exc}); keys missing from the tuned table are "
                   "tuned once per process instead", once="cache_path")
        path, parts = None, {}
    name = read_cache(path, parts).get(key) if path is not None else None
    pick = _candidate(cands, name)
    if name is not None and pick is None:
        _warn_once(f"tuning cache {path}: {key} names {name!r}, which is not a candidate config; "
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
        _warn_once(f"tuning {key} without the device's timing lock ({type(exc).__name__}: {exc}); "
                   "its pick is kept by this process alone")
        shared = False
    with lock:
        if shared and path is not None:  # another process may have tuned the key while this one waited
            pick = _candidate(cands, read_cache(path, parts).get(key))
            if pick is not None:
                return pick
        pick = min(cands, key=lambda c: _time_ms(run, c))
        return _store(path, parts, key, pick, cands) if shared and path is not None else pick


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
        The table's pick; else the tuning cache's (:func:`cache_path`); else (:data:`AUTOTUNE`)
        the fastest candidate, tuned once per machine into the cache; else the first candidate
        (configs.candidates for x's device). :data:`INTERPRETER_CONFIG` under the interpreter.
        A table or cache entry naming a config that is not a candidate is ignored with a
        RuntimeWarning. Nothing about the cache raises: a cache that cannot be read or written
        is warned of once and tuning falls back to once per process.

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
    pick = _candidate(cands, name)
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
