"""The marker's ``mutates=`` (in-place kernels) and inputs with their own dtype and value bounds,
end to end through pytester, with plain-torch kernels (``triton=False``) on tiny dims."""

from __future__ import annotations

import pytest

ROTARY = '''
import pytest
import torch
import pytest_fusion


def rotary(q, k, cos, sin):
    """Out-of-place reference: q and k (T, H, 2 * R) rotated by the (T, R) angles' cos and sin."""
    def rot(x):
        x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
        c, s = cos[:, None, :], sin[:, None, :]
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), -1)
    return rot(q), rot(k)


def in_place(q, k, cos, sin):
    q_new, k_new = rotary(q, k, cos, sin)
    q.copy_(q_new)
    k.copy_(KFIX)
    SPILL
    return None


@pytest.mark.fused_kernel(
    reference=rotary,
    inputs={"q": ("T", "H", 8), "k": ("T", "G", 8), "cos": ("T", 4), "sin": ("T", 4)},
    dims={"T": (1, 5), "H": (1, 3), "G": (1, 2)},
    dtypes=("float32",),
    MUTATES
    triton=False,
    max_examples=3,
    bench={"tiny": dict(T=4, H=2, G=1)},
)
def test_rotary():
    return in_place
'''


def rotary(pytester: pytest.Pytester, mutates: str, k_fix: str = "k_new", *args: str,
           spill: str = "") -> pytest.RunResult:
    pytester.makepyfile(test_rotary=ROTARY.replace("MUTATES", mutates).replace("KFIX", k_fix).replace("SPILL", spill))
    return pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly", *args)


def test_declared_in_place_kernel_passes(pytester: pytest.Pytester) -> None:
    rotary(pytester, 'mutates=("q", "k"),').assert_outcomes(passed=1)


def test_undeclared_in_place_write_fails_naming_the_input(pytester: pytest.Pytester) -> None:
    result = rotary(pytester, "")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] input mutated: the kernel wrote into input 'q'*mutates=*"])


def test_write_into_an_input_left_out_of_mutates_fails(pytester: pytest.Pytester) -> None:
    result = rotary(pytester, 'mutates=("q",),')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*input mutated: the kernel wrote into input 'k'*"])


def test_declared_in_place_kernel_with_a_wrong_value_fails(pytester: pytest.Pytester) -> None:
    # k rotated by the negated angle: a sign error in one of the mutated inputs.
    result = rotary(pytester, 'mutates=("q", "k"),', "rotary(k, k, cos, -sin)[0]")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*elements of the output 1 *"])


def test_declared_input_is_still_guarded_against_writes_past_its_elements(pytester: pytest.Pytester) -> None:
    # The last element of q's allocation lies in the guard band after q's own elements.
    spill = "torch.empty(0, dtype=q.dtype, device=q.device).set_(q.untyped_storage())[-1] = 0.0"
    result = rotary(pytester, 'mutates=("q", "k"),', spill=spill)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] out-of-bounds write: the kernel wrote outside input 'q'*"])


def test_in_place_kernel_benches_on_fresh_inputs(pytester: pytest.Pytester) -> None:
    """Each timed call rotates the values present; were they not restored between calls, the
    timed output on input set 1 would be a rotation of a rotation and fail the recompute check."""
    result = rotary(pytester, 'mutates=("q", "k"),', "k_new", "--fusion-bench", "-k", "bench",
                    "--fusion-providers=eager", "--fusion-warmup=2", "--fusion-rounds=3",
                    "--fusion-min-time=0")
    result.assert_outcomes(passed=1)


def test_mutates_naming_no_input_is_a_usage_error(pytester: pytest.Pytester) -> None:
    result = rotary(pytester, 'mutates=("q", "kk"),')
    result.stdout.fnmatch_lines(["*mutates names 'kk', which is not one of the inputs (did you mean 'k'?)*"])
    assert result.ret != 0


