"""Step 3 of the tuner: the tuned table, the ``--cases``/``--base-table`` rules, and the seed
GeGLU MLP timed with the table's picks."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any, Collection

from reference_kernels.tuning.tuner.cases import sweep_cases
from reference_kernels.tuning.tuner.sweep import Recorder, interleaved_medians

if TYPE_CHECKING:
    import torch


def _dump_table(out_dir: str, device: str | torch.device, meta: dict[str, Any], picks: dict[str, Any]) -> str:
    """Write ``{meta, picks}`` to ``out_dir/<device slug>.json``, as tuning.pick.load_table reads it;
    returns the path."""
    import torch

    from reference_kernels.tuning.cache import device_slug

    slug = device_slug(torch.device(device))
    path = os.path.join(out_dir, f"{slug}.json")
    with open(path, "w") as f:
        json.dump(dict(meta=meta, picks=picks), f, indent=1, sort_keys=True)
    return path


def write_table(rec: Recorder, out_dir: str, device: str) -> str:
    """The tuned table (reference_kernels/tuning/pick.py reads it): picks plus how they were made."""
    return _dump_table(
        out_dir,
        device,
        dict(
            rec.data["meta"],
            note=(
                "written by python3 -m reference_kernels.tune: per key the fastest candidate config by "
                "median CUDA-graph replay time (L2 flushed), candidates and eager interleaved in rounds; "
                "where eager took >= --sustained-ms, by median time with each replayed back to back "
                "(regime: sustained), then the --bench-top fastest there by speedup over eager in "
                "benchmark mode (regime: benchmark). With meta.base_table, only the keys in meta.retimed "
                "were timed by this run; the other picks are that table's"
            ),
        ),
        rec.data["picks"],
    )


def write_cache_table(out_dir: str, device: str = "cuda") -> str:
    """``python3 -m reference_kernels.tune --from-cache``: the tuned table of ``device`` (a torch
    device string; the CPU only in tests) from this machine's tuning cache for it
    (``tuning.cache.cache_path``: this Triton, this device, these kernel sources), written to
    ``out_dir/<device slug>.json``; returns the path.

    Raises:
        SystemExit: the cache holds no pick for this fingerprint (missing, empty or unreadable);
            the message names the file looked at.
    """
    import time

    import torch
    import triton

    from reference_kernels.tuning import cache as tuning_cache

    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None:
        dev = torch.device("cuda", torch.cuda.current_device())
    cache, parts = tuning_cache.cache_path(dev)
    picks = tuning_cache.read_cache(cache, parts)
    if not picks:
        raise SystemExit(
            f"--from-cache: no tuned picks in {cache} ({'no picks' if cache.exists() else 'no such file'}; "
            f"the cache of this device, Triton {parts['triton']} and these kernel sources): run the "
            "kernels on this GPU first (REFERENCE_KERNELS_AUTOTUNE not 0), or run the tuner"
        )
    meta = dict(
        date=time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime()),
        device=parts["device"],
        torch=torch.__version__,
        triton=triton.__version__,
        cache=str(cache),
        fingerprint=parts,
        note=(
            "written by python3 -m reference_kernels.tune --from-cache from the run-time tuning cache: "
            "per key the candidate reference_kernels.tuning.pick picked at the key's first call on this "
            "machine, one triton.testing.do_bench call per candidate; not the tuner's checked, "
            "interleaved sweep (no correctness check, no eager, no sustained or benchmark-mode ranking)"
        ),
    )
    return _dump_table(out_dir, dev, meta, {k: {"config": v} for k, v in sorted(picks.items())})


def case_names(smoke: bool, cases: str) -> list[str]:
    """Names of the sweep cases that the regex ``cases`` matches (re.search).

    Raises:
        SystemExit: an invalid regex, or one that matches no case (a run that times nothing
            would still write a whole table)."""
    import re

    try:
        pattern = re.compile(cases)
    except re.error as exc:
        raise SystemExit(f"--cases {cases!r}: not a regular expression ({exc})") from exc
    names = sorted({case for _, case, *_ in sweep_cases(smoke) if pattern.search(case)})
    if not names:
        raise SystemExit(
            f"--cases {cases!r} matches no sweep case (names look like llama3-70b-M8192, "
            f"llama3-70b-down-M8192; anchor them: '^llama3-70b-M8192$')"
        )
    return names


def base_table_refusal(base_meta: dict[str, Any], device: str) -> str | None:
    """Why a base table cannot be the start of this run's table on ``device`` (a device name as
    tune_kernels.json's meta records it), or None: its picks were timed on another device."""
    if base_meta.get("device") != device:
        return f"it was tuned on {base_meta.get('device')!r}, this run is on {device!r}"
    return None


