"""pytest-fusion: check fused GPU kernels against their eager PyTorch reference, time them against
eager and torch.compile, and gate their speedups in CI.

The plain-Python API (no pytest needed) is importable from here; names load on first use so that
``import pytest_fusion`` stays cheap (no torch import until a name that needs it is touched)::

    spec = pytest_fusion.make_spec(reference, inputs=..., dims=..., bench=...)
    pytest_fusion.check_kernel(spec, kernel)                     # the property test
    record = pytest_fusion.bench_case(spec, kernel, "decode", "float16", stored=None)
    record = pytest_fusion.judge(record, stored_entry)           # the gate, again

Folders, lowest first. A module imports only from earlier modules of its own folder (each
folder's docstring lists them in order) or from folders above it, never below
(tests/test_layers.py walks every import, those inside functions too):

1. ``machine``: atomic file replace, inter-process locks, devices and their names.
2. ``declare``: the spec's data types, argument validators, declared inputs, the marker.
3. ``oracle``: one case checked: inputs, golden, budget, hygiene, backward, memory, failures.
4. ``property``: many cases: Hypothesis strategies, repro payloads, :func:`check_kernel`.
5. ``measure``: timing: timers, rounds, statistics, providers, power, peaks, records.
6. ``gate``: the verdict from measured and stored speedups, and the accuracy-drift rule.
7. ``baselines``: the baseline files: format, environment fields, load and save.
8. ``report``: the report files of a bench run.
9. ``bench``: a bench case timed and judged (:func:`bench_case`, :func:`judge`), slow-shape search.
10. ``plugin``: the pytest layer: options, configuration, items, bench session, fixture, hooks.
11. ``demo``: ``python3 -m pytest_fusion demo``, the main job on shipped kernels.

``reference_kernels`` sits beside this package: it may import the plain core (folders 1-9, e.g. the
tuner times with ``measure.timing`` and ``bench.api``), never ``plugin``, and pytest_fusion never
imports reference_kernels, except the demo's test file (``demo/test_demo.py``), which is a user's
test shipped to be copied and run. docs/architecture.md draws the map.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "make_spec": "pytest_fusion.declare.marker",
    "fused_kernel": "pytest_fusion.declare.marker",
    "KernelSpec": "pytest_fusion.declare.spec",
    "Tensor": "pytest_fusion.declare.spec",
    "BenchCase": "pytest_fusion.declare.spec",
    "FusionUsageError": "pytest_fusion.declare.spec",
    "Case": "pytest_fusion.oracle.tensors",
    "make_inputs": "pytest_fusion.oracle.tensors",
    "check_kernel": "pytest_fusion.property.check",
    "check_case": "pytest_fusion.oracle.case",
    "check_inputs": "pytest_fusion.oracle.case",
    "compare": "pytest_fusion.oracle.budget",
    "FusionFailure": "pytest_fusion.oracle.failures",
    "KernelMismatch": "pytest_fusion.oracle.failures",
    "EagerMismatch": "pytest_fusion.oracle.failures",
    "GradientMismatch": "pytest_fusion.oracle.failures",
    "KernelCrash": "pytest_fusion.oracle.failures",
    "BadOutput": "pytest_fusion.oracle.failures",
    "InputMutated": "pytest_fusion.oracle.failures",
    "SavedTensorMutated": "pytest_fusion.oracle.failures",
    "Nondeterministic": "pytest_fusion.oracle.failures",
    "ReferenceFailed": "pytest_fusion.oracle.failures",
    "OutOfBoundsWrite": "pytest_fusion.oracle.failures",
    "OutputAliased": "pytest_fusion.oracle.failures",
    "NondeterministicFailure": "pytest_fusion.oracle.failures",
    "assert_close": "pytest_fusion.plugin.fixture",
    "bench_case": "pytest_fusion.bench.api",
    "judge": "pytest_fusion.bench.api",
    "BenchSettings": "pytest_fusion.bench.timed_case",
    "BenchRecord": "pytest_fusion.measure.record",
    "interpret_if_no_gpu": "pytest_fusion.machine.devices",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_fusion' has no attribute {name!r}")
