"""Autotune configs of the reference kernels, the shape buckets they are tuned per, and pruning.

One concern: which tile shapes the kernels may run with and how one is picked.

- Decode (M <= 16): BLOCK_M = 16 (the smallest tl.dot tile), narrow N tiles so that a weight
  of N = 3072..28672 rows still spreads over the H200's 132 SMs, long K tiles to keep many
  bytes in flight: the case is bound by reading the weight once.
- Prefill: 64..128 x 128..256 output tiles with K = 64 and 3-4 pipeline stages, the tile shapes
  the Triton matmul tutorial and Hopper GEMMs use for bf16/fp16.

Tuning is keyed on power-of-two buckets of M, N and K (:func:`bucket`), not on the exact sizes,
so a Hypothesis run that draws M = 17, 23, 29 tunes once for the bucket 32.
Under the Triton interpreter (``TRITON_INTERPRET=1``) nothing is tuned: the kernels run
:data:`INTERPRETER_CONFIG` unless ``config=`` names another.
"""

from __future__ import annotations

import os
from typing import Any, Sequence

import triton

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
"""True when the Triton interpreter runs the kernels (read once, at import, as Triton does)."""

AUTOTUNE = os.environ.get("REFERENCE_KERNELS_AUTOTUNE", "1") not in ("", "0")
"""Whether the GPU path autotunes. ``REFERENCE_KERNELS_AUTOTUNE=0`` makes it run
:func:`untuned_config` instead: for correctness runs that draw a new shape bucket on nearly every
example and would otherwise tune each time (every config is checked on its own by the tests)."""

GROUP_M = 8
"""Row-blocks per group in the grouped launch order (tutorial 03): neighbouring programs share
weight tiles in L2."""

SMEM_BYTES = 200 * 1024
"""Shared memory a config may plan for its pipeline. The H100/H200 allow 227 KB per block; the
rest is left for Triton's epilogue layout conversion."""


