"""The correctness oracle: one case, checked against a float64 golden with an error budget.

Policy (shared/DESIGN.md, issues 2 and 15):

- golden: the reference run on the inputs upcast to float64;
- eager: the reference run in the test dtype, on a copy of the inputs, under :func:`ieee_precision`
  (IEEE fp32 matmul and convolution, no reduced-precision reductions, whatever the process set),
  so a process that lowered its own precision does not lower the bar;
- magnitude ``m``: the reference run in float64 on the inputs' absolute values. For a linear layer
  it is ``sum_k |x_k w_k| + |b|`` at each output element, the scale of a dot product's rounding
  error (Higham, *Accuracy and Stability of Numerical Algorithms*, 2nd ed., section 3.1);
- each output element ``i`` passes when

      |kernel_i - golden_i| <= error_multiple * max(|eager_i - golden_i|, lambda * sqrt(n) * u_acc * m_i)
                               + ulps * ulp(max(|golden_i|, rms(golden)))

  (defaults: ``error_multiple`` 2, ``ulps`` 4, :data:`LAMBDA` 6), or, when the spec gives them,
  ``|kernel - golden| <= atol + rtol * |golden|`` as in torch.testing.

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

- NaN and +-inf must sit where golden rounded to the output dtype has them (or where eager has the
  same value: the reference itself overflowing in the test dtype is not the kernel's fault); a
  kernel may also round to +-inf (same sign) where ``|golden_i|`` plus its budget reaches the
  dtype's largest finite value;
- hygiene: tensors the kernel allocates are poisoned (a NaN with its own payload, integers
  0x7F..) and followed by a guard band; inputs sit between guard bands with their layout gaps
  filled by a finite pattern (:mod:`pytest_fusion.tensors`), and their whole allocation must come
  back bitwise unchanged; a changed guard or gap is an "out-of-bounds write". The kernel is called
  twice on the same inputs and each call is checked against golden (a stale workspace fails the
  second); the two calls' outputs must not share memory; a bitwise difference between them
  warns, or fails with ``deterministic=True``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import traceback
import warnings
from typing import Any, Callable, Iterator, Mapping, Sequence

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from pytest_fusion import autotune
from pytest_fusion.devices import interpreter_active
from pytest_fusion.spec import KernelSpec
from pytest_fusion.tensors import (
    GUARD_BYTES,
    Case,
    covered_bytes,
    describe_offset,
    make_inputs,
    storage_bytes,
)

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


class FusionFailure(AssertionError):
    """A fused-kernel check failed. ``kind`` says which way; the message has every detail."""

    kind = "failure"


class KernelMismatch(FusionFailure):
    """The kernel's values are outside the error budget, or NaN/inf are misplaced."""

    kind = "mismatch"


class KernelCrash(FusionFailure):
    """The kernel raised instead of returning."""

    kind = "crash"


class BadOutput(FusionFailure):
    """The kernel returned the wrong number of outputs, or the wrong shape or dtype."""

    kind = "bad output"


class InputMutated(FusionFailure):
    """The kernel wrote into one of its inputs."""

    kind = "input mutated"


class Nondeterministic(FusionFailure):
    """Two runs on the same inputs differ bitwise, and the spec asks for determinism."""

    kind = "nondeterministic"


class OutOfBoundsWrite(FusionFailure):
    """The kernel wrote outside a tensor: into a guard band or a layout gap of an input, or into
    the guard band after a tensor it allocated."""

    kind = "out-of-bounds write"


class OutputAliased(FusionFailure):
    """An output of the second call shares memory with an output of the first: a buffer reused
    across calls, so the second call overwrote the first result."""

    kind = "aliased output"


class NondeterministicFailure(FusionFailure):
    """A case failed, and the same case run again passed: the failure depends on something
    outside the case (timing, state left by earlier calls, uninitialised memory)."""

    kind = "nondeterministic failure"


class ReferenceFailed(FusionFailure):
    """The reference itself raised: the test, not the kernel, is broken."""

    kind = "reference raised"


class NondeterminismWarning(UserWarning):
    """Two runs of the kernel on the same inputs differ bitwise."""


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


