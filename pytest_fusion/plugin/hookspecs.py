"""Hook specifications of pytest-fusion (added by ``plugin.pytest_addhooks``)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.hookspec(firstresult=True)
def pytest_fusion_make_timer(config: pytest.Config, device: str) -> Any:
    """Return the timer to time bench cases on ``device`` (``"cuda"``, ``"cuda:1"``, ``"cpu"``), or
    None for the default (CUDA-graph replay on CUDA, perf_counter on the CPU).

    A timer has ``method`` (a name stored with the results), ``prepare(name, fn)`` returning a
    zero-argument callable that runs ``fn`` and returns milliseconds, ``sync()`` and
    ``peak_memory(name, fn)`` (bytes or None); see ``pytest_fusion.measure.timing.Timer``. A conftest
    returns a deterministic fake here to test gates without real timings.
    """
