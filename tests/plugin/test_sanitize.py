"""``--fusion-sanitize``: a failing or named check case run again under compute-sanitizer in the
replay's child process, the tool's reports in the outcome; skipped with its reason where it cannot run.

On the CPU the tool is a fake ``compute-sanitizer`` on PATH that runs the child command it is given
and writes a memcheck-format log; the GPU test runs the real one on a planted out-of-bounds write."""

import json
import os
import re
import shutil
import sys
import textwrap

import pytest

# In-process pytester runs drop modules first imported inside them from sys.modules afterwards;
# torch cannot be imported twice in one process (the second import crashes), so import it here.
import torch
import triton  # noqa: F401

import pytest_fusion.plugin.fixture  # noqa: F401  (imported here for the same reason)
from pytest_fusion.plugin import sanitize
from pytest_fusion.plugin.config import REPLAY_SETTINGS_ENV

KERNEL = textwrap.dedent(
    """
    import pytest, torch

    @pytest.mark.fused_kernel(reference=torch.relu, inputs={"x": ("N",)}, dims={"N": (1, 64)},
                              dtypes=("float32",), triton=False, special_values=False)
    def test_relu():
        def kernel(x):
            y = torch.relu(x)
            if BROKEN and x.numel() >= 5:
                y[4] += 1.0  # a wrong element from N = 5 on
            return y
        return kernel
    """
)

MEMCHECK_LOG = """\
========= COMPUTE-SANITIZER
========= Invalid __global__ write of size 4 bytes
=========     at copy_kernel+0x1b0 in /src/test_oob.py:12
=========     by thread (7,0,0) in block (0,0,0)
=========     Address 0x7f3a8e000220 is out of bounds
=========     and is 1 bytes after the nearest allocation at 0x7f3a8e000200 of size 31 bytes
=========     Saved host backtrace up to driver entry point at kernel launch time
=========         Host Frame: cuLaunchKernel [0x2dbf1a] in libcuda.so.1
=========         Host Frame: _launch [0x1c4f] in __triton_launcher.so
=========
========= ERROR SUMMARY: {errors} error{plural}
"""
"""A log as memcheck writes it (NVIDIA's compute-sanitizer guide, "Understanding Memcheck Errors")."""

FAKE_TOOL = """\
#!{python}
'''A stand-in for compute-sanitizer: runs the command after its options, records what it ran with,
and writes MEMCHECK_LOG with $FAKE_SANITIZER_ERRORS errors to --log-file.'''
import json, os, subprocess, sys
args, opts = sys.argv[1:], {{}}
while args[0].startswith("--"):
    opts[args[0]], args = args[1], args[2:]
done = subprocess.run(args, capture_output=True, text=True)
with open(os.environ["FAKE_SANITIZER_RECORD"], "w") as f:
    json.dump({{"opts": opts, "argv": args, "no_caching": os.environ.get("PYTORCH_NO_CUDA_MEMORY_CACHING"),
               "settings": json.loads(os.environ["{settings_env}"]), "stdout": done.stdout}}, f)
errors = int(os.environ["FAKE_SANITIZER_ERRORS"])
with open(opts["--log-file"], "w") as f:
    f.write({log!r}.format(errors=errors, plural="" if errors == 1 else "s"))
sys.exit(done.returncode)
"""


def write_kernel(pytester: pytest.Pytester, broken: bool) -> None:
    pytester.makepyfile(test_k=f"BROKEN = {broken}\n" + KERNEL)


@pytest.fixture
def fake_tool(pytester, monkeypatch, cpu_only):
    """A fake compute-sanitizer first on PATH, this process taken for one with a GPU: the record
    of what the tool ran (a JSON file) is returned once read."""
    bin_dir = pytester.mkdir("fake-bin")
    tool = bin_dir / "compute-sanitizer"
    tool.write_text(FAKE_TOOL.format(python=sys.executable, settings_env=REPLAY_SETTINGS_ENV, log=MEMCHECK_LOG))
    tool.chmod(0o755)
    record = pytester.path / "sanitizer-record.json"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SANITIZER_RECORD", str(record))
    monkeypatch.setenv("FAKE_SANITIZER_ERRORS", "1")
    monkeypatch.setattr(sanitize, "unavailable", lambda: "")
    return record


def test_report_lines_keep_the_errors_and_count_and_drop_host_frames():
    count, lines = sanitize.report_lines(MEMCHECK_LOG.format(errors=3, plural="s"))
    assert count == 3
    assert lines[0] == "Invalid __global__ write of size 4 bytes"
    assert "    Address 0x7f3a8e000220 is out of bounds" in lines
    assert not [line for line in lines if "Host Frame" in line or "backtrace" in line or "SANITIZER" in line]
    assert sanitize.report_lines("========= COMPUTE-SANITIZER\nSegmentation fault\n")[0] is None  # unfinished


def test_unavailable_names_the_missing_gpu_then_the_missing_tool(monkeypatch, tmp_path):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert "no CUDA GPU is visible" in sanitize.unavailable()
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setenv("CUDA_HOME", str(tmp_path))
    monkeypatch.setattr(sanitize, "CUDA_ROOTS", ())
    assert "compute-sanitizer was not found on PATH" in sanitize.unavailable()
    tool = tmp_path / "bin" / "compute-sanitizer"
    tool.parent.mkdir()
    tool.write_text("#!/bin/sh\n")
    tool.chmod(0o755)
    assert sanitize.find_tool() == str(tool) and sanitize.unavailable() == ""  # $CUDA_HOME/bin


