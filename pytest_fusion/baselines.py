"""Stored baselines: ``baselines/<device-slug>.json``, one human-diffable file per device.

File format (``schema`` 1), written with sorted keys and 2-space indents so a change reads well
in a diff::

    {"schema": 1, "device": "nvidia-h200",
     "cases": {"<kernel node id>": {"<case>": {"<dtype>": {
         "kernel_ms": 0.1234, "dims": {"M": 8192, ...},
         "providers": {"eager": {"ms": 0.2, "speedup": 1.62, "low": 1.60, "high": 1.64}, ...},
         "env": {"device": ..., "capability": ..., "driver": ..., "cuda": ..., "torch": ...,
                 "triton": ..., "method": ..., "date": ..., "commit": ...}}}}}}

Times in ms. :func:`save` merges a run's records into the file (entries not measured in the run
are kept) and replaces it atomically (temporary file in the same directory, fsync, os.replace),
so an interrupted save leaves the old file whole. The file is the user's: a symlinked file is
written through to its target, an existing file keeps its permission bits, and a new one gets the
default mode (``0o666 & ~umask``), as any editor would leave them. A file that does not parse or
does not match the schema (any entry field of the wrong type, a ``device`` other than the file's
own slug) raises :class:`~pytest_fusion.spec.FusionUsageError` naming the file and the problem,
and is never overwritten.
"""

from __future__ import annotations

import datetime as _dt
import json
import math
import os
import stat
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Iterable, Mapping

from pytest_fusion.bench.record import BenchRecord
from pytest_fusion.devices import cpu_model, device_name, device_slug, slugify  # noqa: F401  (re-exported)
from pytest_fusion.gate import StoredCase, StoredProvider
from pytest_fusion.spec import FusionUsageError

