"""The third-party example run as a user runs it: on a CPU its Liger tests must be skipped with the
Triton interpreter's own error as the reason, never passed and never crashed."""

from __future__ import annotations

from pathlib import Path

import pytest

from pytest_fusion.machine.devices import interpreter_active

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "test_liger_glu.py"


@pytest.mark.skipif(not interpreter_active(),
                    reason="a GPU runs Liger's kernels compiled; nothing is skipped there")
def test_liger_example_skips_with_the_interpreter_error(pytester: pytest.Pytester) -> None:
    pytest.importorskip("liger_kernel", reason="liger-kernel not installed")
    result = pytester.runpytest_subprocess(str(EXAMPLE), "-p", "no:cacheprovider", "-rs")
    outcomes = result.parseoutcomes()
    assert outcomes.get("failed", 0) == 0 and outcomes.get("passed", 0) == 0, result.stdout.str()
    result.stdout.fnmatch_lines([
        "*Triton interpreter cannot run liger_swiglu: InterpreterError: *(at swiglu.py:*",
        "*Triton interpreter cannot run liger_geglu: InterpreterError: *(at geglu.py:*",
    ])
    # By the interpreter's error: the four GLU marker tests (forward and backward, SwiGLU and GeGLU)
    # in fp32 and fp16 (8), the two input-writing pins, the saved-tensor pin and the launcher test
    # (4). By the plugin's own bf16 reason: the four GLU marker tests and the seed MLP against
    # Liger, a Triton kernel of this project (5).
    assert outcomes["skipped"] == 17, result.stdout.str()
