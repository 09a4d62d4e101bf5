"""The marker's contract with its user: registration, options, clear errors for bad use, the
interpreter switch, the bf16 skip, crashes told apart from mismatches, and the fusion fixture."""

from __future__ import annotations

import pytest

from conftest import REPRO_PREFIX, failure_reports, repro_args, repro_command, repro_line
from pytest_fusion.machine.devices import cuda_visible

HEADER = '''
import pytest
import torch
import torch.nn.functional as F


def linear(x, weight):
    return F.linear(x, weight)


def torch_linear(x, weight):
    """A correct CPU kernel: fp32 accumulation, one final rounding."""
    return F.linear(x.float(), weight.float()).to(x.dtype)
'''


def make(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_it=HEADER + body)


def test_help_lists_options_with_text(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--help")
    result.stdout.fnmatch_lines([
        "*pytest-fusion: fused-kernel correctness and benchmarks*",
        "*--fusion-interpret=auto|on|off*", "*--fusion-examples=N*", "*--fusion-max-dim=N*",
        "*--fusion-repro=JSON*",
    ])


def test_markers_lists_fused_kernel_with_its_signature(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--markers")
    result.stdout.fnmatch_lines(["@pytest.mark.fused_kernel(reference, [*], inputs, dims, dtypes=*"])


def test_marker_works_under_strict_markers(pytester: pytest.Pytester) -> None:
    make(pytester, '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False)
def test_k():
    return torch_linear
''')
    pytester.runpytest_subprocess("--strict-markers").assert_outcomes(passed=1)


@pytest.mark.parametrize(
    "marker_args, message",
    [
        ('reference=linear, inputs={"x": ("M", "K")}, dims={"M": (1, 8), "K": (1, 8)}, dtype="float16"',
         "bad @pytest.mark.fused_kernel: unknown fused_kernel argument(s) dtype (did you mean: dtype -> dtypes?); accepted: reference, inputs"),
        ('reference=linear, inputs={"x": ("M", "Q")}, dims={"M": (1, 8)}',
         "inputs['x'] uses shape symbol 'Q', which is missing from dims (declared: M)"),
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (8, 1)}',
         "dims['M'] = (8, 1): need 1 <= low <= high"),
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (1, 8)}, dtypes=("float64",)',
         "dtypes: unsupported dtype 'float64'; choose from float16, bfloat16, float32"),
        ('reference=None, inputs={"x": ("M",)}, dims={"M": (1, 8)}',
         "reference must be a callable"),
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (1, 8)}, bench={"big": dict(M=0)}',
         "bench['big']['M'] must be an int >= 1, got 0"),
        ('reference=linear, inputs={"x": ("M", "k")}, dims={"M": (1, 8), "K": (1, 8)}',
         "inputs['x'] uses shape symbol 'k', which is missing from dims (declared: M, K) (did you mean 'K'?)"),
        # Bench-only arguments: without these checks each passed collection and the correctness
        # items, and failed only under --fusion-bench (or, for a floor, was never checked at all).
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (1, 8)}, tolerance=5',
         "bad @pytest.mark.fused_kernel: tolerance must be a fraction in [0, 1), got 5 (0.05 = 5%)"),
        ('reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")}, dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, '
         'providers={"liger": linear}, min_speedup={"ligr": 1.2}',
         "min_speedup names provider 'ligr', which is not one (did you mean 'liger'?); providers: eager, compile, liger"),
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (1, 8)}, flops=lambda M, K, N: 2 * M * K * N',
         "flops needs 'K', which is not a dims symbol; it is called with M"),
        ('reference=linear, inputs={"x": ("M",)}, dims={"M": (1, 8)}, bench={"big": dict(M=8)}, '
         'bytes=lambda M, itemsize: M * itemsize // 0',
         "bytes raised ZeroDivisionError: integer division or modulo by zero on bench['big']"),
        ('reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")}, dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, '
         'providers={"liger": lambda x: x}',
         "providers['liger'] cannot be called as the kernel is, liger(x, weight): too many positional arguments"),
        # A dims symbol no input uses is never drawn into a tensor: a typo or a forgotten input.
        ('reference=linear, inputs={"x": ("M", "K")}, dims={"M": (1, 8), "K": (1, 8), "Z": (1, 4)}',
         "dims declares 'Z', which no input uses (inputs use: M, K)"),
        ('reference=linear, inputs={"x": ("M", "K")}, dims={"M": (1, 8), "K": (1, 8), "KK": (1, 4)}',
         "dims declares 'KK', which no input uses (inputs use: M, K) (did you mean 'K'?)"),
    ],
    ids=["unknown-argument", "missing-symbol", "bad-range", "bad-dtype", "no-reference", "bad-bench",
         "symbol-case", "tolerance-percent", "min-speedup-provider", "flops-symbol", "bytes-raises",
         "provider-signature", "unused-symbol", "unused-symbol-typo"],
)
def test_bad_marker_is_a_clear_collection_error(pytester: pytest.Pytester, marker_args: str, message: str) -> None:
    make(pytester, f'''
@pytest.mark.fused_kernel({marker_args})
def test_k():
    return torch_linear
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(errors=1)
    assert message in result.stdout.str()
    out = result.stdout.str()
    assert "pytest_fusion/declare/spec.py" not in out and "During handling" not in out  # no plugin traceback
    assert "pytest_fusion/declare/marker.py" not in out


MARKED = '''
@pytest.mark.fused_kernel(reference={reference}, inputs={{"x": ("M", "K"), "weight": ("N", "K")}},
                          dims={{"M": (1, 16), "K": (1, 16), "N": (1, 16)}}, dtypes=("float32",),
                          triton=False{extra})
def test_k():
    {body}
'''


def run_marked(pytester: pytest.Pytester, body: str, reference: str = "linear", extra: str = "", prelude: str = ""):
    make(pytester, prelude + MARKED.format(body=body, reference=reference, extra=extra))
    return pytester.runpytest_subprocess("-p", "no:cacheprovider")


def test_kernel_that_raises_is_a_crash_not_a_mismatch(pytester: pytest.Pytester) -> None:
    result = run_marked(pytester, '''def kernel(x, weight):
        raise RuntimeError("out of shared memory: 232448 bytes needed")
    return kernel''')
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] crash: the kernel raised RuntimeError: out of shared memory*",
                                 "*dims  *M=1 K=1 N=1*"])
    assert "[pytest-fusion] mismatch" not in result.stdout.str()


