"""The error budget: how far each element of a kernel's output may be from golden.

Policy (docs/oracle.md#the-error-budget), for golden, eager and magnitude ``m`` as
:mod:`pytest_fusion.oracle.golden` computes them:

- each output element ``i`` passes when

      |kernel_i - golden_i| <= error_multiple * max(|eager_i - golden_i|, lambda * sqrt(n) * u_acc * m_i)
                               + ulps * ulp(max(|golden_i|, rms(golden)))

  (defaults: ``error_multiple`` 2, ``ulps`` 4, :data:`LAMBDA` 6), or, when the spec gives them,
  ``|kernel - golden| <= atol + rtol * |golden|`` as in torch.testing;
- NaN and +-inf must sit where golden rounded to the output dtype has them (or where eager has the
  same value: the reference itself overflowing in the test dtype, or staying finite where golden
  overflows, is not the kernel's fault; where eager is NaN or inf the kernel may be either); a
  kernel may also round to +-inf (same sign) where ``|golden_i|`` plus its budget reaches the
  dtype's largest finite value, and stay finite, judged by the budget, where golden rounds to inf
  but lies within its budget of that value;
- below the dtype's smallest normal an element's budget is at least that smallest normal, so a
  kernel may flush a subnormal result to zero or round it up to the smallest normal.

Where the budget comes from:

- ``|eager_i - golden_i|``: eager's own error *at that element*, so a kernel may do what eager does
  (round its intermediates to the test dtype) and no element's budget grows because another
  element was hard (eager's worst error over the whole output would let one large element loosen
  every other one).
- ``lambda * sqrt(n) * u_acc * m_i``: the probabilistic rounding bound for a sum of ``n`` products
  in a precision of unit roundoff ``u_acc``, ``|s_hat - s| <= lambda * sqrt(n) * u * sum|x_k w_k|``
  (Higham and Mary, "A new approach to probabilistic rounding error analysis", SIAM J. Sci.
  Comput. 41(5), 2019), which holds for *any* summation order (split-K, atomics, tree
  reductions) with probability at least ``1 - 2n exp(-lambda^2 (1 - u)^2 / 2)`` under that
  paper's model of independent rounding errors: lambda = 6 gives ``1 - 3e-8 n`` per element. It is
  safer still in practice: on zero-mean data the partial sums stay near ``sqrt(k)`` times a term,
  so the error observed is about ``u * m_i``, ``sqrt(n)`` times under the bound. ``u_acc`` is fp32's
  ``2**-24`` for float16, bfloat16 and float32 tests, since eager accumulates those in fp32:
  a kernel accumulating in float16 (``2**-11``) is 2**13 times over it. ``n`` is the largest
  dim of any input (the reduction length is not known to the oracle; the largest dim bounds it).
  m_i is large where the output cancels, so cancelling sums are held to their inputs' scale.
- ``ulps * ulp(max(|golden_i|, rms(golden)))``: the final rounding to the output dtype, and the
  roundings of intermediates a kernel may do where eager does not (for a GEMM epilogue the
  intermediates have the scale of the output's rms, not of a small element).

A GEMM accumulating in float16 fails it at long K (docs/oracle.md#float16-accumulation-measured).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping, Sequence

import torch

MANTISSA_BITS = {torch.float16: 10, torch.bfloat16: 7, torch.float32: 23, torch.float64: 52}
MIN_EXPONENT = {torch.float16: -14, torch.bfloat16: -126, torch.float32: -126, torch.float64: -1022}

LAMBDA = 6.0
"""Confidence factor of the probabilistic rounding bound ``lambda * sqrt(n) * u`` (module docstring)."""

ACCUMULATION_ROUNDOFF = {
    torch.float16: 2.0**-24,
    torch.bfloat16: 2.0**-24,
    torch.float32: 2.0**-24,
    torch.float64: 2.0**-53,
}
"""Unit roundoff of the accumulation a correct kernel uses for each output dtype: fp32 for the
16-bit dtypes (what eager's GEMMs do), the dtype's own otherwise."""


def ulp(values: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Spacing of ``dtype`` at ``|values|`` (float64 in, float64 out): ``2**(e - mantissa)`` with
    ``e = floor(log2 |v|)``, clamped below at the dtype's smallest normal exponent (so zero and
    subnormals get the subnormal spacing)."""
    v = values.abs().to(torch.float64)
    _, exp = torch.frexp(v)
    e = torch.where(
        v == 0, MIN_EXPONENT[dtype], torch.clamp(exp.to(torch.float64) - 1, min=MIN_EXPONENT[dtype])
    )
    return torch.exp2(e - MANTISSA_BITS[dtype])


EAGER_PERCENTILE = 0.99
"""The percentile of eager's error (in ulps of each element's scale) every element may reach."""


def _percentile_lower(values: torch.Tensor, q: float) -> float:
    """The ``q`` quantile of ``values`` taking the lower neighbour (no interpolation), 0 if empty."""
    flat = values.reshape(-1)
    if not flat.numel():
        return 0.0
    k = int(q * (flat.numel() - 1)) + 1
    return float(flat.kthvalue(k).values)


def accumulation_bound(magnitude: torch.Tensor, terms: int, dtype: torch.dtype) -> torch.Tensor:
    """``LAMBDA * sqrt(terms) * u_acc * magnitude`` (float64): the probabilistic bound on the rounding
    error of a sum of ``terms`` products whose absolute values sum to ``magnitude``, accumulated in
    :data:`ACCUMULATION_ROUNDOFF` of ``dtype`` (Higham and Mary 2019; module docstring)."""
    u = ACCUMULATION_ROUNDOFF.get(dtype, 2.0**-24)
    return LAMBDA * math.sqrt(max(terms, 1)) * u * magnitude.to(torch.float64)


@dataclasses.dataclass
class Comparison:
    """Result of comparing one output. Sizes in the output's own units; ``ulps`` in its dtype."""

    mismatches: int
    numel: int
    worst_index: tuple[int, ...] | None
    kernel: float | None
    golden: float | None
    eager: float | None
    abs_error: float | None
    ulps: float | None
    budget: float | None
    eager_max_error: float
    budget_text: str
    nonfinite_mismatches: int


COMPARE_CHUNK_ELEMENTS = 2**24
""":func:`compare` works through an output in chunks of this many elements (flat order): its
float64 temporaries, about 14 of the chunk's size, then stay near 2 GB however large the output
(an M = 8192 x N = 28672 output would hold 30 GB of them at once). The output-wide figures (golden's
rms, eager's p99 error) are gathered first, so every element's budget is the one-pass budget."""


def compare(
    kernel: torch.Tensor,
    golden: torch.Tensor,
    eager: torch.Tensor,
    *,
    magnitude: torch.Tensor | None = None,
    terms: int = 1,
    error_multiple: float,
    ulps: float,
    atol: float | None = None,
    rtol: float | None = None,
) -> Comparison:
    """Compare one kernel output with golden (float64) under the policy in this module's docstring.

    ``magnitude``: golden computed on the inputs' absolute values (the scale of the intermediates,
    ``m`` in the docstring); None leaves the accumulation term out. ``terms``: the length ``n`` of
    the longest sum (callers pass the largest input dim). Shapes must already match. Returns a
    :class:`Comparison`; ``mismatches == 0`` means pass. Outputs larger than
    :data:`COMPARE_CHUNK_ELEMENTS` are compared chunk by chunk, with the same result.
    """
    out_dtype = eager.dtype if eager.dtype in MANTISSA_BITS else kernel.dtype
    if not out_dtype.is_floating_point:
        return _compare_exact(*(t.detach().to(torch.float64) for t in (kernel, golden, eager)))
    shape = tuple(golden.shape)
    k_flat, g_flat, e_flat = (t.detach().reshape(-1) for t in (kernel, golden, eager))
    m_flat = None if magnitude is None else magnitude.detach().reshape(-1)
    n = g_flat.numel()
    spans = [(lo, min(lo + COMPARE_CHUNK_ELEMENTS, n)) for lo in range(0, n, COMPARE_CHUNK_ELEMENTS)]

    whole: list[_Chunk] = []  # an output of one chunk is prepared once, not once per pass

    def chunk(lo: int, hi: int) -> _Chunk:
        if whole and hi - lo == n:
            return whole[0]
        f64 = lambda t: t[lo:hi].to(torch.float64)  # noqa: E731
        m = None if m_flat is None else f64(m_flat)
        c = _Chunk(f64(k_flat), f64(g_flat), f64(e_flat), m, out_dtype)
        if hi - lo == n:
            whole.append(c)
        return c

    # output-wide figures first: golden's rms over its finite elements, eager's worst error
    sumsq, finite, eager_max = 0.0, 0, 0.0
    for lo, hi in spans:
        c = chunk(lo, hi)
        finite_g = c.g[c.g_fin]
        sumsq += float(finite_g.square().sum())
        finite += finite_g.numel()
        if c.g.numel():
            eager_max = max(eager_max, float(c.eager_err.max()))
    rms = math.sqrt(sumsq / finite) if finite else 0.0
    if atol is not None:
        eager_ulps = 0.0
        text = f"atol={atol:g} + rtol={rtol:g} x |golden|"
    else:
        eager_ulps = _eager_ulps([chunk(lo, hi).eager_ratio(rms) for lo, hi in spans])
        text = (
            f"{error_multiple:g} x max(eager's error here, eager's p99 {eager_ulps:.3g} ulp at this "
            f"scale, {LAMBDA:g} sqrt(n={terms}) u_acc x sum|terms|) + "
            f"{ulps:g} ulp of {str(out_dtype).replace('torch.', '')} at max(|golden|, rms {rms:.3g})"
        )
    budget = _Budget(rms, eager_ulps, terms, out_dtype, error_multiple, ulps, atol, rtol)
    mismatches = nonfinite = 0
    worst: dict[str, tuple[float, int]] = {}  # rule -> (ratio, flat index), the first of the largest
    for lo, hi in spans:
        c = chunk(lo, hi)
        bound = budget.bound(c)
        edge = c.overflow_edge(bound)
        both = c.both | edge
        err = torch.where(edge, (c.k - c.g).abs(), c.err)
        nonfinite_bad = _misplaced_nonfinite(c.k, c.g, c.e, c.g_rounded, (c.g_fin, c.k_fin, c.e_fin), bound,
                                             out_dtype) & ~edge
        over = both & (err > bound)
        mismatches += int((over | nonfinite_bad).sum())
        nonfinite += int(nonfinite_bad.sum())
        _note_worst(worst, err, bound, both, over, nonfinite_bad, lo)
    where = _worst_flat(worst, mismatches, nonfinite)
    if where is None:
        return Comparison(0, 0, None, None, None, None, None, None, None, eager_max, text, 0)
    c = chunk(where, where + 1)
    kv, gv, ev = float(c.k[0]), float(c.g[0]), float(c.e[0])
    abs_err = abs(kv - gv) if math.isfinite(kv) and math.isfinite(gv) else float("nan")
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(where), shape)) if shape else ()
    return Comparison(
        mismatches=mismatches, numel=n, worst_index=idx,
        kernel=kv, golden=gv, eager=ev, abs_error=abs_err, ulps=abs_err / float(c.spacing(rms)[0]),
        budget=float(budget.bound(c)[0]), eager_max_error=eager_max, budget_text=text,
        nonfinite_mismatches=nonfinite,
    )


