"""Shared helpers for the plugin's own tests."""

from __future__ import annotations

import os
import re
import shlex
import sys
from typing import Iterator
from pathlib import Path

import pytest

if os.environ.get("PYTEST_XDIST_WORKER"):
    # xdist's workers are this suite's parallelism; each one also starting Inductor's pool of a
    # compile process per core (14 workers x 16 on a GPU machine) oversubscribes the CPUs.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")

# Imported here, once, so that in-process pytester runs find them in the sys.modules snapshot they
# restore afterwards: a second import of torch's C extension in one process crashes it.
import torch
import torch._dynamo  # noqa: F401  (torch imports it lazily on first dispatch-mode use)
import triton  # noqa: F401

PLUGIN_KERNELS = Path(__file__).parent / "plugin_kernels"


def _interpreter_loops_work() -> bool:
    """Whether this Triton's interpreter can run a loop whose bound is a kernel argument: Triton
    3.6's converts the bound with ``int(array)``, which numpy >= 2.4 refuses
    (triton-lang/triton#9171; later Triton squeezes the array first)."""
    import inspect

    import numpy
    from triton.runtime import interpreter

    if tuple(int(p) for p in numpy.__version__.split(".")[:2]) < (2, 4):
        return True
    return "int(self.handle.data))" not in inspect.getsource(interpreter)


interpreter_loops = pytest.mark.skipif(
    not _interpreter_loops_work(),
    reason="this Triton's interpreter cannot run a loop over a kernel argument with numpy >= 2.4 "
    "(triton-lang/triton#9171): install numpy<2.4 or a later Triton (3.9 has the fix)",
)
"""For tests that interpret a kernel looping over a runtime bound (faulty_linear's and
hygiene_kernels' K loops)."""


@pytest.fixture(scope="session", autouse=True)
def inductor_imported(request: pytest.FixtureRequest) -> None:
    """Inductor's modules imported before any in-process pytester run that torch.compiles: such a
    run drops the modules first imported inside it, and some register global state at import (the
    mega-cache's "Artifact of type=autotune already registered" on a second import). A build with
    Inductor's caches off (an independent compile build) imports modules a cached build does not,
    and a GPU's code generation others than the CPU's: each kind is built here once.

    Only in a session that has pytester tests: the builds take about a minute on a GPU machine,
    which a benchmark run of the reference kernels (and each gate replay of one) would wait for."""
    if not any("pytester" in getattr(item, "fixturenames", ()) for item in request.session.items):
        return
    from pytest_fusion.measure.providers import make_providers

    for device in ("cpu", "cuda") if torch.cuda.is_available() else ("cpu",):
        x = torch.ones(2, device=device)
        make_providers(torch.relu, lambda t: torch.relu(t) + 1, (x,), requested=("compile",), compile_builds=2)


@pytest.fixture(autouse=True)
def interpreter_setting_kept() -> Iterator[None]:
    """Each test leaves ``TRITON_INTERPRET`` as it found it: on a GPU machine a test that leaves it
    at 1 makes every later test of its worker run Triton kernels interpreted on CUDA tensors, which
    crash far from the test that caused it (on the CPU it is 1 all along, so nothing shows).
    Defined before every fixture that takes ``monkeypatch``, so it is torn down after its undo."""
    before = os.environ.get("TRITON_INTERPRET")
    yield
    after = os.environ.get("TRITON_INTERPRET")
    if after != before:
        os.environ.pop("TRITON_INTERPRET", None) if before is None else os.environ.update(TRITON_INTERPRET=before)
        pytest.fail(f"the test left TRITON_INTERPRET={after!r}; it was {before!r} (restored)", pytrace=False)


