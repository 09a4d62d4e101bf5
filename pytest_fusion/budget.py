"""The error budget: how far each element of a kernel's output may be from golden.

Policy (shared/DESIGN.md, issues 2 and 15), for golden, eager and magnitude ``m`` as
:mod:`pytest_fusion.reference_runs` computes them:

- each output element ``i`` passes when

      |kernel_i - golden_i| <= error_multiple * max(|eager_i - golden_i|, lambda * sqrt(n) * u_acc * m_i)
                               + ulps * ulp(max(|golden_i|, rms(golden)))

  (defaults: ``error_multiple`` 2, ``ulps`` 4, :data:`LAMBDA` 6), or, when the spec gives them,
  ``|kernel - golden| <= atol + rtol * |golden|`` as in torch.testing;
- NaN and +-inf must sit where golden rounded to the output dtype has them (or where eager has the
  same value: the reference itself overflowing in the test dtype, or staying finite where golden
  overflows, is not the kernel's fault); a
  kernel may also round to +-inf (same sign) where ``|golden_i|`` plus its budget reaches the
  dtype's largest finite value.

Where the budget comes from:

- ``|eager_i - golden_i|``: eager's own error *at that element*, so a kernel may do what eager does
  (round its intermediates to the test dtype) and no element's budget grows because another
  element was hard (issue 15: taking eager's worst error over the whole output let one large
  element loosen every other one).
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

Measured (CPU, torch 2.13; the float16-accumulating linear of tests/test_oracle_defaults.py on
``torch.manual_seed(0)`` normals, M = N = 64, K = 4096): its worst error is 14.6 ulp at
``max(|golden|, rms)`` and 217 of the 4096 elements exceed their budget of at most 5 ulp; eager's
own worst error is 0.5 ulp.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Sequence

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
    :class:`Comparison`; ``mismatches == 0`` means pass.
    """
    out_dtype = eager.dtype if eager.dtype in MANTISSA_BITS else kernel.dtype
    k, g, e = (t.detach().to(torch.float64) for t in (kernel, golden, eager))
    if not out_dtype.is_floating_point:
        return _compare_exact(k, g, e)

    g_rounded = g.to(out_dtype).to(torch.float64)  # where golden overflows the dtype: inf
    g_fin, k_fin, e_fin = torch.isfinite(g_rounded), torch.isfinite(k), torch.isfinite(e)
    both = g_fin & k_fin
    eager_ok = g_fin & e_fin
    eager_err = torch.where(eager_ok, (e - g).abs(), torch.zeros_like(g))
    eager_max = float(eager_err.max()) if eager_err.numel() else 0.0
    err = torch.where(both, (k - g).abs(), torch.zeros_like(g))
    finite_g = g[g_fin]
    rms = float(finite_g.square().mean().sqrt()) if finite_g.numel() else 0.0
    spacing = ulp(g.abs().clamp_min(rms), out_dtype)
    if atol is not None:
        bound = atol + rtol * g.abs()  # type: ignore[operator]
        text = f"atol={atol:g} + rtol={rtol:g} x |golden|"
    else:
        bound, text = _default_budget(
            eager_err, eager_ok, spacing, magnitude,
            terms=terms, dtype=out_dtype, error_multiple=error_multiple, ulps=ulps, rms=rms,
        )
    nonfinite_bad = _misplaced_nonfinite(k, g, e, g_rounded, (g_fin, k_fin, e_fin), bound, out_dtype)
    over = both & (err > bound)
    idx = _worst_index(err, bound, both, over, nonfinite_bad)
    if idx is None:
        return Comparison(0, 0, None, None, None, None, None, None, None, eager_max, text, 0)
    kv, gv, ev = float(k[idx]), float(g[idx]), float(e[idx])
    abs_err = abs(kv - gv) if math.isfinite(kv) and math.isfinite(gv) else float("nan")
    return Comparison(
        mismatches=int((over | nonfinite_bad).sum()), numel=g.numel(), worst_index=idx,
        kernel=kv, golden=gv, eager=ev, abs_error=abs_err, ulps=abs_err / float(spacing[idx]),
        budget=float(bound[idx]), eager_max_error=eager_max, budget_text=text,
        nonfinite_mismatches=int(nonfinite_bad.sum()),
    )