@dataclasses.dataclass
class _Chunk:
    """A span of one output's elements, in float64: kernel, golden, eager, magnitude (or None) and
    the masks every rule reads."""

    k: torch.Tensor
    g: torch.Tensor
    e: torch.Tensor
    m: torch.Tensor | None
    dtype: torch.dtype

    def __post_init__(self) -> None:
        self.g_rounded = self.g.to(self.dtype).to(torch.float64)  # where golden overflows the dtype: inf
        self.g_fin, self.k_fin, self.e_fin = (torch.isfinite(t) for t in (self.g_rounded, self.k, self.e))
        self.both = self.g_fin & self.k_fin
        self.eager_ok = self.g_fin & self.e_fin
        self.eager_err = torch.where(self.eager_ok, (self.e - self.g).abs(), torch.zeros_like(self.g))
        self.err = torch.where(self.both, (self.k - self.g).abs(), torch.zeros_like(self.g))

    def overflow_edge(self, bound: torch.Tensor) -> torch.Tensor:
        """Finite kernel values where golden rounds past the dtype's largest finite value but lies
        within its budget of it (65520 in float16 rounds to inf, 65504 is 0.5 ulp from it): both
        results are within rounding there, so the finite one is judged by the budget."""
        top = torch.finfo(self.dtype).max
        return self.k_fin & ~self.g_fin & torch.isfinite(self.g) & (self.g.abs() - bound <= top)

    def spacing(self, rms: float) -> torch.Tensor:
        """The dtype's ulp at max(|golden|, rms) per element (kept for the next pass)."""
        kept = getattr(self, "_spacing", None)
        if kept is None or kept[0] != rms:
            kept = (rms, ulp(self.g.abs().clamp_min(rms), self.dtype))
            self._spacing = kept
        return kept[1]

    def eager_ratio(self, rms: float) -> torch.Tensor:
        """Eager's error in ulps of each element's scale (0 where eager or golden is not finite)."""
        err = self.eager_err
        ratio = torch.where(self.eager_ok, err / self.spacing(rms), torch.zeros_like(err))
        return torch.nan_to_num(ratio, nan=0.0, posinf=0.0)