# Process-wide precision switches, through the fp32_precision API only (torch >= 2.9): mixing it
# with the legacy allow_tf32 / set_float32_matmul_precision API makes torch raise on the next read
# of a legacy flag. (backend module path, attribute) pairs; absent ones are skipped.
_FP32_PRECISION_LEAVES = (
    "cuda.matmul",
    "cudnn.conv",
    "cudnn.rnn",
    "mkldnn.matmul",
    "mkldnn.conv",
    "mkldnn.rnn",
)
_REDUCED_PRECISION_FLAGS = (
    "cuda.matmul.allow_fp16_reduced_precision_reduction",
    "cuda.matmul.allow_bf16_reduced_precision_reduction",
    "cuda.matmul.allow_fp16_accumulation",
    "cpu.allow_fp16_reduced_precision_reduction",
)


def _backend(path: str) -> Any:
    obj: Any = torch.backends
    for part in path.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj


@contextlib.contextmanager
def ieee_precision() -> Iterator[None]:
    """Run the body with IEEE fp32 matmul and convolution (no TF32, no bf16 passes on oneDNN) and
    no reduced-precision reductions in fp16/bf16 GEMMs, whatever the process set; every setting is
    restored afterwards, also when the body raises.

    Uses ``torch.backends.<backend>.<op>.fp32_precision = "ieee"`` (torch >= 2.9) and the
    ``allow_*_reduced_precision_reduction`` / ``allow_fp16_accumulation`` flags where this torch has
    them; never the legacy ``allow_tf32`` / ``set_float32_matmul_precision``, whose mixing with the
    new API torch rejects.
    """
    saved: list[tuple[Any, str, Any]] = []
    try:
        for path in _FP32_PRECISION_LEAVES:
            leaf = _backend(path)
            if leaf is not None and hasattr(leaf, "fp32_precision"):
                saved.append((leaf, "fp32_precision", leaf.fp32_precision))
                leaf.fp32_precision = "ieee"
        for flag in _REDUCED_PRECISION_FLAGS:
            owner_path, name = flag.rsplit(".", 1)
            owner = _backend(owner_path)
            try:
                value = getattr(owner, name)
            except (AttributeError, RuntimeError):
                continue
            if isinstance(value, bool):
                saved.append((owner, name, value))
                setattr(owner, name, False)
        yield
    finally:
        for owner, name, value in reversed(saved):
            setattr(owner, name, value)


POISON_BITS = {
    torch.float16: 0x7E5A,
    torch.bfloat16: 0x7FDA,
    torch.float32: 0x7FCADEAD,
    torch.float64: 0x7FF8DEADDEADDEAD,
}
"""The quiet NaN that :class:`PoisonAllocations` writes, per dtype: its payload tells an element
the kernel never wrote from a NaN it computed (arithmetic yields the default NaN, 0x7FC00000 in
float32, and NVIDIA GPUs never propagate payloads)."""

GUARD_BYTE = 0xA5
"""Every byte of the guard band after a tensor the kernel allocates: 0xA5A5 is neither a NaN nor
a round number in any dtype, so no plausible stray write leaves it unchanged."""

_INT_VIEW = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def is_poison(t: torch.Tensor, index: tuple[int, ...]) -> bool:
    """Whether element ``index`` of ``t`` still holds :data:`POISON_BITS` (was never written)."""
    bits = POISON_BITS.get(t.dtype)
    if bits is None:
        return False
    value = int(t[index].reshape(1).view(_INT_VIEW[t.element_size()]).item())
    return value & ((1 << (8 * t.element_size())) - 1) == bits


@dataclasses.dataclass
class Allocation:
    """A tensor made by an ``empty``-family op while :class:`PoisonAllocations` was active: its
    whole block (``nbytes`` of storage, then a :data:`GUARD_BYTES` guard band), and what was asked."""

    block: torch.Tensor
    nbytes: int
    shape: tuple[int, ...]
    dtype: torch.dtype

    def guard_changed(self) -> int | None:
        """The first changed byte of the guard band, counted from the end of the storage, or None."""
        guard = self.block[self.nbytes :]
        bad = (guard != GUARD_BYTE).nonzero()
        return int(bad[0]) if bad.numel() else None


