"""Deciding, before any kernel module is imported, whether Triton runs under its interpreter.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is decorated, that is when its module is
imported; so the plugin decides in ``pytest_load_initial_conftests``, before conftest.py files and
test modules load. No torch import here: it would cost seconds at every start.
"""

from __future__ import annotations

import glob
import os

ENV = "TRITON_INTERPRET"


def active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET`` set to a true value)."""
    return os.environ.get(ENV, "0").strip().lower() in ("1", "true", "on", "yes")


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
        state = "on" if active() else "off"
        return f"Triton interpreter: {state} ({ENV}={os.environ[ENV]} set by the user)"
    if cuda_visible():
        return "Triton interpreter: off (a CUDA device is visible)"
    os.environ[ENV] = "1"
    return "Triton interpreter: on (no CUDA device visible)"