FAST_INTRINSIC_ULPS = 16.0
"""A float32 mismatch whose worst element is at most this many ulp off, where eager is within 1 ulp,
gets the fast-intrinsic hint (:func:`fast_intrinsic_hint`). Triton's fp32 ``tl.exp`` is off by
up to about |z| + 2 ulp and its ``/`` by up to 2 (docs/oracle.md, "Fast intrinsics in float32");
a wrong element, TF32 operands or a float16 accumulation are hundreds of ulp off or more."""


def fast_intrinsic_hint(c: Comparison, dtype: torch.dtype) -> str:
    """A line for a mismatch's message naming Triton's approximate fp32 ``exp`` and ``/``, when an
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
        "\n  hint     a few ulp over in float32 where eager is within an ulp: Triton's tl.exp (exp2 of a"
        " rounded product) and fp32 `/` (div.full.f32) are approximate; keep the product's residual and"
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


def _default_budget(
    eager_err: torch.Tensor,
    eager_ok: torch.Tensor,
    spacing: torch.Tensor,
    magnitude: torch.Tensor | None,
    *,
    terms: int,
    dtype: torch.dtype,
    error_multiple: float,
    ulps: float,
    rms: float,
) -> tuple[torch.Tensor, str]:
    """The per-element bound of the default policy (module docstring) and its description."""
    # Eager's typical error, counted in ulps of each element's own scale and applied at every
    # element's scale: a summation order other than eager's puts a kernel's error at other
    # elements than eager's (of the same size, not at the same place), and where the reference
    # normalizes (LayerNorm) the magnitude term below does not bound it. The 99th percentile
    # (the lower neighbour), in local ulps: one element's large error loosens nothing.
    ratio = torch.where(eager_ok, eager_err / spacing, torch.zeros_like(eager_err))
    eager_ulps = _percentile_lower(torch.nan_to_num(ratio, nan=0.0, posinf=0.0), EAGER_PERCENTILE)
    floor = torch.maximum(eager_err, eager_ulps * spacing)
    if magnitude is not None:
        m = torch.nan_to_num(magnitude.detach().to(torch.float64).abs(), nan=0.0, posinf=0.0)
        floor = torch.maximum(floor, accumulation_bound(m, terms, dtype))
    bound = error_multiple * floor + ulps * spacing
    text = (
        f"{error_multiple:g} x max(eager's error here, eager's p99 {eager_ulps:.3g} ulp at this "
        f"scale, {LAMBDA:g} sqrt(n={terms}) u_acc x sum|terms|) + "
        f"{ulps:g} ulp of {str(dtype).replace('torch.', '')} at max(|golden|, rms {rms:.3g})"
    )
    return bound, text


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
    return (~g_fin | ~k_fin) & ~same_special(k, g_rounded) & ~same_special(k, e) & ~overflow_ok


def _worst_index(
    err: torch.Tensor,
    bound: torch.Tensor,
    both: torch.Tensor,
    over: torch.Tensor,
    nonfinite_bad: torch.Tensor,
) -> tuple[int, ...] | None:
    """The index of the element to report: among failing elements the one furthest over its bound
    (the first misplaced NaN/inf when only those fail), else the one nearest its bound among those
    finite in both; None for an empty output."""
    if not bool((over | nonfinite_bad).any()):
        if not err.numel():
            return None
        ratio = torch.where(both, err / bound.clamp_min(1e-300), torch.zeros_like(err))
        flat = int(torch.argmax(ratio))
    elif bool(nonfinite_bad.any()) and not bool(over.any()):
        flat = int(nonfinite_bad.reshape(-1).nonzero()[0])
    else:
        ratio = torch.where(over, err / bound.clamp_min(1e-300), torch.zeros_like(err))
        flat = int(torch.argmax(ratio))
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), err.shape)) if err.dim() else ()


def reduction_length(inputs: Sequence[Any]) -> int:
    """The ``n`` of the accumulation bound: the largest dim of any tensor input (>= 1)."""
    return max([1, *(max(t.shape) for t in inputs if isinstance(t, torch.Tensor) and t.dim())])
