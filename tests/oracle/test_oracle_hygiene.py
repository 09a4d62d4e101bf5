"""The oracle's hygiene at default settings: writes outside a tensor, gap reads, outputs reused
across calls, state left by the previous call, autotuned kernels. Each planted fault fails with
its kind, and the repro it prints fails again in a fresh pytest process."""

from __future__ import annotations


import pytest

from conftest import PLUGIN_KERNELS, interpreter_loops, repro_args

TEST_FILE = '''
import pytest
import pytest_fusion
import hygiene_kernels

hygiene_kernels.ORDER = {order!r}


def linear(x, w):
    return x @ w.T


@pytest.mark.fused_kernel(
    reference=linear,
    inputs={{"x": pytest_fusion.Tensor(("M", "K"), layouts={x_layouts!r}), "w": ("N", "K")}},
    dims={{"M": ({m_low}, 6), "K": (2, 9), "N": (1, 9)}},
    dtypes=("float32",),
    triton={triton},
    special_values={special},
    max_examples=5,
)
def test_kernel():
    return {kernel}
'''


@pytest.fixture
def hygiene(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(hygiene_kernels=(PLUGIN_KERNELS / "hygiene_kernels.py").read_text())
    return pytester


def run(pytester: pytest.Pytester, kernel: str, *args: str, x_layouts: tuple[str, ...] | None = None,
        triton: bool = True, order: tuple[str, ...] = ("skip", "full"), m_low: int = 1,
        special: bool = True) -> pytest.RunResult:
    pytester.makepyfile(test_kernel=TEST_FILE.format(kernel=kernel, x_layouts=x_layouts, triton=triton, order=order,
                                                     m_low=m_low, special=special))
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def assert_repro_fails(pytester: pytest.Pytester, result: pytest.RunResult, line: str, *, exact: bool = True) -> None:
    """The printed repro, run in a fresh pytest process, fails again with ``line``; with ``exact``
    False, with the exact value tier's values replaced by drawn ones."""
    args = repro_args(result.stdout.str())
    if not exact:
        args = [a.replace('"exact": true', '"exact": false') for a in args]
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    replay.assert_outcomes(failed=1)
    replay.stdout.fnmatch_lines([line])


def test_write_past_the_end_of_an_allocated_output(hygiene: pytest.Pytester) -> None:
    result = run(hygiene, "lambda x, w: hygiene_kernels.linear(x, w, 'out_past_end')")
    result.assert_outcomes(failed=1)
    line = ("*[[]pytest-fusion] out-of-bounds write: the kernel wrote past the end of output 0 (call 1 of 2), "
            "shape (*) float32: byte 0 of the 256-byte guard band after its storage*")
    result.stdout.fnmatch_lines([line])
    assert_repro_fails(hygiene, result, line)


def test_write_into_a_padded_inputs_gap(hygiene: pytest.Pytester) -> None:
    # M >= 2: the first changed element is then the padding between rows 0 and 1 (with one row,
    # the padding after it is reported as "past its last element")
    result = run(hygiene, "lambda x, w: hygiene_kernels.linear(x, w, 'gap_write')", x_layouts=("padded",), m_low=2)
    result.assert_outcomes(failed=1)
    line = "*[[]pytest-fusion] out-of-bounds write: the kernel wrote outside input 'x' (call 1 of 2)*(in a gap of its layout)*"
    result.stdout.fnmatch_lines([line])
    assert_repro_fails(hygiene, result, line)


def test_reading_a_padded_gap_into_the_arithmetic(hygiene: pytest.Pytester) -> None:
    result = run(hygiene, "lambda x, w: hygiene_kernels.linear(x, w, 'gap_read')", x_layouts=("padded",))
    result.assert_outcomes(failed=1)
    # either call may be the first to differ: the last call's bytes outside x hold NaN, not the gap pattern
    line = "*[[]pytest-fusion] mismatch: * elements of the output * (call [12] of 2)*"
    result.stdout.fnmatch_lines([line])
    assert "unwritten element" not in result.stdout.str()  # a finite gap value, not the poison
    assert_repro_fails(hygiene, result, line)


SCALE_FILE = '''
import pytest
import torch
import pytest_fusion


def scaled(x, s):
    return x * s[:, None]


def past_end(x, s):
    # one element past s's end, weighted by 0: the dead rows of a last chunk reading its scale
    beyond = torch.as_strided(s, (s.shape[0] + 1,), s.stride(), s.storage_offset())[-1]
    return x * s[:, None] + beyond * 0


@pytest.mark.fused_kernel(
    reference=scaled,
    inputs={{"x": ("M", "N"), "s": ("M",)}},
    dims={{"M": (1, 8), "N": (1, 8)}},
    dtypes=("float32",),
    triton=False,
    special_values={special},
    max_examples=5,
)
def test_kernel():
    return {kernel}
'''


@pytest.mark.parametrize("special", [False, True])
def test_reading_past_the_end_of_an_input_times_zero(pytester: pytest.Pytester, special: bool) -> None:
    pytester.makepyfile(test_kernel=SCALE_FILE.format(kernel="past_end", special=special))
    result = pytester.runpytest("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    line = ("*[[]pytest-fusion] mismatch: * elements of the output * (call 2 of 2)*")
    result.stdout.fnmatch_lines([line, "*the output went NaN where golden is finite*"
                                 "did the kernel read outside an input, past its end or before its start?*"])
    if not special:
        result.stdout.fnmatch_lines(["*NaN where golden is finite and no input element is NaN*"])
    assert_repro_fails(pytester, result, line)


def test_reading_only_inside_an_input_passes_with_nan_around_it(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_kernel=SCALE_FILE.format(kernel="lambda x, s: x * s[:, None]", special=True))
    pytester.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)


def test_output_buffer_reused_across_calls(hygiene: pytest.Pytester) -> None:
    result = run(hygiene, "hygiene_kernels.reused_out", triton=False)
    result.assert_outcomes(failed=1)
    line = "*[[]pytest-fusion] aliased output: output aliases an earlier result: output 0 of call 2 of 2 *output 0 of call 1*"
    result.stdout.fnmatch_lines([line])
    assert_repro_fails(hygiene, result, line)


def test_stale_split_k_workspace(hygiene: pytest.Pytester) -> None:
    # Without special values: an inf an earlier case left in the never-zeroed workspace turns every
    # later case of that shape into NaN, and the shrunk case then fails only through that history,
    # which no fresh process has (a limit of replaying: state a kernel keeps across cases).
    result = run(hygiene, "hygiene_kernels.split_k", triton=False, special=False)
    result.assert_outcomes(failed=1)
    # Shrinking revisits shapes whose workspace earlier cases left stale, so the shrunk case may
    # fail at its first call; its repro, in a fresh process, fails at the second.
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: * elements of the output * (call [12] of 2)*"])
    assert "FlakyFailure" not in result.stdout.str()
    # Where the shrunk case is in the exact tier, its output may be all zero, which a doubled
    # workspace leaves zero: the replay draws the same dims' values as any other case does.
    assert_repro_fails(hygiene, result, "*[[]pytest-fusion] mismatch: * elements of the output * (call 2 of 2)*",
                       exact=False)


@interpreter_loops
def test_autotuned_config_skipping_rows_runs_first_under_the_interpreter(hygiene: pytest.Pytester, cpu_only: None) -> None:
    result = run(hygiene, "hygiene_kernels.rows", order=("skip", "full"))
    result.assert_outcomes(failed=1)
    line = "*[[]pytest-fusion] mismatch: * (call 1 of 2)*"
    result.stdout.fnmatch_lines([line, "*NaN where golden is finite: an unwritten element?*"])
    assert "0 active drivers" not in result.stdout.str()
    assert_repro_fails(hygiene, result, line)


@interpreter_loops
def test_every_config_option_checks_the_second_config(hygiene: pytest.Pytester, cpu_only: None) -> None:
    # The first config is correct: by default only it runs under the interpreter, so the run passes;
    # --fusion-all-configs pins each config in turn and finds the one that skips rows.
    run(hygiene, "hygiene_kernels.rows", order=("full", "skip")).assert_outcomes(passed=1)
    result = run(hygiene, "hygiene_kernels.rows", "--fusion-all-configs", order=("full", "skip"))
    result.assert_outcomes(failed=1)
    line = "*[[]pytest-fusion] mismatch: * (call 1 of 2)*"
    result.stdout.fnmatch_lines([line, "*autotune _linear_kernel: config 2 of 2 (SKIP_ODD: 1*"])
    assert_repro_fails(hygiene, result, line)


@interpreter_loops
def test_correct_autotuned_kernel_passes_under_the_interpreter(hygiene: pytest.Pytester, cpu_only: None) -> None:
    result = run(hygiene, "hygiene_kernels.rows", "--fusion-all-configs", order=("full", "full2"))
    result.assert_outcomes(passed=1)


def test_no_explanation_pointing_into_the_plugin(hygiene: pytest.Pytester) -> None:
    # Without special values: an inf an earlier case left in the never-zeroed workspace turns every
    # later case of that shape into NaN, and the shrunk case then fails only through that history,
    # which no fresh process has (a limit of replaying: state a kernel keeps across cases).
    result = run(hygiene, "hygiene_kernels.split_k", triton=False, special=False)
    result.assert_outcomes(failed=1)
    assert "always and only run by failing examples" not in result.stdout.str()


def test_every_config_counts_the_configs_left_after_the_kernels_own_pruning() -> None:
    # A kernel that prunes its candidates by its arguments (reference_kernels.kernels.int8_linear tunes fp32
    # over other tiles than bf16) has fewer configs for those arguments: --fusion-all-configs runs
    # and names those, not the whole list.
    import torch
    import triton
    import triton.language as tl

    from pytest_fusion.oracle import autotune

    @triton.jit
    def copy(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)

    blocks = [triton.Config({"BLOCK": b}) for b in (16, 32, 64)]
    drop_32 = {"early_config_prune": lambda configs, named_args, **kwargs: [configs[0], configs[2]]}
    tuned = triton.autotune(configs=blocks, key=["n"], prune_configs_by=drop_32)(copy)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    x = torch.arange(100, dtype=torch.float32, device=device)
    out = torch.zeros_like(x)
    with autotune.choose(1):
        tuned[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, out, 100)
    assert torch.equal(out, x)
    assert autotune.config_count() == 2
    assert "copy: config 2 of 2 (BLOCK: 64," in autotune.describe(1)
