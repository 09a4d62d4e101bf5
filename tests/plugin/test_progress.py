"""What a run says while it runs (pytest_fusion.plugin.progress): a wait on another process's timing
lock, a re-measure, a case queued for device memory, and a line per bench case on a terminal only."""

import tempfile
import textwrap
import threading

import pytest

# In-process pytester runs drop modules first imported inside them from sys.modules afterwards;
# torch cannot be imported twice in one process (the second import crashes), so import it here.
import torch  # noqa: F401
import triton  # noqa: F401

import pytest_fusion.plugin.bench_session  # noqa: F401
from pytest_fusion.machine import locks
from pytest_fusion.machine.devices import device_lock
from pytest_fusion.oracle import memory
from pytest_fusion.plugin import progress
from fakes import FAKE_TIMER_CONFTEST, KERNEL_TEST, bench, set_times, write_project


@pytest.fixture
def quiet_env(monkeypatch):
    """Neither CI variable set: the run counts as interactive where its terminal is a tty."""
    for var in ("CI", "BUILD_NUMBER"):
        monkeypatch.delenv(var, raising=False)


def test_a_wait_on_another_processs_timing_lock_says_who_holds_it_and_when_it_was_taken(
        pytester, monkeypatch, tmp_path, cpu_only):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # a private lock directory
    monkeypatch.setattr(locks, "WAIT_NOTICE_S", 0.05)
    noticed = threading.Event()
    holder_of = locks._holder

    def holder_seen(lock_file):  # read for the notice: the holder may let go now
        try:
            return holder_of(lock_file)
        finally:
            noticed.set()

    monkeypatch.setattr(locks, "_holder", holder_seen)
    held = threading.Event()

    def hold():
        with device_lock("cpu", timeout=5, holder="tests/other.py::test_slow[bench-big-float16]"):
            held.set()
            noticed.wait(60)

    other = threading.Thread(target=hold)
    other.start()
    assert held.wait(10)
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    result = bench(pytester, "--fusion-lock-timeout=60")
    other.join(10)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "pytest-fusion: test_kernel.py::test_relu_linear[[]bench-small-float32[]]: waiting for the cpu timing "
        "lock *: held by pid * (tests/other.py::test_slow[[]bench-big-float16[]]) since *UTC; waited 0 s, "
        "waits up to 60 s in all",
        "pytest-fusion: test_kernel.py::test_relu_linear[[]bench-small-float32[]]: took the cpu timing lock "
        "after * s",
    ])

    noticed.clear()  # the lock free: no wait, nothing said
    result = bench(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*timing lock*")


def test_a_noisy_case_says_it_is_re_measured_and_a_steady_one_does_not(pytester):
    spread = [0.7 + 0.6 * ((i * 7) % 37) / 36 for i in range(37)]  # uniform 0.7..1.3 ms, shuffled
    write_project(pytester, times={"kernel": spread, "eager": 2.0})
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "pytest-fusion: test_kernel.py::test_relu_linear[[]bench-small-float32[]]: re-measuring with 4x the "
        "rounds in reverse provider order: the first measurement (10 rounds) was too noisy to judge; 4x the "
        "minimum rounds: 40 rounds, with no time floor",
    ])
    set_times(pytester, kernel=1.0, eager=2.0)
    result = bench(pytester, "--fusion-rounds=10", "--fusion-min-time=0")
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("*re-measuring*")


QUEUED_CHECK = textwrap.dedent(
    """
    import pytest, torch

    def reference(x):
        return torch.relu(x)

    @pytest.mark.fused_kernel(reference=reference, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                              dtypes=("float32",), triton=False, max_examples=2,
                              bench={"small": dict(M=16)})
    def test_relu():
        return torch.relu
    """
)


def test_a_case_queued_for_device_memory_says_so_in_a_check_and_a_bench_case(pytester, monkeypatch):
    # No GPU here: the admission is faked, one that queues for 12 s behind another worker's case.
    import contextlib

    def queued(device, need, *, holder="", notify=None):
        if notify is not None:
            waited = memory.Waited(12.0, ("tests/big.py::test_big[bench-huge-bfloat16] (60.0 GB)",))
            notify(memory.wait_notice("cuda:0", 30 * 10**9, holder, waited))
        return contextlib.nullcontext(memory.Waited(12.0, ()))

    monkeypatch.setattr(memory, "admitted", queued)
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    pytester.makepyfile(test_queued=QUEUED_CHECK)
    set_times(pytester, kernel=1.0, eager=2.0)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-k", "not bench")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "pytest-fusion: test_queued.py::test_relu[[]float32[]]: *queued 12 s for 30.0 GB of cuda:0's memory; "
        "admitted or ahead: tests/big.py::test_big[[]bench-huge-bfloat16[]] (60.0 GB)",
    ])
    result = bench(pytester)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines([
        "pytest-fusion: test_queued.py::test_relu[[]bench-small-float32[]]: queued 12 s for 30.0 GB of "
        "cuda:0's memory; admitted or ahead: tests/big.py::*",
    ])


TTY_CONFTEST = FAKE_TIMER_CONFTEST + textwrap.dedent(
    """
    import pytest

    @pytest.hookimpl(trylast=True)
    def pytest_configure(config):  # the terminal reporter as on a terminal
        reporter = config.pluginmanager.get_plugin("terminalreporter")
        reporter.isatty = lambda: True
    """
)


def test_a_line_per_bench_case_on_a_terminal_and_none_in_ci_or_a_pipe(pytester, monkeypatch, quiet_env):
    pytester.makepyfile(test_kernel=KERNEL_TEST.replace(
        "BENCH", "{'small': dict(M=16, K=8, N=8), 'wide': dict(M=32, K=8, N=8)}"))
    set_times(pytester, kernel=1.0, eager=2.0)
    pytester.makeconftest(TTY_CONFTEST)
    result = bench(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines([
        "pytest-fusion: bench case 1 of 2: test_kernel.py::test_relu_linear[[]bench-small-float32[]]",
        "pytest-fusion: bench case 2 of 2: test_kernel.py::test_relu_linear[[]bench-wide-float32[]]",
    ])

    monkeypatch.setenv("CI", "true")  # a CI log: quiet
    result = bench(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*bench case 1 of*")

    monkeypatch.delenv("CI")
    pytester.makeconftest(FAKE_TIMER_CONFTEST)  # output to a pipe, as pytester's is
    result = bench(pytester)
    result.assert_outcomes(passed=2)
    result.stdout.no_fnmatch_line("*bench case 1 of*")


def test_the_ci_rule_is_pytests(monkeypatch):
    monkeypatch.delenv("BUILD_NUMBER", raising=False)
    monkeypatch.setenv("CI", "")
    assert not progress.running_on_ci()  # set but empty: not CI, as pytest 9 decides
    monkeypatch.setenv("BUILD_NUMBER", "17")
    assert progress.running_on_ci()
