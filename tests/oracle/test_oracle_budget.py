"""The oracle's arithmetic, checked against values computed by hand: ulp, the accumulation bound,
the per-element budget, overflow to inf, and the precision eager runs under."""

from __future__ import annotations

import pytest
import torch

from pytest_fusion.oracle.budget import accumulation_bound, compare, reduction_length, ulp
from pytest_fusion.oracle.golden import ieee_precision

F64 = torch.float64


@pytest.mark.parametrize("value, dtype, expected", [
    (1.0, torch.float16, 2.0**-10),
    (1.5, torch.float16, 2.0**-10),
    (65504.0, torch.float16, 32.0),
    (0.0, torch.float16, 2.0**-24),  # subnormal spacing
    (3.0, torch.bfloat16, 2.0**-6),
    (1.0, torch.float32, 2.0**-23),
    (-0.75, torch.float32, 2.0**-24),
])
def test_ulp(value, dtype, expected):
    assert float(ulp(torch.tensor([value], dtype=F64), dtype)) == expected


def test_accumulation_bound_is_lambda_sqrt_n_u_times_magnitude():
    # 6 * sqrt(16) * 2**-24 * 4 = 96 * 2**-24
    got = accumulation_bound(torch.tensor([4.0], dtype=F64), 16, torch.float16)
    assert float(got) == 96 * 2.0**-24
    assert float(accumulation_bound(torch.tensor([1.0], dtype=F64), 1, torch.float64)) == 6 * 2.0**-53


def test_reduction_length_is_the_largest_input_dim():
    assert reduction_length([torch.zeros(3, 17), torch.zeros(5, 17), torch.zeros(5)]) == 17
    assert reduction_length([torch.tensor(1.0)]) == 1


def fp32(*v):
    return torch.tensor(v, dtype=torch.float32)


def test_budget_is_per_element_not_eager_worst():
    golden = torch.tensor([1.0, 3.0], dtype=F64)
    eager = fp32(1.0, 3.25)  # eager far off at element 1 only
    kernel = fp32(1.0 + 1e-3, 3.0)
    c = compare(kernel, golden, eager, error_multiple=2, ulps=4)
    # element 0: rms = sqrt(5) = 2.236, ulp32(2.236) = 2**-22, budget 2 * 0 + 4 * 2**-22
    assert c.mismatches == 1 and c.worst_index == (0,)
    assert c.budget == 4 * 2.0**-22
    assert c.eager_max_error == 0.25
    assert "eager's error here" in c.budget_text


def test_budget_adds_the_accumulation_bound_of_each_element():
    golden = torch.tensor([0.0, 2.0], dtype=F64)  # element 0 cancels to 0 from terms summing to 4
    magnitude = torch.tensor([4.0, 2.0], dtype=F64)
    eager = fp32(0.0, 2.0)
    # element 0: 2 * 6 * sqrt(16) * 2**-24 * 4 + 4 * ulp32(max(0, rms = sqrt(2))) = 192 * 2**-24 + 4 * 2**-23
    expected = 192 * 2.0**-24 + 8 * 2.0**-24
    inside = compare(fp32(expected * 0.99, 2.0), golden, eager, magnitude=magnitude, terms=16, error_multiple=2, ulps=4)
    assert inside.mismatches == 0
    outside = compare(fp32(expected * 1.02, 2.0), golden, eager, magnitude=magnitude, terms=16, error_multiple=2, ulps=4)
    assert outside.mismatches == 1 and outside.worst_index == (0,)
    assert outside.budget == pytest.approx(expected, rel=1e-12)


def test_explicit_atol_rtol_replace_the_budget():
    golden = torch.tensor([1.0, 100.0], dtype=F64)
    c = compare(fp32(1.05, 100.5), golden, fp32(1.0, 100.0), error_multiple=2, ulps=4, atol=0.01, rtol=0.01)
    assert c.mismatches == 1 and c.worst_index == (0,) and c.budget == pytest.approx(0.02)


def test_overflow_to_inf_allowed_only_where_golden_plus_budget_reaches_the_max():
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    # 65519 rounds to 65504 (finite); its budget 4 * ulp16(65519) = 128 reaches 65504.
    near = compare(f16(float("inf")), torch.tensor([65519.0], dtype=F64), f16(65504.0), error_multiple=2, ulps=4)
    assert near.mismatches == 0
    # 60000 is exact in float16; 60000 + 128 is far from 65504: inf is wrong there.
    far = compare(f16(float("inf")), torch.tensor([60000.0], dtype=F64), f16(60000.0), error_multiple=2, ulps=4)
    assert far.mismatches == 1 and far.nonfinite_mismatches == 1
    # A sign flip is never an overflow.
    flipped = compare(f16(float("-inf")), torch.tensor([65519.0], dtype=F64), f16(65504.0), error_multiple=2, ulps=4)
    assert flipped.mismatches == 1


