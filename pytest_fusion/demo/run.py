"""``python3 -m pytest_fusion demo``: run the main job on the shipped demo kernels, step by step.

Each step is one pytest run (a subprocess, as a user would type it) over a copy of
:mod:`pytest_fusion.demo.test_demo` in a temporary directory, so nothing is written where the demo
is started and the user's own pytest configuration is not read. A step passes when pytest's exit
code is the one the step expects: the planted bug and the planted slowdown must fail.
"""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DEMO_FILE = Path(__file__).with_name("test_demo.py")
PYTEST_FAILED = 1
"""pytest's exit code when tests failed (``pytest.ExitCode.TESTS_FAILED``)."""

FAILURE_HEADER = "[pytest-fusion] "
"""How a check failure's header line begins (``[pytest-fusion] <kind>: <headline>``, from
``pytest_fusion.oracle.failures``; the case's dims, dtype, layouts and repro follow it)."""

GATE_HEADER = "failed the performance gate:"
"""How a gate failure's first line ends (``<test id> [<case>-<dtype>] failed the performance gate:``)."""


@dataclasses.dataclass(frozen=True)
class Step:
    """One pytest run of the demo: what it shows, its arguments, the exit code it must end with."""

    title: str
    args: tuple[str, ...]
    expect: int = 0
    env: tuple[tuple[str, str], ...] = ()
    start: str = ""
    """Where the shown excerpt of pytest's output begins: at the failure whose header line holds
    this text (:func:`excerpt`; empty: all the output)."""


def excerpt(lines: list[str], start: str) -> list[str]:
    """``lines`` from the first that holds ``start`` to the end, with pytest's banner of that
    failure (``____ test_k[float32] ____``, the test's name) when it is the line above; all of
    them when ``start`` is empty or no line holds it, so that an unexpected run is shown whole."""
    first = next((i for i, line in enumerate(lines) if start and start in line), 0)
    if first and lines[first - 1].startswith("_") and lines[first - 1].endswith("_"):
        first -= 1
    return lines[first:]


def steps(baselines: Path) -> list[Step]:
    """The demo's steps; ``baselines`` is the temporary directory its baseline file goes into."""
    base = ("-p", "no:cacheprovider", "-p", "no:randomly", "-p", "no:benchmark", "-q")
    bench = ("--fusion-bench", "--fusion-baseline-dir", str(baselines), "-k", "bench-",
             "--fusion-tolerance=0.10", "--fusion-cpu-clock=process")
    return [
        Step("1. check the kernels against their eager references (Hypothesis draws dims, dtypes, layouts)",
             (*base, "-k", "not bench- and not planted_bug")),
        Step("2. a planted bug: a kernel that ignores its input's strides, caught and shrunk",
             (*base, "-k", "planted_bug", "-W", "ignore"), expect=PYTEST_FAILED, start=FAILURE_HEADER),
        Step("3. time the kernels against eager and torch.compile, and save the speedups as a baseline",
             (*base, *bench, "--fusion-save")),
        Step("4. the gate: the same kernel doing its GEMM three times fails against the saved baseline",
             (*base, *bench), expect=PYTEST_FAILED, env=(("PYTEST_FUSION_DEMO_SLOWER", "1"),),
             start=GATE_HEADER),
    ]


def shown_command(step: Step) -> str:
    """The shell line a user can paste in the demo's directory to run ``step`` again: its
    environment, ``python3 -m pytest``, its arguments quoted, the demo's test file."""
    env = "".join(f"{k}={shlex.quote(v)} " for k, v in step.env)
    return env + shlex.join(["python3", "-m", "pytest", *step.args, DEMO_FILE.name])


def run_step(step: Step, workdir: Path) -> bool:
    """Run one step in ``workdir``, print its output; True when it ended as expected."""
    print(f"\n== {step.title}\n$ {shown_command(step)}", flush=True)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), **dict(step.env)}
    env.pop("PYTEST_ADDOPTS", None)
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "pytest", *step.args, DEMO_FILE.name], cwd=workdir,
                          env=env, capture_output=True, text=True)
    lines = (done.stdout + done.stderr).rstrip().splitlines()
    print("\n".join(excerpt(lines, step.start)))
    ok = done.returncode == step.expect
    verdict = "as expected" if ok else f"UNEXPECTED: pytest exited {done.returncode}, expected {step.expect}"
    print(f"-- {verdict} ({time.monotonic() - started:.0f} s)", flush=True)
    return ok


NEXT = """
Next:
  - the demo's tests, to read and copy: {demo}
  - write your own: README.md, "A first test"; `pytest --markers` prints the marker's signature
  - the oracle's policy: docs/oracle.md; the timing method and the gate: docs/timing-and-gate.md
"""


def main(argv: list[str] | None = None) -> int:
    """Run the demo's steps; 0 when every step ended as expected, 1 otherwise."""
    import argparse

    parser = argparse.ArgumentParser(prog="python3 -m pytest_fusion demo",
                                     description="The main job on the shipped demo kernels, step by step.")
    parser.add_argument("--keep", metavar="DIR",
                        help="run in DIR (created) and keep it, instead of a temporary directory")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="pytest-fusion-demo-") as tmp:
        workdir = Path(args.keep or tmp)
        workdir.mkdir(parents=True, exist_ok=True)
        shutil.copy(DEMO_FILE, workdir / DEMO_FILE.name)
        (workdir / "pytest.ini").write_text("[pytest]\n")  # the demo's rootdir: no user configuration
        kept = "" if args.keep else (" (removed at the end; --keep DIR runs in DIR and keeps it, to paste "
                                     "the commands shown)")
        print(f"pytest-fusion demo in {workdir}{kept}")
        results = [run_step(step, workdir) for step in steps(workdir / "baselines")]
        print(NEXT.format(demo=workdir / DEMO_FILE.name if args.keep else DEMO_FILE))
    if all(results):
        print("demo: every step ended as expected")
        return 0
    print("demo: a step did not end as expected (above)", file=sys.stderr)
    return 1