@pytest.fixture(autouse=True)
def no_replay_in_pytester_runs(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Pytester runs of this suite keep their first gate verdict (``$PYTEST_FUSION_REPLAY=off``):
    a replay is a second pytest process per failing case, and most tests here fail the gate on
    purpose to check its message. The replay's own tests turn it on with ``--fusion-replay=on``."""
    if "pytester" in request.fixturenames:
        monkeypatch.setenv("PYTEST_FUSION_REPLAY", "off")


@pytest.fixture
def cpu_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pytester runs as on a machine without a GPU, for tests that assert CPU or Triton-interpreter
    behaviour (CPU timing, the interpreter's per-dim cap, its first-config autotune pick).

    In-process runs share this process's torch: ``torch.cuda.is_available`` answers False, so the
    plugin picks the CPU, and ``TRITON_INTERPRET=1`` makes ``@triton.jit`` modules imported by the
    run interpreted. Subprocess runs (``runpytest_subprocess``, a printed repro replayed) inherit
    ``CUDA_VISIBLE_DEVICES=""``, which hides every GPU from their CUDA runtime. This process's
    runtime is initialised first where a GPU is visible: it reads ``CUDA_VISIBLE_DEVICES`` once, at
    initialisation, and must not lose its GPU for the tests that run after this one.
    """
    if torch.cuda.is_available():
        torch.cuda.init()
        # This process's Triton driver is set up for the GPU ("0 active drivers" when an in-process
        # run then interprets a kernel): runs go to a subprocess, which sees no GPU.
        monkeypatch.setattr(pytest.Pytester, "runpytest", pytest.Pytester.runpytest_subprocess)
    # A kernel module this process already imported for the GPU would be reused by an in-process
    # run (pytester keeps the modules it finds): drop it, so the run imports it interpreted.
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", "") or "").startswith(str(PLUGIN_KERNELS)):
            monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.fixture
def fusion_pytester(pytester: pytest.Pytester) -> pytest.Pytester:
    """A pytester whose directory holds the fault-switchable Triton kernel (faulty_linear.py)."""
    pytester.makepyfile(faulty_linear=(PLUGIN_KERNELS / "faulty_linear.py").read_text())
    return pytester


def failure_reports(output: str) -> str:
    """The FAILURES part of a pytest run's output: the short summary repeats each message in full
    when pytest runs under CI=true, and would count every failure twice."""
    return output.split("short test summary info")[0]


def shrunk_dims(output: str, which: int = -1) -> dict[str, int]:
    """The dims of a failing case printed by pytest-fusion (``dims     M=1 K=3 N=2``): the last
    one by default, ``which=0`` for the first."""
    lines = re.findall(r"^\s*dims\s+((?:\w+=\d+\s*)+)$", failure_reports(output), flags=re.M)
    assert lines, f"no 'dims' line in the output:\n{output}"
    return {k: int(v) for k, v in (pair.split("=") for pair in lines[which].split())}


REPRO_PREFIX = ["python3", "-m", "pytest"]
"""How a printed repro line runs pytest (``pytest_fusion.plugin.fixture.PYTEST_COMMAND``, split)."""


def repro_line(output: str, which: int = 0) -> str:
    """The repro line a failure printed, as printed (``[cd DIR && ]python3 -m pytest <node id>
    --fusion-repro='...' [--fusion-all-configs]``, indent dropped): the first by default."""
    lines = re.findall(r"^\s*((?:cd .+ && )?python3 -m pytest .+ --fusion-repro=.+)$", output, flags=re.M)
    assert lines, f"no repro line in the output:\n{output}"
    return lines[which]


def repro_command(output: str, which: int = 0) -> list[str]:
    """:func:`repro_line` split as a shell would (``cd DIR &&`` kept as words)."""
    return shlex.split(repro_line(output, which))


def repro_args(output: str, which: int = 0) -> list[str]:
    """The arguments of the printed repro line after ``python3 -m pytest`` (:func:`repro_command`,
    which must not start with ``cd``): what ``pytester.runpytest`` takes to run it as the line does,
    in pytester's directory."""
    command = repro_command(output, which)
    assert command[:3] == REPRO_PREFIX, command
    return command[3:]


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """On a GPU machine, the reference kernels' tests go first: their edge cases run at the full
    declared dims, one at a time per GPU (the check's large-case lock), so they are the suite's long
    pole, and xdist hands out tests in collection order: collected last, they would still be running
    when every other test is done."""
    if not torch.cuda.is_available():
        return
    items.sort(key=lambda item: item.path.name != "test_reference_kernels.py")  # stable: order kept within