def _eager_ulps(ratios: Sequence[torch.Tensor]) -> float:
    """Eager's :data:`EAGER_PERCENTILE` error in local ulps over the whole output (its chunks'
    ratios), the lower neighbour: one element's large error loosens nothing."""
    if not ratios:
        return 0.0
    return _percentile_lower(torch.cat(list(ratios)) if len(ratios) > 1 else ratios[0], EAGER_PERCENTILE)


@dataclasses.dataclass(frozen=True)
class _Budget:
    """The per-element bound of one output: the default policy (module docstring) from its
    output-wide figures, or ``atol + rtol * |golden|``."""

    rms: float
    eager_ulps: float
    terms: int
    dtype: torch.dtype
    error_multiple: float
    ulps: float
    atol: float | None
    rtol: float | None

    def bound(self, c: _Chunk) -> torch.Tensor:
        if self.atol is not None:
            return self.atol + self.rtol * c.g.abs()  # type: ignore[operator]
        # Eager's typical error, counted in ulps of each element's own scale and applied at every
        # element's scale: a summation order other than eager's puts a kernel's error at other
        # elements than eager's (of the same size, not at the same place), and where the reference
        # normalizes (LayerNorm) the magnitude term below does not bound it.
        spacing = c.spacing(self.rms)
        floor = torch.maximum(c.eager_err, self.eager_ulps * spacing)
        if c.m is not None:
            m = torch.nan_to_num(c.m.abs(), nan=0.0, posinf=0.0)
            floor = torch.maximum(floor, accumulation_bound(m, self.terms, self.dtype))
        bound = self.error_multiple * floor + self.ulps * spacing
        # Below the smallest normal a result may be flushed to zero or rounded up to it.
        tiny = torch.finfo(self.dtype).tiny
        return torch.where(c.g.abs() < tiny, bound.clamp_min(tiny), bound)