def _cfg(bm: int, bn: int, bk: int, warps: int, stages: int) -> triton.Config:
    return triton.Config(
        {"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "GROUP_M": GROUP_M},
        num_warps=warps,
        num_stages=stages,
    )


LINEAR_CONFIGS: tuple[triton.Config, ...] = (
    # decode, M <= 16
    _cfg(16, 32, 256, 4, 4),
    _cfg(16, 64, 128, 4, 5),
    _cfg(16, 128, 128, 4, 4),
    # small batches, 16 < M <= 128
    _cfg(64, 64, 128, 4, 4),
    _cfg(64, 128, 64, 4, 4),
    # prefill
    _cfg(128, 128, 64, 4, 4),
    _cfg(128, 128, 64, 8, 4),
    _cfg(128, 256, 64, 8, 3),
    _cfg(64, 256, 64, 4, 4),
)
"""Configs of :func:`reference_kernels.linear_act`; every one is checked by the tests."""

GATED_CONFIGS: tuple[triton.Config, ...] = (
    # decode: two weight tiles per step, so half the K depth of the linear ones
    _cfg(16, 32, 256, 4, 4),
    _cfg(16, 64, 128, 4, 4),
    _cfg(16, 128, 64, 4, 4),
    # small batches
    _cfg(64, 64, 128, 4, 3),
    _cfg(64, 128, 64, 4, 4),
    # prefill: two fp32 accumulators per program, so 8 warps at 128 x 128
    _cfg(128, 64, 64, 4, 4),
    _cfg(128, 128, 64, 8, 3),
    _cfg(128, 128, 32, 8, 4),
    # 2 stages: at 3 (221 KB in bf16) it never fit and was always pruned (H200 run 1, 2026-11-29)
    _cfg(64, 256, 64, 8, 2),
)
"""Configs of :func:`reference_kernels.gated_act`; every one is checked by the tests."""

INTERPRETER_CONFIG = _cfg(16, 32, 32, 4, 1)
"""The one config run under the interpreter when ``config=`` is not given: the smallest tiles,
because the interpreter executes every tile element by element in NumPy."""


def bucket(n: int) -> int:
    """Power-of-two tuning bucket of a size: 16 for n <= 16, else the next power of two, capped
    at 16384 (sizes past it tune like it)."""
    # bit_length, not a loop: this runs three times per launch
    return 1 << min(14, max(4, (n - 1).bit_length()))


def smem_bytes(config: triton.Config, itemsize: int, weights: int) -> int:
    """Shared memory a config's software pipeline needs: stages x (x tile + ``weights`` weight
    tiles) x itemsize."""
    kw = config.kwargs
    tile = kw["BLOCK_M"] * kw["BLOCK_K"] + weights * kw["BLOCK_K"] * kw["BLOCK_N"]
    return config.num_stages * tile * itemsize


def fits(config: triton.Config, itemsize: int, weights: int) -> bool:
    """Whether ``config`` fits :data:`SMEM_BYTES` for inputs of ``itemsize`` bytes."""
    return smem_bytes(config, itemsize, weights) <= SMEM_BYTES


def _m_class(m: int) -> tuple[int, int]:
    """The BLOCK_M range worth timing for M rows: 16 for decode, up to 64 for small batches."""
    if m <= 16:
        return (16, 16)
    if m <= 128:
        return (16, 64)
    return (64, 128)


def pruner(weights: int):
    """An ``early_config_prune`` for triton.autotune: drops configs whose BLOCK_M does not suit
    the M bucket or whose pipeline does not fit shared memory for the input dtype."""

    def prune(configs: Sequence[triton.Config], named_args: dict[str, Any], **kwargs: Any) -> list[triton.Config]:
        lo, hi = _m_class(named_args["M"])
        itemsize = named_args["x_ptr"].element_size()
        kept = [c for c in configs if lo <= c.kwargs["BLOCK_M"] <= hi and fits(c, itemsize, weights)]
        if kept:
            return kept
        # none of the M class fits (fp32 gated decode): what fits, nearest BLOCK_M first
        fitting = sorted((c for c in configs if fits(c, itemsize, weights)), key=lambda c: abs(c.kwargs["BLOCK_M"] - lo))
        return fitting or list(configs[:1])

    return prune


def untuned_config(configs: Sequence[triton.Config], M: int, itemsize: int, weights: int) -> triton.Config:
    """The config run without tuning: the first one :func:`pruner` keeps for M and the dtype."""
    x = _Itemsize(itemsize)
    return pruner(weights)(configs, {"M": M, "x_ptr": x})[0]


class _Itemsize:
    """Stands in for a tensor argument where only ``element_size()`` is read."""

    def __init__(self, itemsize: int) -> None:
        self._itemsize = itemsize

    def element_size(self) -> int:
        return self._itemsize


def quick_bench(fn: Any, quantiles: Any = None) -> Any:
    """Autotuning timer: 5 ms warm-up, 25 ms of repeats (Triton's defaults are 25 and 100 ms),
    so a new bucket met in a correctness run costs about 0.1 s per surviving config."""
    return triton.testing.do_bench(fn, warmup=5, rep=25, quantiles=quantiles)


def autotuner(configs: Sequence[triton.Config], key: list[str], weights: int) -> Any:
    """``triton.autotune`` over ``configs`` with :func:`pruner` and :func:`quick_bench`.

    Triton releases without the ``do_bench`` argument fall back to their own timer."""
    common = dict(configs=list(configs), key=key, prune_configs_by={"early_config_prune": pruner(weights)})
    try:
        return triton.autotune(**common, do_bench=quick_bench)
    except TypeError:
        return triton.autotune(**common)


def launch_kwargs(config: triton.Config) -> dict[str, Any]:
    """Keyword arguments that launch a kernel with ``config`` forced (meta-parameters, warps,
    stages)."""
    if not isinstance(config, triton.Config) or not {"BLOCK_M", "BLOCK_N", "BLOCK_K"} <= set(config.kwargs):
        raise TypeError(
            f"config must be a triton.Config with BLOCK_M, BLOCK_N and BLOCK_K (e.g. one of "
            f"LINEAR_CONFIGS / GATED_CONFIGS), got {config!r}"
        )
    kw = dict(config.kwargs)
    kw.setdefault("GROUP_M", GROUP_M)
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = kw[name]
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise ValueError(f"config {name} must be a power of two >= 16 (tl.dot's minimum), got {v!r}")
    return {**kw, "num_warps": config.num_warps, "num_stages": config.num_stages}


def tile_sizes(configs: Sequence[triton.Config]) -> dict[str, tuple[int, ...]]:
    """``{"M": (...), "N": (...), "K": (...)}``: the distinct tile sizes of ``configs``, for a
    fused_kernel marker's ``tiles=`` (edge dims are drawn at each size +- 1)."""
    return {
        sym: tuple(sorted({c.kwargs[f"BLOCK_{sym}"] for c in configs})) for sym in ("M", "N", "K")
    }
