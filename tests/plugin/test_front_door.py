"""What a new user meets first: the plain API without a GPU, the fixture's bench on the CPU, and
a bench run's output free of torch's own noise."""

import logging
import os
import textwrap

import pytest
import torch

import pytest_fusion
from pytest_fusion.machine import devices as interpreter
from pytest_fusion.measure.providers import quiet_torch_compile


def test_check_kernel_fails_early_for_a_triton_kernel_without_gpu_or_interpreter(monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    calls = []
    spec = pytest_fusion.make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 8)})
    with pytest.raises(pytest_fusion.FusionUsageError) as info:
        pytest_fusion.check_kernel(spec, lambda x: calls.append(x), dtypes=("float32",), device="cpu")
    message = str(info.value)
    assert "no CUDA device is visible and the Triton interpreter is off" in message
    assert "pytest_fusion.interpret_if_no_gpu()" in message and "TRITON_INTERPRET=1" in message
    assert "triton=False" in message
    assert calls == []  # failed before the kernel ran
    plain = pytest_fusion.make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 8)}, triton=False)
    assert pytest_fusion.check_kernel(plain, torch.relu, dtypes=("float32",), device="cpu",
                                      max_examples=2) == {"float32": "passed"}


def test_check_kernels_own_max_examples_wins_over_the_specs():
    # a call's argument is more specific than its spec's, as the marker's is than --fusion-examples
    calls = []

    def relu(x):
        calls.append(x.shape)
        return torch.relu(x)

    spec = pytest_fusion.make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)}, triton=False,
                                   max_examples=12)
    pytest_fusion.check_kernel(spec, relu, dtypes=("float32",), device="cpu", max_examples=6)
    assert len(calls) == 2 * 6  # two calls per case
    calls.clear()
    pytest_fusion.check_kernel(spec, relu, dtypes=("float32",), device="cpu")
    assert len(calls) == 2 * 12


def test_interpret_if_no_gpu_turns_the_interpreter_on_only_without_a_gpu(monkeypatch):
    # set, then delete: monkeypatch records the process's own value (or its absence) first, so
    # the value the function sets below is undone too (a delenv of an absent name records nothing)
    monkeypatch.setenv("TRITON_INTERPRET", "set by this test")
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(interpreter, "cuda_visible", lambda: False)
    assert pytest_fusion.interpret_if_no_gpu() == "Triton kernels: interpreted (no CUDA device visible)"
    assert os.environ["TRITON_INTERPRET"] == "1"
    monkeypatch.delenv("TRITON_INTERPRET")
    monkeypatch.setattr(interpreter, "cuda_visible", lambda: True)
    assert "compiled" in pytest_fusion.interpret_if_no_gpu() and "TRITON_INTERPRET" not in os.environ
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert "set by the user" in pytest_fusion.interpret_if_no_gpu() and os.environ["TRITON_INTERPRET"] == "0"


@pytest.mark.skipif(torch.cuda.is_available(), reason="the skip is for machines without a CUDA device")
def test_fixture_bench_skips_a_triton_kernel_on_the_cpu_and_times_a_plain_one(pytester):
    pytester.makepyfile(test_hand=textwrap.dedent(
        """
        import torch

        def test_triton_kernel(fusion):
            fusion.bench("relu", torch.relu, torch.randn(8, 8), reference=torch.relu)

        def test_plain_kernel(fusion):
            rec = fusion.bench("relu", torch.relu, torch.randn(8, 8), reference=torch.relu, triton=False)
            assert rec.device and rec.providers["eager"].speedup > 0
        """))
    result = pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-rounds=3",
                                          "--fusion-min-time=0", "--fusion-warmup=0", "-rs")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines(["*SKIPPED*bench of a Triton kernel needs a CUDA device*triton=False*"])


