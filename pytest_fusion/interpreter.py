"""Deciding, before any kernel module is imported, whether Triton runs under its interpreter.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is decorated, that is when its module is
imported; so the plugin decides in ``pytest_load_initial_conftests``, before conftest.py files and
test modules load. No torch import here: it would cost seconds at every start.
"""

from __future__ import annotations

import glob
import os

ENV = "TRITON_INTERPRET"


def cuda_visible() -> bool:
    """Whether a CUDA device is likely visible, judged without importing torch: the NVIDIA
    driver's device nodes exist and ``CUDA_VISIBLE_DEVICES`` does not hide every device."""
    hidden = os.environ.get("CUDA_VISIBLE_DEVICES")
    if hidden is not None and hidden.strip() in ("", "-1", "none", "NoDevFiles"):
        return False
    return os.path.exists("/dev/nvidiactl") or bool(glob.glob("/dev/nvidia[0-9]*"))


def apply(mode: str) -> str:
    """Set ``TRITON_INTERPRET`` for ``mode`` and say what was decided.

    ``on``/``off`` force it; ``auto`` keeps a value the user set, else turns the interpreter on
    exactly when no CUDA device is visible.

    Returns:
        a one-line description for the test-run header.
    """
    if mode == "on":
        os.environ[ENV] = "1"
        return "Triton interpreter: on (forced)"
    if mode == "off":
        os.environ[ENV] = "0"
        return "Triton interpreter: off (forced)"
    if ENV in os.environ:
        state = "on" if os.environ[ENV].strip().lower() in ("1", "true", "on", "yes") else "off"
        return f"Triton interpreter: {state} ({ENV}={os.environ[ENV]} set by the user)"
    if cuda_visible():
        return "Triton interpreter: off (a CUDA device is visible)"
    os.environ[ENV] = "1"
    return "Triton interpreter: on (no CUDA device visible)"


def interpret_if_no_gpu() -> str:
    """For the plain API without pytest: turn the Triton interpreter on when no CUDA device is
    visible (a ``TRITON_INTERPRET`` the user set is kept), as the plugin does at start-up.

    Call it before importing any module that defines ``@triton.jit`` kernels::

        import pytest_fusion
        pytest_fusion.interpret_if_no_gpu()
        from mykernels import fused_linear_gelu   # now decorated for the interpreter

    Returns:
        what was decided, e.g. ``"Triton interpreter: on (no CUDA device visible)"``.
    """
    return apply("auto")
