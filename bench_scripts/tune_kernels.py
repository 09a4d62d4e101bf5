"""Check every autotune config of the reference kernels, then time them at the real MLP shapes.

One script for one GPU lease (see notes/KERNELS.md for the runs and their numbers):

1. correctness: every config of linear_act and gated_act, forced one by one, in float16, bfloat16
   and float32 (configs that fit shared memory), at odd shapes (M, K, N not tile multiples, one
   transposed weight), against a float64 golden; relative Frobenius error of the kernel must stay
   within 2x eager's own error (or a floor per dtype). The configs are compiled in a process pool,
   which also fills Triton's disk cache for the timing phase (compiles dominate a cold run).
2. timing: GPU time by CUDA-graph replay (triton.testing.do_bench_cudagraph, median of the
   replays) of the kernels against eager PyTorch at the real shapes of reference_kernels.shapes,
   the down projections (linear_act "none" vs F.linear), and the whole seed GeGLU MLP against
   eager and torch.compile.

Writes ``$OUT/tune_kernels.json`` (appended after every case, so a timeout keeps what finished)
and prints a table. ``--smoke`` runs the same code path on the CPU under the Triton interpreter
at tiny shapes, to test the script itself without a GPU.

    python3 bench_scripts/tune_kernels.py            # on the H200
    TRITON_INTERPRET=1 python3 bench_scripts/tune_kernels.py --smoke
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FLOOR = {"float16": 2e-3, "bfloat16": 1e-2, "float32": 1e-6}
"""Relative error a kernel may always reach: a few ulps at unit scale (fp16 2^-10, bf16 2^-7)."""

ODD_SHAPES = ((1, 257, 131), (37, 1000, 523), (300, 129, 77))
"""(M, K, N) not multiples of any tile; K = 129 and 257 leave one element in the last K tile."""


def _dtype(name):
    import torch

    return getattr(torch, name)


def _rel(out, gold):
    d = (out.double() - gold)
    return (d.norm() / gold.norm().clamp_min(1e-300)).item()


def check_config(task):
    """Worker: run one (kernel, config index) at the odd shapes in each dtype, and once at an
    aligned shape (bf16/fp16) so Triton's disk cache holds the compile the timing phase needs."""
    import torch

    from reference_kernels import configs as C
    from reference_kernels import eager
    from reference_kernels.gated_mlp import gated_act
    from reference_kernels.linear_act import linear_act

    kernel, idx, device, dtypes = task
    cfgs = C.LINEAR_CONFIGS if kernel == "linear" else C.GATED_CONFIGS
    cfg = cfgs[idx]
    weights = 1 if kernel == "linear" else 2
    rows = []
    gen = torch.Generator(device="cpu").manual_seed(1000 + idx)
    acts = ("gelu_tanh", "silu", "gelu", "relu", "none")
    t0 = time.time()
    for di, dt in enumerate(dtypes):
        torch_dt = _dtype(dt)
        if not C.fits(cfg, torch_dt.itemsize, weights) and device == "cuda":
            rows.append(dict(kernel=kernel, config=idx, dtype=dt, skipped="does not fit shared memory"))
            continue
        for si, (M, K, N) in enumerate(ODD_SHAPES):
            act = acts[(si + di + idx) % len(acts)]
            x = torch.randn(M, K, generator=gen).to(device, torch_dt)
            w1 = (torch.randn(N, K, generator=gen) / K**0.5).to(device, torch_dt)
            w2 = (torch.randn(K, N, generator=gen) / K**0.5).to(device, torch_dt).t()  # transposed
            b = torch.randn(N, generator=gen).to(device, torch_dt)
            try:
                if kernel == "linear":
                    w = w2 if si == 1 else w1
                    out = linear_act(x, w, b, act, config=cfg)
                    gold = eager.linear_act_eager(x.double(), w.double(), b.double(), act)
                    eag = eager.linear_act_eager(x, w, b, act)
                else:
                    bg = b if si != 2 else None
                    out = gated_act(x, w1, w2, bg, None, act, config=cfg)
                    gold = eager.gated_act_eager(x.double(), w1.double(), w2.double(),
                                                 None if bg is None else bg.double(), None, act)
                    eag = eager.gated_act_eager(x, w1, w2, bg, None, act)
                if device == "cuda":
                    torch.cuda.synchronize()
                k_err, e_err = _rel(out, gold), _rel(eag, gold)
                ok = bool(torch.isfinite(out).all()) and k_err <= max(2 * e_err, FLOOR[dt])
                rows.append(dict(kernel=kernel, config=idx, dtype=dt, M=M, K=K, N=N, act=act,
                                 kernel_rel=k_err, eager_rel=e_err, ok=ok))
            except Exception as exc:  # noqa: BLE001 - a failing config is a result, not a crash
                rows.append(dict(kernel=kernel, config=idx, dtype=dt, M=M, K=K, N=N, act=act,
                                 ok=False, error=f"{type(exc).__name__}: {exc}"[:400]))
    if device == "cuda":
        # aligned warm-up compiles: M = 1 (specialised) or a multiple of 16, K a multiple of 256
        Ms = [1, 16] if cfg.kwargs["BLOCK_M"] == 16 else [128, 1024]
        for dt in ("bfloat16", "float16"):
            torch_dt = _dtype(dt)
            for M in Ms:
                x = torch.randn(M, 512, device=device, dtype=torch_dt)
                w = torch.randn(256, 512, device=device, dtype=torch_dt)
                b = torch.randn(256, device=device, dtype=torch_dt)
                if kernel == "linear":
                    for act, bias in (("gelu", b), ("gelu_tanh", b), ("none", None)):
                        linear_act(x, w, bias, act, config=cfg)
                else:
                    for act in ("silu", "gelu_tanh"):
                        gated_act(x, w, w, None, None, act, config=cfg)
        torch.cuda.synchronize()
    return rows, time.time() - t0


