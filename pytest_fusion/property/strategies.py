"""Hypothesis strategies for fused-kernel cases: dims with edge tiers, dtypes, layouts, seeds.

Each public strategy takes keyword-only bounds, validates them up front and returns a
``SearchStrategy``. Tensors are never drawn element by element: a case carries a seed and
:func:`pytest_fusion.oracle.tensors.make_inputs` builds the tensors from it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Mapping, Sequence

from hypothesis import strategies as st

from pytest_fusion.declare.spec import DEFAULT_TILES, LAYOUTS, SUPPORTED_DTYPES, FusionUsageError, KernelSpec
from pytest_fusion.oracle.tensors import AMPLITUDES, Case

EDGE_PRIMES = (2, 3, 5, 7, 13, 31, 61, 127, 251, 509, 1021, 2039, 4093, 8191, 16381)
"""Primes at or just under powers of two: no tile divides them, so every tile loop has a tail."""

EDGE_NON_POWERS_OF_TWO = (3, 6, 12, 24, 48, 96, 192, 384, 768, 1536, 3072, 6144, 12288)
"""3 * 2**i: sizes real models use (768, 3072) that power-of-two tiles do not divide evenly."""


def powers_of_two(low: int, high: int) -> list[int]:
    """``2**k`` and ``2**k + 1`` in [low, high]: the boundaries of power-of-two dispatch buckets
    (a kernel choosing its variant by ``next_power_of_2(M)`` changes path between them)."""
    out = []
    for k in range(max(high, 1).bit_length() + 1):
        out += [v for v in (2**k, 2**k + 1) if low <= v <= high]
    return out


def edge_dims(*, low: int, high: int, tiles: Sequence[int] = DEFAULT_TILES) -> list[int]:
    """The edge tier of one dim, ascending: ``low``, 1, every tile size ``t`` and ``t +- 1``,
    powers of two and ``2**k + 1`` (:func:`powers_of_two`), :data:`EDGE_PRIMES`,
    :data:`EDGE_NON_POWERS_OF_TWO` and ``high``, clipped to [low, high].

    Raises:
        FusionUsageError: ``low < 1`` or ``high < low``.
    """
    if low < 1 or high < low:
        raise FusionUsageError(f"edge_dims needs 1 <= low <= high, got low={low}, high={high}")
    values = {low, high, 1, *EDGE_PRIMES, *EDGE_NON_POWERS_OF_TWO, *powers_of_two(low, high)}
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


def bounded_shapes(spec: KernelSpec) -> list[tuple[str | int, ...]]:
    """The symbolic shapes an element bound applies to: every input's, and every matrix over two of
    the dims (an output such as M x N, which the spec does not declare)."""
    dims = list(spec.dims)
    pairs = [(a, b) for i, a in enumerate(dims) for b in dims[i + 1 :]]
    return [tuple(t.shape) for t in spec.inputs.values()] + pairs


def element_cap(
    spec: KernelSpec, symbol: str, chosen: Mapping[str, int], max_elements: int | None
) -> int | None:
    """The largest size ``symbol`` may take so that no input, and no matrix over ``symbol`` and one
    other dim (an output such as M x N, which the spec does not declare), holds more than
    ``max_elements`` elements, given the sizes ``chosen`` so far (symbols not chosen yet count at
    their low end); None when unbounded."""
    if not max_elements:
        return None
    size = lambda s: int(s) if isinstance(s, int) else chosen.get(s, spec.dims[s][0])  # noqa: E731
    cap = None
    for shape in bounded_shapes(spec):
        uses = shape.count(symbol)
        if not uses:
            continue
        rest = math.prod(size(s) for s in shape if s != symbol)
        limit = int(round((max_elements // max(rest, 1)) ** (1.0 / uses), 6))
        cap = limit if cap is None else min(cap, limit)
    return cap


def _limit(
    spec: KernelSpec, symbol: str, chosen: Mapping[str, int], max_dim: int | None, max_elements: int | None
) -> tuple[int, int]:
    lo, hi = capped_range(*spec.dims[symbol], max_dim)
    cap = element_cap(spec, symbol, chosen, max_elements)
    return lo, hi if cap is None else max(lo, min(hi, cap))


def largest_dims(
    spec: KernelSpec, *, max_dim: int | None = None, max_elements: int | None = None
) -> dict[str, int]:
    """Every dim at the high end a draw can reach: its declared high, capped to ``max_dim`` and, in
    declaration order as :func:`dims` draws them, so that no input exceeds ``max_elements``."""
    chosen: dict[str, int] = {}
    for sym in spec.dims:
        chosen[sym] = _limit(spec, sym, chosen, max_dim, max_elements)[1]
    return chosen


def dims(
    spec: KernelSpec, *, max_dim: int | None = None, max_elements: int | None = None
) -> st.SearchStrategy[dict[str, int]]:
    """A ``{symbol: size}`` draw for every symbol in ``spec.dims``, each capped to ``max_dim`` and,
    in declaration order, so that no input tensor exceeds ``max_elements`` elements."""
    if not max_elements:
        per_symbol = {}
        for sym, (lo, hi) in spec.dims.items():
            lo, hi = capped_range(lo, hi, max_dim)
            per_symbol[sym] = dim_values(low=lo, high=hi, tiles=spec.tiles_for(sym))
        return st.fixed_dictionaries(per_symbol)

    @st.composite
    def budgeted(draw: st.DrawFn) -> dict[str, int]:
        chosen: dict[str, int] = {}
        for sym in spec.dims:
            lo, hi = _limit(spec, sym, chosen, max_dim, max_elements)
            chosen[sym] = draw(dim_values(low=lo, high=hi, tiles=spec.tiles_for(sym)))
        return chosen

    return budgeted()


def layouts_for(rank: int, allowed: Sequence[str] | None = None) -> tuple[str, ...]:
    """Layouts that mean something for a tensor of ``rank`` (``transposed`` needs rank >= 2)."""
    names = tuple(allowed) if allowed is not None else LAYOUTS
    return tuple(name for name in names if rank >= 2 or name != "transposed") or ("contiguous",)


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


def cases(
    spec: KernelSpec, *, dtype: str, max_dim: int | None = None, max_elements: int | None = None
) -> st.SearchStrategy[Case]:
    """Full cases for ``spec`` in one ``dtype``: dims (see :func:`dims`), layouts, seed, and either
    the activations' amplitude (:data:`tensors.AMPLITUDES`, shrinking towards 1) or, unless the
    spec opts out, planted special values (in half the cases, so the numeric check still sees
    finite outputs). Special values come at amplitude 1 only: with activations of tens a
    saturating activation's float64 reference rounds to exactly 0 and gives 0 * inf = NaN where a
    kernel that computes the tiny true value gives inf (docs/oracle.md#the-values)."""
    amplitudes = st.sampled_from(AMPLITUDES.get(dtype, (1.0,)))
    plain = st.tuples(st.just(False), amplitudes)
    values = st.one_of(plain, st.tuples(st.just(True), st.just(1.0))) if spec.special_values else plain
    return st.builds(
        lambda d, layouts_, seed, special_amplitude: Case(
            dims=d,
            dtype=dtype,
            layouts=layouts_,
            seed=seed,
            special=special_amplitude[0],
            amplitude=special_amplitude[1],
        ),
        dims(spec, max_dim=max_dim, max_elements=max_elements),
        layouts(spec),
        seeds(),
        values,
    )


EDGE_CASES = 8
"""Each dim takes at least this many distinct edge values across the edge cases, where its range
has that many."""


def spread(values: Sequence[int], count: int) -> list[int]:
    """Up to ``count`` distinct entries of the ascending ``values``, evenly spaced by index, first
    and last included."""
    if len(values) <= count:
        return list(values)
    return sorted({values[round(i * (len(values) - 1) / (count - 1))] for i in range(count)})


def edge_picks(low: int, high: int, tiles: Sequence[int]) -> list[int]:
    """The values one dim walks through in the edge cases, in order: its low end, the first tile
    size + 1, its high end, the first size of every power-of-two bucket (``2**k + 1``) in range,
    then more of its edge tier until it has :data:`EDGE_CASES` values (where the range allows)."""
    edges = edge_dims(low=low, high=high, tiles=tiles)
    above_tile = [t + 1 for t in sorted(tiles) if low <= t + 1 <= high]
    picks = [edges[0], above_tile[0] if above_tile else edges[len(edges) // 2], high]
    picks += [v for v in powers_of_two(low, high) if v % 2 == 1 or v == 2]
    picks = list(dict.fromkeys(picks))
    for v in spread(edges, len(edges)):
        if len(picks) >= EDGE_CASES:
            break
        if v not in picks:
            picks.insert(3 + (len(picks) - 3) // 2, v)  # keep the buckets spread over the cases
    return picks


def edge_cases(
    spec: KernelSpec,
    *,
    dtype: str,
    max_dim: int | None = None,
    max_elements: int | None = None,
    count: int | None = None,
    above_cap: bool = False,
) -> list[Case]:
    """Cases always tried before random ones (contiguous where the input allows it, else its first
    declared layout; seed 0, no special values).

    Case ``j`` sets every dim to the ``j``-th of its :func:`edge_picks` (cycling when a dim has
    fewer): case 0 every dim at its low end, case 1 at the first tile size + 1, case 2 at its
    (capped) high, then through the power-of-two buckets, so a variant chosen per bucket runs
    once per bucket. Cases from 3 on cycle the amplitudes of ``dtype``. Sizes are clipped, in
    declaration order, to ``max_elements`` per tensor (the largest edge value under the cap).
    ``count`` limits the number of cases (default: as many as the longest picks list).

    With ``above_cap`` (Triton kernels under the interpreter), one more case per symbol whose range
    exceeds ``max_dim``: that symbol at ``min(high, 2 * max_dim + 1)``, above the cap and past the
    next power-of-two bucket, every other dim at its low end, so a large-dim path runs at least
    once at a bounded cost.
    """
    per_sym = {
        sym: edge_picks(*capped_range(lo, hi, max_dim), spec.tiles_for(sym))
        for sym, (lo, hi) in spec.dims.items()
    }
    n = max((len(p) for p in per_sym.values()), default=1)
    if count is not None:
        n = min(n, count)
    amplitudes = AMPLITUDES.get(dtype, (1.0,))
    # Contiguous where the declaration allows it, else the first layout it allows.
    allowed = {name: layouts_for(len(t.shape), t.layouts) for name, t in spec.inputs.items()}
    contiguous = {name: "contiguous" if "contiguous" in ok else ok[0] for name, ok in allowed.items()}
    out: list[Case] = []
    for j in range(n):
        chosen: dict[str, int] = {}
        for sym, picks in per_sym.items():
            want = picks[j % len(picks)]
            lo, hi = _limit(spec, sym, chosen, max_dim, max_elements)
            fits = [v for v in edge_dims(low=lo, high=hi, tiles=spec.tiles_for(sym)) if v <= want]
            chosen[sym] = fits[-1] if fits else lo
        amplitude = amplitudes[(j - 2) % len(amplitudes)] if j >= 3 else 1.0
        case = Case(dims=chosen, dtype=dtype, layouts=dict(contiguous), seed=0, amplitude=amplitude)
        if case not in out:
            out.append(case)
    if above_cap and max_dim:
        for sym, (lo, hi) in spec.dims.items():
            if hi > max_dim:
                dims_ = {s: r[0] for s, r in spec.dims.items()}
                dims_[sym] = max(lo, min(hi, 2 * max_dim + 1))
                out.append(Case(dims=dims_, dtype=dtype, layouts=dict(contiguous), seed=0))
    return out


def smaller_cases(spec: KernelSpec, case: Case) -> list[Case]:
    """Candidates for shrinking a failing edge case, simplest first: amplitude 1, then, per symbol
    in order, each edge value of its declared range below its current size, ascending."""
    out = []
    if case.amplitude != 1.0:
        out.append(dataclasses.replace(case, amplitude=1.0))
    for sym, (lo, _) in spec.dims.items():
        size = case.dims[sym]
        for v in edge_dims(low=lo, high=size, tiles=spec.tiles_for(sym))[:-1]:
            out.append(dataclasses.replace(case, dims={**case.dims, sym: v}))
    return out