def replaceable_keys(base_picks: dict[str, Any], names: Collection[str]) -> set[str]:
    """Keys of ``base_picks`` that a run of the cases ``names`` may replace: those whose pick
    was set by one of them. A key that several cases share keeps the pick of the case that set
    it (in a full run, the first), unless that case is re-timed too."""
    return {k for k, v in base_picks.items() if v.get("case") in names}


def load_base_table(path: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(picks, meta)`` of a tuned table that a ``--cases`` run starts from.

    Raises:
        SystemExit: the file is not a tuned table (named, with what is wrong)."""
    try:
        with open(path) as f:
            data = json.load(f)
        picks, meta = data["picks"], data.get("meta", {})
        if not isinstance(picks, dict) or not all(
            isinstance(v, dict) and "config" in v for v in picks.values()
        ):
            raise TypeError("picks is not {key: {config: ...}}")
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise SystemExit(f"--base-table {path}: not a tuned table ({type(exc).__name__}: {exc})") from exc
    return picks, meta


def time_mlps(rec: Recorder, device: str, smoke: bool, compile_ok: bool) -> None:
    """The whole seed GeGLU MLP (models.shapes.SEED_GEGLU) with the table's picks, against eager,
    torch.compile and (when installed) Liger-Kernel's GeGLU, by the same interleaved graph timer."""
    import torch

    from pytest_fusion.measure.timers import default_timer
    from reference_kernels.kernels import eager
    from reference_kernels.models import shapes
    from reference_kernels.models.modules import gated_mlp

    timer = default_timer(device)
    tdt = torch.bfloat16 if not smoke else torch.float16
    M, H, inter = (8192, 768, 3072) if not smoke else (8, 48, 80)
    torch.manual_seed(0)
    x = torch.randn(M, H, device=device, dtype=tdt)
    wg, wu = (torch.randn(inter, H, device=device, dtype=tdt) / H**0.5 for _ in range(2))
    wd = torch.randn(H, inter, device=device, dtype=tdt) / inter**0.5
    calls = {
        "kernel": lambda: gated_mlp(x, wg, wu, wd, activation="gelu_tanh"),
        "eager": lambda: eager.gated_mlp_eager(x, wg, wu, wd, activation="gelu_tanh"),
    }
    try:  # Liger-Kernel's GeGLU between cuBLAS projections, as its LigerGEGLUMLP computes it
        if smoke:  # its kernel fails under the interpreter (a None block pointer offset)
            raise ImportError("not under the interpreter")
        from liger_kernel.ops.geglu import LigerGELUMulFunction

        calls["liger"] = lambda: torch.nn.functional.linear(
            LigerGELUMulFunction.apply(torch.nn.functional.linear(x, wg), torch.nn.functional.linear(x, wu)),
            wd,
        )
    except ImportError as exc:
        print(f"no Liger provider ({exc})", flush=True)
    if compile_ok:
        compiled = torch.compile(eager.gated_mlp_eager)
        calls["compile"] = lambda: compiled(x, wg, wu, wd, activation="gelu_tanh")
    for fn in calls.values():
        fn()
    timer.sync()
    med, _ = interleaved_medians(calls, timer, smoke, rounds=60)
    row = dict(
        case="seed-geglu-mlp",
        M=M,
        K=H,
        N=inter,
        dtype=str(tdt),
        ms=med,
        flops=shapes.gated_mlp_flops(M, H, inter),
        speedups={n: med[n] / med["kernel"] for n in med if n != "kernel"},
    )
    rec.data["mlp"] = row
    rec.save()
    print("seed GeGLU MLP:", json.dumps(row), flush=True)
