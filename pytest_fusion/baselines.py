"""Stored baselines: ``baselines/<device-slug>.json``, one human-diffable file per device.

File format (``schema`` 2), written with sorted keys and 2-space indents so a change reads well
in a diff::

    {"schema": 2, "device": "nvidia-h200",
     "cases": {"<test id>": {"<case>": {"<dtype>": {
         "kernel_ms": 0.1234, "dims": {"M": 8192, ...},
         "providers": {"eager": {"ms": 0.2, "speedup": 1.62, "low": 1.60, "high": 1.64}, ...},
         "env": {"device": ..., "capability": ..., "driver": ..., "cuda": ..., "torch": ...,
                 "triton": ..., "method": ..., "date": ..., "commit": ...}}}}}}

``<test id>`` is the test's node id without pytest-fusion's own parameter (``bench-<case>-<dtype>``)
but with the user's parameters and any ``[`` in its path, e.g. ``suite[v2]/test_k.py::test_k[relu]``
(:func:`kernel_id`). Schema 1 cut the node id at its first ``[``; :func:`load` reads a schema-1 file
as schema 2 (its keys are kept: a key of a node id without ``[`` before its parameters is already the
test id) and the next :func:`save` writes schema 2; ``python -m pytest_fusion.baselines FILE...``
rewrites files in place (:func:`upgrade`).

Times in ms. :func:`save` merges a run's records into the file (entries not measured in the run
are kept, and so are the stored providers a re-measured entry did not time, when its dims are
unchanged) and replaces it atomically (temporary file in the same directory, fsync, os.replace),
so an interrupted save leaves the old file whole. The load-merge-replace runs under a file lock
(:func:`pytest_fusion.locks.path_lock`: per user, in the temp dir, keyed by the file's real path,
so the repository gets no lock file), so two saves at once both keep their entries;
a temporary file left by a save that was killed is removed by the next save. A dangling symlink
at the file's path is refused (following it would create a file wherever it points). The file is
the user's: a symlinked file is written through to its target, an existing file keeps its
permission bits, and a new one gets the default mode (``0o666 & ~umask``), as any editor would
leave them. A file that does not parse or does not match the schema (any entry field of the wrong
type, a ``device`` other than the file's own slug, a key given twice in one object, nesting too
deep to parse) raises :class:`~pytest_fusion.spec.FusionUsageError` naming the file and the
problem, and is never overwritten. :func:`save` refuses a record that timed no provider besides the
kernel (an entry with nothing to compare against would pass every later run).
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

SCHEMA_VERSION = 2
READABLE_SCHEMAS = (1, 2)
"""Schemas :func:`load` reads; schema 1 is upgraded in memory (module docstring)."""
LOCK_TIMEOUT_S = 120.0
"""How long :func:`save` waits for another save of the same file: a save takes milliseconds, so
two minutes only runs out when a process holding the lock is stopped (the error says so)."""
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


def current_env(
    device: str, method: str, rootdir: str | None = None, baseline_dir: str | None = None
) -> dict[str, Any]:
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


def test_id(nodeid: str, own_param_id: str | None = None) -> str:
    """The key of a test's entries: its node id without pytest-fusion's own parameter id.

    ``own_param_id`` is the id pytest-fusion parametrized the item with (``bench-<case>-<dtype>``,
    or the dtype of a check item); the user's own parameters stay, and so does any ``[`` in the
    path: ``suite[v2]/t.py::test_k[relu-bench-small-float32]`` -> ``suite[v2]/t.py::test_k[relu]``.
    A node id whose parameters do not hold ``own_param_id`` is returned unchanged.
    """
    if not own_param_id or not nodeid.endswith("]"):
        return nodeid
    prefix, sep, name = nodeid.rpartition("::")  # a function name holds no '[': its params start at the first
    func, bracket, params = name.partition("[")
    if not bracket:
        return nodeid
    params = params[:-1]
    if params == own_param_id:
        return f"{prefix}{sep}{func}"
    if params.endswith("-" + own_param_id):
        rest = params[: -len(own_param_id) - 1]
    elif params.startswith(own_param_id + "-"):
        rest = params[len(own_param_id) + 1 :]
    else:
        return nodeid
    return f"{prefix}{sep}{func}[{rest}]"


def stale_entries(
    declared: Mapping[str, Iterable[tuple[str, str]]], data: Mapping[str, Any] | None
) -> list[tuple[str, str, str]]:
    """Stored entries ``(test id, case, dtype)`` of tests collected in this run that no longer
    declare that bench case in that dtype (a renamed or removed case), sorted.

    Args:
        declared: ``{test id: {(case, dtype), ...}}`` for every collected test whose bench cases
            are declared (a ``fused_kernel`` marker's ``bench``), whatever ``--fusion-cases`` picked.
            Tests not collected (deselected, in files not run) are absent and never make an entry
            stale; neither do tests that time through the ``fusion`` fixture (their cases are
            known only when they run).
        data: a loaded baseline file (:func:`load`), or None.
    """
    if data is None:
        return []
    out: list[tuple[str, str, str]] = []
    for kernel, cases in declared.items():
        have = set(map(tuple, cases))
        for case, by_dtype in data["cases"].get(kernel, {}).items():
            out.extend((kernel, case, dtype) for dtype in by_dtype if (case, dtype) not in have)
    return sorted(out)


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
        if not isinstance(v, dict) or not (
            _positive_number(v.get("ms")) and _positive_number(v.get("speedup"))
        ):
            raise _bad(path, f"{where}.providers[{p!r}] needs positive numbers 'ms' and 'speedup', got {v!r}")
        for bound in ("low", "high"):  # the saved interval; null when it was not known
            if v.get(bound) is not None and not _positive_number(v[bound]):
                raise _bad(
                    path,
                    f"{where}.providers[{p!r}].{bound} must be a positive number or null, got {v[bound]!r}",
                )
        if v.get("low") is not None and v.get("high") is not None and v["low"] > v["high"]:
            raise _bad(path, f"{where}.providers[{p!r}] has low {v['low']!r} > high {v['high']!r}")


def _validate(path: Path, data: Any) -> dict[str, Any]:
    if not isinstance(data, dict):
        raise _bad(path, f"top level must be an object, got {type(data).__name__}")
    if data.get("schema") not in READABLE_SCHEMAS:
        raise _bad(
            path,
            f"schema is {data.get('schema')!r}, this pytest-fusion reads schema "
            f"{' and '.join(map(str, READABLE_SCHEMAS))}",
        )
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
        raise _bad(
            path,
            f"'device' is {data.get('device')!r} but this file holds baselines for {path.stem!r} "
            f"(a file copied from another device?)",
        )
    return migrate(data)


def migrate(data: dict[str, Any]) -> dict[str, Any]:
    """A validated file's data in the current schema (schema 1 -> 2: the keys stay, see the
    module docstring; only ``schema`` changes). Returns ``data`` itself, updated."""
    data["schema"] = SCHEMA_VERSION
    return data


def _reject_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json`` object hook: the plain decoder keeps the last of two equal keys, which would drop
    a stored entry without a word (two merged branches each adding one)."""
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise _DuplicateKey(key)
        out[key] = value
    return out


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _check_link(path: Path) -> None:
    """A symlink whose target does not exist is refused: writing through it would create a file
    wherever it points (outside the repository, say)."""
    if path.is_symlink() and not path.exists():
        raise _bad(
            path,
            f"is a symlink to {os.readlink(path)!r}, which does not exist; "
            f"pytest-fusion will not create a file through a dangling link",
        )


