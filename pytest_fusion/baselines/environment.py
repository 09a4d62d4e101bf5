"""The environment stored with each baseline entry (device, capability, driver, CUDA, torch,
Triton, timing method, date, commit, and on a CUDA device with ``nvidia-ml-py`` the enforced
power limit and maximum SM clock): what :func:`pytest_fusion.gate.rule.env_differences` compares and a
reader of the file needs to judge where a number came from. A record timed with an L2 flush adds
``l2_bytes``, ``l2_flush_bytes`` and ``l2_cold`` per case (``measure.cold_l2``, through
``bench.api.bench_case``)."""

from __future__ import annotations

import datetime as _dt
import os
import subprocess
from typing import Any

from pytest_fusion.machine.devices import device_name
from pytest_fusion.measure.power import device_env


def _run(cmd: list[str], cwd: str | None = None) -> str | None:
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
        return out.stdout.strip() or None
    except (OSError, subprocess.SubprocessError):
        return None


def _commit(rootdir: str | None, baseline_dir: str | None = None) -> str | None:
    """HEAD's short hash, with ``+dirty`` when tracked files other than the baselines differ from
    it, or ``+unknown`` when git cannot say: a baseline measured from uncommitted code (or a
    copied tree whose .git lags behind) must not name a commit that did not hold the code it
    measured. The baseline directory is left out: re-saving rewrites it."""
    head = _run(["git", "rev-parse", "--short=12", "HEAD"], cwd=rootdir)
    if head is None:
        return None
    cmd = ["git", "status", "--porcelain", "--untracked-files=no", "--", "."]
    if baseline_dir is not None:
        rel = os.path.relpath(os.path.abspath(baseline_dir), os.path.abspath(rootdir or "."))
        if not rel.startswith(".."):  # a directory outside the work tree needs no exclusion
            cmd.append(f":(exclude){rel}")
    try:  # not _run: a failing status must not read as clean; a fresh copy makes git re-hash all files
        out = subprocess.run(cmd, cwd=rootdir, capture_output=True, text=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError):
        return head + "+unknown"
    return head + "+dirty" if out.stdout.strip() else head


def current_env(
    device: str, method: str, *, rootdir: str | None = None, baseline_dir: str | None = None
) -> dict[str, Any]:
    """Environment fields stored with each case (module docstring); unknown ones are None, except
    ``power_limit_w`` (W) and ``sm_clock_max_mhz`` (MHz), present only when NVML read them
    (``measure.power.device_env``; the driver comes from NVML too, else from nvidia-smi), so that a
    run without ``nvidia-ml-py`` does not read as a changed power limit.
    ``commit``: see :func:`_commit` (``rootdir`` is the git work tree, ``baseline_dir`` is left
    out of its dirty check)."""
    import torch

    env: dict[str, Any] = {
        "device": device_name(device),
        "capability": None,
        "driver": None,
        "cuda": None if torch.version.cuda is None else str(torch.version.cuda),
        "torch": str(torch.__version__),
        "triton": None,
        "method": method,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d"),
        "commit": _commit(rootdir, baseline_dir),
    }
    try:
        import triton

        env["triton"] = str(triton.__version__)
    except ImportError:
        pass
    if str(device).startswith("cuda"):
        major, minor = torch.cuda.get_device_capability(torch.device(device))
        env["capability"] = f"{major}.{minor}"
        env.update(device_env(device))
        if env["driver"] is None:
            drv = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])
            env["driver"] = drv.splitlines()[0].strip() if drv else None
    return env
