"""pytest-fusion: check fused GPU kernels against their eager PyTorch reference, time them against
eager and torch.compile, and gate their speedups in CI.

The plain-Python API (no pytest needed) is importable from here; names load on first use so that
``import pytest_fusion`` stays cheap (no torch import until a name that needs it is touched).
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "make_spec": "pytest_fusion.spec",
    "KernelSpec": "pytest_fusion.spec",
    "Tensor": "pytest_fusion.spec",
    "FusionUsageError": "pytest_fusion.spec",
    "Case": "pytest_fusion.tensors",
    "make_inputs": "pytest_fusion.tensors",
    "check_kernel": "pytest_fusion.check",
    "check_case": "pytest_fusion.oracle",
    "check_inputs": "pytest_fusion.oracle",
    "compare": "pytest_fusion.oracle",
    "FusionFailure": "pytest_fusion.oracle",
    "KernelMismatch": "pytest_fusion.oracle",
    "KernelCrash": "pytest_fusion.oracle",
    "BadOutput": "pytest_fusion.oracle",
    "InputMutated": "pytest_fusion.oracle",
    "Nondeterministic": "pytest_fusion.oracle",
    "ReferenceFailed": "pytest_fusion.oracle",
    "assert_close": "pytest_fusion.fixture",
    "interpret_if_no_gpu": "pytest_fusion.interpreter",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'pytest_fusion' has no attribute {name!r}")
