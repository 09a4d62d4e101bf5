"""Hypothesis strategies for fused-kernel cases: dims with edge tiers, dtypes, layouts, seeds.

Each public strategy takes keyword-only bounds, validates them up front and returns a
``SearchStrategy``. Tensors are never drawn element by element: a case carries a seed and
:func:`pytest_fusion.tensors.make_inputs` builds the tensors from it.
"""

from __future__ import annotations

from typing import Mapping, Sequence

from hypothesis import strategies as st

from pytest_fusion.spec import DEFAULT_TILES, LAYOUTS, SUPPORTED_DTYPES, FusionUsageError, KernelSpec
from pytest_fusion.tensors import Case

EDGE_PRIMES = (2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381)
"""Primes at or just under powers of two: no tile divides them, so every tile loop has a tail."""

EDGE_NON_POWERS_OF_TWO = (3, 6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144, 12288)
"""3 * 2**i: sizes real models use (768, 3072) that power-of-two tiles do not divide evenly."""


def edge_dims(*, low: int, high: int, tiles: Sequence[int] = DEFAULT_TILES) -> list[int]:
    """The edge tier of one dim, ascending: ``low``, 1, every tile size ``t`` and ``t +- 1``,
    :data:`EDGE_PRIMES`, :data:`EDGE_NON_POWERS_OF_TWO` and ``high``, clipped to [low, high].

    Raises:
        FusionUsageError: ``low < 1`` or ``high < low``.
    """
    if low < 1 or high < low:
        raise FusionUsageError(f"edge_dims needs 1 <= low <= high, got low={low}, high={high}")
    values = {low, high, 1, *EDGE_PRIMES, *EDGE_NON_POWERS_OF_TWO}
    for t in tiles:
        values.update((t - 1, t, t + 1))
    return sorted(v for v in values if low <= v <= high)


def dim_values(*, low: int, high: int, tiles: Sequence[int] = DEFAULT_TILES) -> st.SearchStrategy[int]:
    """One dim in [low, high]: half the time from :func:`edge_dims`, else uniform.

    Shrinks towards ``low`` (the edge list is tried first and is ascending).
    """
    edges = edge_dims(low=low, high=high, tiles=tiles)
    return st.one_of(st.sampled_from(edges), st.integers(min_value=low, max_value=high))


def capped_range(low: int, high: int, max_dim: int | None) -> tuple[int, int]:
    """[low, high] clipped to ``max_dim`` (never below ``low``): the CPU/interpreter cap."""
    if max_dim is None or max_dim <= 0:
        return low, high
    return low, max(low, min(high, max_dim))


def dims(spec: KernelSpec, *, max_dim: int | None = None) -> st.SearchStrategy[dict[str, int]]:
    """A ``{symbol: size}`` draw for every symbol in ``spec.dims``, each capped to ``max_dim``."""
    per_symbol = {}
    for sym, (lo, hi) in spec.dims.items():
        lo, hi = capped_range(lo, hi, max_dim)
        per_symbol[sym] = dim_values(low=lo, high=hi, tiles=spec.tiles_for(sym))
    return st.fixed_dictionaries(per_symbol)


def layouts_for(rank: int, allowed: Sequence[str] | None = None) -> tuple[str, ...]:
    """Layouts that mean something for a tensor of ``rank`` (``transposed`` needs rank >= 2)."""
    names = tuple(allowed) if allowed is not None else LAYOUTS
    return tuple(l for l in names if rank >= 2 or l != "transposed") or ("contiguous",)


def layouts(spec: KernelSpec) -> st.SearchStrategy[dict[str, str]]:
    """A layout per tensor input; shrinks towards ``contiguous``."""
    return st.fixed_dictionaries(
        {name: st.sampled_from(layouts_for(len(t.shape), t.layouts)) for name, t in spec.inputs.items()}
    )


def dtypes(*, allowed: Sequence[str] = SUPPORTED_DTYPES) -> st.SearchStrategy[str]:
    """A test dtype name from ``allowed`` (default float16, bfloat16, float32)."""
    bad = [d for d in allowed if d not in SUPPORTED_DTYPES]
    if bad or not allowed:
        raise FusionUsageError(f"dtypes: unsupported {bad or 'empty list'}; choose from {SUPPORTED_DTYPES}")
    return st.sampled_from(tuple(allowed))


def seeds() -> st.SearchStrategy[int]:
    """A 32-bit seed for the tensor generator; shrinks towards 0."""
    return st.integers(min_value=0, max_value=2**32 - 1)


def cases(spec: KernelSpec, *, dtype: str, max_dim: int | None = None) -> st.SearchStrategy[Case]:
    """Full cases for ``spec`` in one ``dtype``: dims, layouts, seed, and (when the spec opts in)
    whether special values are planted, drawn half the time so the numeric check still sees
    finite outputs."""
    special = st.booleans() if spec.special_values else st.just(False)
    return st.builds(
        Case,
        dims=dims(spec, max_dim=max_dim),
        dtype=st.just(dtype),
        layouts=layouts(spec),
        seed=seeds(),
        special=special,
    )


def edge_cases(spec: KernelSpec, *, dtype: str, max_dim: int | None = None) -> list[Case]:
    """Cases always tried before random ones (contiguous, seed 0, no special values): every dim at
    its lowest edge; every dim at the first tile size + 1 in range; every dim at its (capped) high."""
    picks: list[Mapping[str, int]] = [{}, {}, {}]
    for sym, (lo, hi) in spec.dims.items():
        lo, hi = capped_range(lo, hi, max_dim)
        edges = edge_dims(low=lo, high=hi, tiles=spec.tiles_for(sym))
        above_tile = [t + 1 for t in sorted(spec.tiles_for(sym)) if lo <= t + 1 <= hi]
        picks[0][sym] = edges[0]  # type: ignore[index]
        picks[1][sym] = above_tile[0] if above_tile else edges[len(edges) // 2]  # type: ignore[index]
        picks[2][sym] = hi  # type: ignore[index]
    out = []
    for d in picks:
        case = Case(dims=dict(d), dtype=dtype, layouts={n: "contiguous" for n in spec.inputs}, seed=0)
        if case not in out:
            out.append(case)
    return out
