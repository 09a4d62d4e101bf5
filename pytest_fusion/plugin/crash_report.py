"""A process that died inside a kernel call, named with its case and repro.

Each process of a run records its kernel calls (:mod:`pytest_fusion.machine.crash_record`) in
``<tempdir>/pytest-fusion-<uid>/crashes/<rootdir hash>/<controller pid>/``: ``main.json`` for a
run without workers, ``<workerid>.json`` for an xdist worker. When a worker dies, the controller's
``pytest_handlecrashitem`` adds the worker's record to xdist's "worker crashed" report. A run
without workers cannot report its own death; the next run in the same root directory finds the
directory of a process that is no longer alive, reports its record in the terminal summary and
removes it. A run that ends removes its own directory.
"""

from __future__ import annotations

import hashlib
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from pytest_fusion.machine import crash_record
from pytest_fusion.machine.locks import lock_dir

EARLIER_KEY = pytest.StashKey[list[dict[str, Any]]]()


def crash_root(config: pytest.Config) -> Path:
    """The directory of this root directory's runs' records (one subdirectory per run)."""
    digest = hashlib.sha1(str(config.rootpath.resolve()).encode()).hexdigest()[:12]
    return lock_dir() / "crashes" / digest


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists; True where that cannot be told (not POSIX)."""
    if os.name != "posix":
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def earlier_crashes(root: Path) -> list[dict[str, Any]]:
    """The records left by runs under ``root`` whose process is gone; their directories are removed."""
    found = []
    for run in sorted(root.glob("*")) if root.is_dir() else []:
        if not run.name.isdigit() or _alive(int(run.name)):
            continue
        found += [r for r in (crash_record.read(p) for p in sorted(run.glob("*.json"))) if r is not None]
        shutil.rmtree(run, ignore_errors=True)
    return found


class CrashReport:
    """The plugin object (registered by :func:`register`)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        workerinput = getattr(config, "workerinput", None)
        if workerinput is not None and "fusion_crash_dir" in workerinput:
            self.dir = Path(workerinput["fusion_crash_dir"])
            self.owner = False
            name = f"{workerinput['workerid']}.json"
        else:
            root = crash_root(config)
            config.stash[EARLIER_KEY] = earlier_crashes(root)
            self.dir = root / str(os.getpid())
            self.owner = True
            name = "main.json"
        self.dir.mkdir(parents=True, exist_ok=True)
        self.outer = crash_record.activate(self.dir / name)  # an in-process pytester run nests

    @pytest.hookimpl(optionalhook=True)
    def pytest_configure_node(self, node: Any) -> None:
        node.workerinput["fusion_crash_dir"] = str(self.dir)

    @pytest.hookimpl(optionalhook=True)
    def pytest_handlecrashitem(self, crashitem: str, report: pytest.TestReport, sched: Any) -> None:
        worker = getattr(report, "node", None)
        workerid = getattr(worker, "workerinput", {}).get("workerid")
        record = crash_record.read(self.dir / f"{workerid}.json") if workerid else None
        if record is not None:
            report.longrepr = f"{report.longrepr}\n{crash_record.describe(record)}"

    def pytest_runtest_logstart(self, nodeid: str) -> None:
        crash_record.set_test(nodeid)

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        earlier = self.config.stash.get(EARLIER_KEY, [])
        if earlier:
            terminalreporter.section("pytest-fusion: an earlier run died inside a kernel call", yellow=True)
            for record in earlier:
                terminalreporter.write_line(crash_record.describe(record))

    def pytest_unconfigure(self) -> None:
        crash_record.activate(self.outer)
        if self.owner:
            shutil.rmtree(self.dir, ignore_errors=True)


def register(config: pytest.Config) -> None:
    """Record kernel calls for this run and report the crashes above (module docstring)."""
    if not config.pluginmanager.has_plugin("pytest-fusion-crash-report"):
        config.pluginmanager.register(CrashReport(config), "pytest-fusion-crash-report")
