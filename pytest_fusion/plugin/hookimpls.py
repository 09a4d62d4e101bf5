"""The pytest plugin: hooks only, plus the ``fusion`` fixture.

Settings come from :mod:`pytest_fusion.plugin.config`, the marker's items from
:mod:`pytest_fusion.plugin.items`,
the bench session from :mod:`pytest_fusion.plugin.bench_session`, devices from
:mod:`pytest_fusion.machine.devices`.
Nothing heavy is imported at import time: torch and triton load when a marked test runs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import pytest

from pytest_fusion.machine import devices
from pytest_fusion.plugin import bench_session, config_tier, crash_report, items, quiet_benchmark
from pytest_fusion.plugin import config as fusion_config

if TYPE_CHECKING:
    from pytest_fusion.plugin.fixture import Fusion

HEADER_KEY = pytest.StashKey[str]()


def pytest_addoption(parser: pytest.Parser) -> None:
    fusion_config.addoptions(parser)


def pytest_addhooks(pluginmanager: pytest.PytestPluginManager) -> None:
    from pytest_fusion.plugin import hookspecs

    pluginmanager.add_hookspecs(hookspecs)


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(
    early_config: pytest.Config, parser: pytest.Parser, args: list[str]
) -> None:
    # Runs before any conftest.py is imported: the last moment TRITON_INTERPRET can take effect,
    # and the safe moment to pin an xdist worker to its GPU (no conftest has initialised CUDA yet).
    devices.pin_worker(early_config)
    mode = fusion_config.resolve(early_config, fusion_config.OPTION["interpret"])
    early_config.stash[HEADER_KEY] = devices.apply_interpreter(mode)


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", items.MARKER_HELP)
    quiet_benchmark.register(config)  # before pytest-benchmark's own pytest_configure (trylast)
    if (
        HEADER_KEY not in config.stash
    ):  # plugin loaded late (e.g. -p from a conftest): too late to switch Triton
        devices.pin_worker(config)
        config.stash[HEADER_KEY] = devices.apply_interpreter("auto")
    cfg = config.stash[fusion_config.KEY] = fusion_config.read(config)
    crash_report.register(config)
    config_tier.register(config)
    if cfg.bench:
        bench_session.start(config)
    if cfg.explore:
        from pytest_fusion.plugin import explore_items as exploring

        exploring.register(config)


def pytest_report_header(config: pytest.Config) -> str | None:
    header = config.stash.get(HEADER_KEY, None)
    return f"pytest-fusion: {header}" if header else None


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    items.parametrize(metafunc)


def pytest_collection_finish(session: pytest.Session) -> None:
    bench = session.config.stash.get(bench_session.KEY, None)
    if bench is not None:  # the declared cases, for the stale-entry check at the end
        bench.declare(*items.declared_bench_cases(session.items))


@pytest.hookimpl(tryfirst=True)
def pytest_pyfunc_call(pyfuncitem: pytest.Function) -> bool | None:
    param = items.param_of(pyfuncitem)
    if isinstance(param, items.CheckItem):
        items.run_check(pyfuncitem, param, items.kernel_of(pyfuncitem))
    elif isinstance(param, items.BenchItem):
        items.run_bench(pyfuncitem, param, items.kernel_of(pyfuncitem))
    elif isinstance(param, items.ExploreItem):
        from pytest_fusion.plugin.explore_items import run_explore

        run_explore(pyfuncitem, param, items.kernel_of(pyfuncitem))
    else:
        return None
    return True


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: pytest.Config) -> None:
    skipped = [
        r
        for r in terminalreporter.stats.get("skipped", [])
        if isinstance(r.longrepr, tuple) and "triton issue 11584" in str(r.longrepr[2])
    ]
    if skipped:
        terminalreporter.write_line(
            f"pytest-fusion: {len(skipped)} bfloat16 check(s) skipped under the Triton interpreter "
            "(triton issue 11584): they are not passed; run on a GPU to check them.",
            yellow=True,
        )


@pytest.fixture
def fusion(request: pytest.FixtureRequest) -> Fusion:
    """The oracle and the bench for hand-written tests: ``fusion.assert_close(actual, reference,
    *inputs)``, ``fusion.check(kernel, reference, *inputs)``, ``fusion.bench(name, kernel, *inputs,
    reference=...)``. See :class:`pytest_fusion.plugin.fixture.Fusion`."""
    from pytest_fusion.plugin.fixture import Fusion

    return Fusion(request.node)
