"""The ``--fusion-explore`` items: the slow-shape search of one test and dtype
(:func:`pytest_fusion.bench.explore.explore`), timed as a bench item is (the session's timer, bench
settings and device lock, the oracle's caps on drawn dims), its findings printed in the terminal
summary under "pytest-fusion explore" (carried in the report's user properties, so that the
controller of a pytest-xdist run prints its workers' findings). Nothing is gated or saved.

torch loads only when an explore item runs.
"""

from __future__ import annotations

from typing import Any, Callable

import pytest

from pytest_fusion.machine import devices
from pytest_fusion.plugin import config as fusion_config
from pytest_fusion.plugin.items import ExploreItem, skip_untimeable
from pytest_fusion.plugin.items import test_id_of_item as test_id

USER_PROPERTY = "pytest_fusion_explore"
"""Key of an explore item's findings in its report's ``user_properties``."""


class ExploreSummary:
    """Collects the explore items' findings from their reports and prints them at the end."""

    def __init__(self, config: pytest.Config) -> None:
        self.config = config
        self.found: list[tuple[str, list[str]]] = []

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":
            return
        for key, value in report.user_properties:
            if key == USER_PROPERTY and isinstance(value, dict):
                self.found.append((str(value["item"]), [str(line) for line in value["lines"]]))

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if hasattr(self.config, "workerinput") or not self.found:
            return
        terminalreporter.section("pytest-fusion explore")
        for name, lines in self.found:
            terminalreporter.write_line(name)
            for line in lines:
                terminalreporter.write_line(f"  {line}")


def register(config: pytest.Config) -> None:
    """Register the run's :class:`ExploreSummary` (``pytest_configure`` under ``--fusion-explore``)."""
    if not config.pluginmanager.has_plugin("pytest-fusion-explore"):
        config.pluginmanager.register(ExploreSummary(config), "pytest-fusion-explore")


def _seed(config: pytest.Config) -> int:
    """Hypothesis' ``--hypothesis-seed`` when it is an integer, else 0: the same shapes every run."""
    raw = config.getoption("hypothesis_seed", default=None)
    try:
        return int(raw) if raw is not None else 0
    except ValueError:
        return 0


def run_explore(item: pytest.Function, param: ExploreItem, kernel: Callable[..., Any]) -> None:
    """Search one test's dims in one dtype for its slowest shapes and record the findings on ``item``.

    Raises:
        pytest.skip.Exception: as a bench item (``items.skip_untimeable``).
        pytest.fail.Exception: the kernel fails its correctness check at a drawn shape (after its
            findings are recorded), bad bench settings, or the device's timing lock held by another
            process beyond ``--fusion-lock-timeout``.
    """
    from pytest_fusion.bench.explore import explore
    from pytest_fusion.machine.locks import LockTimeout
    from pytest_fusion.plugin import bench_session
    from pytest_fusion.property.check import size_limits

    spec = param.spec
    skip_untimeable(spec)
    cfg = fusion_config.of(item.config)
    device = devices.default_device(spec.device)
    bench = bench_session.start(item.config)
    max_dim, max_elements = size_limits(spec, device, cfg.max_dim)
    failure = None
    try:
        with devices.device_lock(device, timeout=cfg.lock_timeout_s, holder=item.nodeid):
            result = explore(
                spec, kernel, param.dtype, device=device, timer=bench.timer(device),
                settings_=bench.settings(), budget_s=cfg.explore_budget_s, max_shapes=cfg.explore_examples,
                max_dim=max_dim, max_elements=max_elements, seed_=_seed(item.config),
                kernel_id=test_id(item, param),
            )
    except (LockTimeout, ValueError) as exc:
        failure = f"{item.nodeid}: not explored: {exc}"
    if failure:  # outside the except clause: the report is the message, not a chain
        pytest.fail(failure, pytrace=False)
    name = f"{test_id(item, param)} [{param.dtype}]"
    item.user_properties.append((USER_PROPERTY, {"item": name, "lines": result.lines()}))
    if result.failure:
        pytest.fail(f"{name}: the kernel fails its correctness check at a shape the search drew:\n"
                    f"{result.failure}", pytrace=False)