def test_eager_finite_where_golden_overflows_is_the_kernels_licence_too():
    """Found by the backward dogfood (fp16, amplitude 16384): a gradient whose golden is -73586.7
    (beyond float16) came out -9304 in eager and, bitwise, in the kernel."""
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    golden = torch.tensor([-73586.7], dtype=F64)
    assert compare(f16(-9304.0), golden, f16(-9304.0), error_multiple=2, ulps=4).mismatches == 0
    other = compare(f16(-9000.0), golden, f16(-9304.0), error_multiple=2, ulps=4)
    assert other.mismatches == 1 and other.nonfinite_mismatches == 1  # finite where -inf is due
    assert compare(f16(float("-inf")), golden, f16(-9304.0), error_multiple=2, ulps=4).mismatches == 0


MIDPOINTS = {
    # halfway between the largest finite value and the next power of the dtype's spacing: rounds to inf
    torch.float16: 65504.0 + 16.0,
    torch.bfloat16: float(torch.finfo(torch.bfloat16).max) + 2.0**(127 - 8),
}


@pytest.mark.parametrize("dtype", list(MIDPOINTS))
def test_at_the_overflow_midpoint_the_largest_finite_and_inf_both_pass(dtype):
    golden = torch.tensor([MIDPOINTS[dtype]], dtype=F64)
    assert golden.to(dtype).isinf().all()  # the edge itself: round-to-nearest-even goes to inf
    top, inf = (torch.tensor([v], dtype=dtype) for v in (torch.finfo(dtype).max, float("inf")))
    for kernel in (top, inf):
        for eager in (top, inf):
            c = compare(kernel, golden, eager, error_multiple=2, ulps=4)
            assert c.mismatches == 0, (kernel, eager, c)
    # one spacing below the largest finite value is 1.5 spacings from golden: still inside 4 ulp
    below = torch.tensor([torch.finfo(dtype).max], dtype=F64) - ulp(golden, dtype)
    assert compare(below.to(dtype), golden, inf, error_multiple=2, ulps=4).mismatches == 0
    # but a value far below the edge is wrong, and said to be finite where inf is due
    far = compare(torch.tensor([1.0], dtype=dtype), golden, inf, error_multiple=2, ulps=4)
    assert far.mismatches == 1 and far.nonfinite_mismatches == 0


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32])
def test_below_the_smallest_normal_a_result_may_be_flushed_to_zero(dtype):
    tiny = torch.finfo(dtype).tiny
    golden = torch.tensor([tiny / 4, -tiny / 2, tiny * 0.75], dtype=F64)  # an all-subnormal output
    eager = golden.to(dtype)
    for kernel in (torch.zeros(3, dtype=dtype), torch.tensor([0.0, -tiny, tiny], dtype=dtype)):
        assert compare(kernel, golden, eager, error_multiple=2, ulps=4).mismatches == 0
    flipped = torch.tensor([0.0, tiny, 0.0], dtype=dtype)  # the sign flip is 1.5 x tiny away
    assert compare(flipped, golden, eager, error_multiple=2, ulps=4).mismatches == 1


def test_where_eager_overflows_the_kernel_may_overflow_differently():
    f16 = lambda *v: torch.tensor(v, dtype=torch.float16)  # noqa: E731
    golden = torch.tensor([1.0, 2.0], dtype=F64)  # golden finite; eager's fp16 intermediates were not
    eager = f16(float("nan"), float("inf"))
    assert compare(f16(float("inf"), float("nan")), golden, eager, error_multiple=2, ulps=4).mismatches == 0
    # where eager is finite, a kernel's inf is still misplaced
    c = compare(f16(float("inf"), 2.0), golden, f16(1.0, float("inf")), error_multiple=2, ulps=4)
    assert c.mismatches == 1 and c.nonfinite_mismatches == 1 and c.worst_index == (0,)


