"""The exact value tier (docs/oracle.md#the-exact-value-tier): small dyadic inputs make a GEMM's
output exact in any summation order, so a row written from the wrong place fails as an exact
mismatch naming its row, not as a question of the error budget."""

from __future__ import annotations

import pytest
import torch

from conftest import failure_reports, shrunk_dims
from pytest_fusion.declare.marker import make_spec
from pytest_fusion.oracle.budget import compare_exact, is_exact_output
from pytest_fusion.oracle.case import check_case
from pytest_fusion.oracle.tensors import Case, make_inputs

DUPLICATED_ROW = '''
import pytest
import torch.nn.functional as F


def linear(x, weight):
    return F.linear(x, weight)


def duplicates_row_0(x, weight):
    out = F.linear(x, weight)
    if out.shape[0] >= 2:
        out[1] = out[0]  # a program writing its tile one row too low
    return out


@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 16), "K": (1, 16), "N": (1, 16)}, dtypes=("bfloat16",),
                          triton=False, special_values=False, max_examples=12)
def test_duplicated_row():
    return duplicates_row_0
'''


def test_a_duplicated_row_fails_as_an_exact_mismatch_naming_the_row(pytester: pytest.Pytester,
                                                                    cpu_only: None) -> None:
    pytester.makepyfile(test_dup=DUPLICATED_ROW)
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] mismatch: exact values: * elements of the output differ from golden, which this "
        "case makes exact (call 1 of 2)",
        "*values: exact*",
        "*--fusion-repro=*\"exact\": true*",
        "*rows     1 (1 of 2)",
        "*moved    row 1 holds golden's row 0",
    ])
    dims = shrunk_dims(result.stdout.str())
    assert dims["M"] == 2, dims
    assert "outside the error budget" not in failure_reports(result.stdout.str())


def _linear(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(x, w)


SPEC = make_spec(_linear, inputs={"x": ("M", "K"), "w": ("N", "K")},
                 dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)}, triton=False)


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_a_correct_gemm_is_exact_at_k_64(dtype: str) -> None:
    case = Case(dims={"M": 64, "K": 64, "N": 64}, dtype=dtype,
                layouts={"x": "contiguous", "w": "contiguous"}, seed=3, exact=True)
    x, w = make_inputs(SPEC, case, "cpu").values()
    golden = _linear(x.double(), w.double())
    magnitude = _linear(x.double().abs(), w.double().abs())
    assert is_exact_output(golden, _linear(x, w), magnitude, (x, w))
    # a kernel that sums K in another order (two halves, each rounded to the output dtype) is exact too
    halves = (_linear(x[:, :32], w[:, :32]).double() + _linear(x[:, 32:], w[:, 32:]).double()).to(x.dtype)
    assert compare_exact(halves, golden).mismatches == 0
    check_case(SPEC, _linear, case, device="cpu")


def test_partial_sums_past_the_significand_are_not_exact() -> None:
    """bfloat16 holds the integers up to 256 only: with partial sums past that, a kernel rounding
    them to bfloat16 legitimately differs from golden, so the output is not treated as exact."""
    x = torch.full((1, 300), 1.0, dtype=torch.bfloat16)
    w = torch.full((1, 300), 1.0, dtype=torch.bfloat16)
    w[0, :44] = -1.0  # golden 212 is a bfloat16, but sum |x w| = 300 is not
    golden = _linear(x.double(), w.double())
    assert float(golden) == 212.0
    assert is_exact_output(golden, golden.to(torch.bfloat16))
    assert not is_exact_output(golden, golden.to(torch.bfloat16), _linear(x.double().abs(), w.double().abs()), (x, w))


def test_compare_exact_names_swapped_columns() -> None:
    golden = torch.arange(12, dtype=torch.float64).reshape(3, 4)
    kernel = golden[:, [0, 2, 1, 3]].float()
    found = compare_exact(kernel, golden)
    assert found.mismatches == 6 and found.cols == [1, 2] and found.rows == [(0,), (1,), (2,)]
    assert "column 1 holds golden's column 2" in found.moved
