"""Configs of the reference kernels: the tile shapes they may run with, and which suit a shape.

One concern: the config space. Which config runs for a given call (the tuned table, tuning at
run time) is :mod:`reference_kernels.tuning.pick`.

- Decode (M <= 16): BLOCK_M = 16 (the smallest tl.dot tile), narrow N tiles so that a weight
  of N = 3072..28672 rows still spreads over the H200's 132 SMs, long K tiles to keep many
  bytes in flight: the case is bound by reading the weight once.
- M <= 128: 16- to 128-row tiles (one 128-row tile reads each weight tile once).
- Prefill: 64..256 x 64..256 output tiles, K tiles of 64 (128 for K = 384) and 2-4 pipeline
  stages, the tile shapes the Triton matmul tutorials and Hopper GEMMs use for bf16/fp16.
- Each tile shape in two loading schemes: pointer loads (any strides, any alignment) and TMA
  tensor descriptors (Hopper and later; contiguous rows, 16-byte aligned), the latter also as a
  persistent kernel (one program per SM walking the output tiles) or with a split tail (the
  tiles past the last full wave of SMs split along K, :mod:`reference_kernels.gemm.split_tail`).

Which of them a GPU is offered depends on its target (:mod:`reference_kernels.gemm.targets`): TMA
configs only where the TMA kernels run (sm_90 and later), and only pipelines that fit its
shared memory (:func:`fits`: 220 KB of planned tiles on sm_90, 156 KB on sm_80, 92 KB on sm_89).

Tuning is keyed on power-of-two buckets of M, N and K (:func:`bucket`), not on the exact sizes,
so a Hypothesis run that draws M = 17, 23, 29 tunes once for the bucket 32.
Under the Triton interpreter (``TRITON_INTERPRET=1``) nothing is tuned: the kernels run
:func:`interpreter_config`'s pick unless ``config=`` names another.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import triton

from reference_kernels.gemm.targets import Target

GROUP_M = 8
"""Row-blocks per group in the grouped launch order (tutorial 03): neighbouring programs share
weight tiles in L2. The default; a config may carry its own (``-gG`` in its name)."""

SWITCH_DEFAULTS = {"TMA": False, "PERSISTENT": False, "TMA_STORE": True, "SPLIT_TAIL": False}
"""Boolean launch-path switches a config may carry, with their values when absent (read by the
wrappers, see LINEAR_CONFIGS)."""


def _cfg(
    bm: int,
    bn: int,
    bk: int,
    warps: int,
    stages: int,
    *,
    tma: bool = False,
    persistent: bool = False,
    tma_store: bool = True,
    split_tail: bool = False,
    group_m: int = GROUP_M,
) -> triton.Config:
    meta = {
        "BLOCK_M": bm,
        "BLOCK_N": bn,
        "BLOCK_K": bk,
        "GROUP_M": group_m,
        "TMA": tma,
        "PERSISTENT": persistent,
    }
    if not tma_store:
        meta["TMA_STORE"] = False
    if split_tail:
        meta["SPLIT_TAIL"] = True
    return triton.Config(meta, num_warps=warps, num_stages=stages)


def config_name(config: triton.Config) -> str:
    """A config's short stable name, the key of the tuned tables:
    ``[tma-|tmaload-][persistent-][splittail-]BMxBNxBK-wW-sS[-gG]``, e.g. ``tma-128x256x64-w8-s3``
    (``tmaload-``: TMA loads, the result stored from registers; ``-gG``: GROUP_M = G where it is
    not :data:`GROUP_M`)."""
    kw = config.kwargs
    sw = tma_switches(config)
    prefix = ""
    if uses_tma(config):
        prefix = "tma-" if sw["TMA_STORE"] else "tmaload-"
    prefix += "persistent-" if sw["PERSISTENT"] else ""
    prefix += "splittail-" if sw["SPLIT_TAIL"] else ""
    group = kw.get("GROUP_M", GROUP_M)
    suffix = f"-g{group}" if group != GROUP_M else ""
    tile = f"{kw['BLOCK_M']}x{kw['BLOCK_N']}x{kw['BLOCK_K']}"
    return f"{prefix}{tile}-w{config.num_warps}-s{config.num_stages}{suffix}"


def uses_tma(config: triton.Config) -> bool:
    return bool(config.kwargs.get("TMA", SWITCH_DEFAULTS["TMA"]))


def tma_switches(config: triton.Config) -> dict[str, bool]:
    """The TMA kernels' switches for ``config``: ``PERSISTENT`` (one program per SM walking the
    tiles, its tile loop flattened with the K loop so the software pipeliner prefetches the next
    tile under this one's epilogue), ``TMA_STORE`` and ``SPLIT_TAIL`` (the tiles past the last
    full wave split along K, reference_kernels.gemm.split_tail)."""
    return {
        name: bool(config.kwargs.get(name, SWITCH_DEFAULTS[name]))
        for name in ("PERSISTENT", "TMA_STORE", "SPLIT_TAIL")
    }


_NAME = re.compile(
    r"(?P<tma>tma-|tmaload-)?(?P<persistent>persistent-)?(?P<split_tail>splittail-)?"
    r"(?P<bm>\d+)x(?P<bn>\d+)x(?P<bk>\d+)-w(?P<warps>\d+)-s(?P<stages>\d+)(?:-g(?P<group_m>\d+))?"
)


def config_from_name(name: str) -> triton.Config:
    """The config :func:`config_name` calls ``name``, e.g. ``tmaload-persistent-128x128x64-w8-s4``:
    BLOCK_M x BLOCK_N x BLOCK_K, warps, stages and the switches the name spells.

    Raises:
        ValueError: ``name`` is not a config name in :func:`config_name`'s form (named, with the
            form), or not the name of the config it spells (``-g8`` for the default GROUP_M)."""
    m = _NAME.fullmatch(name) if isinstance(name, str) else None
    if m is None:
        raise ValueError(
            f"{name!r} is not a config name: want [tma-|tmaload-][persistent-][splittail-]BMxBNxBK-wW-sS[-gG]"
        )
    config = _cfg(
        *(int(m[k]) for k in ("bm", "bn", "bk", "warps", "stages")),
        tma=m["tma"] is not None,
        persistent=m["persistent"] is not None,
        tma_store=m["tma"] != "tmaload-",
        split_tail=m["split_tail"] is not None,
        group_m=int(m["group_m"]) if m["group_m"] else GROUP_M,
    )
    if config_name(config) != name:
        raise ValueError(f"{name!r} is not a config name: that config is named {config_name(config)!r}")
    return config


def _named(*names: str) -> tuple[triton.Config, ...]:
    return tuple(config_from_name(n) for n in names)


LINEAR_CONFIGS: tuple[triton.Config, ...] = _named(
    # decode, M <= 16
    "16x32x256-w4-s4", "16x64x128-w4-s5", "16x128x128-w4-s4", "tma-16x64x128-w4-s5",
    # small batches, 16 < M <= 128
    "64x64x128-w4-s4", "64x128x64-w4-s4", "tma-64x128x64-w4-s4", "tma-64x64x128-w4-s4",
    # prefill
    "128x128x64-w4-s4", "128x128x64-w8-s4", "128x256x64-w8-s3", "64x256x64-w4-s4", "tma-128x128x64-w8-s4",
    "tma-128x256x64-w8-s3", "tma-persistent-128x128x64-w8-s4", "tma-persistent-128x256x64-w8-s3",
    # K = 384 (MiniLM): few K steps per tile, so deeper K tiles and more rows per program
    "tma-128x128x128-w8-s2", "tma-persistent-128x128x128-w8-s2", "tma-256x128x64-w8-s3",
    "tma-64x256x64-w4-s4", "tma-128x64x64-w4-s4",
    # Epilogue overlap: storing from registers (no 32 KB staged out tile) lets two 4-warp programs
    # share an SM, one in its epilogue while the other multiplies. Warp-specialized loops and two
    # 8-warp programs per SM are not here: they lost (docs/reference-kernels.md#what-did-not-work).
    "tmaload-128x128x64-w4-s3", "tmaload-128x256x64-w8-s4", "tmaload-persistent-128x128x64-w8-s4",
    # Groups of 16 row-blocks: a 256-row weight tile is two x tiles' bytes, so as for the gated
    # 128 x 128 tiles (GATED_CONFIGS) g + 264 / g is least at g = 16; for the long down
    # projections of the largest models.
    "tma-128x256x64-w8-s3-g16", "tmaload-128x256x64-w8-s4-g16", "tma-persistent-128x256x64-w8-s3-g16",
    # Split tail (reference_kernels.gemm.split_tail): a down projection at M <= 128 has few output
    # tiles (N = hidden) and a long K, so a tile per program leaves SMs idle.
    "tma-splittail-16x64x128-w4-s5", "tma-splittail-64x64x128-w4-s4", "tma-splittail-128x64x128-w4-s4",
)
"""Configs of :func:`reference_kernels.kernels.linear_act`; every one is checked by the tests.
``TMA``: operands loaded and the result stored through tensor descriptors (Hopper's TMA unit),
used when the inputs allow it (:func:`reference_kernels.gemm.tma.tma_ready`), else the same tiles run
the pointer kernel. ``PERSISTENT``: one program per SM looping over output tiles.
``TMA_STORE=False``: the result is stored from registers, not staged in shared memory for a
descriptor store."""

GATED_CONFIGS: tuple[triton.Config, ...] = _named(
    # decode: two weight tiles per step, so half the K depth of the linear ones
    "16x32x256-w4-s4", "16x64x128-w4-s4", "16x128x64-w4-s4", "tma-16x64x128-w4-s4",
    # small batches
    "64x64x128-w4-s3", "64x128x64-w4-s4", "tma-64x128x64-w4-s4", "tma-64x64x128-w4-s3",
    # prefill: two fp32 accumulators per program, so 8 warps at 128 x 128
    "128x64x64-w4-s4", "128x128x64-w8-s3", "128x128x32-w8-s4",
    # 2 stages: at 3 it never fit in the first tuning run (docs/reference-kernels.md#configs-kept-and-why)
    "64x256x64-w8-s2", "tma-128x128x64-w8-s3", "tma-128x64x64-w4-s4", "tma-persistent-128x128x64-w8-s3",
    "tma-persistent-128x64x64-w4-s4",
    # M = 128 with large weights: bound by reading them, so deeper K tiles keep more bytes in flight
    "tma-64x64x128-w4-s4", "tma-128x64x128-w4-s3", "tma-256x64x64-w8-s3",
    # 96 KB register-store tiles, two programs per SM: they hold keys of the seed GeGLU and Gemma
    # (docs/reference-kernels.md#configs-kept-and-why).
    "tmaload-128x64x64-w4-s3",
    # prefill main loop: a 4th stage in the room the staged out tile took
    "tmaload-128x128x64-w8-s4", "tmaload-persistent-128x128x64-w8-s4",
    # Groups of 16 row-blocks (see GROUP_M): per K step a wave of 132 programs over g row-blocks
    # reads g x tiles and 132 / g pairs of weight tiles, g + 264 / g tiles of 128 x 64, least at
    # g = 16 (docs/reference-kernels.md#configs-kept-and-why).
    "tmaload-128x128x64-w8-s4-g16", "tma-128x128x64-w8-s3-g16",
    # 3-stage register-store 128 x 128 x 64 tiles are not here: they won no key
    # (docs/reference-kernels.md#what-did-not-work).
    # Split tail (reference_kernels.gemm.split_tail), for Qwen2.5-7B at M = 128: its 296 tiles of
    # 128 x 64 fill two waves of 132 SMs and leave 32 tiles, now split 4 ways along K.
    "tma-splittail-16x64x128-w4-s4", "tma-splittail-128x64x128-w4-s3",
    # 128 x 128 tiles read x from L2 half as often per weight byte (picked at larger keys), and two
    # warpgroups at 128 x 64 (docs/reference-kernels.md#configs-kept-and-why).
    "tmaload-splittail-128x128x64-w8-s4", "tma-splittail-128x64x128-w8-s3",
    # Six 32 KB stages instead of three of 64 KB: shared memory is recycled in half the steps
    # (docs/reference-kernels.md#configs-kept-and-why).
    "tmaload-splittail-128x64x64-w8-s6",
    # Persistent split tail: one program per SM walks its whole tiles in one flattened loop, so
    # the next tile's first loads are in flight during this tile's last steps and epilogue, then
    # takes one slice of the tail (docs/reference-kernels.md#configs-kept-and-why).
    "tmaload-persistent-splittail-128x64x64-w8-s6", "tma-persistent-splittail-16x64x128-w4-s4",
    # Stream-K (each program an equal share of all tiles' K steps) is not here: it lost every key
    # it was tried at (docs/reference-kernels.md#what-did-not-work).
)
"""Configs of :func:`reference_kernels.gated_act`; every one is checked by the tests."""

INTERPRETER_CONFIGS = (
    _cfg(16, 32, 32, 4, 1),
    _cfg(32, 64, 32, 4, 1),
    _cfg(64, 64, 64, 4, 1),
    _cfg(64, 128, 64, 4, 1),
    _cfg(64, 256, 128, 4, 1),
)
"""The tiles the interpreter runs when ``config=`` is not given, smallest first
(:func:`interpreter_config` picks one per call)."""

INTERPRETER_CONFIG = INTERPRETER_CONFIGS[0]
"""The smallest: what every call inside the CPU's dim cap (64 per dim) runs, so that the CPU's
cases still cross tile edges and K steps."""

INTERPRETER_PROGRAM_STEPS = 16
"""The most program x K-step iterations :func:`interpreter_config` lets a launch take before it
moves to larger tiles: (64 / 16) x (64 / 32) x (64 / 32), the most a capped case takes at the
smallest tiles."""


def interpreter_config(M: int, N: int, K: int) -> triton.Config:
    """The config a call of x (M, K) and N output columns runs under the Triton interpreter: the
    smallest of :data:`INTERPRETER_CONFIGS` whose launch takes at most
    :data:`INTERPRETER_PROGRAM_STEPS` program x K-step iterations, else the largest.

    The interpreter runs each program's block operations as NumPy calls, so its cost is per
    program and per K step, not per element: a MiniLM intermediate (M=60, K=384, N=1536, linear +
    GELU) took 2.4 s at 16 x 32 x 32 tiles and 0.07 s at 64 x 256 x 128 on a 2-core CPU.
    """
    for config in INTERPRETER_CONFIGS:
        kw = config.kwargs
        steps = -(-M // kw["BLOCK_M"]) * -(-N // kw["BLOCK_N"]) * -(-K // kw["BLOCK_K"])
        if steps <= INTERPRETER_PROGRAM_STEPS:
            return config
    return INTERPRETER_CONFIGS[-1]


def bucket(n: int) -> int:
    """Power-of-two tuning bucket of a size: 16 for n <= 16, else the next power of two.
    Uncapped: a cap ran a larger model's N on a smaller one's pick (docs/reference-kernels.md,
    "Tuning")."""
    # bit_length, not a loop: this runs three times per launch
    return 1 << max(4, (n - 1).bit_length())


def smem_bytes(config: triton.Config, itemsize: int, weights: int) -> int:
    """Shared memory a config plans for, in bytes: stages x (x tile + ``weights`` weight tiles)
    x itemsize, plus the output tile a TMA store stages in shared memory (a register store stages
    none)."""
    kw = config.kwargs
    tile = kw["BLOCK_M"] * kw["BLOCK_K"] + weights * kw["BLOCK_K"] * kw["BLOCK_N"]
    staged = kw["BLOCK_M"] * kw["BLOCK_N"] if uses_tma(config) and tma_switches(config)["TMA_STORE"] else 0
    return (config.num_stages * tile + staged) * itemsize


def fits(config: triton.Config, itemsize: int, weights: int, target: Target) -> bool:
    """Whether ``config``'s pipeline (:func:`smem_bytes`, inputs of ``itemsize`` bytes,
    ``weights`` weight tiles per K step) fits ``target``'s shared-memory budget
    (:attr:`reference_kernels.gemm.targets.Target.smem_budget`, bytes)."""
    return smem_bytes(config, itemsize, weights) <= target.smem_budget


def check_forced(config: triton.Config, itemsize: int, weights: int, target: Target) -> None:
    """Check a config forced through ``config=``: its form (:func:`launch_kwargs`), then that its
    pipeline fits ``target``'s shared memory for this dtype (:func:`fits`; Triton would fail at
    compile time with OutOfResources, naming neither the config nor the dtype).

    Raises:
        TypeError, ValueError: as :func:`launch_kwargs`; ValueError when it does not fit.
    """
    launch_kwargs(config)
    if not fits(config, itemsize, weights, target):
        raise ValueError(
            f"config {config_name(config)} needs about {smem_bytes(config, itemsize, weights) // 1024} KB "
            f"of shared memory for {itemsize}-byte inputs, more than the "
            f"{target.smem_budget // 1024} KB a config may plan for on {target.name}: "
            f"force one that fits (configs.candidates lists them) or leave config=None"
        )


def _m_class(m: int) -> tuple[int, int]:
    """The BLOCK_M range worth timing for M rows: 16 for decode; 16..128 up to 128 rows (one
    128-row tile reads each weight tile once, several 16/64-row tiles give more programs); 64..256
    for prefill."""
    if m <= 16:
        return (16, 16)
    if m <= 128:
        return (16, 128)
    return (64, 256)


def shallower(config: triton.Config, itemsize: int, weights: int, target: Target) -> triton.Config | None:
    """``config`` with fewer pipeline stages: the most below its own whose pipeline fits
    ``target`` for inputs of ``itemsize`` bytes (:func:`fits`); None when not even one stage
    fits. What :func:`candidates` offers where no config fits as it is."""
    for stages in range(config.num_stages - 1, 0, -1):
        shallow = triton.Config(dict(config.kwargs), num_warps=config.num_warps, num_stages=stages)
        if fits(shallow, itemsize, weights, target):
            return shallow
    return None


def candidates(
    configs: Sequence[triton.Config], M: int, itemsize: int, weights: int, tma: bool, target: Target
) -> list[triton.Config]:
    """The configs worth timing for M rows on ``target``: BLOCK_M suits M's class (decode, small
    batch, prefill), the pipeline fits the target's shared memory for the dtype (:func:`fits`),
    and TMA configs only when ``tma`` (the inputs allow descriptors) and the target runs the TMA
    kernels (:func:`reference_kernels.gemm.targets.supports_tma`). Never empty: when nothing of the M
    class fits (fp32 gated decode on sm_90), whatever fits, nearest BLOCK_M first; when no
    config fits at all (every dtype on a 99 KB GPU), the same order of configs each with the
    most pipeline stages that fit (``-s`` in their names lowered).

    Raises:
        ValueError: not one config fits ``target`` even with one pipeline stage.
    """
    path = [c for c in configs if not uses_tma(c) or (tma and target.tma)]
    lo, hi = _m_class(M)

    def order(cfgs: list[triton.Config]) -> list[triton.Config]:
        kept = [c for c in cfgs if lo <= c.kwargs["BLOCK_M"] <= hi]
        return kept or sorted(cfgs, key=lambda c: abs(c.kwargs["BLOCK_M"] - lo))

    usable = [c for c in path if fits(c, itemsize, weights, target)]
    if usable:
        return order(usable)
    shallow: dict[str, triton.Config] = {}
    for c in path:
        s = shallower(c, itemsize, weights, target)
        if s is not None:
            shallow.setdefault(config_name(s), s)
    if not shallow:
        raise ValueError(
            f"no config fits the {target.smem_budget // 1024} KB of shared memory a config may plan "
            f"for on {target.name} with {itemsize}-byte inputs, even with one pipeline stage"
        )
    return order(list(shallow.values()))


def offered(
    configs: Sequence[triton.Config], itemsize: int, weights: int, target: Target
) -> list[triton.Config]:
    """Every config :func:`candidates` offers ``target`` for inputs of ``itemsize`` bytes, at any
    M and on either path (what a tuner checks there), each once."""
    out: dict[str, triton.Config] = {}
    for m in (1, 128, 8192):  # one M of each of _m_class's classes
        for tma in (True, False):
            for c in candidates(configs, m, itemsize, weights, tma, target):
                out.setdefault(config_name(c), c)
    return list(out.values())


META_KEYS = frozenset({"BLOCK_M", "BLOCK_N", "BLOCK_K", "GROUP_M", *SWITCH_DEFAULTS})
"""The keys a config may carry; BLOCK_M/N/K are required."""


def launch_kwargs(config: triton.Config) -> dict[str, Any]:
    """Keyword arguments that launch a kernel with ``config`` forced (meta-parameters, warps,
    stages).

    Raises:
        TypeError: not a ``triton.Config``, a required key missing (named), an unknown key
            (named), or a switch (:data:`SWITCH_DEFAULTS`) not a bool.
        ValueError: a BLOCK size that is not a power of two >= 16, GROUP_M not an int >= 1,
            num_warps not a power of two in 1..32, num_stages < 1, or a TMA-only switch
            (PERSISTENT, TMA_STORE=False, SPLIT_TAIL) without TMA.
    """
    if not isinstance(config, triton.Config):
        raise TypeError(
            f"config must be a triton.Config with BLOCK_M, BLOCK_N and BLOCK_K (e.g. one of "
            f"LINEAR_CONFIGS / GATED_CONFIGS), got {type(config).__name__}"
        )
    missing = sorted({"BLOCK_M", "BLOCK_N", "BLOCK_K"} - set(config.kwargs))
    if missing:
        raise TypeError(f"config lacks {', '.join(missing)} (it has {sorted(config.kwargs)})")
    unknown = sorted(set(config.kwargs) - META_KEYS)
    if unknown:
        raise TypeError(
            f"config has unknown key(s) {', '.join(unknown)}; allowed: {', '.join(sorted(META_KEYS))}"
        )
    kw = dict(config.kwargs)
    kw.setdefault("GROUP_M", GROUP_M)
    if not isinstance(kw["GROUP_M"], int) or isinstance(kw["GROUP_M"], bool) or kw["GROUP_M"] < 1:
        raise ValueError(f"config GROUP_M must be an int >= 1 (row-blocks per group), got {kw['GROUP_M']!r}")
    for name in ("BLOCK_M", "BLOCK_N", "BLOCK_K"):
        v = kw[name]
        if not isinstance(v, int) or v < 16 or v & (v - 1):
            raise ValueError(f"config {name} must be a power of two >= 16 (tl.dot's minimum), got {v!r}")
    if config.num_warps not in (1, 2, 4, 8, 16, 32):
        raise ValueError(f"config num_warps must be a power of two in 1..32, got {config.num_warps!r}")
    if not isinstance(config.num_stages, int) or config.num_stages < 1:
        raise ValueError(f"config num_stages must be an int >= 1, got {config.num_stages!r}")
    switches = {name: kw.pop(name, default) for name, default in SWITCH_DEFAULTS.items()}
    for name, v in switches.items():  # read by the wrappers (tma_switches), not the pointer kernels
        if not isinstance(v, bool):
            raise TypeError(f"config {name} must be True or False, got {v!r}")
    if not switches["TMA"] and (
        switches["PERSISTENT"] or not switches["TMA_STORE"] or switches["SPLIT_TAIL"]
    ):
        raise ValueError(
            "config PERSISTENT, TMA_STORE=False and SPLIT_TAIL apply to the TMA kernels only: set TMA=True"
        )
    return {**kw, "num_warps": config.num_warps, "num_stages": config.num_stages}


def tile_sizes(configs: Sequence[triton.Config]) -> dict[str, tuple[int, ...]]:
    """``{"M": (...), "N": (...), "K": (...)}``: the distinct tile sizes of ``configs``, for a
    fused_kernel marker's ``tiles=`` (edge dims are drawn at each size +- 1)."""
    return {sym: tuple(sorted({c.kwargs[f"BLOCK_{sym}"] for c in configs})) for sym in ("M", "N", "K")}
