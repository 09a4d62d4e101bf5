"""The tuner's command line (``python3 -m reference_kernels.tune``)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import Any

from reference_kernels.tuning.tuner import __doc__ as DOC
from reference_kernels.tuning.tuner.cases import selected_configs
from reference_kernels.tuning.tuner.correctness import check_all, rejected_configs, resume_refusal
from reference_kernels.tuning.tuner.sweep import Recorder, run_sweep
from reference_kernels.tuning.tuner.table import (
    base_table_refusal,
    case_names,
    load_base_table,
    replaceable_keys,
    time_mlps,
    write_cache_table,
    write_table,
)

OUT_DIR_ENV = "OUT"
"""The environment variable naming the directory the tuner writes its files to (<out>)."""


def output_dir() -> str:
    """The directory the tuner writes its files to: the one :data:`OUT_DIR_ENV` names, else /tmp."""
    return os.environ.get(OUT_DIR_ENV, "/tmp")


def parser() -> argparse.ArgumentParser:
    """The command line's arguments."""
    ap = argparse.ArgumentParser(description=(DOC or "").strip().splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="CPU + TRITON_INTERPRET=1, tiny shapes")
    ap.add_argument("--workers", type=int, default=12, help="processes compiling/checking configs")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile provider")
    ap.add_argument("--skip-check", action="store_true")
    ap.add_argument(
        "--check-timeout",
        type=float,
        default=300.0,
        help="seconds the whole correctness check may take, reruns included; configs not done by then "
        "are rejected",
    )
    ap.add_argument("--dtypes", default="bfloat16,float16", help="sweep dtypes, comma-separated")
    ap.add_argument(
        "--sustained-ms",
        type=float,
        default=4.0,
        help="keys whose eager time (interleaved) reaches this many ms are ranked by sustained timing",
    )
    ap.add_argument(
        "--sustained-s", type=float, default=1.2, help="seconds per provider phase of the sustained timing"
    )
    ap.add_argument(
        "--resume",
        metavar="JSON",
        help="a tune_kernels.json whose run was cut: keep its checks and timings, time "
        "only the cases it did not reach, then write the table from both",
    )
    ap.add_argument(
        "--cases",
        metavar="REGEX",
        help="time only the sweep cases whose name matches (re.search; anchor it, e.g. "
        "'^llama3-70b-M8192$', or llama3-8b-M1 also matches -M16, -M128...); the check "
        "covers only their candidates; needs --base-table",
    )
    ap.add_argument(
        "--base-table",
        metavar="JSON",
        help="with --cases: a tuned table of this device whose picks the new table keeps, "
        "except those set by the cases re-timed",
    )
    ap.add_argument(
        "--bench-top",
        type=int,
        default=4,
        help="sustained keys: how many of the fastest back to back are ranked in benchmark mode (< 2: none)",
    )
    ap.add_argument("--bench-passes", type=int, default=2, help="passes of the benchmark-mode ranking")
    ap.add_argument(
        "--from-cache",
        action="store_true",
        help="time nothing: write <out>/<device>.json from this machine's run-time tuning cache for "
        "this GPU (reference_kernels.tuning.cache.cache_path)",
    )
    return ap


def parse_args() -> argparse.Namespace:
    """The arguments, their combinations checked (argparse's usage error otherwise)."""
    ap = parser()
    args = ap.parse_args()
    if (args.cases is None) != (args.base_table is None):
        ap.error(
            "--cases and --base-table go together: a table from some cases alone would drop every other key"
        )
    if args.cases is not None and args.resume:
        ap.error("--cases cannot resume a run: re-run the cases (a few minutes)")
    if args.bench_passes < 1:
        ap.error("--bench-passes must be >= 1")
    if args.from_cache and (args.smoke or args.cases or args.base_table or args.resume):
        ap.error("--from-cache times nothing: it takes no --smoke, --cases, --base-table or --resume")
    return args


