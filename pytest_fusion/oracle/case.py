"""The correctness oracle: one case, checked against a float64 golden with an error budget.

Policy (docs/oracle.md, docs/oracle-hygiene.md), one module per part:

- golden, eager and magnitude, the reference's three runs: :mod:`pytest_fusion.oracle.golden`;
- the error budget each output element must meet, and where NaN and +-inf may sit:
  :mod:`pytest_fusion.oracle.budget`;
- memory hygiene (poisoned and guarded allocations, inputs bitwise unchanged, no output reused
  across calls): :mod:`pytest_fusion.oracle.hygiene`;
- the failure kinds and their messages: :mod:`pytest_fusion.oracle.failures`;
- with ``backward=True``, the gradients against golden's: :mod:`pytest_fusion.oracle.backward`.

This module applies them to one case: the kernel is called twice on the same inputs and each call
is checked against golden (a stale workspace fails the second); the two calls' outputs must not
share memory; a bitwise difference between them warns, or fails with ``deterministic=True``. The
names of the modules above stay importable from here.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any, Callable, Iterable, Mapping, Sequence

import torch

from pytest_fusion.declare.spec import KernelSpec
from pytest_fusion.machine import crash_record
from pytest_fusion.oracle import autotune, inplace, memory
from pytest_fusion.oracle.backward import check_backward
from pytest_fusion.oracle.budget import (
    Comparison,
    compare,
    compare_exact,
    is_exact_output,
    reduction_length,
)
from pytest_fusion.oracle.failures import (
    BadOutput,
    FailureMessages,
    FusionFailure,
    KernelCrash,
    KernelMismatch,
    NondeterminismWarning,
    Nondeterministic,
    OutputViewWarning,
    ReferenceFailed,
    interpreter_hint,
    layouts_field,
    tensor_layout,
    user_traceback,
)
from pytest_fusion.oracle.golden import as_tuple, run_reference
from pytest_fusion.oracle.hygiene import (
    Allocation,
    PoisonAllocations,
    check_allocation_guards,
    check_input_storage,
    check_outputs_not_reused,
    exact_detail,
    mismatch_detail,
    output_view_note,
)
from pytest_fusion.oracle.parity import check_parity
from pytest_fusion.oracle.tensors import (
    Case,
    element_bits,
    finite_outside,
    layout_geometry,
    make_inputs,
    nan_outside,
    pattern_seed,
    shape_of,
    storage_bytes,
)

Outputs = tuple[Any, ...]
"""One call's outputs: what the reference or the kernel returned, as a tuple."""


