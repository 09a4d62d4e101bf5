"""The config tier: after a passing search, its smallest cases at each autotune config pinned, in
rotation across runs within a budget (``--fusion-config-budget``), and a summary line of how many
configs were checked. The planted fault is a config the interpreter never picks (it runs the
first) that leaves odd rows unwritten."""

from __future__ import annotations

import re

import pytest

from conftest import PLUGIN_KERNELS, interpreter_loops, repro_args
from oracle.test_oracle_hygiene import TEST_FILE


@pytest.fixture
def rows_kernel(pytester: pytest.Pytester) -> pytest.Pytester:
    pytester.makepyfile(hygiene_kernels=(PLUGIN_KERNELS / "hygiene_kernels.py").read_text())

    def write(order: tuple[str, ...]) -> None:
        pytester.makepyfile(test_kernel=TEST_FILE.format(kernel="hygiene_kernels.rows", x_layouts=None, triton=True,
                                                         order=order, m_low=2, special=False))

    pytester.write = write  # type: ignore[attr-defined]
    return pytester


@interpreter_loops
def test_the_tier_finds_a_config_the_autotuner_does_not_pick(rows_kernel: pytest.Pytester, cpu_only: None) -> None:
    rows_kernel.write(("full", "skip"))  # type: ignore[attr-defined]
    rows_kernel.runpytest("-p", "no:cacheprovider").assert_outcomes(passed=1)  # off under the interpreter
    result = rows_kernel.runpytest("-p", "no:cacheprovider", "--fusion-config-budget", "60")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: *", "*autotune _linear_kernel: config 2 of 2 (SKIP_ODD: 1*"])
    # its repro checks every config at that case, in a fresh process
    args = repro_args(result.stdout.str())
    assert "--fusion-all-configs" in args, args
    replay = rows_kernel.runpytest_subprocess("-p", "no:cacheprovider", *args)
    replay.assert_outcomes(failed=1)
    replay.stdout.fnmatch_lines(["*autotune _linear_kernel: config 2 of 2 (SKIP_ODD: 1*"])


@interpreter_loops
def test_the_rotation_goes_on_where_the_last_run_stopped(rows_kernel: pytest.Pytester, cpu_only: None) -> None:
    # a budget spent by one config: the first run checks config 1 only and passes; the next starts
    # at config 2, the faulty one
    rows_kernel.write(("full", "skip"))  # type: ignore[attr-defined]
    first = rows_kernel.runpytest("--fusion-config-budget", "0.001")
    first.assert_outcomes(passed=1)
    first.stdout.fnmatch_lines(["*pytest-fusion config tier: 1 of 2 autotune configs checked on up to 2 cases each, "
                                "in 1 test(s) and dtype(s); the rotation goes on from there next run*"])
    second = rows_kernel.runpytest("--fusion-config-budget", "0.001")
    second.assert_outcomes(failed=1)
    second.stdout.fnmatch_lines(["*autotune _linear_kernel: config 2 of 2 (SKIP_ODD: 1*"])


@interpreter_loops
def test_a_correct_autotuned_kernel_passes_every_config_of_the_tier(rows_kernel: pytest.Pytester,
                                                                    cpu_only: None) -> None:
    rows_kernel.write(("full", "full2"))  # type: ignore[attr-defined]
    result = rows_kernel.runpytest("--fusion-config-budget", "60")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*config tier: 2 of 2 autotune configs checked * every config checked*"])


COUNTED = '''
import pytest

CALLS = []


def kernel(x):
    CALLS.append(1)
    return x * 2


@pytest.mark.fused_kernel(reference=lambda x: x * 2, inputs={"x": ("M",)}, dims={"M": (1, 8)},
                          dtypes=("float32",), triton=False, max_examples=4)
def test_double():
    return kernel


def test_zz_calls():
    print(f"kernel calls: {len(CALLS)}")
'''


def test_a_kernel_without_autotune_pays_nothing_for_the_tier(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_counted=COUNTED)

    def calls(budget: str) -> int:
        result = pytester.runpytest("-p", "no:cacheprovider", "-s", "-p", "no:randomly", "--fusion-config-budget", budget)
        result.assert_outcomes(passed=2)
        result.stdout.no_fnmatch_line("*config tier*")
        return int(re.search(r"kernel calls: (\d+)", result.stdout.str()).group(1))

    assert calls("60") == calls("0") > 0