class Recorder:
    def __init__(self, path):
        self.path = path
        self.data = {"meta": {}, "correctness": [], "timing": [], "errors": []}

    def save(self):
        tmp = self.path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(self.data, f, indent=1)
        os.replace(tmp, self.path)


def make_timer(device):
    import torch
    import triton

    if device == "cuda":
        def timer(fn):
            fn()  # autotune / compile outside the graph
            torch.cuda.synchronize()
            q = triton.testing.do_bench_cudagraph(fn, rep=10, quantiles=[0.5, 0.2, 0.8])
            return q[0], q[1], q[2]
    else:
        def timer(fn):
            fn()
            ts = []
            for _ in range(3):
                t = time.perf_counter()
                fn()
                ts.append((time.perf_counter() - t) * 1e3)
            return statistics.median(ts), min(ts), max(ts)
    return timer


def timing_cases(smoke):
    from reference_kernels import shapes

    cases = []
    for s in shapes.CATALOG:
        for m in s.tokens:
            M = 2 if smoke else m
            H, I = (48, 80) if smoke else (s.hidden, s.intermediate)
            cases.append(("gated_up" if s.kind == "gated" else "linear_up", s, M, H, I))
    for s in shapes.CATALOG:
        if s.slug == "seed-geglu":
            continue
        for m in (1, 1024, 8192):
            cases.append(("down", s, 2 if smoke else m, 48 if smoke else s.hidden, 80 if smoke else s.intermediate))
    return cases