SCHEMA_VERSION = 1
SIGNIFICANT_DIGITS = 5
"""Stored floats keep 5 significant digits: far finer than run-to-run noise (>= 0.1%), coarse
enough that an unchanged run rewrites few lines."""


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _commit(rootdir: str | None, baseline_dir: str | None = None) -> str | None:
    """HEAD's short hash, with ``+dirty`` when tracked files other than the baselines differ from
    it, or ``+unknown`` when git cannot say: a baseline measured from uncommitted code (or a
    copied tree whose .git lags behind) must not name a commit that did not hold the code it
    measured. The baseline directory is left out: re-saving rewrites it."""
    head = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=rootdir)
    if head is None:
        return None
    cmd = ["git", "status", "--porcelain", "--untracked-files=no", "--", "."]
    if baseline_dir is not None:
        rel = os.path.relpath(os.path.abspath(baseline_dir), os.path.abspath(rootdir or "."))
        if not rel.startswith(".."):  # a directory outside the work tree needs no exclusion
            cmd.append(f":(exclude){rel}")
    try:  # not _run: a failing status must not read as clean; a fresh copy makes git re-hash all files
        out = subprocess.run(cmd, cwd=rootdir, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return head + "+unknown"
    return head + "+dirty" if out.stdout.strip() else head


def current_env(device: str, method: str, rootdir: str | None = None, baseline_dir: str | None = None) -> dict[str, Any]:
    """Environment fields stored with each case (module docstring); unknown ones are None.
    ``commit``: see :func:`_commit` (``rootdir`` is the git work tree, ``baseline_dir`` is left
    out of its dirty check)."""
    import torch

    env: dict[str, Any] = {
        "device": device_name(device),
        "capability": None,
        "driver": None,
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        "torch": str(torch.__version__),
        "triton": None,
        "method": method,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "commit": _commit(rootdir, baseline_dir),
    }
    try:
        import triton

        env["triton"] = str(triton.__version__)
    except ImportError:
        pass
    if str(device).startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        env["capability"] = f"{major}.{minor}"
        drv = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
        env["driver"] = drv.splitlines()[0].strip() if drv else None
    return env


def baseline_path(directory: str | os.PathLike[str], slug: str) -> Path:
    return Path(directory) / f"{slug}.json"


def other_device_files(directory: str | os.PathLike[str], slug: str) -> list[str]:
    """Names of baseline files in ``directory`` for devices other than ``slug`` (sorted)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.glob("*.json") if p.stem != slug)


def _bad(path: Path, problem: str) -> FusionUsageError:
    return FusionUsageError(f"baseline file {path}: {problem} (fix or delete it; it was not changed)")


def _positive_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and x > 0


def _size(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _scalar(x: Any) -> bool:
    return x is None or isinstance(x, (str, int, float))


def _validate_entry(path: Path, where: str, entry: Any) -> None:
    """Every field :func:`stored_case` and the gate read, with the type they need (extra keys are
    left alone, so a newer pytest-fusion's additions do not break an older reader)."""
    if not isinstance(entry, dict):
        raise _bad(path, f"{where} must be an object, got {type(entry).__name__}")
    if not _positive_number(entry.get("kernel_ms")):
        raise _bad(path, f"{where}.kernel_ms must be a positive number, got {entry.get('kernel_ms')!r}")
    dims = entry.get("dims")
    if dims is not None and not (isinstance(dims, dict) and all(_size(v) for v in dims.values())):
        raise _bad(path, f"{where}.dims must be an object of sizes {{symbol: int >= 0}}, got {dims!r}")
    env = entry.get("env")
    if env is not None and not (isinstance(env, dict) and all(_scalar(v) for v in env.values())):
        raise _bad(path, f"{where}.env must be an object of strings, numbers or null, got {env!r}")
    provs = entry.get("providers")
    if not isinstance(provs, dict):
        raise _bad(path, f"{where}.providers must be an object {{provider: {{ms, speedup, low, high}}}}")
    for p, v in provs.items():
        if not isinstance(v, dict) or not (_positive_number(v.get("ms")) and _positive_number(v.get("speedup"))):
            raise _bad(path, f"{where}.providers[{p!r}] needs positive numbers 'ms' and 'speedup', got {v!r}")
        for bound in ("low", "high"):  # the saved interval; null when it was not known
            if v.get(bound) is not None and not _positive_number(v[bound]):
                raise _bad(path, f"{where}.providers[{p!r}].{bound} must be a positive number or null, got {v[bound]!r}")
        if v.get("low") is not None and v.get("high") is not None and v["low"] > v["high"]:
            raise _bad(path, f"{where}.providers[{p!r}] has low {v['low']!r} > high {v['high']!r}")


def _validate(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _bad(path, f"top level must be an object, got {type(data).__name__}")
    if data.get("schema") != SCHEMA_VERSION:
        raise _bad(path, f"schema is {data.get('schema')!r}, this pytest-fusion reads schema {SCHEMA_VERSION}")
    cases = data.get("cases")
    if not isinstance(cases, dict):
        raise _bad(path, "'cases' must be an object {kernel: {case: {dtype: entry}}}")
    for kernel, by_case in cases.items():
        if not isinstance(by_case, dict):
            raise _bad(path, f"cases[{kernel!r}] must be an object")
        for case, by_dtype in by_case.items():
            if not isinstance(by_dtype, dict):
                raise _bad(path, f"cases[{kernel!r}][{case!r}] must be an object")
            for dtype, entry in by_dtype.items():
                _validate_entry(path, f"cases[{kernel!r}][{case!r}][{dtype!r}]", entry)
    # The file name picks the device; a "device" naming another one means the file was copied or
    # renamed, and gating (or saving into) it would mix two devices' timings.
    if data.get("device") != path.stem:
        raise _bad(path, f"'device' is {data.get('device')!r} but this file holds baselines for {path.stem!r} "
                         f"(a file copied from another device?)")
    return data


def load(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed, validated baseline file, or None when it does not exist.

    Raises:
        FusionUsageError: the file is unreadable, not JSON, not schema 1, has an entry field of the
            wrong type, or names another device than its own slug (names file and problem).
    """
    p = Path(path)
    if not p.exists():
        return None
    # The messages below carry the cause's text: "from None" keeps pytest from printing it twice.
    try:
        text = p.read_text(encoding="utf8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(p, f"cannot be read ({exc})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise _bad(p, f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})") from None
    return _validate(p, data)


def stored_case(data: Mapping[str, Any] | None, kernel: str, case: str, dtype: str) -> StoredCase | None:
    """The entry for ``(kernel, case, dtype)`` of a loaded file, as the gate's StoredCase."""
    if data is None:
        return None
    entry = data["cases"].get(kernel, {}).get(case, {}).get(dtype)
    if entry is None:
        return None
    return StoredCase(
        kernel_ms=float(entry["kernel_ms"]),
        providers={p: StoredProvider(float(v["ms"]), float(v["speedup"]),
                                     None if v.get("low") is None else float(v["low"]),
                                     None if v.get("high") is None else float(v["high"]))
                   for p, v in entry["providers"].items()},
        env=dict(entry.get("env") or {}),
        dims=None if entry.get("dims") is None else dict(entry["dims"]),
    )


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def entry_of(record: BenchRecord) -> dict[str, Any]:
    """The stored form of one record (times rounded to :data:`SIGNIFICANT_DIGITS`)."""
    provs = {
        name: {"ms": _round(p.median_ms), "speedup": _round(p.speedup), "low": _round(p.low), "high": _round(p.high)}
        for name, p in record.providers.items()
        if name != "kernel" and p.speedup is not None
    }
    return {
        "kernel_ms": _round(record.kernel_ms),
        "dims": dict(record.dims),
        "providers": provs,
        "env": dict(record.env),
    }


def dumps(data: Mapping[str, Any]) -> str:
    """Canonical text of a baseline file: sorted keys, 2-space indent, trailing newline."""
    return json.dumps(data, indent=2, sort_keys=True) + "\n"


def _default_mode() -> int:
    """``0o666 & ~umask``: the mode ``open(path, "w")`` gives a new file (mkstemp's is 0o600).
    Python 3.11 has no way to read the umask without setting it, so set it and put it back."""
    umask = os.umask(0o022)
    os.umask(umask)
    return 0o666 & ~umask


def save(directory: str | os.PathLike[str], slug: str, records: Iterable[BenchRecord]) -> Path:
    """Merge ``records`` into ``<directory>/<slug>.json`` atomically; create the directory.

    A symlink at that path is written through: its target gets the new content (the temporary file
    lives beside the target, so the rename stays atomic) and the link is kept. An existing file
    keeps its permission bits; a new one gets ``0o666 & ~umask``.

    Returns:
        The path written (the link's path when it is a symlink).

    Raises:
        FusionUsageError: the existing file is malformed (it is left untouched).
        OSError: the directory or file cannot be written (the old file, if any, is intact).
    """
    path = baseline_path(directory, slug)
    data = load(path) or {"schema": SCHEMA_VERSION, "device": slug, "cases": {}}
    for rec in records:
        data["cases"].setdefault(rec.kernel, {}).setdefault(rec.case, {})[rec.dtype] = entry_of(rec)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(path))  # follows a chain of links; a plain file is itself
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = _default_mode()
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf8") as f:
            f.write(dumps(data))
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, mode)
        os.replace(tmp, target)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path