def test_a_correct_kernel_at_the_float16_overflow_midpoint_passes_the_whole_check():
    """The reference doubles in float16 (eager: inf); golden is 65520, the midpoint; a kernel that
    saturates to 65504 and one that rounds to inf both pass."""
    from pytest_fusion import make_spec
    from pytest_fusion.oracle.case import check_inputs

    spec = make_spec(lambda x: x * 2, inputs={"x": ("N",)}, dims={"N": (4, 4)}, dtypes=["float16"],
                     triton=False)
    x = torch.full((4,), 32760.0, dtype=torch.float16)
    saturating = lambda x: (x.float() * 2).clamp(max=65504.0).half()  # noqa: E731
    for kernel in (saturating, lambda x: (x.float() * 2).half()):
        comparisons, _ = check_inputs(spec, kernel, [x], warn=False)
        assert comparisons[0].mismatches == 0


def test_ieee_precision_overrides_and_restores_the_process_setting():
    matmul = torch.backends.mkldnn.matmul
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("medium")
    try:
        lowered = (matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision)
        with ieee_precision():
            assert matmul.fp32_precision == "ieee" and torch.backends.cuda.matmul.fp32_precision == "ieee"
            assert torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction is False
        assert (matmul.fp32_precision, torch.backends.cuda.matmul.fp32_precision) == lowered
        assert torch.get_float32_matmul_precision() == "medium"
        with pytest.raises(ZeroDivisionError), ieee_precision():
            1 / 0
        assert matmul.fp32_precision == lowered[0]
    finally:
        torch.set_float32_matmul_precision(before)


def _compare_scaled(relative_error: float, dtype=torch.float32, eager_shift: float = 0.0):
    g = torch.linspace(0.5, 1.5, 257, dtype=F64)
    kernel = (g * (1 + relative_error)).to(dtype)
    eager = (g * (1 + eager_shift)).to(dtype)
    return compare(kernel, g, eager, error_multiple=2.0, ulps=4.0)


@pytest.mark.parametrize("relative_error, dtype, eager_shift, hinted", [
    (8 * 2.0**-23, torch.float32, 0.0, True),     # a few ulp over where eager is exact: fast exp or `/`
    (200 * 2.0**-23, torch.float32, 0.0, False),  # far over: not an intrinsic's rounding
    (8 * 2.0**-10, torch.float16, 0.0, False),    # 16-bit outputs: the rounding of the output itself
    (12 * 2.0**-23, torch.float32, 3 * 2.0**-23, False),  # eager itself ulps off there
])
def test_fast_intrinsic_hint_only_for_a_few_ulp_in_float32_where_eager_is_close(
    relative_error, dtype, eager_shift, hinted
):
    from pytest_fusion.oracle.budget import fast_intrinsic_hint

    c = _compare_scaled(relative_error, dtype, eager_shift)
    assert c.mismatches > 0
    assert bool(fast_intrinsic_hint(c, dtype)) is hinted


FAST_EXP_SOFTMAX = '''
def softmax(x):
    # exp as Triton's tl.exp computes it: exp2 of z * log2(e) rounded to float32
    z = x - x.amax(-1, keepdim=True)
    num = torch.exp2(z * 1.4426950408889634)
    # and a few ulp more, as div.full can add
    return num / num.sum(-1, keepdim=True) * (1 + 8 * 2.0**-23)
'''

LSE_SOFTMAX = '''
def softmax(x):
    # the softmax a flash-attention-style backward recomputes: exp(x - lse), lse rounded to float32
    return torch.exp(x - torch.logsumexp(x, -1, keepdim=True))
'''


@pytest.mark.parametrize("kernel", [FAST_EXP_SOFTMAX, LSE_SOFTMAX], ids=["tl.exp", "exp(x - lse)"])
def test_fast_intrinsic_hint_reaches_the_failure_message(pytester: pytest.Pytester, kernel: str) -> None:
    # amplitude 30 (the plugin's large amplitude) makes |z| large enough to show; N >= 2: a
    # one-column softmax is exactly 1 either way
    pytester.makepyfile(test_softmax='''
import pytest
import torch

KERNEL

@pytest.mark.fused_kernel(reference=lambda x: torch.softmax(x, -1), inputs={"x": ("M", "N")},
                          dims={"M": (1, 64), "N": (2, 64)}, dtypes=("float32",), triton=False,
                          special_values=False)
def test_k():
    return softmax
'''.replace("KERNEL", kernel))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*hint     a few ulp over in float32 where eager is within an ulp: an exponent"
                                 " rounded before exp*"])