def load(path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The parsed, validated baseline file (in schema 2), or None when it does not exist.

    Raises:
        FusionUsageError: the file is unreadable, not JSON, has a key twice in one object, is
            nested too deeply, is a dangling symlink, is not schema 1 or 2, has an entry field of
            the wrong type, or names another device than its own slug (names file and problem).
    """
    p = Path(path)
    _check_link(p)
    if not p.exists():
        return None
    # The messages below carry the cause's text: "from None" keeps pytest from printing it twice.
    try:
        text = p.read_text(encoding="utf8")
    except (OSError, UnicodeDecodeError) as exc:
        raise _bad(p, f"cannot be read ({exc})") from None
    problem = None
    try:
        data = json.loads(text, object_pairs_hook=_reject_duplicates)
    except json.JSONDecodeError as exc:
        problem = f"is not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})"
    except _DuplicateKey as exc:
        problem = f"has the key {exc.key!r} twice in one object (a bad merge?); keep one of them"
    except RecursionError:
        problem = "is nested too deeply to parse (not a baseline file)"
    if problem is not None:  # raised outside the except clauses: one message, no chained traceback
        raise _bad(p, problem) from None
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
        providers={
            p: StoredProvider(
                float(v["ms"]),
                float(v["speedup"]),
                None if v.get("low") is None else float(v["low"]),
                None if v.get("high") is None else float(v["high"]),
            )
            for p, v in entry["providers"].items()
        },
        env=dict(entry.get("env") or {}),
        dims=None if entry.get("dims") is None else dict(entry["dims"]),
    )


def _round(x: float | None) -> float | None:
    return None if x is None else float(f"{x:.{SIGNIFICANT_DIGITS}g}")


def entry_of(record: BenchRecord) -> dict[str, Any]:
    """The stored form of one record (times rounded to :data:`SIGNIFICANT_DIGITS`)."""
    provs = {
        name: {
            "ms": _round(p.median_ms),
            "speedup": _round(p.speedup),
            "low": _round(p.low),
            "high": _round(p.high),
        }
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


def merge_entry(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the providers of ``old`` that ``new`` did not time, when both were measured at
    the same dims: re-saving with ``--fusion-providers eager`` keeps the stored ``compile`` (whose
    speedup is still that of the kernel the old entry measured, so the gate stays as strict as
    before). A reshaped entry keeps nothing of the old one: its speedups were at other sizes."""
    if not old or old.get("dims") != new.get("dims"):
        return new
    kept = {p: v for p, v in old.get("providers", {}).items() if p not in new["providers"]}
    return {**new, "providers": {**kept, **new["providers"]}} if kept else new


def check_saveable(record: BenchRecord) -> None:
    """Raise ValueError when ``record`` would store an entry that can judge nothing: no provider
    besides the kernel has a speedup (``--fusion-providers kernel``)."""
    if not entry_of(record)["providers"]:
        raise ValueError(
            f"{record.kernel} [{record.case}-{record.dtype}]: no provider besides the kernel was timed, "
            f"so there is no speedup to store (an entry with none would pass any later run); "
            f"time at least one of eager, compile or the marker's providers"
        )


def _tmp_prefix(target: Path) -> str:
    return f".{target.name}."


def remove_stale_temps(target: Path) -> list[Path]:
    """Remove the temporary files a killed :func:`save` of ``target`` left beside it; returns them.
    Call only under the file's lock: a live save's own temporary file exists only while it holds it."""
    removed = []
    for tmp in target.parent.glob(_tmp_prefix(target) + "*.tmp"):
        try:
            tmp.unlink()
            removed.append(tmp)
        except FileNotFoundError:
            pass
    return removed


def save(
    directory: str | os.PathLike[str],
    slug: str,
    records: Iterable[BenchRecord],
    *,
    lock_timeout: float = LOCK_TIMEOUT_S,
) -> Path:
    """Merge ``records`` into ``<directory>/<slug>.json`` atomically; create the directory.

    Load, merge and replace run under a file lock (module docstring), so concurrent saves of one
    file each keep the other's entries; temporary files of killed saves are removed first. A
    symlink at that path is written through: its target gets the new content (the temporary file
    lives beside the target, so the rename stays atomic) and the link is kept; a dangling one is
    refused. An existing file keeps its permission bits; a new one gets ``0o666 & ~umask``. A
    re-measured entry keeps the stored providers it did not time (:func:`merge_entry`).

    Returns:
        The path written (the link's path when it is a symlink).

    Raises:
        FusionUsageError: the existing file is malformed or a dangling symlink (it is left
            untouched), or the lock was not free within ``lock_timeout`` seconds.
        ValueError: a record timed no provider besides the kernel (:func:`check_saveable`);
            nothing is written.
        OSError: the directory or file cannot be written (the old file, if any, is intact).
    """
    from filelock import Timeout

    from pytest_fusion.locks import path_lock

    records = list(records)
    for rec in records:
        check_saveable(rec)
    path = baseline_path(directory, slug)
    _check_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(path))  # follows a chain of links; a plain file is itself
    lock = path_lock(target, lock_timeout)
    try:
        lock.acquire()
    except Timeout:
        busy = True
    else:
        busy = False
    if busy:
        raise _bad(
            path,
            f"another save held its lock {lock.lock_file} for over {lock_timeout:g} s "
            f"(a stopped process? delete that lock file if no pytest-fusion run is saving)",
        )
    try:
        remove_stale_temps(target)
        data = load(path) or {"schema": SCHEMA_VERSION, "device": slug, "cases": {}}
        for rec in records:
            by_dtype = data["cases"].setdefault(rec.kernel, {}).setdefault(rec.case, {})
            by_dtype[rec.dtype] = merge_entry(by_dtype.get(rec.dtype), entry_of(rec))
        _replace(target, dumps(data))
    finally:
        lock.release()
    return path


