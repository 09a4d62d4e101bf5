"""What a run says while it runs, before its report: long waits and long work as they happen, and
in an interactive terminal a line per bench case.

- Always (CI logs too): a wait for a device's timing lock (its holder, since when), a case queued
  for device memory, a re-measure, a replay in a fresh process. Each takes seconds to minutes, and
  without a line a run that waits looks hung.
- Only in an interactive terminal: a line as each bench case starts (``bench case 3 of 114 ...``).
  Interactive is pytest's own rule: the terminal reporter writes to a tty and the run is not in
  CI, which pytest takes to be ``$CI`` or ``$BUILD_NUMBER`` set and not empty (pytest's docs,
  "How CI is detected"), so a CI log gets no line per case.

Lines go through pytest's terminal reporter with output capture suspended, as pytest's live
logging writes them. An xdist worker's terminal reporter reaches no terminal, so a worker writes
to its stderr instead (capture suspended), which reaches the controller's terminal, each line
naming the worker; it writes no per-case lines (the controller shows its own progress).
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any

import pytest

PREFIX = "pytest-fusion: "


def running_on_ci() -> bool:
    """Whether pytest counts this run as a CI run: ``$CI`` or ``$BUILD_NUMBER`` set and not empty
    (the rule of pytest's docs, "How CI is detected")."""
    return any(os.environ.get(var) for var in ("CI", "BUILD_NUMBER"))


class Progress:
    """The run's voice for :mod:`pytest_fusion.plugin.bench_item` and the check items: call it with a
    line (:meth:`__call__`, always written) or give it a case's line (:meth:`case`, written only
    where :attr:`interactive`)."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.worker: str | None = getattr(config, "workerinput", {}).get("workerid")
        self.terminal = config.pluginmanager.get_plugin("terminalreporter")

    @property
    def interactive(self) -> bool:
        """Whether per-case lines are written: a terminal reporter on a tty, outside CI, not an
        xdist worker."""
        if self.worker is not None or self.terminal is None:
            return False
        tty = self.terminal.isatty  # a method since pytest 8.1 (CallableBool), a bool before
        return bool(tty() if callable(tty) else tty) and not running_on_ci()

    def __call__(self, line: str) -> None:
        """Write ``line`` now, prefixed with ``pytest-fusion: `` (and a worker's id)."""
        self._write(line, yellow=True)

    def case(self, line: str) -> None:
        """Write ``line`` now when :attr:`interactive`, else nothing."""
        if self.interactive:
            self._write(line)

    def _write(self, line: str, **markup: bool) -> None:
        capture: Any = self.config.pluginmanager.get_plugin("capturemanager")
        with capture.global_and_fixture_disabled() if capture is not None else contextlib.nullcontext():
            if self.worker is not None or self.terminal is None:
                who = f"[{self.worker}] " if self.worker else ""
                sys.stderr.write(f"{who}{PREFIX}{line}\n")
                sys.stderr.flush()
            else:
                self.terminal.ensure_newline()
                self.terminal.write_line(PREFIX + line, **markup)


KEY = pytest.StashKey[Progress]()


def of(config: pytest.Config) -> Progress:
    """The run's :class:`Progress`, made on first use."""
    found = config.stash.get(KEY, None)
    if found is None:
        found = config.stash[KEY] = Progress(config)
    return found