def bitwise_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` have the same shape, dtype and bits (NaN == NaN with the same payload,
    -0.0 != 0.0; :func:`~pytest_fusion.oracle.tensors.element_bits`)."""
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(element_bits(a), element_bits(b))


def describe_case(case: Case, spec: KernelSpec) -> str:
    """The lines naming ``case`` in a failure message: dims, dtype, each input's layout with its
    shape, strides and storage offset (:func:`~pytest_fusion.oracle.failures.tensor_layout`, as
    :func:`~pytest_fusion.oracle.tensors.make_inputs` lays the tensors out; the offset counts from
    the start of the input's buffer, after its guard band), seed, special values, amplitude."""
    dims = " ".join(f"{k}={v}" for k, v in case.dims.items())
    described = []
    for name, tensor in spec.inputs.items():
        layout = case.layouts.get(name, "contiguous")
        shape = shape_of(tensor, case.dims)
        strides, offset, _ = layout_geometry(shape, layout)
        described.append(tensor_layout(name, layout, shape, strides, offset))
    return (
        f"  dims     {dims}\n  dtype    {case.dtype}\n{layouts_field(described)}\n"
        f"  seed     {case.seed}    special values: {'yes' if case.special else 'no'}    "
        f"amplitude: {case.amplitude:g}" + ("    values: exact" if case.exact else "")
    )


@dataclasses.dataclass
class CaseResult:
    """What one passing case measured: per output, the kernel's worst error in ulps and eager's."""

    case: Case
    comparisons: list[Comparison]
    deterministic: bool


def _call(fn: Callable[..., Any], args: Sequence[Any], constants: Mapping[str, Any]) -> Any:
    """``fn`` called on the inputs, with the spec's constants as keywords."""
    return fn(*args, **constants)


def check_case(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    case: Case,
    *,
    device: str,
    repro: Callable[[Case], str] | None = None,
    warn: bool = True,
    every_config: bool = False,
    values: list[torch.Tensor] | None = None,
    configs: Callable[[int], Iterable[int]] | None = None,
) -> CaseResult:
    """Build ``case``'s inputs on ``device`` (from ``values``,
    :func:`~pytest_fusion.oracle.tensors.draw_values`
    drawn earlier, when given) and apply the whole policy (:func:`check_inputs`),
    starting from empty autotune caches (:func:`autotune.reset`), so that the case's calls tune
    exactly as its repro does. With ``every_config``, the case is then checked once more per
    config of its autotuned Triton kernels, each pinned in turn (:func:`autotune.choose`);
    ``configs``, given the number of configs, names which ones instead (the config tier:
    ``pytest_fusion.property.config_tier``).

    On a CUDA device the case first waits for its bytes of the device's memory
    (:func:`pytest_fusion.oracle.memory.admitted`), unless its caller holds an admission already.

    The failure message carries the case's fields and, when ``repro`` is given, its repro snippet.
    """
    need = 0 if memory.holding() else memory.case_bytes(spec, case, device)
    with memory.admitted(device, need, holder=describe_case(case, spec).splitlines()[0].strip()):
        inputs = list(make_inputs(spec, case, device, values).values())
        line = repro(case) if repro else None
        context = describe_case(case, spec) + (f"\n  repro:\n{line}" if line else "")
        named = dict(case=case, repro=line.strip() if line else None)
        autotune.reset()
        found = check_inputs(spec, kernel, inputs, context=context, warn=warn, seed=case.seed,
                             nan_outside=True, failure=named, exact=case.exact)
        result = CaseResult(case, *found)
        if every_config and configs is None:
            configs = range
        if configs is not None:
            for index in configs(autotune.config_count()):
                autotune.reset()
                for i, t in enumerate(inputs):  # each config's first call sees the finite pattern again
                    finite_outside(t, pattern_seed(case.seed, i))
                check_inputs(spec, kernel, inputs, context=context, warn=warn, config=index, seed=case.seed,
                             nan_outside=True, failure=named, exact=case.exact)
    return result


CALLS = 2
"""Calls of the kernel per case, on the same inputs; each is checked against golden."""


def check_inputs(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    *,
    context: str = "",
    warn: bool = True,
    config: int | None = None,
    n_calls: int = CALLS,
    seed: int = 0,
    backward: bool | None = None,
    nan_outside: bool = False,
    failure: Mapping[str, Any] | None = None,
    exact: bool = False,
) -> tuple[list[Comparison], bool]:
    """Run ``spec.reference`` and then ``kernel`` ``n_calls`` times (default :data:`CALLS`) on ``inputs`` (in
    ``spec.inputs`` order) and apply the policy of this module to every call: golden, eager, the
    error budget, NaN/inf placement, poisoned and guarded allocations, the whole allocation of
    every input (guard bands and layout gaps included) bitwise unchanged, no output sharing
    memory with an earlier call's; then the two calls bitwise equal (a difference warns with
    :class:`NondeterminismWarning` when ``warn``; callers that aggregate pass ``warn=False``).
    ``config``: pin that config of autotuned Triton kernels (:func:`autotune.choose`).
    ``n_calls=1`` checks one output already computed (``assert_close``: no second call to compare).
    ``backward`` (None: ``spec.backward``): then check the kernel's gradients too
    (:func:`pytest_fusion.oracle.backward.check_backward`), with upstream gradients drawn from ``seed``.
    On a CUDA device the check first waits for its bytes of the device's memory
    (:func:`pytest_fusion.oracle.memory.admitted_inputs`), unless its caller holds an admission.
    With ``spec.mutates``, each call runs on its own copies of those inputs and the outputs are
    read as :mod:`pytest_fusion.oracle.inplace` says.
    ``nan_outside``: before the last call (of two or more), fill the bytes before and after each
    floating input with NaN (:func:`~pytest_fusion.oracle.tensors.nan_outside`; they stay so for
    the backward check), so a read past an input shows as NaN in that call's output. Only for
    inputs in allocations of their own (:func:`~pytest_fusion.oracle.tensors.make_inputs`).
    ``failure``: ``case`` and ``repro`` for the attributes of any failure raised
    (:class:`~pytest_fusion.oracle.failures.FusionFailure`).
    ``exact``: the inputs are of the exact value tier (:attr:`~pytest_fusion.oracle.tensors.Case.exact`):
    an output that is exact on them (:func:`~pytest_fusion.oracle.budget.is_exact_output`) must
    equal golden at every element, before its error budget is checked; not with explicit
    ``atol``/``rtol`` (a kernel declared approximate).

    Returns:
        the per-output comparisons of the first call (then, with ``backward``, one per gradient
        checked) and whether the calls were bitwise equal.

    Raises:
        ReferenceFailed: the reference raised (golden or eager).
        KernelCrash: the kernel raised.
        OutOfBoundsWrite: a guard band or layout gap changed.
        InputMutated: the elements of an input not in ``spec.mutates`` changed.
        BadOutput: wrong output count, shape or dtype.
        OutputAliased: an output shares memory with the previous call's.
        KernelMismatch: values outside the budget or misplaced NaN/inf.
        EagerMismatch: an output differs bitwise from eager's and ``spec.eager_parity`` is set.
        Nondeterministic: the calls differ and ``spec.deterministic`` is set.
        GradientMismatch: with ``backward``, a gradient is wrong (and the failures above, of the
            backward run).
        SavedTensorMutated: with ``backward``, the backward wrote into an output of the forward or
            (unless ``spec.retain_graph`` is False) a tensor the forward saved
            (:func:`pytest_fusion.oracle.backward.check_backward`).
    """
    inputs = list(inputs)
    with memory.admitted_inputs(spec, inputs, n_calls=n_calls, backward=backward):
        return _check_inputs(spec, kernel, inputs, context=context, warn=warn, config=config,
                             n_calls=n_calls, seed=seed, backward=backward, nan_outside=nan_outside,
                             failure=failure or {}, exact=exact)


def _check_inputs(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: list[torch.Tensor],
    *,
    context: str,
    warn: bool,
    config: int | None,
    n_calls: int,
    seed: int,
    backward: bool | None,
    nan_outside: bool,
    failure: Mapping[str, Any],
    exact: bool = False,
) -> tuple[list[Comparison], bool]:
    """:func:`check_inputs` once its device's memory is admitted."""
    before = [storage_bytes(t).clone() for t in inputs]
    fail = FailureMessages(_footer(context, config), failure.get("case"), failure.get("repro"))
    mutated = inplace.positions(spec)
    reference = inplace.with_outputs(spec.reference, mutated, copy=True) if mutated else spec.reference
    original = kernel
    kernel = inplace.with_outputs(kernel, mutated) if mutated else kernel
    expected = _reference_outputs(reference, spec, inputs, fail)
    calls: list[Outputs] = []
    comparisons: list[Comparison] = []
    outside = False
    for n in range(n_calls):
        call = f"call {n + 1} of {n_calls}"
        if nan_outside and n_calls > 1 and n == n_calls - 1:
            # the last call only: the first keeps finite bands, so a NaN stray write still shows
            before = _with_nan_outside(inputs)
            outside = True
        args = inplace.fresh_copies(inputs, mutated) if mutated else inputs
        out, allocations = _call_kernel(spec, kernel, args, config, call, fail)
        check_allocation_guards(allocations, out, call, fail)
        check_input_storage(list(spec.inputs), args, before, call, fail, mutable=spec.mutates)
        found = _check_outputs(spec, args, out, expected, call, fail, outside=outside, exact=exact)
        comparisons = comparisons or found
        check_outputs_not_reused(out, calls, args, call, fail)
        if n == 0 and n_calls > 1 and not spec.output_views:  # not for assert_close's given output
            _warn_output_view(original, out, args, allocations, fail)
        calls.append(out)
    agree = _calls_agree(calls, spec.deterministic, warn, fail)
    if spec.backward if backward is None else backward:
        run = lambda thunk, call: _run_kernel(spec, thunk, config, call, fail)  # noqa: E731
        comparisons = comparisons + check_backward(
            spec, kernel, inputs, expected[1], before, run=run, seed=seed, fail=fail
        )
    return comparisons, agree


_VIEW_WARNED: weakref.WeakSet[Any] = weakref.WeakSet()
"""Kernels an :class:`OutputViewWarning` was given for in this process: one warning per kernel."""


def _warn_output_view(
    kernel: Callable[..., Any],
    out: Outputs,
    inputs: Sequence[torch.Tensor],
    allocations: Sequence[Allocation],
    fail: FailureMessages,
) -> None:
    """An :class:`OutputViewWarning` (once per kernel) when an output is a view into a larger buffer
    the kernel allocated (:func:`~pytest_fusion.oracle.hygiene.output_view_note`)."""
    try:
        if kernel in _VIEW_WARNED:
            return
    except TypeError:  # not weakly referenceable: warn every time
        pass
    name = getattr(kernel, "__qualname__", None) or type(kernel).__name__
    note = output_view_note(out, inputs, allocations, f"kernel {name!r}")
    if note is None:
        return
    try:
        _VIEW_WARNED.add(kernel)
    except TypeError:
        pass
    warnings.warn(OutputViewWarning(f"{note}\n{fail.footer}"), stacklevel=4)


def _with_nan_outside(inputs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """:func:`~pytest_fusion.oracle.tensors.nan_outside` on every input; their allocations' new
    bytes, what the hygiene checks compare the next call against."""
    for t in inputs:
        nan_outside(t)
    return [storage_bytes(t).clone() for t in inputs]


def _footer(context: str, config: int | None) -> str:
    """The lines every failure of one check ends with: ``context``, then the pinned autotune config."""
    if config is None:
        return context
    pinned = f"  autotune {autotune.describe(config)}"
    return f"{context}\n{pinned}" if context else pinned


def _reference_outputs(
    reference: Callable[..., Any], spec: KernelSpec, inputs: Sequence[torch.Tensor], fail: FailureMessages
) -> tuple[Outputs, Outputs, Outputs]:
    """Golden, eager and magnitude outputs (:func:`run_reference`); :class:`ReferenceFailed` if it raises."""
    try:
        return run_reference(reference, inputs, spec.constants)
    except Exception as exc:  # the user's reference: report it as such, not as a kernel failure
        raise fail(
            ReferenceFailed, f"the reference raised {type(exc).__name__}: {exc}", user_traceback(exc)
        ) from exc


def _call_kernel(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    config: int | None,
    call: str,
    fail: FailureMessages,
) -> tuple[Outputs, list[Allocation]]:
    """The kernel's outputs and the tensors it allocated (:func:`_run_kernel`)."""
    return _run_kernel(spec, lambda: _call(kernel, inputs, spec.constants), config, call, fail)


def _run_kernel(
    spec: KernelSpec, thunk: Callable[[], Any], config: int | None, call: str, fail: FailureMessages
) -> tuple[Outputs, list[Allocation]]:
    """What ``thunk`` (kernel code: a call, or a backward) returns, as a tuple, and the tensors it
    allocated (poisoned and guarded when ``spec.poison``); :class:`KernelCrash` naming ``call`` if
    it raises."""
    poison = PoisonAllocations() if spec.poison else None
    try:
        with crash_record.kernel_call(call, fail.footer), warnings.catch_warnings(), autotune.choose(config):
            # NaN poison and special values make numpy under the Triton interpreter warn
            # ("invalid value encountered in matmul"): expected here, and noise in the report.
            warnings.filterwarnings("ignore", category=RuntimeWarning, module=r"triton\.runtime\.interpreter")
            if poison is not None:
                with poison:
                    out = as_tuple(thunk())
            else:
                out = as_tuple(thunk())
    except FusionFailure:
        raise
    except Exception as exc:
        raise fail(
            KernelCrash,
            f"the kernel raised {type(exc).__name__}: {exc} ({call}){interpreter_hint(exc)}",
            user_traceback(exc),
        ) from exc
    return out, poison.allocations if poison is not None else []


def _check_outputs(
    spec: KernelSpec,
    inputs: Sequence[torch.Tensor],
    out: Outputs,
    expected: tuple[Outputs, Outputs, Outputs],
    call: str,
    fail: FailureMessages,
    outside: bool = False,
    exact: bool = False,
) -> list[Comparison]:
    """Each output's :class:`Comparison` with golden; :class:`BadOutput` when the outputs' count,
    shapes or dtypes differ from the reference's, :class:`KernelMismatch` when one fails its budget
    (with ``exact``, an exact output: when one element differs from golden at all),
    :class:`EagerMismatch` when ``spec.eager_parity`` and one differs bitwise from eager's.
    ``outside``: this call ran with NaN around the inputs (the mismatch then says so)."""
    golden, eager, scale = expected
    _check_output_types(out, golden, eager, fail)
    comparisons = []
    for i, (k, g, e, m) in enumerate(zip(out, golden, eager, scale, strict=True)):
        where = f"output {i}" if len(out) > 1 else "output"
        if exact and spec.atol is None and is_exact_output(g, e, m, inputs):
            x = compare_exact(k, g)
            if x.mismatches:
                raise fail(
                    KernelMismatch,
                    f"exact values: {x.mismatches} of {x.numel} elements of the {where} differ from golden, "
                    f"which this case makes exact ({call})",
                    exact_detail(x, k, outside_nan=outside, inputs_nan=outside and _holds_nan(inputs)),
                )
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
            raise fail(
                KernelMismatch,
                f"{c.mismatches} of {c.numel} elements of the {where} outside the error budget ({call})",
                mismatch_detail(c, k, outside_nan=outside, inputs_nan=outside and _holds_nan(inputs)),
            )
        if spec.eager_parity:
            check_parity(k, e, where, call, fail)
    return comparisons


def _holds_nan(inputs: Sequence[Any]) -> bool:
    """Whether an element of a floating input is NaN."""
    return any(isinstance(t, torch.Tensor) and t.dtype.is_floating_point and bool(t.isnan().any())
               for t in inputs)


def _check_output_types(out: Outputs, golden: Outputs, eager: Outputs, fail: FailureMessages) -> None:
    """:class:`BadOutput` unless ``out`` has golden's count and shapes, and eager's dtypes."""
    in_place = " (an in-place kernel returning None names the inputs it writes in the marker's mutates=)"
    if len(out) != len(golden):
        hint = in_place if out == (None,) else ""
        raise fail(BadOutput, f"the kernel returned {len(out)} output(s), the reference {len(golden)}{hint}")
    for i, (k, g, e) in enumerate(zip(out, golden, eager, strict=True)):
        if not isinstance(k, torch.Tensor):
            hint = in_place if k is None else ""
            raise fail(BadOutput, f"output {i} is a {type(k).__name__}, not a tensor{hint}")
        if tuple(k.shape) != tuple(g.shape):
            raise fail(BadOutput, f"output {i} has shape {tuple(k.shape)}, the reference {tuple(g.shape)}")
        if k.dtype != e.dtype:
            raise fail(BadOutput, f"output {i} has dtype {k.dtype}, the reference gives {e.dtype}")


def _calls_agree(calls: Sequence[Outputs], deterministic: bool, warn: bool, fail: FailureMessages) -> bool:
    """Whether the first and last calls' outputs are bitwise equal; when not, :class:`Nondeterministic`
    if ``deterministic``, else a :class:`NondeterminismWarning` (when ``warn``) at check_inputs' caller."""
    same = all(bitwise_equal(a, b) for a, b in zip(calls[0], calls[-1], strict=True))
    if not same:
        msg = "two runs of the kernel on the same inputs differ bitwise"
        if deterministic:
            raise fail(Nondeterministic, msg)
        if warn:
            warnings.warn(NondeterminismWarning(f"{msg}\n{fail.footer}"), stacklevel=3)
    return same