def test_reference_that_raises_blames_the_reference(pytester: pytest.Pytester) -> None:
    prelude = '''
def broken_reference(x, weight):
    raise ValueError("reference bug")
'''
    result = run_marked(pytester, "return torch_linear", reference="broken_reference", prelude=prelude)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] reference raised: the reference raised ValueError: reference bug*"])


def test_wrong_shape_and_wrong_dtype_are_bad_outputs(pytester: pytest.Pytester) -> None:
    result = run_marked(pytester, "return lambda x, w: torch_linear(x, w).t()")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] bad output: output 0 has shape (*), the reference (*)*"])
    result = run_marked(pytester, "return lambda x, w: torch_linear(x, w).double()")
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] bad output: output 0 has dtype torch.float64, the reference gives torch.float32*"])


def test_test_that_returns_no_kernel(pytester: pytest.Pytester) -> None:
    result = run_marked(pytester, "pass")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*a fused_kernel test must return the kernel under test (a callable), got None*"])


NOISY = '''def kernel(x, weight):
        out = torch_linear(x, weight)
        noisy = out + torch.rand_like(out) * 2e-7 * out.abs()  # up to ~2 ulp: within budget, not bitwise stable
        # -inf + inf * rand would be NaN (special values); the exact tier's integer sums come out exact
        # in any summation order, so summation-order noise has none to add there
        return torch.where(out.isfinite() & (out != out.round()), noisy, out)
    return kernel'''


def test_nondeterminism_warns_by_default_and_fails_when_asked(pytester: pytest.Pytester) -> None:
    result = run_marked(pytester, NOISY)
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines(["*NondeterminismWarning: two runs of the kernel on the same inputs differ bitwise*"])
    result = run_marked(pytester, NOISY, "linear", ", deterministic=True")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] nondeterministic: two runs of the kernel*"])


def test_bf16_torch_kernel_with_large_outputs_passes(pytester: pytest.Pytester) -> None:
    # Outputs reach |v| ~ 30 and beyond: an atol-only policy would flake here, the ulp budget does not.
    make(pytester, '''
import pytest_fusion

@pytest.mark.fused_kernel(reference=linear,
                          inputs={"x": pytest_fusion.Tensor(("M", "K"), scale=30.0), "weight": ("N", "K")},
                          dims={"M": (1, 48), "K": (1, 48), "N": (1, 48)}, dtypes=("bfloat16",), triton=False,
                          max_examples=100)
def test_k():
    return torch_linear

def test_outputs_are_large():
    x = torch.randn(48, 48) * 30
    w = torch.randn(48, 48) / 48 ** 0.5
    assert torch_linear(x.bfloat16(), w.bfloat16()).abs().max() > 30
''')
    pytester.runpytest_subprocess("-p", "no:cacheprovider").assert_outcomes(passed=2)


