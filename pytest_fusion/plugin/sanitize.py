"""``--fusion-sanitize=memcheck|racecheck|initcheck``: a check case run again under NVIDIA's
compute-sanitizer, its first reports put in the item's outcome.

Why: the oracle's guard bands catch a write up to 256 bytes past a tensor (docs/oracle-hygiene.md),
not one further past, nor one into memory its dispatch mode never sees, and no check in one process
sees a shared-memory race (racecheck) or a read of uninitialised global memory that happens to hold
a plausible value (initcheck). compute-sanitizer sees each access, at a cost of 10-100x the run's
time, so it runs only on demand and only on the cases asked for.

The rule, with the option given:

- a check item that fails on a case (``FusionFailure.case``, the shrunk one) has that case run again
  under the tool; the sanitizer's report joins the failure;
- a check item named on the command line (``-k``, or a node id with ``::``) that passes has its
  property test (or ``--fusion-repro``'s one case) run again under the tool, and fails when the tool
  reports an error.

The child is the replay's (:func:`pytest_fusion.plugin.replay.child_command` and
:func:`~pytest_fusion.plugin.replay.child_env`): ``compute-sanitizer --tool TOOL --log-file LOG
python -m pytest <node id>`` (the printed rerun says ``python3 -m pytest``) with the case as the
settings' ``repro``, the payload ``--fusion-repro`` reads, and ``PYTORCH_NO_CUDA_MEMORY_CACHING=1``:
PyTorch's caching allocator carves tensors out of large segments, so an access past a tensor but
inside its segment is no error to memcheck; with it off, each tensor is its own ``cudaMalloc``. The
log's first :data:`MAX_REPORT_LINES` report lines (host backtrace frames left out) and its error
summary go in the outcome.

Without a CUDA GPU or the tool (:func:`unavailable`), a failing item's failure says why it was not
sanitized and a passing named item is skipped with that reason; so past :data:`MAX_SANITIZED` items
in one process.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Mapping

import pytest

from pytest_fusion.declare.spec import KernelSpec
from pytest_fusion.plugin.config import FusionConfig
from pytest_fusion.plugin.fixture import PYTEST_COMMAND, repro_location
from pytest_fusion.plugin.replay import child_command, child_env
from pytest_fusion.property.repro import dumps

NO_CACHING_ENV = "PYTORCH_NO_CUDA_MEMORY_CACHING"
"""PyTorch's switch for its CUDA caching allocator: set to 1 in the child, each tensor is its own
allocation, whose bounds compute-sanitizer knows."""

SANITIZE_TIMEOUT_S = 3600.0
"""Most seconds a sanitized child may take: a property test under memcheck runs 10-100x slower
than without (NVIDIA's compute-sanitizer guide), so only a hung child hits it."""

MAX_REPORT_LINES = 24
"""Most lines of the sanitizer's report an outcome quotes: the first errors (the later ones are
often the same access in other threads); the full log is the command's to rerun."""

PRINT_LIMIT = 20
"""``--print-limit``: most errors the tool prints; the error summary still counts them all."""

MAX_SANITIZED = 8
"""Most items one process runs under the tool: each is a fresh pytest and a slow run of the case."""

CUDA_ROOTS = ("/usr/local/cuda",)
"""Where the CUDA toolkit installs by default (its ``bin`` holds compute-sanitizer), searched after
``PATH`` and ``$CUDA_HOME``."""

_SUMMARY = re.compile(r"ERROR SUMMARY:\s*(\d+) error")
_PREFIX = re.compile(r"^=+ ?")
_BACKTRACE = ("Host Frame", "Saved host backtrace")

_COUNT = pytest.StashKey[int]()


def find_tool() -> str | None:
    """The ``compute-sanitizer`` executable: on ``PATH``, else in ``$CUDA_HOME/bin``, else in the
    ``bin`` of a :data:`CUDA_ROOTS` folder; None when none is found."""
    found = shutil.which("compute-sanitizer")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), *CUDA_ROOTS):
        if root and os.access(Path(root, "bin", "compute-sanitizer"), os.X_OK):
            return str(Path(root, "bin", "compute-sanitizer"))
    return None


def unavailable() -> str:
    """Why compute-sanitizer cannot run a case here, "" when it can: no CUDA GPU visible to torch,
    or no ``compute-sanitizer`` found (:func:`find_tool`)."""
    import torch

    if not torch.cuda.is_available():
        return "no CUDA GPU is visible (compute-sanitizer checks CUDA kernels)"
    if find_tool() is None:
        where = "".join(f" or {r}/bin" for r in CUDA_ROOTS)
        return (f"compute-sanitizer was not found on PATH, in $CUDA_HOME/bin{where} "
                "(it comes with the CUDA toolkit)")
    return ""


def named(config: pytest.Config) -> bool:
    """Whether the command line names cases: ``-k`` given, or an argument that is a node id."""
    return bool(config.option.keyword) or any("::" in str(a) for a in config.args)


