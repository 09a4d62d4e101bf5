#!/usr/bin/env python3
"""False-failure soak: correct kernels run under many Hypothesis seeds must never fail.

A benchmark, not a test: it runs pytest once per seed in subprocesses and counts the runs that
failed. A correct kernel that fails under some seed is a false failure of the oracle (a budget too
tight at a dtype's edge, an exact tier demanding bits a correct kernel need not give).

    python3 benchmarks/false_failure_soak.py --seeds 200              # the CPU suite below
    python3 benchmarks/false_failure_soak.py --suite reference --seeds 20 --examples 5 --jobs 1 -- -n 14

Suites:

- ``cpu``: small correct kernels written here, plain PyTorch (``triton=False``) with an
  accumulation order of their own (fp32, one rounding): linear + bias + GELU (tanh) scaled by 1 and
  by 30 in float32, float16 and bfloat16 (by 30 a float16 output reaches its overflow edge); a
  fused cross-entropy forward + backward (``backward=True``, a hand-written gradient); a
  block-quantized matmul (int8 weight, one float32 scale per 32 columns of K).
- ``reference``: the reference kernels' correctness tests (``tests/kernels``), on the GPU at full
  declared dims.

Prints one line per failing seed with the failing node ids, then a summary; ``--json`` writes the
same for machines. Exit status 1 when any seed failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CPU_SUITE = '''
import pytest
import pytest_fusion
import torch
import torch.nn.functional as F
from hypothesis import settings

settings.register_profile("soak", deadline=None, database=None)  # each seed on its own
settings.load_profile("soak")


def linear_gelu(x, w, b, *, scale):
    return F.gelu(F.linear(x, w, b), approximate="tanh") * scale


def linear_gelu_fused(x, w, b, *, scale):
    # the epilogue of a fused GEMM: fp32 accumulator, bias, activation and scale in fp32, one rounding
    acc = x.float() @ w.float().T + b.float()
    return (F.gelu(acc, approximate="tanh") * scale).to(x.dtype)


LINEAR_GELU = dict(
    reference=linear_gelu,
    inputs={"x": ("M", "K"), "w": ("N", "K"), "b": ("N",)},
    dims={"M": (1, 48), "K": (1, 96), "N": (1, 48)},
    triton=False,
)


@pytest.mark.fused_kernel(**LINEAR_GELU, constants={"scale": 1.0})
def test_linear_gelu():
    return linear_gelu_fused


@pytest.mark.fused_kernel(**LINEAR_GELU, constants={"scale": 30.0})
def test_linear_gelu_scaled_by_30():
    return linear_gelu_fused


class _CrossEntropy(torch.autograd.Function):
    """Per-row loss from the online-softmax statistics in fp32 (row max m, sum d of exp(x - m)), as
    fused cross-entropy kernels keep them; the backward writes (exp(x - m) / d - onehot) * dloss.
    (Recomputing the softmax as exp(x - lse) instead rounds lse, |x| 2^-24 relative: at logits of 30
    that is about 13 ulp in float32, which the oracle reports with a hint; docs/oracle.md.)"""

    @staticmethod
    def forward(ctx, logits, target):
        x = logits.float()
        row_max = x.amax(dim=-1, keepdim=True)  # an inf logit gives NaN here, as in eager
        total = torch.exp(x - row_max).sum(dim=-1, keepdim=True)
        ctx.save_for_backward(x, row_max, total, target)
        # log(sum) - (x_t - max), not lse - x_t: the latter rounds lse at the logits' scale and
        # loses the loss's digits when the target dominates (docs/oracle.md)
        shifted_target = x.gather(-1, target[:, None])[:, 0] - row_max[:, 0]
        return (torch.log(total[:, 0]) - shifted_target).to(logits.dtype)

    @staticmethod
    def backward(ctx, dloss):
        x, row_max, total, target = ctx.saved_tensors
        grad = torch.exp(x - row_max) / total
        grad[torch.arange(x.shape[0]), target] -= 1.0
        return (grad * dloss.float()[:, None]).to(dloss.dtype), None


def cross_entropy(logits, target):
    return F.cross_entropy(logits, target, reduction="none")


@pytest.mark.fused_kernel(
    reference=cross_entropy,
    inputs={"logits": ("M", "V"), "target": pytest_fusion.Tensor(("M",), dtype="int64", bounds=(0, 7))},
    dims={"M": (1, 64), "V": (8, 200)},
    backward=True,
    triton=False,
)
def test_cross_entropy():
    return _CrossEntropy.apply


BLOCK = 32


def dequant_linear(x, w, scales):
    k = w.shape[1]
    w_float = w.to(scales.dtype) * scales.repeat_interleave(BLOCK, dim=1)[:, :k]
    return F.linear(x, w_float.to(x.dtype))


def dequant_linear_fused(x, w, scales):
    # dequantize each K block in fp32 inside the GEMM's loop, one rounding at the end
    k = w.shape[1]
    w_float = w.float() * scales.float().repeat_interleave(BLOCK, dim=1)[:, :k]
    return (x.float() @ w_float.T).to(x.dtype)


@pytest.mark.fused_kernel(
    reference=dequant_linear,
    inputs={"x": ("M", "K"),
            "w": pytest_fusion.Tensor(("N", "K"), dtype="int8", bounds=(-127, 127)),
            "scales": pytest_fusion.Tensor(("N", "cdiv(K, 32)"), dtype="float32", bounds=(0.5 / 127, 2 / 127))},
    dims={"M": (1, 48), "K": (16, 160), "N": (1, 48)},
    triton=False,
)
def test_block_quantized_matmul():
    return dequant_linear_fused
'''


def run_seed(seed: int, args: list[str], cwd: Path, env: dict[str, str]) -> dict:
    """One pytest run under ``--hypothesis-seed seed``: its exit status, wall and failing ids."""
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rfE", "-p", "no:randomly", "-p", "no:cacheprovider",
         f"--hypothesis-seed={seed}", *args],
        cwd=cwd, env=env, capture_output=True, text=True,
    )
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in proc.stdout.splitlines()
              if line.startswith(("FAILED ", "ERROR "))]
    tail = proc.stdout.strip().splitlines()[-1:] if proc.stdout.strip() else [proc.stderr[-300:]]
    return {"seed": seed, "rc": proc.returncode, "wall_s": round(time.perf_counter() - start, 1),
            "failed": failed, "summary": tail[0] if tail else ""}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--suite", choices=("cpu", "reference"), default="cpu")
    parser.add_argument("--seeds", type=int, default=200, help="how many seeds, 0 .. N-1 (default 200)")
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--examples", type=int, default=None,
                        help="--fusion-examples for each run (default: the tests' own)")
    parser.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) // 2),
                        help="seeds run at once (default: half the CPUs)")
    parser.add_argument("--json", default=None, help="also write the per-seed results here")
    parser.add_argument("pytest_args", nargs="*", help="after --: more pytest arguments for each run (-n 14)")
    opts = parser.parse_args(argv)
    if opts.seeds < 1:
        parser.error(f"--seeds must be at least 1, got {opts.seeds}")

    env = dict(os.environ, HYPOTHESIS_PROFILE="soak")  # no example database: seeds stay independent
    env.pop("CI", None)  # CI's profile derandomizes, which would make every seed the same run
    with tempfile.TemporaryDirectory(prefix="fusion-soak-") as tmp:
        if opts.suite == "cpu":
            env.setdefault("CUDA_VISIBLE_DEVICES", "")
            env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
            Path(tmp, "test_soak.py").write_text(CPU_SUITE)
            cwd, args = Path(tmp), ["test_soak.py"]
        else:
            cwd, args = ROOT, ["tests/kernels", "-k", "not bench"]
        if opts.examples is not None:
            args += ["--fusion-examples", str(opts.examples)]
        args += opts.pytest_args
        seeds = range(opts.first_seed, opts.first_seed + opts.seeds)
        start = time.perf_counter()
        with ThreadPoolExecutor(opts.jobs) as pool:
            results = []
            for result in pool.map(lambda s: run_seed(s, args, cwd, env), seeds):
                results.append(result)
                if result["rc"] != 0:
                    print(f"seed {result['seed']}: rc {result['rc']}, {result['summary']}", flush=True)
                    for node in result["failed"]:
                        print(f"    {node}", flush=True)
        wall = time.perf_counter() - start
    bad = [r for r in results if r["rc"] != 0]
    print(f"{opts.suite} suite: {len(results)} seeds, {len(bad)} with a failure, "
          f"{wall:.0f} s wall ({opts.jobs} at once); a run: {results[0]['summary']}")
    if opts.json:
        Path(opts.json).write_text(json.dumps({"suite": opts.suite, "examples": opts.examples,
                                               "wall_s": round(wall, 1), "runs": results}, indent=1))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