def test_bf16_triton_checks_are_skipped_visibly_under_the_interpreter(pytester: pytest.Pytester) -> None:
    make(pytester, '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32", "bfloat16"))
def test_k():
    return torch_linear
''')
    result = pytester.runpytest_subprocess("-rs", "--fusion-interpret=on")
    result.assert_outcomes(passed=1, skipped=1)
    result.stdout.fnmatch_lines([
        "*pytest-fusion: 1 bfloat16 check(s) skipped under the Triton interpreter*",
        "*SKIPPED*bfloat16 not checked: the Triton interpreter computes bf16 arithmetic and tl.dot wrongly (triton issue 11584)*",
    ])


@pytest.mark.parametrize("flag, env, seen", [
    ([], None, None if cuda_visible() else "1"),  # auto: on exactly when no CUDA device is visible
    (["--fusion-interpret=off"], None, "0"),
    (["--fusion-interpret=on"], "0", "1"),        # the option beats the environment
    ([], "0", "0"),                               # auto keeps the user's own setting
])
def test_interpreter_is_decided_before_conftest_imports(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, flag: list[str], env: str | None, seen: str
) -> None:
    if env is None:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    else:
        monkeypatch.setenv("TRITON_INTERPRET", env)
    pytester.makeconftest("import os\nSEEN = os.environ.get('TRITON_INTERPRET')\n")
    pytester.makepyfile(test_env=f"import conftest\ndef test_seen():\n    assert conftest.SEEN == {seen!r}\n")
    result = pytester.runpytest_subprocess(*flag)
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["pytest-fusion: Triton kernels: *"])


def test_bad_option_values_are_usage_errors(pytester: pytest.Pytester) -> None:
    result = pytester.runpytest_subprocess("--fusion-examples=0")
    result.stderr.fnmatch_lines(["*--fusion-examples*expected an integer >= 1, got 0*"])
    pytester.makeini("[pytest]\nfusion_max_dim = lots\n")
    result = pytester.runpytest_subprocess()
    result.stderr.fnmatch_lines(["*pytest-fusion: bad value 'lots' in ini option fusion_max_dim*"])


def test_max_dim_caps_drawn_dims_on_the_cpu(pytester: pytest.Pytester) -> None:
    make(pytester, '''
SEEN = []

def kernel(x, weight):
    SEEN.append(max(x.shape[0], x.shape[1], weight.shape[0]))
    return torch_linear(x, weight)

@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8192), "K": (1, 8192), "N": (1, 8192)}, dtypes=("float32",), triton=False)
def test_k():
    return kernel

def test_zz_cap_held():
    assert SEEN and max(SEEN) == 20
''')
    pytester.runpytest_subprocess("--fusion-max-dim=20", "-p", "no:randomly").assert_outcomes(passed=2)


COUNTED = '''
from pathlib import Path

def kernel(x, weight):
    with Path("calls.txt").open("a") as f:  # one line per kernel call, two calls per case
        f.write("call\\n")
    return torch_linear(x, weight)

@pytest.mark.fused_kernel(reference=linear, inputs={{"x": ("M", "K"), "weight": ("N", "K")}},
                          dims={{"M": (1, 64), "K": (1, 64), "N": (1, 64)}}, dtypes=("float32",),
                          triton=False{extra})
def test_k():
    return kernel
'''


def cases_run(pytester: pytest.Pytester, *args: str, extra: str = "") -> int:
    """Cases one fused_kernel test ran under ``args``: its kernel's calls, two per case."""
    make(pytester, COUNTED.format(extra=extra))
    pytester.runpytest_subprocess("-p", "no:cacheprovider", *args).assert_outcomes(passed=1)
    return len((pytester.path / "calls.txt").read_text().splitlines()) // 2


def test_a_markers_max_examples_wins_over_the_option(pytester: pytest.Pytester) -> None:
    # as --fusion-examples' help says; a budget of 1 would run the 3 edge cases and 1 drawn case
    assert cases_run(pytester, "--fusion-examples=1", extra=", max_examples=6") == 6


def test_the_option_sets_the_examples_of_a_marker_that_gives_none(pytester: pytest.Pytester) -> None:
    assert cases_run(pytester, "--fusion-examples=6") == 6  # the default would run 25


def test_fusion_fixture_checks_hand_written_tests(pytester: pytest.Pytester) -> None:
    make(pytester, '''
def test_good(fusion):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    fusion.check(torch_linear, linear, x, w)
    fusion.assert_close(torch_linear(x, w), linear, x, w)

def test_bad(fusion):
    x, w = torch.randn(5, 7), torch.randn(3, 7)
    fusion.assert_close(torch_linear(x, w) * 1.01, linear, x, w)