def run_timing(rec, device, smoke, compile_ok, prefill_only=False, dtypes=("bfloat16", "float16")):
    import torch

    from reference_kernels import eager, shapes
    from reference_kernels.gated_mlp import gated_act
    from reference_kernels.linear_act import linear_act
    from reference_kernels.modules import gated_mlp, mlp

    timer = make_timer(device)

    # by module path: the package re-exports functions named gated_mlp / linear_act, which
    # shadow the submodules as package attributes (run 2 on the H200 failed on exactly that)
    gated_mod = sys.modules["reference_kernels.gated_mlp"]
    linear_mod = sys.modules["reference_kernels.linear_act"]

    def record(case, dt, M, K, N, flops, bytes_, providers, tuned=None):
        row = dict(case=case, dtype=dt, M=M, K=K, N=N)
        base = None
        for name, fn in providers:
            try:
                t0 = time.time()
                med, lo, hi = timer(fn)
                row[name] = dict(ms=med, p20=lo, p80=hi, wall_s=round(time.time() - t0, 2))
                if name == "eager":
                    base = med
            except Exception as exc:  # noqa: BLE001
                row[name] = dict(error=f"{type(exc).__name__}: {exc}"[:300])
        if tuned is not None and getattr(tuned, "best_config", None) is not None:
            row["config"] = str(tuned.best_config)
        k = row.get("kernel", {}).get("ms")
        if k and base:
            row["speedup_eager"] = base / k
            row["tflops"] = flops / (k * 1e-3) / 1e12
            row["gbps"] = bytes_ / (k * 1e-3) / 1e9
        if k and "ms" in row.get("compile", {}):
            row["speedup_compile"] = row["compile"]["ms"] / k
        if base and "ms" in row.get("kernel_triton_down", {}):
            row["speedup_eager_triton_down"] = base / row["kernel_triton_down"]["ms"]
        rec.data["timing"].append(row)
        rec.save()
        s = row.get("speedup_eager")
        extra = f"  [{row.get('config', '')}]" + "".join(f"  {n} {row[n]['ms']:.4f} ms" for n in ("kernel_triton_down", "compile") if "ms" in row.get(n, {}))
        print(f"{case:26s} {dt:8s} M={M:<5d} K={K:<5d} N={N:<5d} kernel {k if k else float('nan'):8.4f} ms  "
              f"eager {base if base else float('nan'):8.4f} ms  x{s if s else float('nan'):5.2f}{extra}", flush=True)

    def shapes_in(dt):
        tdt = _dtype(dt)
        for kind, s, M, H, I in timing_cases(smoke):
            if prefill_only and (kind == "down" or M < 1024):
                continue
            torch.manual_seed(0)
            x = torch.randn(M, H, device=device, dtype=tdt)
            item = tdt.itemsize
            try:
                if kind == "gated_up":
                    wg = torch.randn(I, H, device=device, dtype=tdt) / H**0.5
                    wu = torch.randn(I, H, device=device, dtype=tdt) / H**0.5
                    a = s.activation
                    record(f"{s.slug}-up", dt, M, H, I, shapes.gated_flops(M, H, I), (M * H + 2 * I * H + M * I) * item, [
                        ("kernel", lambda: gated_act(x, wg, wu, activation=a)),
                        ("eager", lambda: eager.gated_act_eager(x, wg, wu, activation=a)),
                    ], tuned=gated_mod._tuned)
                elif kind == "linear_up":
                    w = torch.randn(I, H, device=device, dtype=tdt) / H**0.5
                    b = torch.randn(I, device=device, dtype=tdt)
                    a = s.activation
                    record(f"{s.slug}-up", dt, M, H, I, shapes.up_flops(M, H, I), (M * H + I * H + M * I) * item, [
                        ("kernel", lambda: linear_act(x, w, b, a)),
                        ("eager", lambda: eager.linear_act_eager(x, w, b, a)),
                    ], tuned=linear_mod._tuned)
                else:  # down projection: (M, I) -> (M, H)
                    h = torch.randn(M, I, device=device, dtype=tdt)
                    w = torch.randn(H, I, device=device, dtype=tdt) / I**0.5
                    b = torch.randn(H, device=device, dtype=tdt) if s.bias else None
                    record(f"{s.slug}-down", dt, M, I, H, shapes.up_flops(M, I, H), (M * I + I * H + M * H) * item, [
                        ("kernel", lambda: linear_act(h, w, b, "none")),
                        ("eager", lambda: torch.nn.functional.linear(h, w, b)),
                    ], tuned=linear_mod._tuned)
            except Exception as exc:  # noqa: BLE001
                rec.data["errors"].append(dict(case=f"{kind}-{s.slug}-{M}-{dt}", error=traceback.format_exc()[-800:]))
                rec.save()
                print("ERROR", kind, s.slug, M, dt, exc, flush=True)
            finally:
                if device == "cuda":
                    torch.cuda.empty_cache()

    shapes_in(dtypes[0])
    # Whole MLPs: the seed GeGLU (the aim) and GPT-2 at M = 8192, bf16.
    dt = "bfloat16"
    tdt = _dtype(dt)
    M = 4 if smoke else 8192
    H, I = (48, 80) if smoke else (768, 3072)
    torch.manual_seed(0)
    x = torch.randn(M, H, device=device, dtype=tdt)
    wg, wu = (torch.randn(I, H, device=device, dtype=tdt) / H**0.5 for _ in range(2))
    wd = torch.randn(H, I, device=device, dtype=tdt) / I**0.5
    providers = [
        ("kernel", lambda: gated_mlp(x, wg, wu, wd, activation="gelu_tanh", down="torch")),
        ("kernel_triton_down", lambda: gated_mlp(x, wg, wu, wd, activation="gelu_tanh", down="triton")),
        ("eager", lambda: eager.gated_mlp_eager(x, wg, wu, wd, activation="gelu_tanh")),
    ]
    record("seed-geglu-mlp", dt, M, H, I, shapes.gated_mlp_flops(M, H, I), (M * H * 2 + 3 * H * I) * tdt.itemsize, providers, tuned=gated_mod._tuned)

    w1 = torch.randn(I, H, device=device, dtype=tdt) / H**0.5
    b1 = torch.randn(I, device=device, dtype=tdt)
    w2 = torch.randn(H, I, device=device, dtype=tdt) / I**0.5
    b2 = torch.randn(H, device=device, dtype=tdt)
    record("gpt2-mlp", dt, M, H, I, shapes.mlp_flops(M, H, I), (M * H * 2 + 2 * H * I) * tdt.itemsize, [
        ("kernel", lambda: mlp(x, w1, b1, w2, b2, activation="gelu_tanh", down="torch")),
        ("kernel_triton_down", lambda: mlp(x, w1, b1, w2, b2, activation="gelu_tanh", down="triton")),
        ("eager", lambda: eager.mlp_eager(x, w1, b1, w2, b2, activation="gelu_tanh")),
    ])
    if compile_ok:  # last but fp16: inductor's cold compile takes tens of seconds
        t0 = time.time()
        compiled = torch.compile(eager.gated_mlp_eager, dynamic=False)
        compiled(x, wg, wu, wd, activation="gelu_tanh")
        rec.data["meta"]["compile_cold_start_s"] = round(time.time() - t0, 1)
        record("seed-geglu-mlp-vs-compile", dt, M, H, I, shapes.gated_mlp_flops(M, H, I),
               (M * H * 2 + 3 * H * I) * tdt.itemsize, [
                   ("kernel", lambda: gated_mlp(x, wg, wu, wd, activation="gelu_tanh", down="torch")),
                   ("eager", lambda: eager.gated_mlp_eager(x, wg, wu, wd, activation="gelu_tanh")),
                   ("compile", lambda: compiled(x, wg, wu, wd, activation="gelu_tanh")),
               ], tuned=gated_mod._tuned)
    for dt in dtypes[1:]:
        shapes_in(dt)


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--workers", type=int, default=12, help="processes compiling/checking configs")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument("--prefill-only", action="store_true", help="time only M >= 1024 up projections and the MLPs")
    ap.add_argument("--dtypes", default="bfloat16,float16", help="timing dtypes, comma-separated; bf16 first")
    args = ap.parse_args()
    out_dir = os.environ.get("OUT", "/tmp")
    rec = Recorder(os.path.join(out_dir, "tune_kernels.json"))

    import torch
    import triton

    device = "cpu" if args.smoke else "cuda"
    rec.data["meta"] = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        torch=torch.__version__, triton=triton.__version__,
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        argv=sys.argv,
    )
    rec.save()
    print(json.dumps(rec.data["meta"]), flush=True)

    from reference_kernels import configs as C

    if not args.skip_check:
        t0 = time.time()
        dtypes = ("float16", "float32") if args.smoke else ("float16", "bfloat16", "float32")
        tasks = [("linear", i, device, dtypes) for i in range(len(C.LINEAR_CONFIGS))]
        tasks += [("gated", i, device, dtypes) for i in range(len(C.GATED_CONFIGS))]
        ctx = mp.get_context("spawn")
        try:
            with cf.ProcessPoolExecutor(max_workers=args.workers, mp_context=ctx) as pool:
                for rows, secs in pool.map(check_config, tasks):
                    rec.data["correctness"].extend(rows)
                    rec.save()
                    bad = [r for r in rows if r.get("ok") is False]
                    r0 = rows[0]
                    print(f"check {r0['kernel']:6s} config {r0['config']}: {len(rows)} rows, "
                          f"{len(bad)} failing, {secs:.1f}s" + (f"  FIRST FAIL {bad[0]}" if bad else ""), flush=True)
        except Exception:  # noqa: BLE001 - keep the timing phase even if the pool breaks
            rec.data["errors"].append(dict(case="correctness pool", error=traceback.format_exc()[-1500:]))
            rec.save()
            traceback.print_exc()
        n_bad = sum(1 for r in rec.data["correctness"] if r.get("ok") is False)
        n_ok = sum(1 for r in rec.data["correctness"] if r.get("ok") is True)
        print(f"correctness: {n_ok} passed, {n_bad} failed, "
              f"{sum(1 for r in rec.data['correctness'] if 'skipped' in r)} skipped in {time.time() - t0:.0f}s", flush=True)

    t0 = time.time()
    run_timing(rec, device, args.smoke, compile_ok=not (args.no_compile or args.smoke),
               prefill_only=args.prefill_only, dtypes=args.dtypes.split(","))
    print(f"timing done in {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
