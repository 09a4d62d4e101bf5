"""``python3 -m pytest_fusion.baselines prune FILE [--write] [-- PYTEST_ARGS...]``: drop the stale
entries of one baseline file.

The project's tests are collected in this process as ``pytest --collect-only PYTEST_ARGS`` collects
them from the working directory (nothing runs); then FILE's stale entries are listed with why, as a
bench run's summary lists them (:func:`pytest_fusion.baselines.store.stale_with_reasons`): a
collected test no longer declares the case in that dtype, or the test file is gone. Tests that were
not collected (deselected with ``-k``, in paths not given) never make an entry stale, nor do tests
that time through the ``fusion`` fixture. The entries of a gone test file whose tests are collected
from one other file are kept and the ``rename`` command that moves them is printed
(:func:`pytest_fusion.baselines.store.moved_files`). Nothing changes without ``--write``; with it the entries
are dropped under the save lock, atomically (:func:`pytest_fusion.baselines.store.drop_entries`).
Only FILE is read and written: it holds one device's entries, and other devices' files stay as
they are (run the command once per file).

Refused with nothing changed (exit status 1, the reason printed): FILE missing or malformed; a
collection that failed or did not load pytest-fusion; and a rootdir under which none of FILE's
test files exists (test ids are relative to the rootdir: run from elsewhere, every entry would look
orphaned). Exit status 0 otherwise (stale entries listed or dropped, or none), 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import pytest

from pytest_fusion.declare.spec import FusionUsageError
from pytest_fusion.plugin import hookimpls, items

PROG = "python3 -m pytest_fusion.baselines prune"


class Collected:
    """A plugin for the collection run: the collected ``fused_kernel`` tests' declared bench cases
    (:func:`pytest_fusion.plugin.items.declared_bench_cases`), the rootdir, the failed collectors."""

    def __init__(self) -> None:
        self.declared: dict[str, list[tuple[str, str]]] = {}
        self.rootpath: Path | None = None  # set when the collection finished with pytest-fusion loaded
        self.errors: list[str] = []

    def pytest_collectreport(self, report: pytest.CollectReport) -> None:
        if report.failed:
            last = (report.longreprtext.strip().splitlines() or ["failed"])[-1]
            self.errors.append(f"{report.nodeid or '.'}: {last}")

    def pytest_collection_finish(self, session: pytest.Session) -> None:
        if session.config.pluginmanager.is_registered(hookimpls):
            self.declared = items.declared_bench_cases(session.items)[0]
            self.rootpath = session.config.rootpath


def collect(pytest_args: list[str]) -> tuple[dict[str, list[tuple[str, str]]], Path]:
    """``({test id: [(case, dtype), ...]}, rootdir)`` of the ``fused_kernel`` tests that
    ``pytest --collect-only pytest_args`` collects here, pytest's own terminal output off.

    Raises:
        FusionUsageError: the collection failed (its errors named), or pytest-fusion's plugin was
            not loaded in it.
    """
    found = Collected()
    code = pytest.main(["--collect-only", "-p", "no:terminal", *pytest_args], plugins=[found])
    if found.errors or code not in (pytest.ExitCode.OK, pytest.ExitCode.NO_TESTS_COLLECTED):
        named = "".join(f"\n  {e}" for e in found.errors)
        raise FusionUsageError(
            f"collecting the tests failed (pytest exit status {int(code)}){named or ' (see above)'}; "
            f"an entry of a test that is not collected cannot be judged: fix the collection, or name "
            f"the test paths that collect after '--'"
        )
    if found.rootpath is None:
        raise FusionUsageError(
            "pytest-fusion's plugin was not loaded by the collection (PYTEST_DISABLE_PLUGIN_AUTOLOAD "
            "set?): pass '-- -p pytest_fusion.plugin.hookimpls'"
        )
    return found.declared, found.rootpath


def _entry(entry: tuple[str, str, str]) -> str:
    kernel, case, dtype = entry
    return f"{kernel} [{case}-{dtype}]"


def prune(path: Path, pytest_args: list[str], *, write: bool, out: Any = None) -> list[tuple[str, str, str]]:
    """List (print to ``out``, default stdout) the stale entries of the baseline file at ``path``
    against the tests ``pytest_args`` collect, and with ``write`` drop them.

    Returns:
        The stale entries (dropped, with ``write``).

    Raises:
        FusionUsageError: see the module docstring; nothing is changed.
    """
    from pytest_fusion.baselines import store

    out = out or sys.stdout
    data = store.load(path)  # a malformed file is refused before anything is collected
    if data is None:
        raise FusionUsageError(f"baseline file {path}: does not exist")
    declared, rootpath = collect(pytest_args)
    total = sum(len(by_dtype) for cases in data["cases"].values() for by_dtype in cases.values())
    stale = store.stale_with_reasons(declared, data, rootpath)
    moved = store.moved_files(declared, data, rootpath)
    renames = "".join(f"\n  {store.rename_command(path, old, new)}" for old, new in sorted(moved.items()))
    orphaned = {kernel for (kernel, _, _), why in stale if why == store.ORPHANED}
    if data["cases"] and orphaned == set(data["cases"]):
        raise FusionUsageError(
            f"none of the test files of {path} exists under the rootdir {rootpath}, which its test "
            f"ids are relative to: run this where you run pytest on the project"
            + (f"; its tests are collected from other files, so they moved: keep their entries with{renames}"
               if moved else "; if every test of the file is gone, delete the file instead")
        )
    kept = [(entry, why) for entry, why in stale if entry[0].partition("::")[0] in moved]
    stale = [(entry, why) for entry, why in stale if entry[0].partition("::")[0] not in moved]
    print(f"{path}: {len(stale)} of {total} entries stale ({len(declared)} fused_kernel test(s) "
          f"collected under {rootpath})", file=out)
    for entry, why in stale:
        print(f"  {'drop' if write else 'would drop'} {_entry(entry)}: {why}", file=out)
    for entry, why in kept:
        print(f"  keep {_entry(entry)}: {why}, but its test is collected from "
              f"{moved[entry[0].partition('::')[0]]}", file=out)
    if kept:
        print(f"moved test files keep their entries with:{renames}", file=out)
    if not stale:
        return []
    if not write:
        print("dry run: nothing changed; run again with --write to drop them", file=out)
        return [entry for entry, _ in stale]
    dropped = store.drop_entries(path, [entry for entry, _ in stale])
    print(f"{path}: {len(dropped)} entries dropped, {total - len(dropped)} kept", file=out)
    return dropped


def main(argv: list[str]) -> int:
    """The command line (module docstring): exit status 0, 1 for a refusal (its reason printed to
    stderr), 2 for bad arguments."""
    pytest_args: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, pytest_args = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="List the stale entries of a baseline file (cases the collected tests no longer "
        "declare, tests whose file is gone) and why; drop them with --write. Arguments after '--' go "
        "to pytest's collection (paths, -k, -m, -p ...).",
    )
    parser.add_argument("file", type=Path, help="the baseline file, e.g. baselines/nvidia-h200.json")
    parser.add_argument("--write", action="store_true",
                        help="drop the stale entries (default: only list them)")
    args = parser.parse_args(argv)
    try:
        prune(args.file, pytest_args, write=args.write)
    except FusionUsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0
