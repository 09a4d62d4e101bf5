"""Every TMA kernel variant compiles for Hopper (sm_90), on any machine.

The interpreter runs the kernels' Python, not Triton's compiler, so a kernel can pass every CPU
test and still fail to compile on the GPU: a Python ``False`` assigned in a constexpr branch
became a tensor in Triton 3.6 and compiled a dead branch that dereferenced a None argument
(H200 run of 2026-11-29, every TMA config). Triton's CUDA backend compiles to PTX without a
GPU, so tests/sm90_compile.py builds each variant for ``GPUTarget("cuda", 90, 32)`` in a
process without the interpreter; shared-memory limits are checked at load time, not here
(configs.fits covers them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")

sys.path.insert(0, str(Path(__file__).parent))
import sm90_compile  # noqa: E402

VARIANTS = [vid for vid, *_ in sm90_compile.variants()]


@pytest.fixture(scope="module")
def compiled() -> dict[str, dict]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    # the checkout's packages, whether or not an install points at this checkout
    root = str(Path(__file__).parent.parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, str(Path(__file__).with_name("sm90_compile.py"))],
                         capture_output=True, text=True, env=env, timeout=900)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert rows, f"sm90_compile.py printed nothing (exit {run.returncode}):\n{run.stderr[-3000:]}"
    return {row["id"]: row for row in rows}


@pytest.mark.parametrize("vid", VARIANTS)
def test_tma_kernel_compiles_for_sm90(compiled, vid):
    row = compiled.get(vid)
    assert row is not None, f"{vid} was not compiled"
    assert row["ok"], row["error"]
    # the split tail counts its slices in with one acquire-release atomic add at GPU scope, after
    # a CTA barrier, and reads the partials past L1; the other variants have none of it
    split = "-splittail-" in vid and not vid.endswith("-unsplit")
    assert (row["acq_rel_atomic"], row["barrier_before_atomic"], row["cg_loads"]) == (split, split, split)
    # tiles of 64 rows or more multiply on wgmma; the gated kernel's two weight tiles in one
    # instruction of twice the tile's width (x read from shared memory once per K step)
    if row["block_m"] >= 64:
        weights = 2 if row["kernel"] == "gated" else 1
        assert row["wgmma_n"] == [weights * row["block_n"]], row["wgmma_n"]
