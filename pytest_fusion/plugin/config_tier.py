"""The config tier in a pytest run (``pytest_fusion.property.config_tier``): its budget, its place
in the rotation kept in pytest's cache between runs (one entry per test and dtype), and the summary
line saying how many configs were checked.

Each check item that ran the tier adds ``("fusion_config_tier", {...})`` to its report's
``user_properties``, which xdist carries to the controller, where the summary is written.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

import pytest

from pytest_fusion.declare.spec import CONFIG_TIER_BUDGET_S, CONFIG_TIER_CASES
from pytest_fusion.machine.devices import interpreter_active
from pytest_fusion.plugin.config import FusionConfig

if TYPE_CHECKING:
    from pytest_fusion.property.config_tier import ConfigTier

PROPERTY = "fusion_config_tier"
CACHE_PREFIX = "pytest-fusion/config-tier/"


def budget_s(cfg: FusionConfig, device: str) -> float:
    """The tier's seconds for one test and dtype: ``--fusion-config-budget``, else
    ``CONFIG_TIER_BUDGET_S`` on a GPU and 0 (off) under the Triton interpreter or on the CPU
    (``run_property`` skips the tier under ``--fusion-all-configs``, which checks every config at
    every case already)."""
    if cfg.config_budget_s is not None:
        return cfg.config_budget_s
    return CONFIG_TIER_BUDGET_S if str(device).startswith("cuda") and not interpreter_active() else 0.0


def _key(nodeid: str) -> str:
    return CACHE_PREFIX + hashlib.sha1(nodeid.encode()).hexdigest()[:16]


def offset(config: pytest.Config, nodeid: str) -> int:
    """Where this test's rotation starts: where its last run stopped (0 without pytest's cache)."""
    cache = getattr(config, "cache", None)
    value = cache.get(_key(nodeid), 0) if cache is not None else 0
    return value if isinstance(value, int) and value >= 0 else 0


def record(item: pytest.Item, tier: ConfigTier) -> None:
    """Keep the rotation's place for the next run and what ran for the summary."""
    cache = getattr(item.config, "cache", None)
    if cache is not None:
        cache.set(_key(item.nodeid), tier.next_offset)
    item.user_properties.append((PROPERTY, {"checked": len(tier.checked), "total": tier.total}))


class ConfigTierSummary:
    """Counts the tier's configs over the run's reports; one line in the terminal summary."""

    def __init__(self) -> None:
        self.tests = self.checked = self.total = 0

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.when != "call":  # the teardown's report carries the same properties
            return
        for name, value in report.user_properties:
            if name == PROPERTY and isinstance(value, dict) and value.get("total"):
                self.tests += 1
                self.checked += int(value["checked"])
                self.total += int(value["total"])

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not self.tests:
            return
        rest = ("every config checked" if self.checked >= self.total else "the rotation goes on from there "
                "next run; --fusion-all-configs checks every config at every case")
        terminalreporter.write_line(
            f"pytest-fusion config tier: {self.checked} of {self.total} autotune configs checked on up to "
            f"{CONFIG_TIER_CASES} cases each, in {self.tests} test(s) and dtype(s); {rest}"
        )


def register(config: pytest.Config) -> None:
    """Add the summary's plugin once per run."""
    if not config.pluginmanager.has_plugin("pytest-fusion-config-tier"):
        config.pluginmanager.register(ConfigTierSummary(), "pytest-fusion-config-tier")
