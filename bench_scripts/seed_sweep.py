"""Issue 2's flake check: the correct kernels pass under many different Hypothesis seeds.

Runs the property test of each correct kernel once per seed, with the plugin's default settings
(25 examples, default error budget), and counts passes. Kernels: the plugin tests' correct Triton
kernel (tests/plugin_kernels/faulty_linear.py with no fault; fp16 and fp32 under the interpreter)
and a bf16 torch kernel (fp32 accumulation, one rounding) whose outputs reach |v| ~ 30 and beyond.

    TRITON_INTERPRET=1 python3 bench_scripts/seed_sweep.py --seeds 200
"""

from __future__ import annotations

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests", "plugin_kernels")]

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import faulty_linear  # noqa: E402
from pytest_fusion import Tensor, make_spec  # noqa: E402
from pytest_fusion.check import DEFAULT_CPU_MAX_DIM, run_property  # noqa: E402
from pytest_fusion.oracle import FusionFailure  # noqa: E402


def linear_gelu(x, weight, bias, activation):
    return F.gelu(F.linear(x, weight, bias), approximate="tanh")


def linear(x, weight):
    return F.linear(x, weight)


def torch_linear(x, weight):
    return F.linear(x.float(), weight.float()).to(x.dtype)


CASES = [
    ("triton linear+gelu_tanh (special values)", make_spec(
        linear_gelu, inputs={"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)},
        dims={"M": (1, 4096), "K": (1, 4096), "N": (1, 4096)}, constants={"activation": "gelu_tanh"},
        tiles=faulty_linear.TILES, special_values=True),
     lambda x, w, b, activation: faulty_linear.linear_act(x, w, b, activation), ("float16", "float32")),
    ("torch bf16 linear, |v| ~ 30", make_spec(
        linear, inputs={"x": Tensor(("M", "K"), scale=30.0), "weight": ("N", "K")},
        dims={"M": (1, 48), "K": (1, 48), "N": (1, 48)}, triton=False),
     torch_linear, ("bfloat16",)),
]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", type=int, default=200)
    args = parser.parse_args()
    for name, spec, kernel, dtypes in CASES:
        for dtype in dtypes:
            start, failures = time.time(), []
            for seed in range(args.seeds):
                try:
                    run_property(spec, kernel, dtype=dtype, device="cpu", max_dim=DEFAULT_CPU_MAX_DIM, seed=seed)
                except FusionFailure as exc:
                    failures.append((seed, str(exc).splitlines()[:3]))
            print(f"{name} [{dtype}]: {args.seeds - len(failures)}/{args.seeds} seeds passed "
                  f"({time.time() - start:.0f} s)", flush=True)
            for seed, lines in failures[:5]:
                print(f"  seed {seed}: {' | '.join(lines)}", flush=True)


if __name__ == "__main__":
    torch.set_num_threads(1)
    main()
