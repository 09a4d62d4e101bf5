"""pytest-benchmark, installed with pytest-fusion (its JSON format and statistics write
``--fusion-benchmark-json``), kept quiet in runs that use none of its fixtures.

pytest-benchmark's plugin loads in every pytest run of the environment. Its ``pytest_report_header``
prints a ``benchmark: <version> (defaults: ...)`` line before anything is collected, and its
``pytest_configure`` (``BenchmarkSession`` -> ``FileStorage``) makes its storage directory,
``.benchmarks/`` in the invocation directory by default, whether or not a test uses its
``benchmark`` fixture. Here:

- its header line is taken out of the header, and printed after collection instead when a
  collected test uses the fixture;
- its storage directory (and the parents it made for it) is removed again at the session's
  start when this run created it, it is still empty, and neither ``--benchmark-save``,
  ``--benchmark-autosave`` nor ``--benchmark-compare`` was given (the only options that read or
  write it): nothing pytest-benchmark does later looks at it then.

Without pytest-benchmark (not installed, or ``-p no:benchmark``) nothing is registered.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Generator, Sequence

import pytest

PLUGIN_NAME = "benchmark"
"""pytest-benchmark's plugin name (its ``pytest11`` entry point), as ``-p no:benchmark`` names it."""
FIXTURE = "benchmark"
STORAGE_OPTIONS = ("benchmark_save", "benchmark_autosave", "benchmark_compare")
"""pytest-benchmark's options that read or write its storage directory."""


def _plugin(config: pytest.Config) -> Any:
    return config.pluginmanager.get_plugin(PLUGIN_NAME)


def uses_fixture(items: Sequence[pytest.Item]) -> bool:
    """Whether a collected test uses pytest-benchmark's ``benchmark`` fixture (directly or through
    another fixture), the test pytest-benchmark itself applies for ``--benchmark-skip``."""
    return any(FIXTURE in getattr(item, "fixturenames", ()) for item in items)


def storage_dir(config: pytest.Config) -> Path | None:
    """pytest-benchmark's file storage directory for this run (``--benchmark-storage``, default
    ``file://./.benchmarks``, relative to the working directory as ``FileStorage`` takes it), or
    None when its storage is no directory (elasticsearch) or an option of
    :data:`STORAGE_OPTIONS` uses it."""
    if any(config.getoption(name, None) for name in STORAGE_OPTIONS):
        return None
    storage = str(config.getoption("benchmark_storage", None) or "")
    if "://" not in storage:
        storage = "file://" + storage
    if not storage.startswith("file://") or storage == "file://":
        return None
    return Path(storage[len("file://"):]).absolute()


class QuietBenchmark:
    """The hooks of the module docstring, registered by :func:`register` before pytest-benchmark
    configures, with the directories its storage is about to create (``mkdir(parents=True)``),
    deepest first: none when the storage directory exists already."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.created: list[Path] = []
        path = storage_dir(config)
        while path is not None and not os.path.lexists(path) and path != path.parent:
            self.created.append(path)
            path = path.parent

    def _header(self) -> Any:
        """pytest-benchmark's own header line for this run."""
        return _plugin(self.config).pytest_report_header(self.config)

    @pytest.hookimpl(wrapper=True)
    def pytest_report_header(self, config: pytest.Config) -> Generator[None, list[Any], list[Any]]:
        lines = yield
        theirs = self._header()
        return [line for line in lines if line != theirs]

    def pytest_report_collectionfinish(
        self, config: pytest.Config, items: Sequence[pytest.Item]
    ) -> list[str]:
        theirs = self._header() if uses_fixture(items) else None
        return [theirs] if isinstance(theirs, str) else []

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        """Remove the directories this run's storage created, deepest first, while each is empty:
        ``os.rmdir`` removes nothing else, so a file written meanwhile keeps its directory."""
        for path in self.created:
            try:
                os.rmdir(path)
            except OSError:  # not empty, or already gone: leave it and those above it
                return


def register(config: pytest.Config) -> None:
    """Register :class:`QuietBenchmark` when pytest-benchmark is loaded (from ``pytest_configure``,
    which runs before pytest-benchmark's own, ``trylast``)."""
    if _plugin(config) is not None and hasattr(_plugin(config), "pytest_report_header"):
        config.pluginmanager.register(QuietBenchmark(config), "pytest-fusion-quiet-benchmark")