DEQUANT = '''
import pytest
import torch
import pytest_fusion


def dequant_linear(x, w, scale):
    return x @ (w.to(x.dtype) * scale[:, None].to(x.dtype)).T


def kernel(x, w, scale):
    # The declared dtypes and bounds reach the kernel, whatever the test dtype.
    assert w.dtype == torch.int8 and scale.dtype == torch.float32, (w.dtype, scale.dtype)
    assert int(w.abs().max()) <= 127 and bool((scale > 0).all()), (w, scale)
    return (x.float() @ w.float().T * scale).to(x.dtype)


@pytest.mark.fused_kernel(
    reference=dequant_linear,
    inputs={
        "x": ("M", "K"),
        "w": pytest_fusion.Tensor(("N", "K"), dtype=W_DTYPE, bounds=(-127, 127)),
        "scale": pytest_fusion.Tensor(("N",), dtype="float32", bounds=(0.5 / 127, 2 / 127), special=False),
    },
    dims={"M": (1, 4), "K": (1, 40), "N": (1, 4)},
    dtypes=("float16", "float32"),
    triton=False,
    max_examples=4,
)
def test_dequant():
    return kernel
'''


def test_input_dtype_and_bounds_are_honoured(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dequant=DEQUANT.replace("W_DTYPE", '"int8"'))
    pytester.runpytest_inprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_unknown_input_dtype_is_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dequant=DEQUANT.replace("W_DTYPE", '"int4"'))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*inputs[[]'w'] declares dtype 'int4', which is not a tensor dtype an input may have*"])
    assert result.ret != 0


def test_bounds_outside_the_dtype_are_a_clear_error(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_dequant=DEQUANT.replace("W_DTYPE", '"int8"').replace("(-127, 127)", "(-127, 255)"))
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider")
    result.stdout.fnmatch_lines(["*inputs[[]'w']: bounds (-127, 255) exceed what int8 holds (-128, 127)*"])
    assert result.ret != 0


def test_bounded_values_are_drawn_inside_their_bounds() -> None:
    import torch

    import pytest_fusion

    spec = pytest_fusion.make_spec(
        lambda w, s: w,
        inputs={"w": pytest_fusion.Tensor(("N", "K"), dtype="int8", bounds=(-127, 127)),
                "s": pytest_fusion.Tensor(("N",), dtype="float32", bounds=(0.25, 0.5))},
        dims={"N": (1, 64), "K": (1, 64)},
    )
    case = pytest_fusion.Case(dims={"N": 64, "K": 64}, dtype="float16", layouts={}, seed=3)
    inputs = pytest_fusion.make_inputs(spec, case, "cpu")
    w, s = inputs["w"], inputs["s"]
    assert w.dtype == torch.int8 and s.dtype == torch.float32
    # 4096 uniform draws over 255 integers reach both ends' neighbourhood, far past the default 8.
    assert -127 <= int(w.min()) < -100 and 100 < int(w.max()) <= 127
    assert 0.25 <= float(s.min()) and float(s.max()) <= 0.5


RETURNS_NONE = '''
import pytest


def scale_add(x, y, alpha):
    return x + alpha * y


def scale_add_(x, y, alpha):  # meant to write into an output it forgot to return
    out = x + alpha * y


@pytest.mark.fused_kernel(reference=scale_add, inputs={"x": ("M", "N"), "y": ("M", "N")},
                          dims={"M": (1, 8), "N": (1, 8)}, constants={"alpha": 0.5},
                          dtypes=("float32",), triton=False, max_examples=3)
def test_scale_add():
    return scale_add_
'''


def test_a_kernel_returning_none_is_pointed_at_mutates(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_scale_add=RETURNS_NONE)
    result = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] bad output: output 0 is a NoneType, not a tensor (an in-place kernel returning "
        "None names the inputs it writes in the marker's mutates=)*",
    ])


def test_two_distinct_faults_reach_the_user_as_one_failure_message() -> None:
    """An in-place kernel without mutates= failed two ways in one run (a write into x; None where
    x was left as it was), and Hypothesis raised both as an ExceptionGroup traceback through the
    plugin. The property reports the one with the smallest case."""
    from pytest_fusion.property.check import property_settings

    assert property_settings(None, max_examples=5).report_multiple_bugs is False