''')
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch: * elements of the output outside the error budget*"])


def test_a_failing_fusion_check_says_where_it_is_and_how_to_replay_it(pytester: pytest.Pytester) -> None:
    body = '''
def test_broken(fusion):
    x, w = torch.randn(5, 7), torch.randn(3, 7).t().contiguous().t()
    fusion.check(lambda x, w: torch_linear(x, w) * 1.01, linear, x, w)
'''
    written = pytester.makepyfile(test_x=HEADER + body)
    line = written.read_text().splitlines().index(
        "    fusion.check(lambda x, w: torch_linear(x, w) * 1.01, linear, x, w)") + 1
    result = pytester.runpytest_subprocess()
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] mismatch: * elements of the output outside the error budget (call 1 of 2)",
        f"  at       test_x.py:{line} (fusion.check)",
        "  dims     input0=(5, 7) input1=(3, 7)",
        "  dtype    float32",
        "  layouts  input0: contiguous (shape 5x7, strides (7, 1), offset 0)",
        "           input1: transposed (shape 3x7, strides (1, 3), offset 0)",
        "  repro:",
        "    python3 -m pytest test_x.py::test_broken",
    ])


def test_a_plain_api_failure_carries_its_case_and_repro() -> None:
    import torch

    from pytest_fusion import Case, KernelMismatch, check_case, check_kernel, make_spec

    spec = make_spec(torch.relu, inputs={"x": ("M",)}, dims={"M": (1, 8)}, dtypes=("float32",), triton=False)
    with pytest.raises(KernelMismatch) as failed:
        check_kernel(spec, lambda x: torch.relu(x) + 1, device="cpu", max_examples=3)
    assert isinstance(failed.value.case, Case) and failed.value.case.dims == {"M": 1}
    case = Case({"M": 3}, "float32", {"x": "contiguous"}, seed=5)
    with pytest.raises(KernelMismatch) as failed:
        check_case(spec, lambda x: torch.relu(x) + 1, case, device="cpu", repro=lambda c: f"    replay {c.seed}")
    assert failed.value.case == case and failed.value.repro == "replay 5"


def test_valid_bench_arguments_are_accepted(pytester: pytest.Pytester) -> None:
    # The checks above must not reject what a bench needs: a floor per provider, a flops callable of
    # some of the dims, a bytes callable taking itemsize, an extra provider called as the kernel is.
    make(pytester, '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False,
                          bench={"small": dict(M=4, K=8, N=8)}, tolerance=0.1,
                          flops=lambda M, K, N: 2 * M * K * N, bytes=lambda M, N, itemsize: M * N * itemsize,
                          providers={"unfused": linear}, min_speedup={"eager": 0.5, "unfused": 0.5})
def test_k():
    return torch_linear
''')
    pytester.runpytest_subprocess().assert_outcomes(passed=1)


BUGGY = '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False)
def test_buggy():
    return lambda x, weight: torch_linear(x, weight) * 1.01
'''


def test_repro_line_runs_from_a_subdirectory_of_the_rootdir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    # The rootdir (where tox.ini is) is above the directory the user runs pytest in: the node id
    # (mytests/test_mine.py::...) would not resolve there, the path relative to it does.
    pytester.makeini("[pytest]\n")
    tests = pytester.mkdir("mytests")
    (tests / "test_mine.py").write_text(HEADER + BUGGY)
    monkeypatch.chdir(tests)
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    args = repro_args(result.stdout.str())
    assert args[0] == "test_mine.py::test_buggy[float32]", args
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", *args)
    replay.assert_outcomes(failed=1)
    replay.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*"])
    assert "file or directory not found" not in replay.stdout.str() + replay.stderr.str()


def run_buggy_from_outside_the_rootdir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> pytest.RunResult:
    """The failing ``mytests/test_mine.py`` run from a directory beside the rootdir, not under it."""
    pytester.makeini("[pytest]\n")
    tests = pytester.mkdir("mytests")
    (tests / "test_mine.py").write_text(HEADER + BUGGY)
    monkeypatch.chdir(pytester.mkdir("elsewhere"))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "--rootdir", str(pytester.path), str(tests))
    result.assert_outcomes(failed=1)
    return result


def test_repro_line_from_outside_the_tests_changes_to_the_rootdir(pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    result = run_buggy_from_outside_the_rootdir(pytester, monkeypatch)
    command = repro_command(result.stdout.str())
    assert command[:6] == ["cd", str(pytester.path), "&&", *REPRO_PREFIX], command
    assert command[6] == "mytests/test_mine.py::test_buggy[float32]", command
    monkeypatch.chdir(command[1])
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", *command[6:])
    replay.assert_outcomes(failed=1)
    replay.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*"])


def test_the_printed_repro_line_runs_in_a_shell_with_the_interpreter_not_a_pytest_script(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    # A `pytest` script of another environment comes first on PATH (it fails loudly); the printed
    # line, pasted into a shell where this interpreter is `python3`, must replay the failure anyway.
    import os
    import subprocess
    import sys

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in (("python3", f'exec {sys.executable} "$@"'),
                       ("pytest", "echo 'a pytest of another environment'; exit 99")):
        (bin_dir / name).write_text(f"#!/bin/sh\n{body}\n")
        (bin_dir / name).chmod(0o755)
    result = run_buggy_from_outside_the_rootdir(pytester, monkeypatch)
    line = repro_line(result.stdout.str())  # cd <rootdir> && python3 -m pytest <node id> --fusion-repro=...
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(line, shell=True, cwd=pytester.path / "elsewhere", env=env, capture_output=True, text=True)
    out = done.stdout + done.stderr
    assert "of another environment" not in out and done.returncode == 1, out
    assert "[pytest-fusion] mismatch:" in out and "1 failed" in out, out


UNSORTED = '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (2, 8), "N": (2, 8), "K": (2, 8)}, dtypes=("float32",), triton=False)
def test_buggy():
    return lambda x, weight: torch_linear(x, weight) * 1.01
'''


