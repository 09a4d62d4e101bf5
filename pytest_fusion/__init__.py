"""pytest-fusion: check fused GPU kernels against their eager PyTorch reference, time them against
eager and torch.compile, and gate their speedups in CI.

The plain-Python API (no pytest needed) is importable from here; names load on first use so that
``import pytest_fusion`` stays cheap (no torch import until a name that needs it is touched)::

    spec = pytest_fusion.make_spec(reference, inputs=..., dims=..., bench=...)
    pytest_fusion.check_kernel(spec, kernel)                     # the property test
    record = pytest_fusion.bench_case(spec, kernel, "decode", "float16", stored=None)
    record = pytest_fusion.judge(record, stored_entry)           # the gate, again

Layers, lowest first. A module imports only from its own row's earlier entries or from rows
above it, never below (tests/test_layers.py walks every import, those inside functions too):

1. ``atomic``, ``locks``, ``devices``: atomic file replace; per-user inter-process file locks
   (timing, baseline files); environment switches, visible GPUs, worker pinning, device locks,
   names and slugs.
2. ``spec``: the data types of a declaration (KernelSpec, Tensor, BenchCase) and policy defaults.
3. ``validate``, ``declared_inputs``, ``marker``: argument validators; those of the declared
   inputs (dims, shapes, dtypes, bounds, mutates, tiles); the ``fused_kernel`` signature and one
   validator per argument.
4. ``tensors``, ``repro``, ``strategies``, ``autotune``, ``failures``, ``budget``, ``parity``,
   ``reference_runs``, ``inplace``, ``hygiene``, ``backward``, ``memory``, ``oracle``, ``case_runner``,
   ``check``: inputs, the ``--fusion-repro`` payload checked against a spec, Hypothesis
   strategies, autotuned Triton kernels' config choice, the oracle's failure kinds, its error
   budget, eager parity (bitwise equality with eager), the reference's golden, eager and magnitude
   runs, in-place kernels' inputs and outputs (``mutates``), memory hygiene around a kernel's
   calls, the backward checks (gradients against golden's), a check's peak device bytes and
   their admission against the GPU's free memory, the correctness oracle, running a
   property's cases (retry, GPU memory), the property test.
5. ``bench.stats``, ``bench.timers``, ``bench.power``, ``bench.recompute``, ``bench.rounds``,
   ``bench.timing``, ``bench.record``, ``bench.providers``, ``bench.peaks``, ``bench.peak_bound``:
   timing and its statistics (timers, SM clock/power/throttle state over the timed rounds (NVML),
   fresh inputs and the recompute check, the rounds, the measurement loop, records, providers,
   device peaks, the record against the peaks).
6. ``comparable``, ``gate``, ``drift``, ``baseline_schema``, ``baseline_env``,
   ``baselines``, ``report``: a stored entry and whether it can judge a run, the verdict, the
   accuracy-drift rule, the baseline file's format, its environment fields,
   the stored speedups, the report files.
7. ``case_timing``, ``runner``, ``explore``: a case timed (and re-measured); the plain
   bench-and-gate API (:func:`bench_case`, :func:`judge`); the slow-shape search over a spec's dims.
8. ``converters``, ``config``, ``hooks``: option converters, the pytest layer's one
   configuration object, hook specs.
9. ``outputs``, ``replay``, ``session``, ``fixture``, ``items``, ``exploring``: the records saved
   and the report files at a bench run's end, a gate failure run again in a fresh process, bench
   session (records, save, reports), the ``fusion`` fixture, the marker's test items, the
   ``--fusion-explore`` items and their summary.
10. ``plugin``: pytest hooks only.

``reference_kernels`` sits beside this package: it may import the plain core (rows 1-7, e.g. the
tuner times with ``bench.timing`` and ``runner``), never the pytest layer (rows 8-10), and
pytest_fusion never imports reference_kernels.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "make_spec": "pytest_fusion.marker",
    "fused_kernel": "pytest_fusion.marker",
    "KernelSpec": "pytest_fusion.spec",
    "Tensor": "pytest_fusion.spec",
    "BenchCase": "pytest_fusion.spec",
    "FusionUsageError": "pytest_fusion.spec",
    "Case": "pytest_fusion.tensors",
    "make_inputs": "pytest_fusion.tensors",
    "check_kernel": "pytest_fusion.check",
    "check_case": "pytest_fusion.oracle",
    "check_inputs": "pytest_fusion.oracle",
    "compare": "pytest_fusion.oracle",
    "FusionFailure": "pytest_fusion.oracle",
    "KernelMismatch": "pytest_fusion.oracle",
    "EagerMismatch": "pytest_fusion.oracle",
    "GradientMismatch": "pytest_fusion.oracle",
    "KernelCrash": "pytest_fusion.oracle",
    "BadOutput": "pytest_fusion.oracle",
    "InputMutated": "pytest_fusion.oracle",
    "SavedTensorMutated": "pytest_fusion.failures",
    "Nondeterministic": "pytest_fusion.oracle",
    "ReferenceFailed": "pytest_fusion.oracle",
    "OutOfBoundsWrite": "pytest_fusion.oracle",
    "OutputAliased": "pytest_fusion.oracle",
    "NondeterministicFailure": "pytest_fusion.oracle",
    "assert_close": "pytest_fusion.fixture",
    "bench_case": "pytest_fusion.runner",
    "judge": "pytest_fusion.runner",
    "BenchSettings": "pytest_fusion.runner",
    "BenchRecord": "pytest_fusion.bench.record",
    "interpret_if_no_gpu": "pytest_fusion.devices",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_fusion' has no attribute {name!r}")
