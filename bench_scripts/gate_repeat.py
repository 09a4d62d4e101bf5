"""Measure the gate's issue-5 figures with real CPU timings (no GPU, no pytest).

1. Save a baseline of a CPU kernel against eager (through ``baselines.save``, as --fusion-save does).
2. ``--trials`` times: time the unchanged kernel and gate it against that baseline   -> expect pass.
3. ``--trials`` times: the same kernel slowed by ``--slowdown`` (a calibrated busy-wait of that
   fraction of its baseline time after each call)                                    -> expect fail,
   blaming the kernel.
4. Save a second baseline in which eager was ``--slowdown`` slower (the same busy-wait on eager),
   then gate the plain eager ``--trials`` times: the baseline provider got faster    -> expect fail,
   blaming the baseline.

Two providers are timed, eager and ``unfused`` (a second baseline), as the plugin times eager and
compile: with two, the gate tells the sides apart by which speedups fell (gate.blame).

Run:  python bench_scripts/gate_repeat.py [--trials 20] [--rounds 30] [--tolerance 0.05]

The kernel is ``linear + bias + GELU(tanh)`` as one ``addmm`` and an in-place GELU; the reference
is ``F.gelu(F.linear(x, w, b), approximate="tanh")``. torch runs one thread: on a shared 2-core
machine a second OpenMP thread waits on whoever else holds the other core.
"""

from __future__ import annotations

import argparse
import collections
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from pytest_fusion import baselines  # noqa: E402
from pytest_fusion.bench.runner import Settings, run_case  # noqa: E402
from pytest_fusion.bench.timing import CpuTimer  # noqa: E402


def reference(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return F.gelu(F.linear(x, w, b), approximate="tanh")


def kernel(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    out = torch.addmm(b, x, w.t())
    return F.gelu(out, approximate="tanh")


def unfused(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A second baseline provider (matmul, bias add and GELU as three ops), so that the gate can
    tell a slower kernel (every speedup falls) from one faster baseline (only its speedup falls)."""
    return F.gelu(torch.matmul(x, w.t()) + b, approximate="tanh")


def spin(seconds: float) -> None:
    """Busy-wait (sleep is too coarse and lets the core go idle)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def slowed(fn, seconds):
    def wrapper(*args):
        out = fn(*args)
        spin(seconds)
        return out

    return wrapper


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--slowdown", type=float, default=0.10)
    ap.add_argument("--M", type=int, default=256)
    ap.add_argument("--K", type=int, default=512)
    ap.add_argument("--N", type=int, default=512)
    ap.add_argument("--clock", choices=("wall", "process"), default="wall",
                    help="CPU clock of the timer (pytest --fusion-cpu-clock)")
    args = ap.parse_args()
    torch.set_num_threads(1)

    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.M, args.K, generator=gen)
    w = torch.randn(args.N, args.K, generator=gen) / args.K**0.5
    b = torch.randn(args.N, generator=gen)
    dims = {"M": args.M, "K": args.K, "N": args.N}
    settings = Settings(rounds=args.rounds, warmup=args.warmup, providers=("eager", "unfused"),
                        tolerance=args.tolerance)
    timer = CpuTimer(clock=args.clock)
    slug = baselines.device_slug("cpu")
    env = baselines.current_env("cpu", timer.method)
    store = Path(tempfile.mkdtemp(prefix="gate_repeat_"))

    def measure(kern, ref, stored=None, where="baseline"):
        return run_case(kernel_id="gate_repeat::linear_gelu", case=where, dtype="float32", dims=dims,
                        device_slug=slug, kernel=kern, reference=ref, inputs=(x, w, b), timer=timer,
                        settings=settings, stored=stored, env=env, baselines={"unfused": unfused}, where=str(store / f"{slug}.json"))

    def save_and_load(rec):
        path = baselines.save(store, slug, [rec])
        return baselines.stored_case(baselines.load(path), rec.kernel, rec.case, rec.dtype)

    print(f"machine: {baselines.cpu_model()} ({platform.machine()}, {os.cpu_count()} cores), torch "
          f"{torch.__version__}, 1 thread; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}; "
          f"load average {os.getloadavg()[0]:.1f}")
    print(f"case: linear+bias+gelu_tanh float32 M={args.M} K={args.K} N={args.N}; rounds {args.rounds}, "
          f"clock {args.clock} ({timer.method}), tolerance {args.tolerance:.0%}, slowdown {args.slowdown:.0%}, trials {args.trials}")

    base = measure(kernel, reference)
    stored = save_and_load(base)
    k_ms, e_ms = base.kernel_ms, base.providers["eager"].median_ms
    ks = base.providers["kernel"].samples_ms
    cv = statistics.stdev(ks) / statistics.mean(ks)
    print(f"baseline: kernel {k_ms:.4f} ms (per-sample CV {cv:.3f} over {len(ks)} rounds), eager {e_ms:.4f} ms, "
          f"speedup {stored.providers['eager'].speedup:.3f} "
          f"[{base.providers['eager'].low:.3f}, {base.providers['eager'].high:.3f}]")

    # The slowed baseline for scenario 3: eager made slower when the baseline was taken.
    base_slow_eager = measure(kernel, slowed(reference, e_ms * 1e-3 * (1 / (1 - args.slowdown) - 1)), where="fast-eager")
    stored_slow_eager = save_and_load(base_slow_eager)
    print(f"baseline with eager slowed: eager {base_slow_eager.providers['eager'].median_ms:.4f} ms, "
          f"speedup {stored_slow_eager.providers['eager'].speedup:.3f}")

    scenarios = {
        "unchanged kernel": (kernel, reference, stored, "pass"),
        f"kernel slowed {args.slowdown:.0%}": (slowed(kernel, k_ms * 1e-3 * args.slowdown), reference, stored, "fail"),
        f"eager {args.slowdown:.0%} faster than baseline": (kernel, reference, stored_slow_eager, "fail"),
    }
    ok = True
    for name, (kern, ref, st, expect) in scenarios.items():
        outcomes = collections.Counter()
        blames = collections.Counter()
        speedups = []
        for _ in range(args.trials):
            rec = measure(kern, ref, stored=st, where="baseline" if st is stored else "fast-eager")
            status = "fail" if rec.status == "fail" else "pass"
            outcomes[status] += 1
            speedups.append(rec.providers["eager"].speedup)
            for r in rec.reasons:
                blames["noise" if "too noisy" in r else "kernel" if "kernel got slower" in r
                       else "baseline" if "baseline (eager) got faster" in r else "other"] += 1
            last = rec
        hit = outcomes[expect]
        ok &= hit == args.trials
        print(f"{name}: {hit}/{args.trials} {expect}; eager speedup min {min(speedups):.3f} median "
              f"{sorted(speedups)[len(speedups) // 2]:.3f} max {max(speedups):.3f}; failure reasons {dict(blames)}")
        if last.reasons:
            print(f"  e.g. {last.reasons[0]}")
    print(f"load average at the end: {os.getloadavg()[0]:.1f}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
