"""Sustained speed under the H200's power cap: Llama-3-70B gate/up at M = 8192, kernel vs eager.

The tune sweep timed this case at 1.11x eager (fp16) and benchmark mode at 1.00x; eager's time
agreed between the two, the kernel's did not. nvidia-smi showed the software power cap active
(clocks 1575 MHz at about 680 W) during such GEMMs. This runs each provider back to back for
``--seconds`` (eager, kernel, eager, kernel), times every call with CUDA events, and samples the
SM clock and power every 100 ms, to see whether the kernel runs at lower clocks than cuBLAS when
both are capped.

Prints one JSON line per phase: median ms over the phase's second half, median SM MHz and W.

    python3 bench_scripts/probe_power.py     # on the H200
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch

from reference_kernels import eager
from reference_kernels.gated_mlp import gated_act


def sustained(fn, seconds: float) -> dict:
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits",
                            "-lms", "100"], stdout=subprocess.PIPE, text=True)
    times = []
    t0 = time.time()
    while time.time() - t0 < seconds:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    smi.terminate()
    out, _ = smi.communicate(timeout=10)
    samples = []
    for line in out.splitlines():
        try:
            mhz, watts = (float(v) for v in line.split(","))
        except ValueError:  # a header, "[N/A]" or a cut line
            continue
        samples.append((mhz, watts))
    half = samples[len(samples) // 2:] or samples
    return dict(calls=len(times), ms=statistics.median(times[len(times) // 2:]),
                sm_mhz=statistics.median(s[0] for s in half) if half else None,
                watts=statistics.median(s[1] for s in half) if half else None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    args = ap.parse_args()
    M, K, N = 8192, 8192, 28672
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=dt)
        wg, wu = (torch.randn(N, K, device="cuda", dtype=dt) / K**0.5 for _ in range(2))
        calls = {"eager": lambda: eager.gated_act_eager(x, wg, wu, activation="silu"),
                 "kernel": lambda: gated_act(x, wg, wu, activation="silu")}
        for fn in calls.values():
            fn()
        torch.cuda.synchronize()
        for phase, provider in enumerate(("eager", "kernel", "eager", "kernel")):
            row = sustained(calls[provider], args.seconds)
            print(json.dumps(dict(dtype=name, phase=phase, provider=provider, **row)), flush=True)
        del x, wg, wu
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
