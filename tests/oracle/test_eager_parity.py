"""Eager parity (``eager_parity=True``): an elementwise kernel within the error budget but not
bitwise eager passes by default and fails with parity on, naming the first differing element; an
exact kernel passes with parity on; the flag is a checked bool.

Plain-torch kernels (``triton=False``) on tiny dims, so bf16 runs on the CPU without the interpreter.
"""

from __future__ import annotations

import pytest
import torch

from pytest_fusion import EagerMismatch, FusionUsageError, assert_close, make_spec
from pytest_fusion.oracle.parity import differing

SEED = "--hypothesis-seed=1"

KERNELS = '''
import pytest
import torch
import torch.nn.functional as F


def bias_gelu(x, bias):
    return F.gelu(x + bias)


def one_ulp_off(x, bias):
    # eager's own ops, then the first element moved one bf16 ulp up: 1 ulp is inside the budget.
    out = bias_gelu(x, bias)
    out[0, 0] = torch.nextafter(out[0, 0], torch.tensor(float("inf"), dtype=out.dtype))
    return out


def fp32_epilogue(x, bias):
    # A fused epilogue that keeps x + bias in fp32 where eager rounds it to bf16 before the GELU.
    return F.gelu(x.float() + bias.float()).to(x.dtype)


def eager_ops(x, bias):
    return F.gelu(torch.add(x, bias))


MARK = pytest.mark.fused_kernel(reference=bias_gelu, inputs={{"x": ("M", "N"), "bias": ("N",)}},
                                dims={{"M": (1, 16), "N": (1, 16)}}, dtypes=("bfloat16",), triton=False,
                                max_examples=10{extra})


@MARK
def test_one_ulp_off():
    return one_ulp_off


@MARK
def test_fp32_epilogue():
    return fp32_epilogue


@MARK
def test_eager_ops():
    return eager_ops
'''


def run(pytester: pytest.Pytester, extra: str = "") -> pytest.RunResult:
    pytester.makepyfile(test_parity=KERNELS.format(extra=extra))
    return pytester.runpytest("-p", "no:cacheprovider", SEED)


def test_kernels_off_eager_pass_the_budget_and_fail_parity(pytester: pytest.Pytester, cpu_only: None) -> None:
    run(pytester).assert_outcomes(passed=3)
    # special values off: the bumped first element is then always finite, so it is the first to differ.
    result = run(pytester, ", eager_parity=True, special_values=False")
    result.assert_outcomes(passed=1, failed=2)
    out = result.stdout.str()
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] eager parity: 1 of * elements of the output differ from eager's bits (call 1 of 2)*",
        "*first    [[]0, 0]: kernel=* eager=* (bits 0x* vs 0x*): +1 ulp of bfloat16*",
    ])
    assert "test_parity.py::test_fp32_epilogue FAILED" in out or "FAILED test_parity.py::test_fp32_epilogue" in out
    assert "FAILED test_parity.py::test_eager_ops" not in out
    assert "[pytest-fusion] mismatch" not in out  # the budget passed; only parity failed


def test_exact_kernel_passes_with_parity_and_special_values(pytester: pytest.Pytester, cpu_only: None) -> None:
    # Special values on (the default): NaN, +-inf and -0.0 in the inputs come out where eager's do.
    pytester.makepyfile(test_parity=KERNELS.format(extra=", eager_parity=True").replace(
        "@MARK\ndef test_one_ulp_off", "def _one_ulp_off").replace("@MARK\ndef test_fp32", "def _fp32"))
    result = pytester.runpytest("-p", "no:cacheprovider", SEED)
    result.assert_outcomes(passed=1)


@pytest.mark.parametrize("value", [1, "True", None])
def test_eager_parity_must_be_a_bool(value: object) -> None:
    with pytest.raises(FusionUsageError, match=f"eager_parity must be True or False, got {value!r}"):
        make_spec(lambda x: x, inputs={"x": ("N",)}, dims={"N": (1, 4)}, eager_parity=value)
    assert make_spec(lambda x: x, inputs={"x": ("N",)}, dims={"N": (1, 4)}, eager_parity=True).eager_parity


def test_nan_payloads_match_and_signed_zeros_differ() -> None:
    quiet = torch.tensor([float("nan")], dtype=torch.bfloat16)
    other = torch.tensor([0x7FC1], dtype=torch.int16).view(torch.bfloat16)  # another NaN payload
    assert not differing(quiet, other).any()
    assert differing(torch.tensor([0.0]), torch.tensor([-0.0])).all()
    assert differing(torch.tensor([1.0]), torch.nextafter(torch.tensor([1.0]), torch.tensor([2.0]))).all()


def test_assert_close_checks_parity_when_asked() -> None:
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(0)).to(torch.bfloat16)
    out = torch.nn.functional.gelu(x)
    out[1, 2] = torch.nextafter(out[1, 2], torch.tensor(float("inf"), dtype=out.dtype))
    assert_close(out, torch.nn.functional.gelu, x)  # one ulp: inside the budget
    with pytest.raises(EagerMismatch, match=r"1 of 32 elements(?s:.*)first    \[1, 2\]: .*\+1 ulp of bfloat16"):
        assert_close(out, torch.nn.functional.gelu, x, eager_parity=True)
    assert_close(torch.nn.functional.gelu(x), torch.nn.functional.gelu, x, eager_parity=True)