def test_the_repro_payload_lists_dims_as_declared_and_replays_in_any_order(pytester: pytest.Pytester) -> None:
    import json

    make(pytester, UNSORTED)  # M, N, K: neither sorted nor the inputs' order
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1)
    args = repro_args(result.stdout.str())
    payload = json.loads(args[1].removeprefix("--fusion-repro="))
    assert list(payload["dims"]) == ["M", "N", "K"], payload
    assert list(payload["layouts"]) == ["x", "weight"], payload
    assert list(payload)[0] == "dims", payload
    # pasted with every key reversed, it replays the same case, printed in the declared order again
    pasted = {k: dict(reversed(v.items())) if isinstance(v, dict) else v for k, v in reversed(payload.items())}
    replay = pytester.runpytest_subprocess("-p", "no:cacheprovider", args[0], f"--fusion-repro={json.dumps(pasted)}")
    replay.assert_outcomes(failed=1)
    again = json.loads(repro_args(replay.stdout.str())[1].removeprefix("--fusion-repro="))
    assert again == payload and list(again["dims"]) == ["M", "N", "K"], again
    dims = [ln.split(None, 1)[1] for ln in failure_reports(replay.stdout.str()).splitlines()
            if ln.startswith("  dims  ")]
    assert dims == [" ".join(f"{k}={v}" for k, v in payload["dims"].items())], dims


def test_dims_too_large_for_the_gpu_fail_with_the_remedy_not_a_hang(
    pytester: pytest.Pytester, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A GPU seen from this CPU machine: the check is refused before any tensor is made, so nothing
    # else of CUDA is reached (a real GPU would first swap 160 GB of float32 draws on the host).
    import torch

    from pytest_fusion.oracle import memory

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(memory, "device_total_bytes", lambda device: 80 * 10**9)
    make(pytester, '''
@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")}, device="cuda",
                          dims={"M": (1, 200000), "K": (1, 200000), "N": (1, 64)}, dtypes=("float32",), triton=False)
def test_k():
    return torch_linear
''')
    result = pytester.runpytest_inprocess("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*test_it.py::test_k[[]float32[]]: the declared dims reach a case too large to check on cuda: at "
        "M=200000 K=200000 N=64 (float32) the check holds about * GB at its peak (inputs, their float64 "
        "golden, eager, both kernel calls' outputs and the comparison) of the device's 80.0 GB. Declare "
        "smaller dims, or cap every drawn dim with --fusion-max-dim (check_kernel's max_dim).",
    ])
    assert "Traceback" not in result.stdout.str()


def test_hypothesis_own_failing_case_line_names_each_field(pytester: pytest.Pytester) -> None:
    # wrong only where the inputs hold NaN: found by a drawn case, whose build Hypothesis prints
    result = run_marked(pytester, "return lambda x, w: torch_linear(x, w).nan_to_num()")
    result.assert_outcomes(failed=1)
    out = result.stdout.str()
    example = out[max(out.find("Falsifying example:"), out.find("Failing test case:")):]
    assert "fused_kernel_property(" in example, out
    for field in ("dims=", "layouts=", "seed="):  # not bare positional dicts and numbers
        assert field in example.split("\n)", 1)[0], example