def test_torch_trace_records_are_dropped_without_torch_trace(monkeypatch):
    monkeypatch.delenv("TORCH_TRACE", raising=False)
    trace_log = logging.getLogger("torch.__trace")
    seen = []
    handler = logging.Handler(logging.DEBUG)
    handler.emit = seen.append
    monkeypatch.setattr(trace_log, "filters", [])  # as before the first compile of the process
    monkeypatch.setattr(trace_log, "handlers", [handler])  # wherever records go: stderr, pytest's capture
    trace_log.debug("")
    assert len(seen) == 1  # what the filter is for
    with quiet_torch_compile():
        trace_log.debug("")
    trace_log.debug("")  # the filter stays for the process: recompiles log after the block
    assert len(seen) == 1
    monkeypatch.setenv("TORCH_TRACE", "/tmp/traces")  # a user who asks for traces gets them
    monkeypatch.setattr(trace_log, "filters", [])
    with quiet_torch_compile():
        trace_log.debug("")
    assert len(seen) == 2


def test_bench_output_has_no_torch_noise_and_fits_120_columns(pytester):
    pytester.makepyfile(test_plain=textwrap.dedent(
        """
        import pytest, torch

        @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 64)},
                                  dtypes=("float32",), triton=False, bench={"llama3-70b-M8192": dict(M=64)})
        def test_relu():
            return torch.relu
        """))
    # a fresh process: torch.compile's first import of Inductor is where torch warns
    result = pytester.runpytest_subprocess("--fusion-bench", "-k", "bench", "--fusion-rounds=3",
                                           "--fusion-min-time=0", "--fusion-warmup=0", "-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)
    out = result.stdout.str()
    assert "torch.jit" not in out and "DeprecationWarning" not in out and "torch.__trace" not in out
    result.stdout.fnmatch_lines(["*pytest-fusion bench*", "*case*dtype*kernel ms*vs eager*vs compile*gate*"])
    summary = out.split("pytest-fusion bench", 1)[1].splitlines()
    table = [l for l in summary if l.startswith("  ") and not l.lstrip().startswith(("FAIL", "note"))]
    assert len(table) == 2 and "llama3-70b-M8192" in table[1] and max(map(len, table)) <= 120, table


PLAIN_TEST = "def test_a():\n    assert True\n"
BENCHMARK_FIXTURE_TEST = "def test_b(benchmark):\n    assert benchmark(sum, [1, 2]) == 3\n"


def test_pytest_benchmark_beside_the_plugin_is_quiet_in_a_run_that_does_not_use_it(pytester):
    # pytest-benchmark is installed with pytest-fusion; a user's plain run neither prints its
    # header nor leaves its empty .benchmarks/ behind.
    pytest.importorskip("pytest_benchmark")
    pytester.makepyfile(test_a=PLAIN_TEST)
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1)
    result.stdout.no_fnmatch_line("benchmark: *defaults*")
    assert not (pytester.path / ".benchmarks").exists()
    (pytester.path / ".benchmarks").mkdir()  # one the user made is theirs, empty or not
    pytester.runpytest_subprocess().assert_outcomes(passed=1)
    assert (pytester.path / ".benchmarks").is_dir()
    # a storage path of its own: the parents pytest-benchmark made for it go too
    pytester.runpytest_subprocess("--benchmark-storage=deep/er/store").assert_outcomes(passed=1)
    assert not (pytester.path / "deep").exists()


def test_a_run_using_pytest_benchmarks_fixture_keeps_its_header_table_and_storage(pytester, monkeypatch):
    pytest.importorskip("pytest_benchmark")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)  # inherited, it disables pytest-benchmark's timing
    pytester.makepyfile(test_a=PLAIN_TEST, test_b=BENCHMARK_FIXTURE_TEST)
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["collected 2 items", "benchmark: * (defaults: *)", "*- benchmark: 1 tests -*",
                                 "test_b *"])
    pytester.runpytest_subprocess("-p", "no:randomly", "--benchmark-autosave").assert_outcomes(passed=2)
    assert len(list((pytester.path / ".benchmarks").glob("*/0001_*.json"))) == 1
