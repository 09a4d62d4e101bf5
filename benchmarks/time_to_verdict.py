#!/usr/bin/env python3
"""Time to verdict: how long pytest-fusion takes to say pass or fail, each aim's figure against its
target. A benchmark, not a test: it runs pytest in subprocesses and prints one line per aim.

    python3 benchmarks/time_to_verdict.py                         # every aim this machine can measure
    python3 benchmarks/time_to_verdict.py --aims overhead -v      # one aim, with its cases
    python3 benchmarks/time_to_verdict.py --ci --json ttv.json    # .ci/run's wall too; JSON for machines

The aims (docs/contributing.md, "Time to verdict"):

- ``overhead``: a bench case's harness seconds, outside its timed rounds and its torch.compile
  builds, at catalogued sizes (``reference_kernels.models.shapes``): item call wall - wall inside
  the rounds (``measure.rounds.run_rounds``: the samples and the input-set copies between them) -
  wall of the compile builds (``measure.providers.make_compiled``). On a GPU the reference kernels'
  bench cases; on a CPU the plugin's CPU bench path, a torch kernel (``triton=False``) at the same
  shapes. The first case of the run pays the session's one-time costs (device peaks, timers, the
  imports) and is reported apart. Target: 1 s per case.
- ``bench``: wall of the 114-case reference bench in gate mode, against a copy of ``baselines/``
  (GPU only). Target: 180 s.
- ``suite``: wall of the documented suite command (GPU: docs/contributing.md's; CPU: the README's
  ``python3 -m pytest -n auto``, the part of ``.ci/run`` that takes longest). Target: 240 s on a
  GPU; on a CPU, ``.ci/run``'s 480 s, which the suite alone must stay under.
- ``marker``: the README's first test at its declared dims (the reference ``linear_act``, gelu tanh),
  default examples, the slowest dtype (GPU only). Target: 20 s per dtype.
- ``ci`` (only with ``--ci``): wall of ``.ci/run`` (it pip-installs the project, editable, into the
  running Python: run it in the environment CI uses). Target: 480 s on the 2-core CPU machine.

Nothing of the repository is written: baselines go to temporary directories, and the bench aim
gates against a copy of ``baselines/``. Run it on a quiet machine: the figures are wall time.

This file is also the pytest plugin that measures the phases inside the subprocesses
(``-p time_to_verdict``, :class:`Phases`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable

import pytest

ROOT = Path(__file__).resolve().parent.parent
HERE = Path(__file__).resolve().parent
OUT_ENV = "TIME_TO_VERDICT_OUT"
"""Where the plugin inside a subprocess writes its per-item figures (a JSON path)."""

OVERHEAD_TARGET_S = 1.0
BENCH_TARGET_S = 180.0
GPU_SUITE_TARGET_S = 240.0
CI_TARGET_S = 480.0
MARKER_TARGET_S = 20.0

GPU_CASES = (
    ("test_linear_gelu_erf", "minilm-M1", "bfloat16"),  # first: pays the session's one-time costs
    ("test_mlp_gpt2", "gpt2-M1", "bfloat16"),
    ("test_gated_mlp_swiglu", "llama3-8b-M1", "bfloat16"),
    ("test_gated_mlp_swiglu", "llama3-70b-M1", "bfloat16"),
    ("test_gated_mlp_swiglu", "llama3-70b-M8192", "bfloat16"),
)
"""(test, bench case, dtype) of the GPU overhead run: tests/kernels/test_reference_kernels.py."""

CPU_CASES = ("minilm-M1", "gpt2-M1", "gpt2-M128", "llama3-8b-M1")
"""Bench cases of the CPU overhead run (the first pays the session's costs); ``--large`` adds
llama3-70b-M1 (about 10 GB of host memory)."""

GPU_SUITE = ["-m", "pytest", "-n", "14", "--dist", "worksteal", "--fusion-examples", "5"]
GPU_SUITE_ENV = {"REFERENCE_KERNELS_AUTOTUNE": "0"}
CPU_SUITE = ["-m", "pytest", "-n", "auto"]

CPU_PROBE = textwrap.dedent(
    '''
    """The plugin's CPU bench path at catalogued shapes: torch kernels, triton=False."""
    import pytest
    import torch.nn.functional as F
    from reference_kernels.kernels.eager import gated_act_eager, linear_act_eager
    from reference_kernels.models import shapes

    CASES = {cases!r}


    def _bench(kind):
        found = shapes.bench_cases(shapes.select(kind=kind), dtypes=("bfloat16",))
        return {{name: dims for name, dims in found.items() if name in CASES}}


    def linear_kernel(x, weight, bias, activation):
        return F.gelu(F.linear(x, weight, bias), approximate="tanh" if activation == "gelu_tanh" else "none")


    def gated_kernel(x, w_gate, w_up, activation):
        return F.silu(F.linear(x, w_gate)) * F.linear(x, w_up)


    DIMS = {{"M": (1, 8192), "K": (1, 8192), "N": (1, 28672)}}


    @pytest.mark.fused_kernel(
        reference=linear_act_eager, inputs={{"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)}},
        dims=DIMS, dtypes=("bfloat16",), constants={{"activation": "gelu_tanh"}}, triton=False,
        bench=_bench("plain"), flops=shapes.up_flops,
    )
    def test_plain():
        return linear_kernel


    @pytest.mark.fused_kernel(
        reference=gated_act_eager, inputs={{"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")}},
        dims=DIMS, dtypes=("bfloat16",), constants={{"activation": "silu"}}, triton=False,
        bench=_bench("gated"), flops=shapes.gated_flops,
    )
    def test_gated():
        return gated_kernel
    '''
)

README_MARKER = textwrap.dedent(
    '''
    """The README's first test, at its declared dims, on the reference linear_act kernel."""
    import pytest
    import torch.nn.functional as F
    from reference_kernels.kernels.linear_act import linear_act


    def linear_gelu(x, weight, bias):
        return F.gelu(F.linear(x, weight, bias), approximate="tanh")


    def fused_linear_gelu(x, weight, bias):
        return linear_act(x, weight, bias, "gelu_tanh")


    @pytest.mark.fused_kernel(
        reference=linear_gelu,
        inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
        dims={"M": (1, 8192), "K": (16, 8192), "N": (16, 16384)},
        dtypes=("float16", "bfloat16", "float32"),
        flops=lambda M, K, N: 2 * M * K * N,
    )
    def test_fused_linear_gelu():
        return fused_linear_gelu
    '''
)


# -- the plugin inside the subprocesses -------------------------------------------------------------


class Phases:
    """Per test item: the call's wall, and the wall spent inside the timed rounds and inside the
    torch.compile builds, in seconds; written to ``$TIME_TO_VERDICT_OUT`` at the session's end."""

    def __init__(self) -> None:
        self.items: dict[str, dict[str, float]] = {}
        self.current: dict[str, float] | None = None

    def _wrap(self, module: Any, name: str, phase: str) -> None:
        original = getattr(module, name)

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                if self.current is not None:
                    self.current[phase] = self.current.get(phase, 0.0) + time.perf_counter() - t0

        setattr(module, name, timed)

    def pytest_configure(self, config: Any) -> None:
        from pytest_fusion.measure import providers, timing

        self._wrap(timing, "run_rounds", "rounds_s")  # measure's rounds (the build pick's too)
        self._wrap(providers, "make_compiled", "compile_s")

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_call(self, item: Any) -> Any:
        self.current = self.items.setdefault(item.nodeid, {})
        t0 = time.perf_counter()
        try:
            return (yield)
        finally:
            self.current["call_s"] = time.perf_counter() - t0
            self.current = None

    def pytest_runtest_logreport(self, report: Any) -> None:
        entry = self.items.setdefault(report.nodeid, {})
        entry[f"{report.when}_outcome"] = report.outcome  # type: ignore[assignment]
        entry["duration_s"] = entry.get("duration_s", 0.0) + report.duration

    def pytest_sessionfinish(self, session: Any) -> None:
        out = os.environ.get(OUT_ENV)
        if out:
            Path(out).write_text(json.dumps(self.items, indent=1))


def pytest_configure(config: Any) -> None:
    """Loaded as a plugin (``-p time_to_verdict``): register the phase probe."""
    config.pluginmanager.register(Phases(), "time-to-verdict-phases")


# -- the driver ---------------------------------------------------------------------------------------


def cuda() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"python": platform.python_version(), "cpus": os.cpu_count(),
                            "processor": platform.processor() or platform.machine()}
    try:
        import torch

        info["torch"] = torch.__version__
        info["device"] = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu"
    except ImportError:
        info["device"] = "unknown (no torch)"
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                            text=True)
    info["commit"] = commit.stdout.strip() or None
    info["date"] = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    return info


def run(args: list[str], *, cwd: Path, env: dict[str, str] | None = None, probe: bool = False,
        timeout: float | None = None) -> tuple[float, int, str, dict[str, Any]]:
    """``python3 <args>`` in ``cwd``: (wall s, exit status, output tail, the probe's items)."""
    full_env = {**os.environ, **(env or {})}
    items: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="ttv-") as tmp:
        if probe:
            out = Path(tmp, "phases.json")
            full_env[OUT_ENV] = str(out)
            full_env["PYTHONPATH"] = os.pathsep.join(
                [str(HERE), str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])
            args = [*args, "-p", "time_to_verdict"]
        t0 = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, *args], cwd=cwd, env=full_env, capture_output=True, text=True,
                                  timeout=timeout)
            status, output = done.returncode, done.stdout + done.stderr
        except subprocess.TimeoutExpired as exc:
            status, output = -1, f"timed out after {timeout} s: {exc}"
        wall = time.perf_counter() - t0
        if probe and Path(tmp, "phases.json").exists():
            items = json.loads(Path(tmp, "phases.json").read_text())
    return wall, status, "\n".join(output.strip().splitlines()[-15:]), items


def aim(name: str, figure: float | None, target: float, what: str, *, status: str | None = None,
        detail: Any = None) -> dict[str, Any]:
    if status is None:
        status = "pass" if figure is not None and figure <= target else "miss"
    return {"aim": name, "what": what, "figure_s": figure, "target_s": target, "status": status,
            "detail": detail}


def _case_overheads(items: dict[str, Any]) -> list[dict[str, Any]]:
    rows = []
    for nodeid, p in items.items():
        if "call_s" not in p:
            continue
        rows.append({
            "item": nodeid, "call_s": p["call_s"], "rounds_s": p.get("rounds_s", 0.0),
            "compile_s": p.get("compile_s", 0.0), "outcome": p.get("call_outcome"),
            "overhead_s": p["call_s"] - p.get("rounds_s", 0.0) - p.get("compile_s", 0.0),
        })
    return rows


def overhead_aim(gpu: bool, large: bool, verbose: bool) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="ttv-baselines-") as baselines:
        if gpu:
            expr = " or ".join(f"({t} and bench-{c}-{d})" for t, c, d in GPU_CASES)
            args = ["-m", "pytest", "tests/kernels/test_reference_kernels.py", "--fusion-bench", "-k", expr,
                    "--fusion-baseline-dir", baselines, "-q", "-p", "no:randomly", "-p", "no:cacheprovider"]
            wall, status, tail, items = run(args, cwd=ROOT, probe=True)
            what = "per bench case, reference kernels"
        else:
            cases = CPU_CASES + (("llama3-70b-M1",) if large else ())
            with tempfile.TemporaryDirectory(prefix="ttv-cpu-") as project:
                Path(project, "test_cpu_bench.py").write_text(CPU_PROBE.format(cases=list(cases)))
                args = ["-m", "pytest", "test_cpu_bench.py", "--fusion-bench", "-k", "bench-",
                        "--fusion-baseline-dir", baselines, "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                        "--rootdir", project]
                wall, status, tail, items = run(args, cwd=Path(project), probe=True)
            what = "per bench case, CPU bench path (torch kernels)"
    rows = _case_overheads(items)
    if status not in (0, 1) or len(rows) < 2:
        return aim("overhead", None, OVERHEAD_TARGET_S, what, status="error", detail={"status": status, "tail": tail})
    first, rest = rows[0], rows[1:]
    worst = max(rest, key=lambda r: r["overhead_s"])
    if verbose:
        for r in rows:
            print(f"  {r['item']}: call {r['call_s']:.2f} s = overhead {r['overhead_s']:.2f} + rounds "
                  f"{r['rounds_s']:.2f} + compile {r['compile_s']:.2f} ({r['outcome']})")
    return aim("overhead", worst["overhead_s"], OVERHEAD_TARGET_S, f"{what}, worst: {worst['item']}",
               detail={"cases": rest, "first_case": first, "wall_s": wall})


def bench_aim(gpu: bool) -> dict[str, Any]:
    what = "114-case reference bench, gate mode"
    if not gpu:
        return aim("bench", None, BENCH_TARGET_S, what, status="needs a GPU")
    with tempfile.TemporaryDirectory(prefix="ttv-baselines-") as baselines:
        for f in (ROOT / "baselines").glob("*.json"):
            shutil.copy(f, baselines)
        args = ["-m", "pytest", "tests/kernels/test_reference_kernels.py", "--fusion-bench", "-k", "bench-",
                "--fusion-baseline-dir", baselines, "-q", "-p", "no:cacheprovider"]
        wall, status, tail, items = run(args, cwd=ROOT, probe=True)
    cases = sum(1 for p in items.values() if "call_s" in p)
    return aim("bench", wall, BENCH_TARGET_S, f"{what} ({cases} cases)",
               detail={"status": status, "tail": tail, "cases": cases})


def suite_aim(gpu: bool) -> dict[str, Any]:
    args, env, target = (GPU_SUITE, GPU_SUITE_ENV, GPU_SUITE_TARGET_S) if gpu else (CPU_SUITE, {}, CI_TARGET_S)
    what = " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + "python3 " + " ".join(args)
    wall, status, tail, _ = run(list(args), cwd=ROOT, env=env)
    return aim("suite", wall, target, what, status=None if status == 0 else "error",
               detail={"status": status, "tail": tail})


def marker_aim(gpu: bool) -> dict[str, Any]:
    what = "README marker at its declared dims, slowest dtype"
    if not gpu:
        return aim("marker", None, MARKER_TARGET_S, what, status="needs a GPU")
    with tempfile.TemporaryDirectory(prefix="ttv-marker-") as project:
        Path(project, "test_readme.py").write_text(README_MARKER)
        args = ["-m", "pytest", "test_readme.py", "-q", "-p", "no:randomly", "-p", "no:cacheprovider",
                "--rootdir", project]
        wall, status, tail, items = run(args, cwd=Path(project), probe=True)
    per_dtype = {nodeid.rsplit("[", 1)[-1].rstrip("]"): p.get("duration_s", 0.0)
                 for nodeid, p in items.items()}
    if status != 0 or not per_dtype:
        return aim("marker", None, MARKER_TARGET_S, what, status="error", detail={"status": status, "tail": tail})
    worst = max(per_dtype, key=per_dtype.__getitem__)
    return aim("marker", per_dtype[worst], MARKER_TARGET_S, f"{what} ({worst})", detail=per_dtype)


def ci_aim() -> dict[str, Any]:
    t0 = time.perf_counter()
    done = subprocess.run(["bash", str(ROOT / ".ci" / "run")], cwd=ROOT, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
    return aim("ci", wall, CI_TARGET_S, ".ci/run", status=None if done.returncode == 0 else "error",
               detail={"status": done.returncode, "tail": tail})


AIMS: dict[str, Callable[..., dict[str, Any]]] = {
    "overhead": overhead_aim, "bench": bench_aim, "suite": suite_aim, "marker": marker_aim,
}


def line(result: dict[str, Any]) -> str:
    fig = "-" if result["figure_s"] is None else f"{result['figure_s']:.2f} s"
    return (f"{result['aim']:<9} {fig:>10}  target {result['target_s']:g} s  {result['status']:<11} "
            f"{result['what']}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--aims", default=",".join(AIMS),
                        help=f"comma-separated, of {', '.join(AIMS)} (default: all of them)")
    parser.add_argument("--ci", action="store_true", help="also time .ci/run (installs the project)")
    parser.add_argument("--large", action="store_true", help="CPU: also the llama3-70b-M1 bench case")
    parser.add_argument("--json", metavar="PATH", help="write the figures as JSON")
    parser.add_argument("-v", "--verbose", action="store_true", help="print the overhead aim's cases")
    ns = parser.parse_args(argv)
    wanted = [a.strip() for a in ns.aims.split(",") if a.strip()]
    unknown = [a for a in wanted if a not in AIMS]
    if unknown:
        parser.error(f"unknown aim(s) {', '.join(unknown)}; choose from {', '.join(AIMS)}")
    gpu = cuda()
    info = machine()
    print(f"time to verdict on {info['device']} ({info['cpus']} CPUs, torch {info.get('torch')}, "
          f"commit {info['commit']}, {info['date']})")
    results = []
    for name in wanted:
        fn = AIMS[name]
        result = fn(gpu, ns.large, ns.verbose) if name == "overhead" else fn(gpu)
        print(line(result), flush=True)
        results.append(result)
    if ns.ci:
        results.append(ci_aim())
        print(line(results[-1]))
    for r in results:
        if r["status"] == "error":
            print(f"{r['aim']}: exit {r['detail'].get('status')}\n{r['detail'].get('tail')}", file=sys.stderr)
    if ns.json:
        Path(ns.json).write_text(json.dumps({"machine": info, "aims": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
