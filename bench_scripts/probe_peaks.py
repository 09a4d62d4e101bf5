"""Why does benchmark mode's copy peak read lower than the kernels it rates?

The H200 save of 2026-11-29 reported kernels at up to 156% of the measured copy peak
(pytest_fusion/bench/peaks.py before commit 0859801: 1 GiB ``dst.copy_(src)`` timed by CUDA-graph
replay, 2.7 TB/s),
where KINDS.md's device copy moved 4.3 TB/s. Two candidate causes, each timed here:

- clocks: the copy is timed right after the process starts, before the GPU leaves its idle
  clocks (the matmul before it runs about 10 ms);
- the graph: a ``copy_`` captured in a CUDA graph becomes a memcpy node, which the driver may
  run on a copy engine instead of an SM kernel.

Prints one JSON line per variant: GB/s counting bytes read and written, best of 5.

    python3 bench_scripts/probe_peaks.py      # on a CUDA GPU
"""

from __future__ import annotations

import json
import subprocess
import time

import torch

from pytest_fusion.bench.timing import CudaGraphTimer

NBYTES = 1 << 30


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"nvidia-smi failed: {exc}"


def events(fn) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    fn()
    end.record()
    end.synchronize()
    return start.elapsed_time(end)


def main() -> None:
    timer = CudaGraphTimer("cuda")
    src = torch.empty(NBYTES // 4, dtype=torch.float32, device="cuda")
    dst = torch.empty_like(src)
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    variants = {
        "graph copy_ (peaks.py)": lambda: timer.prepare("c", lambda: dst.copy_(src)),
        "events copy_": lambda: (lambda: events(lambda: dst.copy_(src))),
        "graph neg(out=)": lambda: timer.prepare("n", lambda: torch.neg(src, out=dst)),
        "graph add(0, out=)": lambda: timer.prepare("a", lambda: torch.add(src, 0.0, out=dst)),
    }

    def row(phase: str) -> None:
        for name, make in variants.items():
            run = make()
            ms = min(run() for _ in range(5))
            print(json.dumps(dict(phase=phase, variant=name, ms=ms, gbps=2 * NBYTES / ms / 1e6, clocks=clocks())),
                  flush=True)

    print(json.dumps(dict(phase="start", clocks=clocks())), flush=True)
    row("cold")
    t0 = time.time()
    while time.time() - t0 < 2.0:  # 2 s of matmuls: clocks up
        a @ a
    torch.cuda.synchronize()
    row("after 2 s of matmuls")


if __name__ == "__main__":
    main()
