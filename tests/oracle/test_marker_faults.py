"""The marker end to end: a correct Triton kernel passes, and each kernel with one planted fault
fails under the plugin's default settings with the failure kind, the printed case fields, and a
shrunk case small enough to point at that fault."""

from __future__ import annotations

import pytest

from conftest import failure_reports, repro_args, shrunk_dims
from fakes import TEST_FILE


CASE_FIELDS = ["*dims  *M=*K=*N=*", "*dtype  *float*", "*layouts  x: * (shape *, strides (*), offset *)",
               "*weight: * (shape *, strides (*), offset *)", "*bias: * (shape *, strides (*), offset *)",
               "*seed  *special values:*"]


def run(pytester: pytest.Pytester, fault: str | None, activation: str = "gelu_tanh", special: bool = False):
    pytester.makepyfile(test_kernel=TEST_FILE.format(fault=fault, activation=activation, special=special))
    return pytester.runpytest("-p", "no:cacheprovider")


def test_correct_kernel_passes_in_every_dtype(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, None, special=True)
    result.assert_outcomes(passed=2)


@pytest.mark.parametrize("activation", ["relu", "gelu_tanh"])
def test_k_tail_not_masked(fusion_pytester: pytest.Pytester, activation: str) -> None:
    result = run(fusion_pytester, "k_tail", activation)
    result.assert_outcomes(failed=2)
    # either tier's headline: the exact tier (no budget) or the error budget's
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: * elements of the output *",
                                 *CASE_FIELDS, "*  [wf][oi][rr]s[t]  *kernel=*golden=*"])
    dims = shrunk_dims(result.stdout.str())
    assert dims["K"] % 16 != 0, dims  # only a K tail exposes it
    assert max(dims.values()) <= 17, dims


def test_k_tail_not_masked_outside_the_exact_tier_names_the_budget(fusion_pytester: pytest.Pytester) -> None:
    """The same fault at one case the exact tier does not cover (random values, ``exact`` off): the
    budget's lines, with eager's error and the ulps beside the kernel's."""
    fusion_pytester.makepyfile(test_kernel=TEST_FILE.format(fault="k_tail", activation="gelu_tanh", special=False))
    case = ('{"dims": {"M": 16, "K": 17, "N": 16}, "dtype": "float32", "layouts": {"x": "contiguous", '
            '"weight": "contiguous", "bias": "contiguous"}, "seed": 0, "special": false, "amplitude": 1.0, '
            '"exact": false}')
    result = fusion_pytester.runpytest("-p", "no:cacheprovider", "test_kernel.py::test_linear_act[float32]",
                                       f"--fusion-repro={case}")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: * elements of the output outside the error budget*",
                                 *CASE_FIELDS, "*worst  *kernel=*golden=*eager=*ulp*", "*budget  *"])


def test_bias_dropped_on_last_n_tile(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, "bias_last_tile")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", *CASE_FIELDS])
    dims = shrunk_dims(result.stdout.str())
    assert dims["N"] <= 17 and dims["M"] <= 17 and dims["K"] <= 17, dims


def test_grid_with_floor_division_leaves_rows_unwritten(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, "grid_floor")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", "*NaN where golden is finite: an unwritten element?*"])
    dims = shrunk_dims(result.stdout.str())
    assert dims["M"] % 16 != 0 and dims["M"] < 16, dims  # rows past the last full tile never written
    assert dims["N"] <= 17 and dims["K"] <= 17, dims


def test_strides_ignored_fails_on_a_strided_input(fusion_pytester: pytest.Pytester) -> None:
    import re

    result = run(fusion_pytester, "strides")
    result.assert_outcomes(failed=2)
    out = failure_reports(result.stdout.str())
    # Each failing dtype shrinks to a non-contiguous x (transposed, or padded: a row stride K + 3)
    # with at least two rows: with one row, or contiguous, the assumed strides are right.
    layouts = re.findall(r"^\s*layouts\s+x: (\w+) ", out, flags=re.M)
    assert len(layouts) == 2 and set(layouts) <= {"transposed", "padded"}, out
    for which in (0, 1):
        dims = shrunk_dims(out, which)
        assert dims["M"] >= 2 and max(dims.values()) <= 17, dims


def test_strides_ignored_fails_on_a_transposed_input(fusion_pytester: pytest.Pytester) -> None:
    # The same fault with x drawn only contiguous or transposed: the shrunk case is 2 x 2.
    fusion_pytester.makepyfile(test_kernel=TEST_FILE.format(fault="strides", activation="gelu_tanh", special=False)
                               .replace('"x": ("M", "K")', '"x": pytest_fusion.Tensor(("M", "K"), layouts=("contiguous", "transposed"))')
                               .replace("import pytest\n", "import pytest\nimport pytest_fusion\n", 1))
    result = fusion_pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=2)
    out = failure_reports(result.stdout.str())
    assert out.count("layouts  x: transposed (") == 2, out
    for which in (0, 1):
        dims = shrunk_dims(out, which)
        assert dims["M"] >= 2 and dims["K"] >= 2 and max(dims.values()) <= 17, dims


def test_gelu_erf_instead_of_tanh_is_caught_in_float32(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, "gelu_erf")
    out = result.stdout.str()
    assert "test_linear_act[float32] FAILED" in out or "FAILED test_kernel.py::test_linear_act[float32]" in out, out
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", "*dtype  *float32*",
                                 "*budget  *eager's error here*ulp of float32*"])


def test_relu_mapping_nan_to_zero_is_caught_with_special_values(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, "relu_nan", "relu", special=True)
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*", "*special values: yes*", "*NaN/inf misplaced: [1-9]*"])


def test_relu_mapping_nan_to_zero_passes_unnoticed_without_special_values(fusion_pytester: pytest.Pytester) -> None:
    # Why special values are opt-in but matter: finite inputs cannot tell the two relus apart.
    result = run(fusion_pytester, "relu_nan", "relu", special=False)
    result.assert_outcomes(passed=2)


def test_kernel_writing_into_its_input(fusion_pytester: pytest.Pytester) -> None:
    result = run(fusion_pytester, "writes_input")
    result.assert_outcomes(failed=2)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] input mutated: the kernel wrote into input 'bias'*", *CASE_FIELDS])
    assert max(shrunk_dims(result.stdout.str()).values()) == 1


def test_failure_prints_a_repro_that_replays_the_case(fusion_pytester: pytest.Pytester) -> None:
    # bias_last_tile, not k_tail: a read past K's end sees whatever memory follows the input, so
    # a k_tail case can pass when replayed (seen in CI: a FlakyFailure whose repro passed)
    result = run(fusion_pytester, "bias_last_tile")
    replay = fusion_pytester.runpytest("-p", "no:cacheprovider", *repro_args(result.stdout.str()))
    replay.assert_outcomes(failed=1)
    replay.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*"])
    assert shrunk_dims(replay.stdout.str()) == shrunk_dims(result.stdout.str(), which=0)
