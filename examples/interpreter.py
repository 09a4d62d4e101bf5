"""Skip, with the interpreter's own words, a kernel the Triton interpreter cannot run.

Third-party Triton kernels are written for the compiler, not for ``TRITON_INTERPRET=1``: some
use constructs the interpreter lacks (a ``.to()`` on a float scalar argument, libdevice calls).
On a CPU machine such a kernel can be neither passed nor failed; the test is skipped and the
skip reason is the interpreter's error message, so the run shows exactly what stopped it.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import pytest

from pytest_fusion.machine.devices import interpreter_active


def _interpreter_error_types() -> tuple[type[BaseException], ...]:
    try:
        from triton.runtime.errors import InterpreterError
    except ImportError:  # a triton without the interpreter's error class: nothing to catch
        return ()
    return (InterpreterError,)


def probe_or_skip(kernel: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """Call ``kernel(*args, **kwargs)`` once; under the interpreter, skip on an InterpreterError.

    Only the interpreter's own error type is caught, and only while the interpreter is active: on a
    GPU any exception propagates and fails the test, as a broken kernel must.

    Raises:
        pytest.skip.Exception: the interpreter raised; the reason is ``"Triton interpreter cannot
            run <name>: <error>"`` with the error as triton formats it.
    """
    if not interpreter_active():
        return
    try:
        kernel(*args, **kwargs)
    except _interpreter_error_types() as err:
        name = getattr(kernel, "__qualname__", repr(kernel))
        pytest.skip(f"Triton interpreter cannot run {name}: {type(err).__name__}: {err}{_where(err)}")


def _where(err: BaseException) -> str:
    """`` (at file.py:line: source)`` of the kernel line that raised, from the chained cause:
    InterpreterError's own message names only the Python error, not the kernel line."""
    cause = err.__cause__
    frames = traceback.extract_tb(cause.__traceback__) if cause is not None else []
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {os.path.basename(last.filename)}:{last.lineno}: {(last.line or '').strip()})"
