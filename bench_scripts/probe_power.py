"""Sustained speed under the H200's power cap: Llama-3-70B gate/up at M = 8192, configs vs eager.

The tune sweep timed this case at 1.11x eager (fp16) and benchmark mode at 1.00x; eager's time
agreed between the two, the kernel's did not. nvidia-smi showed the software power cap active
(clocks 1575 MHz at about 680 W) during such GEMMs. This runs each provider back to back for
``--seconds`` (eager first, then each config, eager again after every ``--eager-every``), times
every call with CUDA events, and samples the SM clock and power every 100 ms: capped, a config is
as fast as its work per joule.

Prints one JSON line per phase: median ms over the phase's second half, median SM MHz and W.

    python3 bench_scripts/probe_power.py                 # on the H200: the tuned pick
    python3 bench_scripts/probe_power.py --configs tma-128x128x64-w8-s3,g16:tma-128x128x64-w8-s3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import time

import torch
import triton

from reference_kernels import configs as C
from reference_kernels import eager
from reference_kernels.gated_mlp import gated_act
from tune_kernels import phase_order, time_interleaved  # this folder, the script's own on sys.path


def sustained(fn, seconds: float) -> dict:
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=clocks.sm,power.draw,temperature.gpu",
                            "--format=csv,noheader,nounits", "-lms", "100"], stdout=subprocess.PIPE, text=True)
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
            mhz, watts, temp = (float(v) for v in line.split(","))
        except ValueError:  # a header, "[N/A]" or a cut line
            continue
        samples.append((mhz, watts, temp))
    half = samples[len(samples) // 2:] or samples
    med = (lambda i: statistics.median(s[i] for s in half)) if half else (lambda i: None)
    return dict(calls=len(times), ms=statistics.median(times[len(times) // 2:]),
                ms_first=times[0], sm_mhz=med(0), watts=med(1), temp_c=med(2))


def interleaved(calls: dict, rounds: int) -> dict:
    """Median ms per provider when each runs one L2-flushed graph replay per round, in rotating
    order, as the tune sweep times them: short bursts with gaps, unlike sustained()."""
    from pytest_fusion.bench.timing import default_timer

    timer = default_timer("cuda")
    prepared = {n: timer.prepare(n, fn) for n, fn in calls.items()}
    return {n: round(ms, 4) for n, ms in time_interleaved(prepared, rounds).items()}


def config_named(name: str) -> triton.Config:
    """A gated config by name: one of GATED_CONFIGS (or EXTRA), or ``gN:NAME`` for NAME with
    GROUP_M = N."""
    prefix, _, rest = name.rpartition(":")
    base = {C.config_name(c): c for c in C.GATED_CONFIGS}
    base.update({C.config_name(c): c for c in EXTRA})
    if rest not in base:
        raise SystemExit(f"unknown config {rest!r}; known: {', '.join(sorted(base))}")
    cfg = base[rest]
    kw = dict(cfg.kwargs)
    for p in filter(None, prefix.split(":")):
        if p.startswith("g"):
            kw["GROUP_M"] = int(p[1:])
        else:
            raise SystemExit(f"unknown prefix {p!r} in {name!r}")
    return triton.Config(kw, num_warps=cfg.num_warps, num_stages=cfg.num_stages)


EXTRA = (C._cfg(128, 128, 128, 8, 2, tma=True, tma_store=False),)
"""Configs probed here that GATED_CONFIGS does not (yet) hold."""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--dtypes", default="float16,bfloat16")
    ap.add_argument("--configs", default="", help="comma-separated config names (see config_named); "
                    "empty: the tuned pick")
    ap.add_argument("--eager-every", type=int, default=2, help="an eager phase after every N configs")
    ap.add_argument("--shape", default="8192,8192,28672", help="M,K,N")
    ap.add_argument("--rounds", type=int, default=15, help="rounds of the interleaved timing (as the "
                    "tune sweep times: one graph replay per provider per round, L2 flushed); 0: none")
    args = ap.parse_args()
    if args.eager_every < 1:
        ap.error(f"--eager-every must be >= 1, got {args.eager_every}")
    M, K, N = (int(v) for v in args.shape.split(","))
    names = [n for n in args.configs.split(",") if n]
    cfgs = {n: config_named(n) for n in names}
    for name in args.dtypes.split(","):
        dt = getattr(torch, name)
        torch.manual_seed(0)
        x = torch.randn(M, K, device="cuda", dtype=dt)
        wg, wu = (torch.randn(N, K, device="cuda", dtype=dt) / K**0.5 for _ in range(2))
        gold = eager.gated_act_eager(x, wg, wu, activation="silu")
        calls = {"eager": lambda: eager.gated_act_eager(x, wg, wu, activation="silu")}
        if not cfgs:
            calls["kernel"] = lambda: gated_act(x, wg, wu, activation="silu")
        for n, c in cfgs.items():
            calls[n] = (lambda c=c: gated_act(x, wg, wu, activation="silu", config=c))
        errors = {}
        for n, fn in list(calls.items()):
            try:
                out = fn()
                torch.cuda.synchronize()
                err = ((out.float() - gold.float()).norm() / gold.float().norm()).item()
                if n != "eager":
                    print(json.dumps(dict(dtype=name, provider=n, rel_err_vs_eager=err)), flush=True)
            except Exception as exc:  # noqa: BLE001 - a config that cannot run is a result
                errors[n] = f"{type(exc).__name__}: {exc}"[:400]
                del calls[n]
        if errors:
            print(json.dumps(dict(dtype=name, errors=errors)), flush=True)
        order = phase_order(calls, args.eager_every)
        if args.rounds:
            print(json.dumps(dict(dtype=name, interleaved=interleaved(calls, args.rounds))), flush=True)
        for phase, provider in enumerate(order):
            row = sustained(calls[provider], args.seconds)
            print(json.dumps(dict(dtype=name, phase=phase, provider=provider, **row)), flush=True)
        del x, wg, wu, gold
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