class PoisonAllocations(TorchDispatchMode):
    """While active, every tensor created by ``torch.empty``-family ops is filled with a NaN
    carrying :data:`POISON_BITS` (integers: their max value), so elements a kernel never writes
    fail the check; and (``guard=True``) is placed at the start of a larger block whose last
    :data:`GUARD_BYTES` hold :data:`GUARD_BYTE`, checked after the call (:attr:`allocations`).
    The tensor starts where the block starts, so it is exactly as aligned as torch's own
    allocation (512 bytes from the CUDA caching allocator; TMA paths see no change).

    What it cannot see: allocations that bypass the dispatcher (inside C++ extensions, and the
    buffers Inductor's generated code allocates with its own ``empty_strided`` calls).

    A dispatch mode rather than ``torch.use_deterministic_algorithms`` + fill_uninitialized_memory:
    that switch changes which algorithms the kernel and torch may use."""

    FACTORIES = {
        "empty.memory_format",
        "empty_strided.default",
        "empty_like.default",
        "new_empty.default",
        "new_empty_strided.default",
        "empty.out",
    }

    def __init__(self, guard: bool = True) -> None:
        super().__init__()
        self.guard = guard
        self.allocations: list[Allocation] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Sequence[Any] = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._opname + "." + func._overloadname
        if not isinstance(out, torch.Tensor) or name not in self.FACTORIES:
            return out
        with torch.no_grad():
            if self.guard and name != "empty.out" and type(out) is torch.Tensor and out.device.type != "meta":
                out = self._guarded(out)
            if out.dtype in POISON_BITS:
                out.view(_INT_VIEW[out.element_size()]).fill_(
                    _signed(POISON_BITS[out.dtype], out.element_size())
                )
            elif out.dtype.is_floating_point or out.dtype.is_complex:
                out.fill_(float("nan"))
            elif out.dtype == torch.bool:
                out.fill_(True)
            else:
                out.fill_(torch.iinfo(out.dtype).max)
        return out

    def _guarded(self, out: torch.Tensor) -> torch.Tensor:
        nbytes = out.untyped_storage().nbytes()
        block = torch.empty(nbytes + GUARD_BYTES, dtype=torch.uint8, device=out.device)
        block[nbytes:].fill_(GUARD_BYTE)
        view = torch.empty(0, dtype=out.dtype, device=out.device)
        view.set_(block.untyped_storage(), out.storage_offset(), out.shape, out.stride())
        self.allocations.append(Allocation(block, nbytes, tuple(out.shape), out.dtype))
        return view


def _signed(bits: int, size: int) -> int:
    return bits - (1 << (8 * size)) if bits >= 1 << (8 * size - 1) else bits