def run_meta(args: argparse.Namespace, device: str) -> dict[str, Any]:
    """The run's ``meta``: date, versions, device and its target (compute capability, opt-in
    shared memory per block in bytes: the candidates it was offered), command line and the
    ranking regimes' settings."""
    import torch
    import triton

    from reference_kernels.gemm import targets

    target = targets.of_device(torch.device(device))
    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        torch=torch.__version__,
        triton=triton.__version__,
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu (interpreter)",
        target=dict(capability=list(target.capability), smem_optin=target.smem_optin),
        argv=sys.argv,
    )
    meta["regimes"] = dict(
        sustained_ms=args.sustained_ms,
        sustained_s=args.sustained_s,
        bench_top=args.bench_top,
        bench_passes=args.bench_passes,
    )
    return meta


def note_base_table(
    rec: Recorder, args: argparse.Namespace, base_picks: dict[str, Any], base_meta: dict[str, Any]
) -> None:
    """Record in ``meta`` what the base table's picks came from.

    Raises:
        SystemExit: the base table is not of this run's device (base_table_refusal).
    """
    why = base_table_refusal(base_meta, rec.data["meta"]["device"])
    if why:
        raise SystemExit(f"--base-table {args.base_table}: {why}")
    # what the base table's picks came from, its own base table and re-timed keys included
    rec.data["meta"]["base_table"] = dict(
        path=args.base_table,
        keys=len(base_picks),
        **{k: base_meta.get(k) for k in ("date", "resumed", "regimes", "base_table", "retimed")},
    )


def resume_from(rec: Recorder, args: argparse.Namespace, resumed: dict[str, Any]) -> None:
    """Continue the cut run ``resumed``: its record, with this run appended to ``meta.resumed``;
    its checks stand, so this run's are skipped.

    Raises:
        SystemExit: a run this one cannot resume (resume_refusal).
    """
    first = resumed["meta"]
    now = rec.data["meta"]
    why = resume_refusal(resumed, now, rec.data["configs"])
    if why:
        raise SystemExit(f"--resume {args.resume}: {why}")
    runs = first.get("resumed", [])
    rec.data = dict(resumed, meta=dict(first, resumed=(runs if isinstance(runs, list) else [runs]) + [now]))
    args.skip_check = True  # its checks stand: rejected_configs reads them


def start(args: argparse.Namespace) -> tuple[Recorder, str, list[str] | None, dict[str, Any], str]:
    """The run's record (meta, configs; a resumed run's rows), the device, the ``--cases`` names
    and the base table's picks.

    Raises:
        SystemExit: a base table or a resumed run this run cannot start from.
    """
    base_picks: dict[str, Any] = {}
    base_meta: dict[str, Any] = {}
    names: list[str] | None = None
    if args.base_table:
        names = case_names(args.smoke, args.cases)
        base_picks, base_meta = load_base_table(args.base_table)
    out_dir = output_dir()
    rec = Recorder(os.path.join(out_dir, "tune_kernels.json"))
    resumed = None
    if args.resume:
        with open(args.resume) as f:
            resumed = json.load(f)
    device = "cpu" if args.smoke else "cuda"
    rec.data["meta"] = run_meta(args, device)
    if args.base_table:
        note_base_table(rec, args, base_picks, base_meta)
    from reference_kernels.gemm import configs as C

    # the check rows name configs by index: these names say which
    rec.data["configs"] = {
        "linear": [C.config_name(c) for c in C.LINEAR_CONFIGS],
        "gated": [C.config_name(c) for c in C.GATED_CONFIGS],
    }
    if resumed is not None:
        resume_from(rec, args, resumed)
    rec.save()
    print(json.dumps(rec.data["meta"]), flush=True)
    return rec, device, names, base_picks, out_dir


