"""Stored baselines: ``baselines/<device-slug>.json``, one human-diffable file per device.

File format (``schema`` 2), written with sorted keys and 2-space indents so a change reads well
in a diff::

    {"schema": 2, "device": "nvidia-h200",
     "cases": {"<test id>": {"<case>": {"<dtype>": {
         "kernel_ms": 0.1234, "dims": {"M": 8192, ...},
         "providers": {"eager": {"ms": 0.2, "speedup": 1.62, "low": 1.60, "high": 1.64}, ...},
         "accuracy": {"budget_used": 0.16, "ulps": 1.5},  # optional (pytest_fusion.gate.drift)
         "cold_start": {"kernel": {"cold_s": 4.2, "warm_s": 0.31}, ...},  # optional (gate.cold_start)
         "env": {"device": ..., "capability": ..., "driver": ..., "cuda": ..., "torch": ...,
                 "triton": ..., "method": ..., "date": ..., "commit": ...,
                 "l2_bytes": ..., "l2_flush_bytes": ..., "l2_cold": ...}}}}}}  # L2: a GPU timer's

``<test id>`` is the test's node id without pytest-fusion's own parameter (``bench-<case>-<dtype>``)
but with the user's parameters and any ``[`` in its path, e.g. ``suite[v2]/test_k.py::test_k[relu]``
(:func:`test_id_of_node`). Schema 1 cut the node id at its first ``[``; :func:`load` reads a schema-1 file
as schema 2 (its keys are kept: a key of a node id without ``[`` before its parameters is already the
test id) and the next :func:`save` writes schema 2; ``python3 -m pytest_fusion.baselines FILE...``
rewrites files in place (:func:`upgrade`). :func:`drop_entries` removes entries under the same lock
and atomic replace (``python3 -m pytest_fusion.baselines prune FILE`` drops a file's stale entries,
:func:`stale_with_reasons`).

Times in ms. :func:`save` merges a run's records into the file (entries not measured in the run
are kept, and so are the stored providers a re-measured entry did not time, when its dims are
unchanged) and replaces it atomically (temporary file in the same directory, fsync, os.replace),
so an interrupted save leaves the old file whole. The load-merge-replace runs under a file lock
(:func:`pytest_fusion.machine.locks.path_lock`: per user, in the temp dir, keyed by the file's real path,
so the repository gets no lock file), so two saves at once both keep their entries;
a temporary file left by a save that was killed is removed by the next save. A dangling symlink
at the file's path is refused (following it would create a file wherever it points). The file is
the user's: a symlinked file is written through to its target, an existing file keeps its
permission bits, and a new one gets the default mode (``0o666 & ~umask``), as any editor would
leave them. A file that does not parse or does not match the schema (any entry field of the wrong
type, a ``device`` other than the file's own slug, a key given twice in one object, nesting too
deep to parse) raises :class:`~pytest_fusion.declare.spec.FusionUsageError` naming the file and the
problem, and is never overwritten. :func:`save` refuses a record that timed no provider besides the
kernel (an entry with nothing to compare against would pass every later run).

The schema's checks and the file's text are in :mod:`pytest_fusion.baselines.schema`, the
environment fields in :mod:`pytest_fusion.baselines.environment`, the atomic replace in
:mod:`pytest_fusion.machine.atomic`.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Mapping

from pytest_fusion.baselines.schema import (
    SCHEMA_VERSION,
    bad,
    dumps,
    parse,
    validate,
)
from pytest_fusion.declare.spec import FusionUsageError
from pytest_fusion.gate.comparable import DEFAULT_METHOD, StoredCase, StoredProvider
from pytest_fusion.gate.rule import BUILD_ENV_KEYS
from pytest_fusion.machine.atomic import remove_stale_temps, replace_text
from pytest_fusion.machine.devices import (
    legacy_slug,
)
from pytest_fusion.measure.record import BenchRecord

LOCK_TIMEOUT_S = 120.0
"""How long :func:`save` waits for another save of the same file: a save takes milliseconds, so
two minutes only runs out when a process holding the lock is stopped (the error says so)."""
SIGNIFICANT_DIGITS = 5
"""Stored floats keep 5 significant digits: far finer than run-to-run noise (>= 0.1%), coarse
enough that an unchanged run rewrites few lines."""


def test_id_of_node(nodeid: str, own_param_id: str | None = None) -> str:
    """The test id of a node id, the key of the test's entries: the node id without
    pytest-fusion's own parameter id.

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