def _as_tuple(out: Any) -> tuple[Any, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _bits(t: torch.Tensor) -> torch.Tensor:
    """A view comparing bitwise (NaN == NaN with the same payload, -0.0 != 0.0)."""
    if t.dtype.is_floating_point:
        return t.contiguous().view({2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])
    return t


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def upcast(t: Any) -> Any:
    """Floating tensors to float64; anything else unchanged (integer weights stay integers)."""
    if isinstance(t, torch.Tensor) and t.dtype.is_floating_point:
        return t.detach().to(torch.float64)
    return t


def magnitudes(t: Any) -> Any:
    """|t| upcast like :func:`upcast`: the inputs of the magnitude run."""
    t = upcast(t)
    return t.abs() if isinstance(t, torch.Tensor) and (t.dtype.is_floating_point or t.is_signed()) else t


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
    k = kernel.detach().to(torch.float64)
    g = golden.detach().to(torch.float64)
    e = eager.detach().to(torch.float64)
    if not out_dtype.is_floating_point:
        bad = k != g
        idx = tuple(int(i) for i in bad.nonzero()[0]) if bad.any() else None
        return Comparison(
            int(bad.sum()),
            k.numel(),
            idx,
            *(float(t[idx]) if idx else None for t in (k, g, e)),
            None,
            None,
            0.0,
            0.0,
            "exact (integer output)",
            0,
        )

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
        # Eager's typical error, counted in ulps of each element's own scale and applied at every
        # element's scale: a summation order other than eager's puts a kernel's error at other
        # elements than eager's (of the same size, not at the same place), and where the reference
        # normalizes (LayerNorm) the magnitude term below does not bound it. The 99th percentile
        # (the lower neighbour), in local ulps: one element's large error loosens nothing.
        ratio = torch.where(eager_ok, eager_err / spacing, torch.zeros_like(g))
        eager_ulps = _percentile_lower(torch.nan_to_num(ratio, nan=0.0, posinf=0.0), EAGER_PERCENTILE)
        floor = torch.maximum(eager_err, eager_ulps * spacing)
        if magnitude is not None:
            m = torch.nan_to_num(magnitude.detach().to(torch.float64).abs(), nan=0.0, posinf=0.0)
            floor = torch.maximum(floor, accumulation_bound(m, terms, out_dtype))
        bound = error_multiple * floor + ulps * spacing
        text = (
            f"{error_multiple:g} x max(eager's error here, eager's p99 {eager_ulps:.3g} ulp at this "
            f"scale, {LAMBDA:g} sqrt(n={terms}) u_acc x sum|terms|) + "
            f"{ulps:g} ulp of {str(out_dtype).replace('torch.', '')} at max(|golden|, rms {rms:.3g})"
        )
    same_special = lambda a, b: (torch.isnan(a) & torch.isnan(b)) | (a == b)  # noqa: E731
    # Rounding to +-inf is right where golden plus its budget reaches the largest finite value.
    overflow_ok = (
        torch.isinf(k)
        & g_fin
        & (torch.sign(k) == torch.sign(g))
        & (g.abs() + bound >= torch.finfo(out_dtype).max)
    )
    nonfinite_bad = (
        (~g_fin | ~k_fin) & ~same_special(k, g_rounded) & ~((~e_fin) & same_special(k, e)) & ~overflow_ok
    )
    over = both & (err > bound)
    bad = over | nonfinite_bad
    n_bad = int(bad.sum())
    if n_bad == 0:
        worst_flat = (
            int(torch.argmax(torch.where(both, err / bound.clamp_min(1e-300), torch.zeros_like(g))))
            if g.numel()
            else None
        )
    elif bool(nonfinite_bad.any()) and not bool(over.any()):
        worst_flat = int(nonfinite_bad.reshape(-1).nonzero()[0])
    else:
        ratio = torch.where(over, err / bound.clamp_min(1e-300), torch.zeros_like(g))
        worst_flat = int(torch.argmax(ratio))
    if worst_flat is None:
        return Comparison(0, 0, None, None, None, None, None, None, None, eager_max, text, 0)
    idx = tuple(int(i) for i in torch.unravel_index(torch.tensor(worst_flat), g.shape)) if g.dim() else ()
    kv, gv, ev = float(k[idx]), float(g[idx]), float(e[idx])
    abs_err = abs(kv - gv) if math.isfinite(kv) and math.isfinite(gv) else float("nan")
    b = bound if isinstance(bound, float) else float(bound[idx])
    return Comparison(
        mismatches=n_bad,
        numel=g.numel(),
        worst_index=idx,
        kernel=kv,
        golden=gv,
        eager=ev,
        abs_error=abs_err,
        ulps=abs_err / float(spacing[idx]),
        budget=b,
        eager_max_error=eager_max,
        budget_text=text,
        nonfinite_mismatches=int(nonfinite_bad.sum()),
    )


def reduction_length(inputs: Sequence[Any]) -> int:
    """The ``n`` of the accumulation bound: the largest dim of any tensor input (>= 1)."""
    return max([1, *(max(t.shape) for t in inputs if isinstance(t, torch.Tensor) and t.dim())])


def run_reference(
    reference: Callable[..., Any], inputs: Sequence[Any], constants: Mapping[str, Any]
) -> tuple[tuple[Any, ...], tuple[Any, ...], tuple[Any, ...]]:
    """golden (float64), eager (test dtype, under :func:`ieee_precision`, on copies of the inputs)
    and magnitude (float64 on |inputs|) outputs of ``reference``, each as a tuple."""
    golden = _as_tuple(reference(*[upcast(t) for t in inputs], **constants))
    with ieee_precision():
        eager = _as_tuple(
            reference(*[t.clone() if isinstance(t, torch.Tensor) else t for t in inputs], **constants)
        )
    scale = _as_tuple(reference(*[magnitudes(t) for t in inputs], **constants))
    return golden, eager, scale


def describe_case(case: Case) -> str:
    dims = " ".join(f"{k}={v}" for k, v in case.dims.items())
    layouts = " ".join(f"{k}={v}" for k, v in case.layouts.items())
    return (
        f"  dims     {dims}\n  dtype    {case.dtype}\n  layouts  {layouts}\n"
        f"  seed     {case.seed}    special values: {'yes' if case.special else 'no'}    "
        f"amplitude: {case.amplitude:g}"
    )


@dataclasses.dataclass
class CaseResult:
    """What one passing case measured: per output, the kernel's worst error in ulps and eager's."""

    case: Case
    comparisons: list[Comparison]
    deterministic: bool


def _call(fn: Callable[..., Any], args: Sequence[Any], constants: Mapping[str, Any]) -> Any:
    return fn(*args, **constants)


_PACKAGE_DIR = __file__.rsplit("/", 1)[0]


def user_traceback(exc: BaseException) -> str:
    """The traceback of ``exc`` without pytest-fusion's own frames: what the user's code did."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if not f.filename.startswith(_PACKAGE_DIR)]
    lines = traceback.format_list(frames) + traceback.format_exception_only(type(exc), exc)
    return "  traceback (pytest-fusion frames omitted):\n" + "".join(lines).rstrip()


def check_case(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    case: Case,
    *,
    device: str,
    repro: Callable[[Case], str] | None = None,
    warn: bool = True,
    every_config: bool = False,
) -> CaseResult:
    """Build ``case``'s inputs on ``device`` and apply the whole policy (:func:`check_inputs`),
    starting from empty autotune caches (:func:`autotune.reset`), so that the case's calls tune
    exactly as its repro does. With ``every_config``, the case is then checked once more per
    config of its autotuned Triton kernels, each pinned in turn (:func:`autotune.choose`).

    The failure message carries the case's fields and, when ``repro`` is given, its repro snippet.
    """
    inputs = list(make_inputs(spec, case, device).values())
    context = describe_case(case) + (f"\n  repro:\n{repro(case)}" if repro else "")
    autotune.reset()
    result = CaseResult(case, *check_inputs(spec, kernel, inputs, context=context, warn=warn))
    if every_config:
        for index in range(autotune.config_count()):
            autotune.reset()
            check_inputs(spec, kernel, inputs, context=context, warn=warn, config=index)
    return result


def _interpreter_hint(exc: BaseException) -> str:
    """A hint for a crash that comes from the Triton interpreter itself, not from the kernel: the
    interpreter of Triton 3.6 converts a loop bound to int in a way numpy >= 2.4 refuses
    (triton-lang/triton#9171, fixed in later Triton releases)."""
    if "only 0-dimensional arrays can be converted to Python scalars" in str(exc) and interpreter_active():
        return (
            "\n  hint: this Triton's interpreter does not work with numpy >= 2.4 (triton-lang/triton#9171);"
            " install numpy<2.4 or a newer Triton to run this kernel interpreted"
        )
    return ""


CALLS = 2
"""Calls of the kernel per case, on the same inputs; each is checked against golden."""


def _shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the byte ranges of ``a`` and ``b`` overlap (same allocation, overlapping span)."""
    if a.device != b.device or not a.numel() or not b.numel():
        return False

    def span(t: torch.Tensor) -> tuple[int, int]:
        start = t.data_ptr()
        extent = sum((d - 1) * abs(st) for d, st in zip(t.shape, t.stride(), strict=True)) + 1
        return start, start + extent * t.element_size()

    (a0, a1), (b0, b1) = span(a), span(b)
    return a0 < b1 and b0 < a1


def check_inputs(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    *,
    context: str = "",
    warn: bool = True,
    config: int | None = None,
    n_calls: int = CALLS,
) -> tuple[list[Comparison], bool]:
    """Run ``spec.reference`` and then ``kernel`` ``n_calls`` times (default :data:`CALLS`) on ``inputs`` (in
    ``spec.inputs`` order) and apply the policy of this module to every call: golden, eager, the
    error budget, NaN/inf placement, poisoned and guarded allocations, the whole allocation of
    every input (guard bands and layout gaps included) bitwise unchanged, no output sharing
    memory with an earlier call's; then the two calls bitwise equal (a difference warns with
    :class:`NondeterminismWarning` when ``warn``; callers that aggregate pass ``warn=False``).
    ``config``: pin that config of autotuned Triton kernels (:func:`autotune.choose`).
    ``n_calls=1`` checks one output already computed (``assert_close``: no second call to compare).

    Returns:
        the per-output comparisons of the first call and whether the calls were bitwise equal.

    Raises:
        ReferenceFailed: the reference raised (golden or eager).
        KernelCrash: the kernel raised.
        OutOfBoundsWrite: a guard band or layout gap changed.
        InputMutated: an input's elements changed.
        BadOutput: wrong output count, shape or dtype.
        OutputAliased: an output shares memory with the previous call's.
        KernelMismatch: values outside the budget or misplaced NaN/inf.
        Nondeterministic: the calls differ and ``spec.deterministic`` is set.
    """
    inputs = list(inputs)
    names = list(spec.inputs)
    before = [storage_bytes(t).clone() for t in inputs]
    constants = spec.constants
    footer = context
    if config is not None:
        footer = (
            f"{context}\n  autotune {autotune.describe(config)}"
            if context
            else f"  autotune {autotune.describe(config)}"
        )

    def fail(cls: type[FusionFailure], headline: str, detail: str = "") -> FusionFailure:
        text = f"[pytest-fusion] {cls.kind}: {headline}"
        return cls("\n".join(part for part in (text, footer, detail) if part))

    try:
        golden, eager, scale = run_reference(spec.reference, inputs, constants)
    except Exception as exc:  # the user's reference: report it as such, not as a kernel failure
        raise fail(
            ReferenceFailed, f"the reference raised {type(exc).__name__}: {exc}", user_traceback(exc)
        ) from exc

    def run_kernel(call: str) -> tuple[Any, ...]:
        poison = PoisonAllocations() if spec.poison else None
        try:
            with warnings.catch_warnings(), autotune.choose(config):
                # NaN poison and special values make numpy under the Triton interpreter warn
                # ("invalid value encountered in matmul"): expected here, and noise in the report.
                warnings.filterwarnings(
                    "ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter"
                )
                if poison is not None:
                    with poison:
                        out = _as_tuple(_call(kernel, inputs, constants))
                else:
                    out = _as_tuple(_call(kernel, inputs, constants))
        except FusionFailure:
            raise
        except Exception as exc:
            raise fail(
                KernelCrash,
                f"the kernel raised {type(exc).__name__}: {exc} ({call}){_interpreter_hint(exc)}",
                user_traceback(exc),
            ) from exc
        for alloc in poison.allocations if poison is not None else ():
            offset = alloc.guard_changed()
            if offset is not None:
                owner = next(
                    (
                        f"output {i}"
                        for i, k in enumerate(out)
                        if isinstance(k, torch.Tensor)
                        and k.untyped_storage().data_ptr() == alloc.block.data_ptr()
                    ),
                    None,
                )
                what = owner or "a tensor it allocated and did not return (a workspace?)"
                size = torch.empty((), dtype=alloc.dtype).element_size()
                raise fail(
                    OutOfBoundsWrite,
                    f"the kernel wrote past the end of {what} ({call}), shape {alloc.shape} "
                    f"{str(alloc.dtype).replace('torch.', '')}: byte {offset} of the "
                    f"{GUARD_BYTES}-byte guard band after its storage (element offset "
                    f"+{(alloc.nbytes + offset) // size} from the storage's start)",
                )
        for name, t, old in zip(names, inputs, before, strict=True):
            now = storage_bytes(t)
            if torch.equal(old, now):
                continue
            changed = old != now
            inside = covered_bytes(t)
            if bool((changed & inside).any()):
                n = int((changed & inside).view(-1, t.element_size()).any(1).sum())
                raise fail(
                    InputMutated,
                    f"the kernel wrote into input {name!r} ({n} of {t.numel()} elements changed; {call})",
                )
            first = int(changed.nonzero()[0])
            raise fail(
                OutOfBoundsWrite,
                f"the kernel wrote outside input {name!r} ({call}), shape {tuple(t.shape)} strides "
                f"{tuple(t.stride())}: {describe_offset(t, first)}, "
                f"{int(changed.view(-1, t.element_size()).any(1).sum())} element(s) changed "
                "in its guard bands and layout gaps",
            )
        return out

    def check_outputs(call: str, out: tuple[Any, ...]) -> list[Comparison]:
        if len(out) != len(golden):
            raise fail(BadOutput, f"the kernel returned {len(out)} output(s), the reference {len(golden)}")
        for i, (k, g, e) in enumerate(zip(out, golden, eager, strict=True)):
            if not isinstance(k, torch.Tensor):
                raise fail(BadOutput, f"output {i} is a {type(k).__name__}, not a tensor")
            if tuple(k.shape) != tuple(g.shape):
                raise fail(
                    BadOutput, f"output {i} has shape {tuple(k.shape)}, the reference {tuple(g.shape)}"
                )
            if k.dtype != e.dtype:
                raise fail(BadOutput, f"output {i} has dtype {k.dtype}, the reference gives {e.dtype}")
        comparisons = []
        for i, (k, g, e, m) in enumerate(zip(out, golden, eager, scale, strict=True)):
            c = compare(
                k,
                g,
                e,
                magnitude=m,
                terms=reduction_length(inputs),
                error_multiple=spec.error_multiple,
                ulps=spec.ulps,
                atol=spec.atol,
                rtol=spec.rtol,
            )
            comparisons.append(c)
            if c.mismatches:
                where = f"output {i}" if len(out) > 1 else "output"
                unwritten = ""
                if (
                    c.kernel is not None
                    and math.isnan(c.kernel)
                    and c.worst_index is not None
                    and is_poison(k, c.worst_index)
                ):
                    unwritten = (
                        " (NaN where golden is finite: an unwritten element? it holds the poison NaN of"
                        " a tensor the kernel allocated)"
                    )
                detail = (
                    f"  worst    {list(c.worst_index or ())}: kernel={c.kernel:.6g} golden={c.golden:.6g} "
                    f"eager={c.eager:.6g} |err|={c.abs_error:.3g} = {c.ulps:.1f} ulp{unwritten}\n"
                    f"  budget   {c.budget_text} (here {c.budget:.3g})\n"
                    f"  NaN/inf misplaced: {c.nonfinite_mismatches}"
                )
                raise fail(
                    KernelMismatch,
                    f"{c.mismatches} of {c.numel} elements of the {where} outside the error budget ({call})",
                    detail,
                )
        return comparisons

    calls: list[tuple[Any, ...]] = []
    comparisons: list[Comparison] = []
    for n in range(n_calls):
        call = f"call {n + 1} of {n_calls}"
        out = run_kernel(call)
        found = check_outputs(call, out)
        comparisons = comparisons or found
        for i, k in enumerate(out):
            if any(_shares_memory(k, t) for t in inputs):
                continue  # an output that is a view of an input is the input's business
            for m, earlier in enumerate(calls):
                j = next((j for j, e in enumerate(earlier) if _shares_memory(k, e)), None)
                if j is not None:
                    raise fail(
                        OutputAliased,
                        f"output aliases an earlier result: output {i} of {call} shares memory with "
                        f"output {j} of call {m + 1}, so this call overwrote that result (an output "
                        "buffer reused across calls; allocate it per call)",
                    )
        calls.append(out)

    same = all(bitwise_equal(a, b) for a, b in zip(calls[0], calls[-1], strict=True))
    if not same:
        msg = "two runs of the kernel on the same inputs differ bitwise"
        if spec.deterministic:
            raise fail(Nondeterministic, msg)
        if warn:
            warnings.warn(NondeterminismWarning(f"{msg}\n{footer}"), stacklevel=2)
    return comparisons, same
