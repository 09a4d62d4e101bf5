"""The kernels compile for the GPUs they may run on, on any machine.

The interpreter runs the kernels' Python, not Triton's compiler, so a kernel can pass every CPU
test and still fail to compile on the GPU: a Python ``False`` assigned in a constexpr branch
became a tensor in Triton 3.6 and compiled a dead branch that dereferenced a None argument
(every TMA config on an H200). Triton's CUDA backend compiles to PTX and a cubin without a GPU,
so tests/kernels/arch_compile.py builds the kernels in a process without the interpreter:

- every TMA variant for sm_90, with properties of its PTX (the split tail's handoff, the wgmma
  widths) and its shared memory within the H100's 227 KB;
- for each GPU of arch_compile.TARGETS (A100, L4, H100, B200, RTX 50xx), what the selection
  logic offers it: no TMA config before sm_90, and the first candidate of each kernel, dtype
  and M class compiled within the GPU's shared memory per block (arch_compile.violations).

Each compile runs once per session, however many xdist workers share it (:func:`_once`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

pytest.importorskip("triton.backends.nvidia", reason="this Triton has no CUDA backend")

sys.path.insert(0, str(Path(__file__).parent))
import arch_compile  # noqa: E402

HARNESS = Path(__file__).with_name("arch_compile.py")
VARIANTS = [vid for vid, *_ in arch_compile.tma_variants()]


def _harness(args: list[str]) -> list[dict]:
    """The JSON lines of ``python3 <args>`` in a process without the interpreter, the checkout's
    packages first on its path (whether or not an install points at this checkout)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).parents[2])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, str(HARNESS.parent), env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, *args], capture_output=True, text=True, env=env, timeout=900)
    rows = [json.loads(line) for line in run.stdout.splitlines() if line.startswith("{")]
    assert rows, f"{args} printed nothing (exit {run.returncode}):\n{run.stderr[-3000:]}"
    return rows


def _once(tmp_path_factory, name: str, args: list[str]) -> list[dict]:
    """:func:`_harness` run once per session: under xdist the workers share one run through a
    file in the session's temporary directory (each worker would otherwise compile it all)."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return _harness(args)
    path = tmp_path_factory.getbasetemp().parent / f"{name}.json"
    with FileLock(f"{path}.lock"):
        if not path.exists():
            path.write_text(json.dumps(_harness(args)))
        return json.loads(path.read_text())


@pytest.fixture(scope="session")
def compiled(tmp_path_factory) -> dict[str, dict]:
    return {row["id"]: row for row in _once(tmp_path_factory, "tma-variants", [str(HARNESS), "tma-variants"])}


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
    # in fp16 every TMA config fits an H100's block (Triton would refuse to load it)
    assert row["shared"] <= arch_compile.TARGETS["sm_90"][1], row["shared"]


# The check is tested against planted faults too: a path decision that offers TMA configs to an
# A100, and an L4 given Hopper's shared memory (the single 220 KB budget of before), under which
# fp32 linear decode's first candidate needs 144 KB. Planted after the real checks, in the same
# harness process (one interpreter start), each undone before the next.
PLANTS = {
    "tma-on-sm_80": ("targets.supports_tma = lambda capability: True",
                     "'sm_80', ('linear',), ('float16',), ('prefill',)"),
    "hopper-smem-on-sm_89": ("targets.SMEM_OPTIN_BYTES[(8, 9)] = targets.SMEM_OPTIN_BYTES[(9, 0)]",
                             "'sm_89', ('linear',), ('float32',), ('decode',)"),
}


@pytest.fixture(scope="session")
def checked(tmp_path_factory) -> list[dict]:
    code = "import json, arch_compile\nfrom reference_kernels.gemm import targets\n"
    code += "arch_compile.main(['all'])\n"
    for name, (plant, where) in PLANTS.items():
        code += (f"saved = targets.supports_tma, dict(targets.SMEM_OPTIN_BYTES)\n{plant}\n"
                 f"found = arch_compile.violations({where})\n"
                 f"print(json.dumps({{'planted': {name!r}, 'violations': found}}))\n"
                 "targets.supports_tma = saved[0]\ntargets.SMEM_OPTIN_BYTES.update(saved[1])\n")
    return _once(tmp_path_factory, "targets", ["-c", code])


@pytest.mark.parametrize("name", list(arch_compile.TARGETS))
def test_each_gpu_is_offered_configs_it_can_run(checked, name):
    lines = [r for r in checked if r.get("target") == name and ("violations" in r or "cannot_target" in r)]
    row = lines[0] if lines else None
    assert row is not None, f"{name} was not checked"
    if "cannot_target" in row:
        pytest.skip(f"this Triton cannot target {name}: {row['cannot_target']}")
    assert row["violations"] == []


@pytest.fixture(scope="session")
def planted(checked) -> dict[str, list[str]]:
    return {r["planted"]: r["violations"] for r in checked if "planted" in r}


def test_the_check_names_a_tma_config_offered_before_sm90(planted):
    found = planted["tma-on-sm_80"]
    assert found and all("uses TMA before sm_90" in v for v in found), found
    assert any(v.startswith("sm_80 linear float16 M=8192: tma-128x64x64-w4-s4 ") for v in found), found


def test_the_check_names_a_kernel_that_needs_more_shared_memory_than_the_gpu_has(planted):
    found = planted["hopper-smem-on-sm_89"]
    planned = "sm_89: configs are planned for 232448 bytes of shared memory per block, more than its 101376"
    assert planned in found, found
    (compiled,) = [v for v in found if " needs " in v]
    assert compiled.startswith("sm_89 linear float32 M=1: 16x32x256-w4-s4 needs "), found