def test_without_a_gpu_a_named_case_is_skipped_and_a_failure_says_why_it_was_not_sanitized(pytester, cpu_only):
    write_kernel(pytester, broken=False)
    result = pytester.runpytest_inprocess("-k", "relu", "--fusion-sanitize=memcheck", "-rs", "-p", "no:randomly")
    result.assert_outcomes(skipped=1)
    result.stdout.fnmatch_lines(
        ["*the check passed; --fusion-sanitize=memcheck not run: no CUDA GPU is visible*"])
    pytester.runpytest_inprocess("--fusion-sanitize=memcheck", "-p", "no:randomly").assert_outcomes(passed=1)

    write_kernel(pytester, broken=True)
    result = pytester.runpytest_inprocess("--fusion-sanitize=racecheck", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] mismatch:*",
                                 "*[[]pytest-fusion] not run under compute-sanitizer racecheck: no CUDA GPU is visible*"])


def test_a_failing_case_runs_again_under_the_tool_with_its_repro_and_the_caching_allocator_off(
    pytester, fake_tool
):
    write_kernel(pytester, broken=True)
    result = pytester.runpytest_inprocess("--fusion-sanitize=memcheck", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] mismatch:*",
        "*[[]pytest-fusion] compute-sanitizer memcheck on this case (a fresh process, PyTorch's caching "
        "allocator off): 1 error",
        "    Invalid __global__ write of size 4 bytes",
        "        Address 0x7f3a8e000220 is out of bounds",
        "  rerun:",
        "    PYTORCH_NO_CUDA_MEMORY_CACHING=1 compute-sanitizer --tool memcheck python3 -m pytest "
        "'test_k.py::test_relu[[]float32]' --fusion-repro=*",
    ])
    assert "Host Frame" not in result.stdout.str()
    printed = re.search(r"--fusion-repro='(\{.*?\})'", result.stdout.str())
    assert printed, result.stdout.str()
    ran = json.loads(fake_tool.read_text())
    assert ran["opts"]["--tool"] == "memcheck" and ran["no_caching"] == "1"
    assert ran["argv"][1:4] == ["-m", "pytest", str(pytester.path / "test_k.py") + "::test_relu[float32]"]
    assert ran["settings"]["repro"] == json.loads(printed.group(1))  # the shrunk case, not a new search
    assert ran["settings"]["sanitize"] is None and ran["settings"]["save"] is False
    assert "1 failed" in ran["stdout"] and "mismatch" in ran["stdout"]  # the child reproduced the failure


def test_a_named_passing_case_fails_only_when_the_tool_reports_an_error(pytester, fake_tool, monkeypatch):
    write_kernel(pytester, broken=False)
    result = pytester.runpytest_inprocess("-k", "relu", "--fusion-sanitize=initcheck", "-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] compute-sanitizer initcheck on the property test (a fresh process*: 1 error",
        "    Invalid __global__ write of size 4 bytes",
        "*(the check itself passed)",
    ])
    ran = json.loads(fake_tool.read_text())
    assert ran["opts"]["--tool"] == "initcheck" and ran["settings"]["repro"] is None
    assert "1 passed" in ran["stdout"]

    monkeypatch.setenv("FAKE_SANITIZER_ERRORS", "0")
    result = pytester.runpytest_inprocess("-k", "relu", "--fusion-sanitize=initcheck", "-rP", "-p", "no:randomly")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*compute-sanitizer initcheck on the property test*: 0 errors"])

    fake_tool.unlink()
    pytester.runpytest_inprocess("--fusion-sanitize=initcheck", "-p", "no:randomly").assert_outcomes(passed=1)
    assert not fake_tool.exists()  # not named, not failing: the tool does not run


OOB_KERNEL = textwrap.dedent(
    """
    import pytest, torch, triton, triton.language as tl

    @triton.jit
    def _copy_kernel(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        x = tl.load(x_ptr + offs, mask=offs < n, other=0.0)
        tl.store(out_ptr + offs, x)  # the planted fault: no mask, BLOCK - n elements written past out

    def copy(x):
        x = x.contiguous()
        out = torch.empty_like(x)
        _copy_kernel[(triton.cdiv(x.numel(), 1024),)](x, out, x.numel(), BLOCK=1024)
        return out

    @pytest.mark.fused_kernel(reference=lambda x: x.clone(), inputs={"x": ("N",)}, dims={"N": (1, 64)},
                              dtypes=("float32",), special_values=False, max_examples=3)
    def test_copy():
        return copy
    """
)


@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("compute-sanitizer") is None,
                    reason="needs a CUDA GPU and compute-sanitizer on PATH")
def test_memcheck_reports_a_planted_out_of_bounds_write_on_the_gpu(pytester):
    path = pytester.makepyfile(test_oob=OOB_KERNEL)
    store_line = next(i for i, line in enumerate(path.read_text().splitlines(), 1) if "tl.store" in line)
    result = pytester.runpytest_subprocess("-k", "copy", "--fusion-sanitize=memcheck", "-p", "no:randomly",
                                           timeout=1800)
    result.assert_outcomes(failed=1)  # the oracle may or may not see the write; memcheck does
    # Triton may vectorize the store (16-byte writes on an H100), so the width is not pinned
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] compute-sanitizer memcheck on *: [1-9]* error*",
                                 "*Invalid __global__ write of size * bytes*",
                                 f"*at _copy_kernel* in test_oob.py:{store_line}"])
