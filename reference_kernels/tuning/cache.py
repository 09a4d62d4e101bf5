"""The per-machine tuning cache: where it lives, what its files are keyed on, how they are read
and written.

One directory per user and machine (:func:`cache_dir`: ``$REFERENCE_KERNELS_TUNING_CACHE``, else
``$XDG_CACHE_HOME/pytest-fusion/tuning``, else ``~/.cache/pytest-fusion/tuning``), one file per
fingerprint (:func:`cache_path`): the Triton version, the device's name and compute capability
and a hash of the kernels' sources (:data:`KERNEL_SOURCES`); a change to any starts a new, empty
file. Delete the directory to tune again. A file is ``{key: config name}`` picks; GPUs of one
model share a file, and the pick written first stands (:func:`store`). A cache that cannot be
read or written is warned of once (:func:`warn_once`); a file that is not JSON or of another
schema is read as empty (with a RuntimeWarning naming it) and rewritten at the next tune. What
reads and fills the cache is :mod:`reference_kernels.tuning.pick`.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import warnings
from pathlib import Path
from typing import Any, Sequence

import torch
import triton

from pytest_fusion.machine import atomic, devices, locks
from reference_kernels.gemm.configs import config_name

PACKAGE = Path(__file__).resolve().parents[1]
"""The reference_kernels package directory."""

CACHE_ENV = "REFERENCE_KERNELS_TUNING_CACHE"
"""Environment variable naming the tuning cache's directory (see :func:`cache_dir`)."""

CACHE_SCHEMA = 1
"""The tuning cache files' format; a file of another schema is read as empty (and warned of)."""

KERNEL_SOURCES: tuple[Path, ...] = tuple(
    PACKAGE / name
    for name in (
        "kernels/gated_mlp.py",
        "kernels/linear_act.py",
        "kernels/dispatch.py",
        "kernels/validate.py",
        "gemm/pointer_tile.py",
        "gemm/tile_loop.py",
        "gemm/tma.py",
        "gemm/split_tail.py",
        "gemm/epilogue.py",
        "gemm/schedule.py",
        "gemm/configs.py",
        "gemm/targets.py",
    )
)
"""The modules that define the tuned kernels and their configs: kernels/gated_mlp.py and
kernels/linear_act.py and what they import from reference_kernels (the tuning folder aside). Their
hash is part of the cache's fingerprint, so a changed kernel is tuned again."""

CACHE_LOCK_TIMEOUT_S = 60.0
"""Seconds a write of the cache waits for another process's: a read-merge-write of one small JSON
file, so only a stopped process holds it that long (the write is then skipped, with a warning)."""

_warned: set[str] = set()
"""Cache warnings given in this process: each is given once, not at every call that meets it."""


def warn_once(message: str, once: str = "") -> None:
    """Warn ``message`` unless this process gave the warning ``once`` (default: the message) already."""
    if (once or message) not in _warned:
        _warned.add(once or message)
        warnings.warn(message, RuntimeWarning, stacklevel=4)


def device_slug(device: torch.device) -> str:
    """``"nvidia-h200"`` for an NVIDIA H200 (pytest-fusion's rule, ``devices.device_slug``, so the
    tuned tables, the cache files and baselines/ name a device alike); ``"cpu"`` off CUDA (the
    interpreter)."""
    if device.type != "cuda":
        return device.type
    return _slug(device.index or 0)


@functools.cache
def _slug(index: int) -> str:
    return devices.device_slug(f"cuda:{index}")


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
        warn_once(f"tuning cache {path} could not be read ({type(exc).__name__}: {exc}); read as empty",
                  once=f"read {path}")
        return {}
    try:
        data = json.loads(text)
    except ValueError as exc:
        data, why = None, f"not JSON: {exc}"
    else:
        why = _cache_problem(data, parts)
    if why:
        warn_once(f"tuning cache {path} is not a tuning cache of this fingerprint ({why}); read as empty, "
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


def candidate(cands: Sequence[triton.Config], name: str | None) -> triton.Config | None:
    """The config of ``cands`` named ``name`` (configs.config_name), or None."""
    return next((c for c in cands if config_name(c) == name), None)


def store(path: Path, parts: dict[str, str], key: str, pick: triton.Config,
          cands: Sequence[triton.Config]) -> triton.Config:
    """Add ``key: pick`` to the cache file and return the key's pick: one another process wrote
    first (a candidate) wins, so that every process runs the same config. A cache that cannot be
    written is warned of once; ``pick`` is then returned, kept by this process alone."""
    try:  # filelock's Timeout is an OSError
        path.parent.mkdir(parents=True, exist_ok=True)
        with locks.path_lock(path, timeout=CACHE_LOCK_TIMEOUT_S):
            picks = read_cache(path, parts)
            first = candidate(cands, picks.get(key))
            if first is not None:
                return first
            picks[key] = config_name(pick)
            atomic.remove_stale_temps(path)
            data = {"schema": CACHE_SCHEMA, "fingerprint": fingerprint(parts), "parts": parts, "picks": picks}
            atomic.replace_text(path, json.dumps(data, indent=1, sort_keys=True) + "\n")
    except OSError as exc:
        warn_once(f"tuning cache {path} could not be written ({type(exc).__name__}: {exc}); keys missing "
                  "from the tuned table are tuned once per process instead", once=f"write {path}")
    return pick