def _note_worst(worst: dict[str, tuple[float, int]], err: torch.Tensor, bound: torch.Tensor,
                both: torch.Tensor, over: torch.Tensor, nonfinite_bad: torch.Tensor, start: int) -> None:
    """Keep, across chunks, what :func:`_worst_flat` chooses from: the element furthest over its
    bound, the first misplaced NaN/inf, the finite element nearest its bound (each the first of
    its kind in flat order)."""
    if not err.numel():
        return
    any_over, any_nonfinite = bool(over.any()), bool(nonfinite_bad.any())
    failing = any_over or any_nonfinite or "over" in worst or "nonfinite" in worst
    # "near" matters only while nothing fails; once something does it is never read
    for rule, mask, wanted in (("over", over, any_over), ("near", both, not failing)):
        if not wanted:
            continue
        ratio = torch.where(mask, err / bound.clamp_min(1e-300), torch.zeros_like(err))
        at = int(torch.argmax(ratio))
        value = float(ratio[at])
        if rule not in worst or value > worst[rule][0]:
            worst[rule] = (value, start + at)
    worst.setdefault("near", (0.0, start))  # an output with elements has something to report
    if "nonfinite" not in worst and any_nonfinite:
        worst["nonfinite"] = (0.0, start + int(nonfinite_bad.nonzero()[0, 0]))


