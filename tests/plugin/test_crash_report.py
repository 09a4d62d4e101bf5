"""A process that dies inside a kernel call (``os.abort()`` stands for a host-heap corruption) is
named with its test, its call and its case's repro: by the xdist controller at once, and without
workers by the next run in the same directory."""

from __future__ import annotations

import hashlib

import pytest

from pytest_fusion.machine.locks import lock_dir

CRASHING = '''
import os

import pytest


def kernel(x):
    if x.shape[0] == 3:
        os.abort()
    return x * 2


@pytest.mark.fused_kernel(reference=lambda x: x * 2, inputs={"x": ("M",)}, dims={"M": (3, 3)},
                          dtypes=("float32",), triton=False)
def test_crashes():
    return kernel
'''

NAMED = [
    "*died inside a kernel call: test_crash.py::test_crashes?float32?, call 1 of *",
    "*dims     M=3*",
    "*--fusion-repro=*",
]


def test_a_worker_that_dies_in_a_kernel_names_the_call_and_its_repro(pytester: pytest.Pytester) -> None:
    pytest.importorskip("xdist")
    pytester.makepyfile(test_crash=CRASHING)
    result = pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*crashed while running*", *NAMED])


def test_the_next_run_reports_a_run_that_died_in_a_kernel_once(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_crash=CRASHING, test_ok="def test_ok():\n    pass\n")
    died = pytester.runpytest_subprocess("test_crash.py", "-p", "no:cacheprovider")
    assert died.ret not in (0, 1), died.stdout.str()  # killed by SIGABRT, no report of its own
    died.stdout.no_fnmatch_line("*died inside a kernel call*")
    after = pytester.runpytest_subprocess("test_ok.py", "-p", "no:cacheprovider")
    after.assert_outcomes(passed=1)
    after.stdout.fnmatch_lines(["*an earlier run died inside a kernel call*", *NAMED])
    again = pytester.runpytest_subprocess("test_ok.py", "-p", "no:cacheprovider")
    again.stdout.no_fnmatch_line("*died inside a kernel call*")


def test_a_run_that_ends_leaves_no_record(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_fine=CRASHING.replace("== 3", "== 4"))
    pytester.runpytest_subprocess("-n", "1", "-p", "no:cacheprovider").assert_outcomes(passed=1)
    runs = lock_dir() / "crashes" / hashlib.sha1(str(pytester.path.resolve()).encode()).hexdigest()[:12]
    assert runs.is_dir() and not any(runs.iterdir()), list(runs.iterdir())