def report_lines(log: str) -> tuple[int | None, list[str]]:
    """The error count of a compute-sanitizer log (its ``ERROR SUMMARY``, None when the log has
    none: the run did not finish) and its report lines, the ``=====`` prefix stripped, host
    backtrace frames and the banner left out."""
    count = None
    lines = []
    for raw in log.splitlines():
        m = _SUMMARY.search(raw)
        if m:
            count = int(m.group(1))
            continue
        line = _PREFIX.sub("", raw).rstrip()
        if not line.strip() or line.strip() == "COMPUTE-SANITIZER" or line.strip().startswith(_BACKTRACE):
            continue
        lines.append(line)
    return count, lines


def rerun_command(
    item: pytest.Item, tool: str, repro: Mapping[str, Any] | None, spec: KernelSpec | None = None
) -> str:
    """The shell command that runs ``item`` (the one case ``repro``, else its property test) under
    ``tool`` again, from where the user ran pytest (:func:`~pytest_fusion.plugin.fixture.repro_location`),
    ``repro``'s dims in the order ``spec`` declares them (:func:`~pytest_fusion.property.repro.dumps`)."""
    cd, node = repro_location(item)
    cmd = f"{cd}{NO_CACHING_ENV}=1 compute-sanitizer --tool {tool} {PYTEST_COMMAND} {node}"
    if repro is not None:
        cmd += f" --fusion-repro={shlex.quote(dumps(repro, spec))}"
    return cmd


def run_child(
    cfg: FusionConfig, item: pytest.Item, tool: str, repro: Mapping[str, Any] | None
) -> tuple[int | None, str]:
    """Run ``item`` (the one case ``repro``, else its property test) under compute-sanitizer's
    ``tool`` in a fresh process with ``cfg``'s settings: the error count (None when the tool's run
    did not finish) and the text an outcome quotes (the report's first lines, or why there is no
    report)."""
    import torch

    config = item.config
    tool_path = find_tool() or "compute-sanitizer"
    if torch.cuda.is_available():
        try:
            torch.cuda.empty_cache()  # the child allocates its own copy of the case's tensors
        except RuntimeError:  # this process's context is lost to the kernel's fault; the child's is new
            pass
    with tempfile.TemporaryDirectory(prefix="pytest-fusion-sanitize-") as tmp:
        log = Path(tmp, "sanitizer.log")
        cmd = [tool_path, "--tool", tool, "--log-file", str(log), "--print-limit", str(PRINT_LIMIT),
               *child_command(config, item)]
        env = child_env(cfg, repro=None if repro is None else dict(repro))
        env[NO_CACHING_ENV] = "1"
        try:
            done = subprocess.run(cmd, cwd=config.rootpath, env=env, capture_output=True, text=True,
                                  timeout=SANITIZE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            return None, f"the sanitized process ran past {SANITIZE_TIMEOUT_S:g} s"
        except OSError as exc:
            return None, f"compute-sanitizer did not start ({exc})"
        count, lines = report_lines(log.read_text(errors="replace") if log.exists() else "")
    if count is None:
        tail = " | ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return None, f"compute-sanitizer {tool} did not finish (exit {done.returncode}): {tail}"
    shown = lines[:MAX_REPORT_LINES]
    more = [f"... {len(lines) - len(shown)} more lines"] if len(lines) > len(shown) else []
    return count, "\n".join("    " + line for line in [*shown, *more])


def outcome(
    item: pytest.Item, cfg: FusionConfig, failure: str | None, case: Any = None,
    spec: KernelSpec | None = None,
) -> str | None:
    """The check item's failure message after ``--fusion-sanitize`` (the module docstring's rule):
    ``failure`` with the sanitizer's report of ``case`` (a ``tensors.Case``) or a note saying why
    there is none; for a passing named item, None when the tool reports no error, a failure message
    when it does. ``spec``: the item's, whose declared dims order the printed rerun's payload.

    Raises:
        pytest.skip.Exception: a passing named item where the tool cannot run (:func:`unavailable`).
    """
    config = item.config
    tool = cfg.sanitize
    if tool is None or (failure is None and not named(config)):
        return failure
    why = unavailable()
    if not why and failure is not None and case is None:
        why = "the failure names no case to run again"
    if not why and config.stash.get(_COUNT, 0) >= MAX_SANITIZED:
        why = (f"{MAX_SANITIZED} items already were in this process "
               "(pytest_fusion.plugin.sanitize.MAX_SANITIZED)")
    if why:
        if failure is None:
            pytest.skip(f"the check passed; --fusion-sanitize={tool} not run: {why}")
        return f"{failure}\n\n[pytest-fusion] not run under compute-sanitizer {tool}: {why}"
    config.stash[_COUNT] = config.stash.get(_COUNT, 0) + 1
    repro = case.as_dict() if failure is not None else cfg.repro
    count, text = run_child(cfg, item, tool, repro)
    what = "this case" if repro is not None else "the property test"
    head = (f"[pytest-fusion] compute-sanitizer {tool} on {what} (a fresh process, PyTorch's caching "
            f"allocator off): ")
    rerun = f"  rerun:\n    {rerun_command(item, tool, repro, spec)}"
    if count is None:
        report = f"{head}no report: {text}\n{rerun}"
    else:
        report = f"{head}{count} error{'s' * (count != 1)}" + (f"\n{text}" if count else "") + f"\n{rerun}"
    if failure is not None:
        return f"{failure}\n\n{report}"
    if count == 0:
        item.add_report_section("call", f"fusion-sanitize {tool}", report)
        return None
    return f"{report}\n(the check itself passed)"