def _worst_flat(worst: Mapping[str, tuple[float, int]], mismatches: int, nonfinite: int) -> int | None:
    """The flat index of the element to report: among failing elements the one furthest over its
    bound (the first misplaced NaN/inf when only those fail), else the one nearest its bound among
    those finite in both; None for an empty output."""
    if "near" not in worst:
        return None
    if not mismatches:
        return worst["near"][1]
    if nonfinite == mismatches:
        return worst["nonfinite"][1]
    return worst["over"][1]


FAST_INTRINSIC_ULPS = 16.0
"""A float32 mismatch whose worst element is at most this many ulp off, where eager is within 1 ulp,
gets the fast-intrinsic hint (:func:`fast_intrinsic_hint`). Triton's fp32 ``tl.exp`` is off by
up to about |z| + 2 ulp and its ``/`` by up to 2 (docs/oracle.md, "Fast intrinsics in float32");
a wrong element, TF32 operands or a float16 accumulation are hundreds of ulp off or more."""


def fast_intrinsic_hint(c: Comparison, dtype: torch.dtype) -> str:
    """A line for a mismatch's message naming an exponent rounded before ``exp`` (Triton's
    ``tl.exp``, ``exp(x - lse)``) and Triton's approximate fp32 ``/``, when an
    output of ``dtype`` float32 is a few ulp over its default budget where eager is within an ulp
    of golden; else ``""``."""
    if (
        dtype != torch.float32
        or c.budget_text.startswith("atol")
        or c.ulps is None
        or c.abs_error is None
        or c.eager is None
        or c.golden is None
        or not 0 < c.ulps <= FAST_INTRINSIC_ULPS
    ):
        return ""
    spacing = c.abs_error / c.ulps
    if not abs(c.eager - c.golden) <= spacing:
        return ""
    return (
        "\n  hint     a few ulp over in float32 where eager is within an ulp: an exponent rounded before exp"
        " costs |z| 2^-24 relative (Triton's tl.exp is exp2 of a rounded product; exp(x - lse) rounds lse)"
        " and fp32 `/` (div.full.f32) is approximate; keep the residual (exp(x - max) / sum, tl.fma) and"
        " use tl.math.div_rn, or declare ulps= (docs/oracle.md, \"Fast intrinsics in float32\")"
    )


def _compare_exact(k: torch.Tensor, g: torch.Tensor, e: torch.Tensor) -> Comparison:
    """The :class:`Comparison` of an integer output (float64 here): every element must equal golden."""
    bad = k != g
    idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else None
    kv, gv, ev = (float(t[idx]) if idx else None for t in (k, g, e))
    return Comparison(
        int(bad.sum()), k.numel(), idx, kv, gv, ev, None, None, 0.0, 0.0, "exact (integer output)", 0
    )