def _replace(target: Path, text: str) -> None:
    """Write ``text`` to ``target`` through a temporary file beside it, fsync, os.replace."""
    try:
        mode = stat.S_IMODE(os.stat(target).st_mode)
    except FileNotFoundError:
        mode = _default_mode()
    fd, tmp = tempfile.mkstemp(prefix=_tmp_prefix(target), suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf8") as f:
            f.write(text)
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


def upgrade(path: str | os.PathLike[str]) -> bool:
    """Rewrite baseline file ``path`` in the current schema (numbers untouched, through
    :func:`save`'s lock and atomic replace). Returns True when the file changed.

    Raises:
        FusionUsageError: the file is missing or malformed (it is left untouched).
    """
    from pytest_fusion.locks import path_lock

    p = Path(path)
    _check_link(p)
    target = Path(os.path.realpath(p))
    with path_lock(target, LOCK_TIMEOUT_S):
        data = load(p)
        if data is None:
            raise _bad(p, "does not exist")
        text = dumps(data)
        if text == p.read_text(encoding="utf8"):
            return False
        _replace(target, text)
    return True


def main(argv: list[str] | None = None) -> int:
    """``python -m pytest_fusion.baselines FILE...``: :func:`upgrade` each file, print what changed."""
    import sys

    files = sys.argv[1:] if argv is None else argv
    if not files:
        print("usage: python -m pytest_fusion.baselines BASELINE.json...", file=sys.stderr)
        return 2
    for f in files:
        try:
            changed = upgrade(f)
        except FusionUsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{f}: {'upgraded to' if changed else 'already'} schema {SCHEMA_VERSION}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