def check_phase(rec: Recorder, args: argparse.Namespace, device: str, names: list[str] | None) -> None:
    """Step 1: every config (of a ``--cases`` run: the cases' candidates) checked."""
    import torch

    from reference_kernels.gemm import configs as C
    from reference_kernels.gemm import targets

    if not args.skip_check:
        t0 = time.time()
        dtypes = ("float16", "float32") if args.smoke else ("float16", "bfloat16", "float32")
        tasks = [("linear", i, device, dtypes) for i in range(len(C.LINEAR_CONFIGS))]
        tasks += [("gated", i, device, dtypes) for i in range(len(C.GATED_CONFIGS))]
        if args.cases is not None:
            timed = selected_configs(
                args.smoke,
                ("float16",) if args.smoke else args.dtypes.split(","),
                names or (),  # set with --cases (parse_args: --cases needs --base-table)
                targets.of_device(torch.device(device)),
            )
            tasks = [t for t in tasks if t[:2] in timed]
        for rows, secs in check_all(tasks, args.workers, args.check_timeout):
            rec.data["correctness"].extend(rows)
            rec.save()
            bad = [r for r in rows if r.get("ok") is False]
            r0 = rows[0]
            print(
                f"check {r0['kernel']:6s} config {r0['config']}: {len(rows)} rows, "
                f"{len(bad)} failing, {secs:.1f}s" + (f"  FIRST FAIL {bad[0]}" if bad else ""),
                flush=True,
            )
        n_bad = sum(1 for r in rec.data["correctness"] if r.get("ok") is False)
        n_ok = sum(1 for r in rec.data["correctness"] if r.get("ok") is True)
        print(
            f"correctness: {n_ok} passed, {n_bad} failed, "
            f"{sum(1 for r in rec.data['correctness'] if 'skipped' in r)} skipped in {time.time() - t0:.0f}s",
            flush=True,
        )


def sweep_phase(
    rec: Recorder, args: argparse.Namespace, device: str, names: list[str] | None, base_picks: dict[str, Any]
) -> None:
    """Step 2: the sweep of every case not rejected; a ``--cases`` run notes the keys it re-timed."""
    t0 = time.time()
    dtypes = ("float16",) if args.smoke else tuple(args.dtypes.split(","))
    rejected = rejected_configs(rec.data["correctness"])
    rec.data["rejected"] = sorted(f"{k}:{n}" for k, n in rejected)
    if rejected:
        print("not timed (failed the check):", ", ".join(rec.data["rejected"]), flush=True)
    if args.base_table:
        rec.data["picks"] = dict(base_picks)
    before = dict(rec.data.get("picks", {}))  # a pick this run sets is a new object
    run_sweep(
        rec,
        device,
        args.smoke,
        dtypes,
        rejected,
        args.sustained_ms,
        args.sustained_s,
        cases=names,
        replaceable=replaceable_keys(base_picks, names or ()),
        bench_top=args.bench_top,
        bench_passes=args.bench_passes,
        compile_ok=not (args.no_compile or args.smoke),
    )
    if args.base_table:
        rec.data["meta"]["retimed"] = sorted(
            k for k, v in rec.data["picks"].items() if k not in before or v is not before[k]
        )
        changed = {
            k: (before[k]["config"], v["config"])
            for k, v in rec.data["picks"].items()
            if k in before and before[k]["config"] != v["config"]
        }
        print(
            f"re-timed {len(rec.data['meta']['retimed'])} keys; picks changed: {changed or 'none'}",
            flush=True,
        )
    print(f"sweep done in {time.time() - t0:.0f}s", flush=True)


def main() -> None:
    """``python3 -m reference_kernels.tune``: check, sweep, write the table, time the seed MLP
    (``--from-cache``: write the table from the tuning cache instead, :func:`write_cache_table`)."""
    args = parse_args()
    if args.from_cache:
        path = write_cache_table(output_dir())
        print(f"table {path} (copy it to reference_kernels/tuning/tables/ to commit it)", flush=True)
        return
    rec, device, names, base_picks, out_dir = start(args)
    check_phase(rec, args, device, names)
    sweep_phase(rec, args, device, names, base_picks)
    path = write_table(rec, out_dir, device)
    print(f"table {path} ({len(rec.data['picks'])} keys)", flush=True)
    # the MLP timing reads the table from the package, as a user's process would
    import shutil

    from reference_kernels.tuning import pick

    if not args.smoke:  # the interpreter ignores tables; keep a CPU smoke run out of the package
        pick.TABLE_DIR.mkdir(exist_ok=True)
        shutil.copy(path, pick.TABLE_DIR / os.path.basename(path))
        pick.load_table.cache_clear()
    time_mlps(rec, device, args.smoke, compile_ok=not (args.no_compile or args.smoke))