def _misplaced_nonfinite(
    k: torch.Tensor,
    g: torch.Tensor,
    e: torch.Tensor,
    g_rounded: torch.Tensor,
    finite: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    bound: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """The mask of elements whose NaN or inf (in the kernel's output or in golden rounded to
    ``dtype``; ``finite`` holds their finite masks, then eager's) the NaN/inf rule does not allow."""
    g_fin, k_fin, e_fin = finite
    same_special = lambda a, b: (torch.isnan(a) & torch.isnan(b)) | (a == b)  # noqa: E731
    # Rounding to +-inf is right where golden plus its budget reaches the largest finite value.
    overflow_ok = (
        torch.isinf(k)
        & g_fin
        & (torch.sign(k) == torch.sign(g))
        & (g.abs() + bound >= torch.finfo(dtype).max)
    )
    # Eager's own value is never the kernel's fault, special or not: where golden overflows the
    # dtype but eager's arithmetic stayed finite (cancellation in a 16-bit backward), a kernel
    # returning eager's value passes as it does wherever golden is finite.
    # Where eager's own arithmetic overflows (inf, or NaN from inf - inf) the kernel's may too.
    both_overflow = ~k_fin & ~e_fin & torch.isfinite(g)
    allowed = same_special(k, g_rounded) | same_special(k, e) | overflow_ok | both_overflow
    return (~g_fin | ~k_fin) & ~allowed


def reduction_length(inputs: Sequence[Any]) -> int:
    """The ``n`` of the accumulation bound: the largest dim of any tensor input (>= 1)."""
    return max([1, *(max(t.shape) for t in inputs if isinstance(t, torch.Tensor) and t.dim())])


@dataclasses.dataclass
class ExactComparison:
    """One output of an exact-tier case compared with golden element by element (no budget).

    ``rows``/``cols``: the indices, along the output's dims before the last and along its last,
    of the elements that differ; ``moved``: lines such as ``"row 1 holds golden's row 0"`` for
    differing rows (or columns) that equal another of golden's exactly."""

    mismatches: int
    numel: int
    first_index: tuple[int, ...] | None
    kernel: float | None
    golden: float | None
    rows: list[tuple[int, ...]]
    row_count: int
    cols: list[int]
    col_count: int
    moved: list[str]


def is_exact_output(
    golden: torch.Tensor,
    eager: torch.Tensor,
    magnitude: torch.Tensor | None = None,
    inputs: Sequence[Any] = (),
) -> bool:
    """Whether an output is exact on these inputs: floating, and at every element where golden is
    finite, golden rounds to the output's dtype without error and eager returns that very value
    (the reference's own arithmetic in the test dtype was exact). With ``magnitude`` (the
    reference on the inputs' absolute values: ``sum_k |x_k w_k|`` for a linear layer), also every
    partial sum in any order: the dtype's spacing at the largest magnitude is at most the lattice
    the terms lie on, so a kernel that rounds partial sums to the output dtype (a split-K
    workspace) is exact too. That lattice is taken as the finest power of two that golden's and
    magnitude's elements are multiples of, and no coarser than the product over the floating
    ``inputs`` of each one's own (capped at 1): a product of one value of each input is a
    multiple of it. Elements where golden is NaN or inf are left to :func:`compare`."""
    if not eager.dtype.is_floating_point or eager.dtype not in MANTISSA_BITS:
        return False
    g = golden.detach().to(torch.float64)
    fin = torch.isfinite(g)
    if not bool(fin.any()):
        return False
    rounded = g.to(eager.dtype).to(torch.float64)
    e = eager.detach().to(torch.float64)
    if not bool(((rounded == g) & (e == g) | ~fin).all()):
        return False
    if magnitude is None:
        return True
    m = magnitude.detach().to(torch.float64)
    if m.shape != g.shape or not bool(torch.isfinite(m[fin]).all()):
        return False
    values = torch.cat([g[fin].abs(), m[fin].abs()])
    values = values[values > 0]
    if not values.numel():
        return True
    products = 1.0  # the lattice of a product of one value of each floating input
    for t in inputs:
        if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
            v = t.detach().to(torch.float64).abs().reshape(-1)
            v = v[torch.isfinite(v) & (v > 0)]
            if v.numel():
                products *= min(1.0, _lattice(v))
    lattice = min(_lattice(values), products)
    return float(ulp(values.max().reshape(1), eager.dtype)[0]) <= lattice


def _lattice(values: torch.Tensor) -> float:
    """The largest power of two that every one of ``values`` (float64, > 0) is a multiple of."""
    mantissa, exponent = torch.frexp(values)
    bits = (mantissa * 2.0**53).to(torch.int64)  # exact: a float64 significand has 53 bits
    low = bits & -bits  # the lowest set bit of each significand
    return float((low.to(torch.float64) * torch.exp2(exponent.to(torch.float64) - 53)).min())


MOVED_LINES = 3
"""At most this many "row i holds golden's row j" lines in an exact mismatch."""


def compare_exact(kernel: torch.Tensor, golden: torch.Tensor) -> ExactComparison:
    """``kernel`` against golden at every element where golden is finite: any difference counts
    (NaN where golden is finite included; ``-0.0`` equals ``0.0``). For an output
    :func:`is_exact_output` says is exact."""
    k = kernel.detach().to(torch.float64)
    g = golden.detach().to(torch.float64)
    bad = torch.isfinite(g) & ~(k == g)
    n = int(bad.sum())
    if not n:
        return ExactComparison(0, g.numel(), None, None, None, [], 0, [], 0, [])
    first = tuple(int(i) for i in bad.nonzero()[0])
    if g.dim() == 0:
        return ExactComparison(n, 1, (), float(k), float(g), [], 0, [], 0, [])
    cols_total = g.shape[-1]
    bad2 = bad.reshape(-1, cols_total)
    k2, g2 = k.reshape(-1, cols_total), g.reshape(-1, cols_total)
    row_idx = [int(r) for r in bad2.any(1).nonzero().flatten()]
    col_idx = [int(c) for c in bad2.any(0).nonzero().flatten()]
    lead = tuple(g.shape[:-1])
    rows: list[tuple[int, ...]] = []
    if lead:
        rows = [tuple(int(i) for i in torch.unravel_index(torch.tensor(r), lead)) for r in row_idx]
    moved: list[str] = []
    if lead:
        for r in row_idx:
            if len(moved) >= MOVED_LINES:
                break
            same = [j for j in range(g2.shape[0]) if j != r and torch.equal(k2[r], g2[j])]
            if same:
                at = tuple(int(i) for i in torch.unravel_index(torch.tensor(same[0]), lead))
                here = _index_text(rows[row_idx.index(r)])
                moved.append(f"row {here} holds golden's row {_index_text(at)}")
    if g2.shape[0] > 1:
        for c in col_idx:
            if len(moved) >= MOVED_LINES:
                break
            same = [j for j in range(cols_total) if j != c and torch.equal(k2[:, c], g2[:, j])]
            if same:
                moved.append(f"column {c} holds golden's column {same[0]}")
    return ExactComparison(
        n, g.numel(), first, float(k[first]), float(g[first]), rows, g2.shape[0] if lead else 0,
        col_idx, cols_total, moved,
    )


def _index_text(index: tuple[int, ...]) -> str:
    return str(index[0]) if len(index) == 1 else str(list(index))


def indices_text(values: Sequence[Any], total: int, shown: int = 8) -> str:
    """``"1, 3 (2 of 64)"``, ``"all 3"``, or the first ``shown`` and a count: which rows or
    columns an exact mismatch touches."""
    if total and len(values) == total and total > 1:
        return f"all {total}"
    text = ", ".join(_index_text(v) if isinstance(v, tuple) else str(v) for v in values[:shown])
    more = ", ..." if len(values) > shown else ""
    return f"{text}{more} ({len(values)} of {total})"