def orphaned_entries(
    data: Mapping[str, Any] | None, root: str | os.PathLike[str]
) -> list[tuple[str, str, str]]:
    """Stored entries ``(test id, case, dtype)`` whose test file no longer exists under ``root``
    (the rootdir test ids are relative to), sorted. A renamed test file's cases are new under
    their new id and pass as new; its old entries are never collected, so :func:`stale_entries`
    cannot see them (docs/gate-safety.md, "3. Stale entries are listed")."""
    if data is None:
        return []
    out: list[tuple[str, str, str]] = []
    for kernel, cases in data["cases"].items():
        if not Path(root, kernel.split("::", 1)[0]).exists():
            out.extend((kernel, case, dtype) for case, by_dtype in cases.items() for dtype in by_dtype)
    return sorted(out)


def moved_files(
    declared: Mapping[str, Iterable[tuple[str, str]]], data: Mapping[str, Any] | None,
    root: str | os.PathLike[str],
) -> dict[str, str]:
    """``{gone test file: collected test file}`` for the stored test files that no longer exist
    under ``root`` whose tests (the part of their id after ``::``) are collected from exactly one
    other file: most likely a moved file, whose entries ``rename`` keeps and ``prune`` would lose."""
    if data is None:
        return {}
    by_test: dict[str, set[str]] = {}
    for kernel in declared:
        path, sep, rest = kernel.partition("::")
        if sep:
            by_test.setdefault(rest, set()).add(path)
    out: dict[str, str] = {}
    for kernel in data["cases"]:
        path = kernel.partition("::")[0]
        if Path(root, path).exists() or path in out:
            continue
        found = {f for k in data["cases"] if k.partition("::")[0] == path
                 for f in by_test.get(k.partition("::")[2], ())}
        if len(found) == 1:
            out[path] = found.pop()
    return out


def rename_command(path: str | os.PathLike[str], old: str, new: str) -> str:
    """The shell command that moves the entries of test file ``old`` in the baseline file at ``path``
    to ``new`` (:func:`rename_tests`)."""
    import shlex

    return " ".join(shlex.quote(str(a)) for a in
                    ("python3", "-m", "pytest_fusion.baselines", "rename", path, old, new))


UNDECLARED = "the test no longer declares this case"
ORPHANED = "its test file no longer exists"


def stale_with_reasons(
    declared: Mapping[str, Iterable[tuple[str, str]]], data: Mapping[str, Any] | None,
    root: str | os.PathLike[str],
) -> list[tuple[tuple[str, str, str], str]]:
    """Every stale entry ``(test id, case, dtype)`` of a loaded file with why: those of
    :func:`stale_entries` (:data:`UNDECLARED`), then those of :func:`orphaned_entries`
    (:data:`ORPHANED`); the two never share an entry (a test whose file is gone is not collected).
    What the bench summary lists and ``python3 -m pytest_fusion.baselines prune`` drops."""
    return ([(entry, UNDECLARED) for entry in stale_entries(declared, data)]
            + [(entry, ORPHANED) for entry in orphaned_entries(data, root)])


def baseline_path(directory: str | os.PathLike[str], slug: str) -> Path:
    return Path(directory) / f"{slug}.json"


def other_device_files(directory: str | os.PathLike[str], slug: str) -> list[str]:
    """Names of baseline files in ``directory`` for devices other than ``slug`` (sorted)."""
    d = Path(directory)
    if not d.is_dir():
        return []
    return sorted(p.name for p in d.glob("*.json") if p.stem != slug)


def legacy_file(directory: str | os.PathLike[str], slug: str, *, name: str) -> Path | None:
    """The baseline file in ``directory`` that an older pytest-fusion named the device ``name``
    (``env.device``) by (:func:`~pytest_fusion.machine.devices.legacy_slug`), when that stem is not
    ``slug`` and the file exists; else None. It is only named to the user (it may hold another
    machine's timings): never read as this device's, never written."""
    old = legacy_slug(name)
    path = baseline_path(directory, old)
    return path if old != slug and path.is_file() else None


def _check_link(path: Path) -> None:
    """A symlink whose target does not exist is refused: writing through it would create a file
    wherever it points (outside the repository, say)."""
    if path.is_symlink() and not path.exists():
        raise bad(
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
        raise bad(p, f"cannot be read ({exc})") from None
    return validate(p, parse(p, text))


def stored_case(data: Mapping[str, Any] | None, *, kernel: str, case: str, dtype: str) -> StoredCase | None:
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
        accuracy=entry.get("accuracy"),
        cold_start=entry.get("cold_start"),
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
    acc = {k: _round(v) for k, v in record.accuracy.items()} if record.accuracy else None
    entry = {"kernel_ms": _round(record.kernel_ms), "dims": dict(record.dims), "providers": provs,
             "env": dict(record.env)}
    cold = ({p: {k: _round(v) for k, v in figs.items()} for p, figs in record.cold_start.items()}
            if record.cold_start else None)
    return {**entry, **({"accuracy": acc} if acc else {}), **({"cold_start": cold} if cold else {})}


def merge_entry(old: Mapping[str, Any] | None, new: dict[str, Any]) -> dict[str, Any]:
    """``new`` with the providers of ``old`` that ``new`` did not time, when both were measured at
    the same dims in the same environment: re-saving with ``--fusion-providers eager`` keeps the
    stored ``compile`` (whose speedup is still that of the kernel the old entry measured, so the
    gate stays as strict as before; likewise a stored accuracy or cold-start figure when ``new`` has
    none). A
    reshaped entry keeps nothing of the old one: its speedups were at other sizes; nor does one
    whose timing method, device or software (``gate.rule.BUILD_ENV_KEYS``) differs, since the new
    entry's ``env`` would label the kept speedups wrongly (docs/gate-safety.md, "1. Nothing
    comparable is a failure")."""
    if not old or old.get("dims") != new.get("dims") or not _same_env(old.get("env"), new.get("env")):
        return new
    kept = {p: v for p, v in old.get("providers", {}).items() if p not in new["providers"]}
    acc = {k: old[k] for k in ("accuracy", "cold_start") if k in old and k not in new}
    return {**new, **acc, "providers": {**kept, **new["providers"]}}


def _same_env(old: Mapping[str, Any] | None, new: Mapping[str, Any] | None) -> bool:
    """Whether no :data:`gate.BUILD_ENV_KEYS` field differs between two entries' environments (a
    field neither records is no difference; an entry without ``method`` was CUDA-graph timed)."""
    old, new = dict(old or {}), dict(new or {})
    for env in (old, new):
        env.setdefault("method", DEFAULT_METHOD)
    return all(old.get(k) == new.get(k) for k in BUILD_ENV_KEYS)


def check_saveable(record: BenchRecord) -> None:
    """Raise ValueError when ``record`` would store an entry that can judge nothing: no provider
    besides the kernel has a speedup (``--fusion-providers kernel``)."""
    if not entry_of(record)["providers"]:
        raise ValueError(
            f"{record.kernel} [{record.case}-{record.dtype}]: no provider besides the kernel was timed, "
            f"so there is no speedup to store (an entry with none would pass any later run); "
            f"time at least one of eager, compile or the marker's providers"
        )


def _acquire(path: Path, target: Path, lock_timeout: float) -> Any:
    """The held file lock of ``target`` (the real path of ``path``); FusionUsageError when another
    save kept it over ``lock_timeout`` seconds."""
    from filelock import Timeout

    from pytest_fusion.machine.locks import path_lock

    lock = path_lock(target, lock_timeout)
    try:
        lock.acquire()
    except Timeout:
        busy = True
    else:
        busy = False
    if busy:
        raise bad(
            path,
            f"another save held its lock {lock.lock_file} for over {lock_timeout:g} s "
            f"(a stopped process? delete that lock file if no pytest-fusion run is saving)",
        )
    return lock


def _merged(path: Path, slug: str, records: list[BenchRecord]) -> dict[str, Any]:
    """The file at ``path`` (or a new one for ``slug``) with ``records`` merged in (:func:`merge_entry`)."""
    data = load(path) or {"schema": SCHEMA_VERSION, "device": slug, "cases": {}}
    for rec in records:
        by_dtype = data["cases"].setdefault(rec.kernel, {}).setdefault(rec.case, {})
        by_dtype[rec.dtype] = merge_entry(by_dtype.get(rec.dtype), entry_of(rec))
    return data


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
    records = list(records)
    for rec in records:
        check_saveable(rec)
    path = baseline_path(directory, slug)
    _check_link(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    target = Path(os.path.realpath(path))  # follows a chain of links; a plain file is itself
    lock = _acquire(path, target, lock_timeout)
    try:
        remove_stale_temps(target)
        replace_text(target, dumps(_merged(path, slug, records)))
    finally:
        lock.release()
    return path


@contextlib.contextmanager
def _editing(path: str | os.PathLike[str]) -> Iterator[tuple[dict[str, Any], Callable[[], None]]]:
    """``(data, write)`` of the baseline file at ``path``, read under :func:`save`'s lock, held
    until the block ends; ``write()`` replaces the file with ``data`` atomically. An error raised in
    the block leaves the file untouched.

    Raises:
        FusionUsageError: the file is missing, malformed or a dangling symlink, or its lock was
            not free within :data:`LOCK_TIMEOUT_S`.
    """
    p = Path(path)
    _check_link(p)
    target = Path(os.path.realpath(p))
    lock = _acquire(p, target, LOCK_TIMEOUT_S)
    try:
        data = load(p)
        if data is None:
            raise bad(p, "does not exist")

        def write() -> None:
            remove_stale_temps(target)
            replace_text(target, dumps(data))

        yield data, write
    finally:
        lock.release()


def drop_entries(
    path: str | os.PathLike[str], entries: Iterable[tuple[str, str, str]]
) -> list[tuple[str, str, str]]:
    """Remove ``entries`` ``(test id, case, dtype)`` from the baseline file at ``path`` through
    :func:`save`'s lock and atomic replace; a case or test left without entries goes with its last.
    The file is read again under the lock: entries it no longer holds are skipped, and every other
    entry is kept as it is. The file is rewritten only when something was removed.

    Returns:
        The entries removed, sorted.

    Raises:
        FusionUsageError: the file is missing, malformed or a dangling symlink, or its lock was
            not free within :data:`LOCK_TIMEOUT_S` (the file is left untouched).
    """
    with _editing(path) as (data, write):
        removed = []
        for kernel, case, dtype in sorted(set(entries)):
            by_case = data["cases"].get(kernel, {})
            if dtype not in by_case.get(case, {}):
                continue
            del by_case[case][dtype]
            removed.append((kernel, case, dtype))
            if not by_case[case]:
                del by_case[case]
            if not by_case:
                del data["cases"][kernel]
        if removed:
            write()
    return removed


def _renamed(kernel: str, old: str, new: str) -> str | None:
    """``kernel`` (a test id) under ``new`` when ``old`` names it (the whole id) or its test file
    (the part before ``::``); None otherwise."""
    if kernel == old:
        return new
    path, sep, rest = kernel.partition("::")
    return f"{new}{sep}{rest}" if sep and path == old else None


def rename_tests(path: str | os.PathLike[str], old: str, new: str) -> dict[str, str]:
    """Move the entries of a renamed test or test file to its new id in the baseline file at
    ``path``, numbers untouched, through :func:`save`'s lock and atomic replace. ``old`` is a test
    id (``tests/test_k.py::test_k``, moved to the test id ``new``) or a test file
    (``tests/test_k.py``: every test id of that file moves to the file ``new``, the ``::`` part kept).

    Returns:
        ``{old test id: new test id}`` of the ids moved.

    Raises:
        FusionUsageError: the file is missing, malformed or a dangling symlink; nothing in it is
            named by ``old`` (its test files are listed); ``new`` already holds an entry of a moved
            case in the same dtype (named: nothing is overwritten); or the lock was not free within
            :data:`LOCK_TIMEOUT_S`. The file is left untouched.
    """
    p = Path(path)
    if not old or not new or old == new:
        raise FusionUsageError(f"rename needs two different names, got {old!r} and {new!r}")
    with _editing(p) as (data, write):
        moves = {k: n for k in data["cases"] if (n := _renamed(k, old, new)) is not None}
        if not moves:
            files = sorted({k.split("::", 1)[0] for k in data["cases"]})
            raise FusionUsageError(f"baseline file {p}: no test id or test file in it is {old!r} (its test "
                                   f"files: {', '.join(files) or 'none'}); it was not changed")
        clashes = sorted(f"{n} [{case}-{dtype}]" for k, n in moves.items()
                         for case, by_dtype in data["cases"][k].items()
                         for dtype in by_dtype if dtype in data["cases"].get(n, {}).get(case, {}))
        if clashes:
            more = f" and {len(clashes) - 3} more" if len(clashes) > 3 else ""
            held = ", ".join(clashes[:3]) + more
            raise FusionUsageError(f"baseline file {p}: already holds {held}: renaming would overwrite "
                                   f"them (drop one of the two first); it was not changed")
        for k, n in moves.items():
            by_case = data["cases"].pop(k)
            for case, by_dtype in by_case.items():
                data["cases"].setdefault(n, {}).setdefault(case, {}).update(by_dtype)
        write()
    return moves


def upgrade(path: str | os.PathLike[str]) -> bool:
    """Rewrite baseline file ``path`` in the current schema (numbers untouched, through
    :func:`save`'s lock and atomic replace). Returns True when the file changed.

    Raises:
        FusionUsageError: the file is missing or malformed (it is left untouched).
    """
    from pytest_fusion.machine.locks import path_lock

    p = Path(path)
    _check_link(p)
    target = Path(os.path.realpath(p))
    with path_lock(target, LOCK_TIMEOUT_S):
        data = load(p)
        if data is None:
            raise bad(p, "does not exist")
        text = dumps(data)
        if text == p.read_text(encoding="utf8"):
            return False
        replace_text(target, text)
    return True


USAGE = """usage: python3 -m pytest_fusion.baselines [upgrade] FILE...
       python3 -m pytest_fusion.baselines prune FILE [--write] [-- PYTEST_ARGS...]
       python3 -m pytest_fusion.baselines rename FILE OLD NEW

upgrade  rewrite baseline files in the current schema (the numbers untouched)
prune    list FILE's stale entries (cases the collected tests no longer declare, tests whose file
         is gone) and why; --write drops them
rename   move the entries of a renamed test (OLD and NEW test ids) or test file (OLD and NEW
         paths, every test of the file) to the new name, the numbers untouched"""


def main(argv: list[str] | None = None) -> int:
    """``python3 -m pytest_fusion.baselines [upgrade] FILE...``: :func:`upgrade` each file, print
    what changed. Exit status 0, 1 for a file that cannot be upgraded (the error is printed), 2 for
    no file."""
    import sys

    files = sys.argv[1:] if argv is None else argv
    if not files or files[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr if not files else sys.stdout)
        return 2 if not files else 0
    for f in files:
        try:
            changed = upgrade(f)
        except FusionUsageError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 1
        print(f"{f}: {'upgraded to' if changed else 'already'} schema {SCHEMA_VERSION}")
    return 0


def rename_main(argv: list[str]) -> int:
    """``python3 -m pytest_fusion.baselines rename FILE OLD NEW``: :func:`rename_tests`, print what
    moved. Exit status 0, 1 for a refusal (the error printed), 2 for bad arguments."""
    import sys

    if len(argv) != 3:
        print(USAGE, file=sys.stderr)
        return 2
    try:
        moves = rename_tests(*argv)
    except FusionUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    for old, new in sorted(moves.items()):
        print(f"{argv[0]}: {old} -> {new}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
