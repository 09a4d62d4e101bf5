"""Backward checks (``backward=True``): a kernel's autograd gradients against the float64 golden's.

Training kernels ship a ``torch.autograd.Function`` whose backward is a second fused kernel; this
module holds it to the forward's policy (:mod:`pytest_fusion.oracle.budget`,
:mod:`pytest_fusion.oracle.hygiene`):

- upstream gradients: one per floating-point output, N(0, 1) in the output's dtype and on its
  device, in a layout of :data:`UPSTREAM_LAYOUTS` (contiguous, transposed, expanded with stride 0,
  offset), both drawn from the case's seed (:func:`upstream_gradients`), so a failing case's
  printed seed rebuilds them;
- the inputs differentiated: every floating-point tensor input the reference differentiates (its
  float64 autograd gives a gradient); integer inputs and inputs the reference's outputs do not
  depend on are left out;
- golden: the reference's autograd in float64 (inputs and upstream gradients upcast); eager: its
  autograd in the test dtype under IEEE fp32 matmul; magnitude: its float64 autograd on the
  inputs' and upstream gradients' absolute values (for a linear map exactly the sum of |terms| of
  each gradient element, elsewhere the scale of its intermediates). Each gradient of the kernel
  then meets :func:`pytest_fusion.oracle.budget.compare`'s budget against them, as an output does:
  eager's own gradient error sets it;
- hygiene: the kernel's forward is run once more with the inputs requiring grad, then
  ``torch.autograd.grad``; both run with their allocations poisoned and guarded, and every input's
  whole allocation must be bitwise unchanged afterwards (a backward that writes its gradients into
  the tensors the forward saved, when those are the caller's inputs, overwrites them). So must the
  forward's outputs (the caller holds them) and every other tensor the forward saved for backward
  (read from the autograd graph's nodes before the backward): a second backward over the same
  graph (``retain_graph=True``) reads them, and a backward kernel's own writes bypass the version
  counter that makes autograd refuse an in-place change of a saved tensor. The check holds each
  such tensor, and a copy of it, through the backward. ``retain_graph=False`` in the spec declares
  a backward that consumes the saved tensors (stores gradients into them, as Liger-Kernel's GLU
  ops do; torch frees saved tensors after a backward without ``retain_graph=True`` anyway): only
  the inputs and the forward's outputs are held then.

Failures are :class:`~pytest_fusion.oracle.failures.GradientMismatch` naming the input ("gradient of
'gate'"), or the forward's kinds (crash, input mutated, out-of-bounds write) with ``backward`` in
the headline. :func:`forward_backward` is what ``--fusion-bench`` times for a ``-fwdbwd`` case.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import torch

from pytest_fusion.declare.spec import KernelSpec
from pytest_fusion.oracle.budget import Comparison, compare, reduction_length
from pytest_fusion.oracle.failures import (
    BadOutput,
    FailureMessages,
    GradientMismatch,
    ReferenceFailed,
    SavedTensorMutated,
    tensor_layout,
    user_traceback,
)
from pytest_fusion.oracle.golden import as_tuple, ieee_precision, magnitudes, upcast
from pytest_fusion.oracle.hygiene import (
    Allocation,
    check_allocation_guards,
    check_input_storage,
    mismatch_detail,
    shares_memory,
)
from pytest_fusion.oracle.tensors import element_bits

Grads = list[Any]
"""One gradient (or None) per input, in the spec's input order."""

Run = Callable[[Callable[[], Any], str], tuple[tuple[Any, ...], list[Allocation]]]
"""How the oracle runs kernel code: ``run(thunk, call)`` -> (its outputs as a tuple, the tensors it
allocated), with allocations poisoned and guarded, an autotune config pinned, and a raise turned
into :class:`~pytest_fusion.oracle.failures.KernelCrash` naming ``call``."""


def upstream_seed(seed: int, index: int) -> int:
    """Seed of the upstream gradient of output ``index`` in a case drawn with ``seed``: its own
    stream, apart from the inputs' values and gap patterns."""
    return (seed * 1_000_003 + index * 7919 + 0x2545F491) % 2**63


UPSTREAM_LAYOUTS = ("contiguous", "transposed", "expanded", "offset")
"""Memory layouts an upstream gradient is drawn in (``upstream_gradients(..., layouts=True)``):
``transposed`` swaps the last two dims' strides; ``expanded`` has stride 0 along dim 0 (every row
the same, as the zero strides ``loss.sum()`` hands a backward); ``offset`` starts one element into
its storage, whose element 0 is NaN. A dim that cannot show the layout (one dim for transposed,
none for expanded or transposed) leaves the gradient contiguous, named so."""


def _laid_out(values: torch.Tensor, layout: str) -> torch.Tensor:
    """``values`` (contiguous, on its device) in ``layout`` (:data:`UPSTREAM_LAYOUTS`)."""
    if layout == "transposed" and values.dim() >= 2:
        return values.transpose(-1, -2).contiguous().transpose(-1, -2)
    if layout == "expanded" and values.dim() >= 1:
        # a storage of one row only, as torch's own expanded gradients have
        return values[:1].clone().expand(values.shape)
    if layout == "offset":
        block = torch.full((values.numel() + 1,), float("nan"), dtype=values.dtype, device=values.device)
        block[1:] = values.reshape(-1)
        return block.as_strided(values.shape, values.stride(), 1)
    return values


def upstream_gradients(
    outputs: Sequence[Any], seed: int, *, layouts: bool = False
) -> tuple[torch.Tensor | None, ...]:
    """One upstream gradient per output: N(0, 1) (drawn in float32 on the CPU, rounded once to the
    output's dtype), of the output's shape, on the output's device; None for an output that is not
    a floating-point tensor. Contiguous, or with ``layouts`` in one of :data:`UPSTREAM_LAYOUTS`
    drawn after the values from the same stream (the values do not depend on it);
    :func:`upstream_layouts` names them."""
    grads: list[torch.Tensor | None] = []
    for i, out in enumerate(outputs):
        if not (isinstance(out, torch.Tensor) and out.dtype.is_floating_point):
            grads.append(None)
            continue
        gen = torch.Generator(device="cpu").manual_seed(upstream_seed(seed, i))
        values = torch.randn(tuple(out.shape), generator=gen, dtype=torch.float32)
        values = values.to(out.dtype).to(out.device)
        if layouts:
            pick = UPSTREAM_LAYOUTS[int(torch.randint(len(UPSTREAM_LAYOUTS), (), generator=gen))]
            values = _laid_out(values, pick)
        grads.append(values)
    return tuple(grads)


def _layout_name(g: torch.Tensor) -> str:
    """Which of :data:`UPSTREAM_LAYOUTS` ``g`` lies in."""
    if g.dim() >= 1 and g.stride(0) == 0 and g.shape[0] > 1:
        return "expanded"
    if g.storage_offset():
        return "offset"
    return "contiguous" if g.is_contiguous() else "transposed"


def upstream_layouts(grads: Sequence[torch.Tensor | None]) -> str:
    """The layouts of :func:`upstream_gradients`' tensors, for a failure message:
    ``"output 0 transposed, output 1 offset"`` (outputs without a gradient left out)."""
    return ", ".join(f"output {i} {_layout_name(g)}" for i, g in enumerate(grads) if g is not None)


def upstream_geometry(grads: Sequence[torch.Tensor | None]) -> str:
    """:func:`upstream_layouts` with each gradient's shape, strides and storage offset, for a
    gradient mismatch: ``"output 0: transposed (shape 3x5, strides (1, 3), offset 0)"``."""
    return ", ".join(
        tensor_layout(f"output {i}", _layout_name(g), tuple(g.shape), g.stride(), int(g.storage_offset()))
        for i, g in enumerate(grads) if g is not None
    )


def floating_inputs(inputs: Sequence[Any]) -> list[bool]:
    """Which inputs a gradient is asked for: the floating-point tensors."""
    return [isinstance(t, torch.Tensor) and t.dtype.is_floating_point for t in inputs]


def autograd(
    fn: Callable[..., Any],
    args: Sequence[Any],
    constants: Mapping[str, Any],
    grad_outputs: Sequence[torch.Tensor | None],
    wanted: Sequence[bool],
) -> Grads:
    """``fn(*args, **constants)``'s vector-Jacobian product with ``grad_outputs`` for each input
    marked ``wanted`` (None elsewhere, and where the outputs do not depend on it). ``args`` are
    leaves (``detach``'d views are fine: gradients never write into them)."""
    leaves = [a.detach().requires_grad_() if w else a for a, w in zip(args, wanted, strict=True)]
    with torch.enable_grad():
        outs = as_tuple(fn(*leaves, **constants))
    pairs = [
        (o, g) for o, g in zip(outs, grad_outputs, strict=False)
        if g is not None and isinstance(o, torch.Tensor) and o.requires_grad
    ]
    targets = [leaf for leaf, w in zip(leaves, wanted, strict=True) if w]
    found = (
        list(torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True))
        if pairs and targets else [None] * len(targets)
    )
    return [found.pop(0) if w else None for w in wanted]


def forward_backward(
    fn: Callable[..., Any], grad_outputs: Sequence[torch.Tensor | None], wanted: Sequence[bool]
) -> Callable[..., tuple[Any, ...]]:
    """``fn`` as a fwd+bwd bench case times it: a call taking ``fn``'s arguments that runs ``fn``
    with the ``wanted`` inputs requiring grad, then ``torch.autograd.grad`` with the fixed
    ``grad_outputs``, and returns the gradients (one per input, None where not wanted)."""

    def fwd_bwd(*args: Any, **constants: Any) -> tuple[Any, ...]:
        return tuple(autograd(fn, args, constants, grad_outputs, wanted))

    return fwd_bwd


def reference_gradients(
    spec: KernelSpec,
    inputs: Sequence[Any],
    grad_outputs: Sequence[torch.Tensor | None],
    fail: FailureMessages,
) -> tuple[Grads, Grads, Grads]:
    """Golden, eager and magnitude gradients of ``spec.reference`` (module docstring); a raise is
    :class:`ReferenceFailed`, as is a reference that differentiates no input."""
    wanted = floating_inputs(inputs)
    absolute = [None if g is None else g.abs() for g in grad_outputs]
    try:
        golden = autograd(spec.reference, [upcast(t) for t in inputs], spec.constants,
                          [upcast(g) for g in grad_outputs], wanted)
        with ieee_precision():
            copies = [t.clone() if isinstance(t, torch.Tensor) else t for t in inputs]
            eager = autograd(spec.reference, copies, spec.constants, grad_outputs, wanted)
        scale = autograd(spec.reference, [magnitudes(t) for t in inputs], spec.constants,
                         [upcast(g) for g in absolute], wanted)
    except Exception as exc:  # the user's reference: report it as such, not as a kernel failure
        raise fail(
            ReferenceFailed, f"the reference's autograd raised {type(exc).__name__}: {exc} (backward)",
            user_traceback(exc),
        ) from exc
    if all(g is None for g in golden):
        raise fail(ReferenceFailed, "backward=True, but the reference's outputs have no gradient with "
                                    "respect to any floating-point input")
    return golden, eager, [None if m is None else m.abs() for m in scale]


def check_backward(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    inputs: Sequence[Any],
    outputs: Sequence[Any],
    before: Sequence[torch.Tensor],
    *,
    run: Run,
    seed: int,
    fail: FailureMessages,
) -> list[Comparison]:
    """The backward check of one case (module docstring). ``outputs``: eager's forward outputs
    (their shapes and dtypes size the upstream gradients); ``before``: each input's whole
    allocation before the kernel first ran (``tensors.storage_bytes``).

    Returns:
        one :class:`Comparison` per gradient checked, in input order.

    Raises:
        ReferenceFailed: the reference's autograd raised, or differentiates no input.
        KernelCrash: the kernel's forward or backward raised.
        BadOutput: a kernel output the reference differentiates carries no autograd history.
        InputMutated, OutOfBoundsWrite: the forward or the backward wrote into an input or
            outside a tensor.
        SavedTensorMutated: the backward wrote into an output of the forward or (unless
            ``spec.retain_graph`` is False) into another tensor the forward saved for backward.
        GradientMismatch: a gradient missing, of the wrong shape or dtype, or outside the budget.
    """
    names = list(spec.inputs)
    grad_outputs = upstream_gradients(outputs, seed, layouts=True)
    golden, eager, scale = reference_gradients(spec, inputs, grad_outputs, fail)
    wanted = [g is not None for g in golden]
    leaves = [t.detach().requires_grad_() if w else t for t, w in zip(inputs, wanted, strict=True)]

    def forward() -> Any:
        with torch.enable_grad():
            return kernel(*leaves, **spec.constants)

    outs, allocations = run(forward, "forward with autograd, for backward")
    check_allocation_guards(allocations, outs, "forward with autograd", fail)
    check_input_storage(names, inputs, before, "forward with autograd", fail)
    # retain_graph=False declares a backward that consumes what its forward saved (module docstring)
    watched = _watched(outs, _saved_tensors(outs) if spec.retain_graph else [], inputs)
    pairs = _differentiated_outputs(outs, grad_outputs, fail)
    targets = [leaf for leaf, w in zip(leaves, wanted, strict=True) if w]
    grads, allocations = run(
        lambda: torch.autograd.grad([o for o, _ in pairs], targets, [g for _, g in pairs], allow_unused=True),
        f"backward; upstream gradient layouts: {upstream_layouts(grad_outputs)}",
    )
    check_allocation_guards(allocations, grads, "backward", fail)
    check_input_storage(
        names, inputs, before, "backward", fail,
        hint="a backward must leave the forward's inputs as they were (the caller may still read them)",
    )
    _check_unchanged(watched, fail)
    found = list(grads)
    kernel_grads = [found.pop(0) if w else None for w in wanted]
    terms = reduction_length(inputs)
    comparisons = []
    for name, k, g, e, m in zip(names, kernel_grads, golden, eager, scale, strict=True):
        if g is not None:
            comparisons.append(_check_gradient(spec, name, k, g, e, m, terms, seed, fail,
                                               upstream_geometry(grad_outputs)))
    return comparisons


def _saved_tensors(outs: Sequence[Any]) -> list[tuple[str, torch.Tensor]]:
    """(what, tensor) for each tensor the autograd graph behind ``outs`` saved for backward: the
    ``_saved_*`` fields of torch's own nodes (``"_saved_result of ExpBackward0"``) and the
    ``saved_tensors`` of custom Functions' nodes (``"saved tensor 2 of SiluMulBackward"``), read
    before the backward. Reading them leaves autograd as it was (``saved_tensors_hooks`` would
    switch off its version-counter check and tie saved outputs into reference cycles); one that an
    in-place change already spoiled is skipped, and the backward raises for it."""
    found: list[tuple[str, torch.Tensor]] = []
    seen: set[int] = set()
    nodes: list[Any] = [o.grad_fn for o in outs if isinstance(o, torch.Tensor) and o.grad_fn is not None]
    keep = list(nodes)  # node wrappers stay alive while their ids are in ``seen``
    while nodes:
        node = nodes.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        keep.append(node)
        for name in [a for a in dir(node) if a.startswith("_saved_") or a == "saved_tensors"]:
            try:
                value = getattr(node, name)
            except Exception:  # spoiled by an in-place change, or freed: the backward reports it
                continue
            values = value if isinstance(value, (tuple, list)) else (value,)
            for i, v in enumerate(values):
                if isinstance(v, torch.Tensor):
                    what = f"saved tensor {i}" if name == "saved_tensors" else name
                    found.append((f"{what} of {type(node).__name__}", v))
        nodes.extend(n for n, _ in node.next_functions)
    return found


Watched = list[tuple[str, torch.Tensor, torch.Tensor]]
"""(what, tensor, a copy of its element bits before the backward), see :func:`_watched`."""


def _watched(
    outs: Sequence[Any], saved: Sequence[tuple[str, torch.Tensor]], inputs: Sequence[Any]
) -> Watched:
    """(what, tensor, a copy of its :func:`~pytest_fusion.oracle.tensors.element_bits`) for each
    output of the forward and each other tensor it saved for backward (:func:`_saved_tensors`),
    once each; tensors sharing memory with an input are the input check's."""
    out: Watched = []
    labelled = [(f"output {i} of the forward", o) for i, o in enumerate(outs)] + list(saved)
    for what, t in labelled:
        if not isinstance(t, torch.Tensor) or t.layout != torch.strided:
            continue
        if any(shares_memory(t, x) for x in inputs if isinstance(x, torch.Tensor)):
            continue
        if any(_same_view(t, w) for _, w, _ in out):
            continue
        out.append((what, t, element_bits(t).clone()))
    return out


def _same_view(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether ``a`` and ``b`` are the same elements of the same memory (a saved output is a new
    tensor object over the output's memory)."""
    def view(t: torch.Tensor) -> tuple[Any, ...]:
        return t.data_ptr(), t.shape, t.stride(), t.dtype, t.device

    return view(a) == view(b)


def _check_unchanged(watched: Watched, fail: FailureMessages) -> None:
    """:class:`SavedTensorMutated` for the first watched tensor (:func:`_watched`) whose bits the
    backward changed."""
    for what, t, old in watched:
        try:
            now = element_bits(t)
        except RuntimeError as exc:  # e.g. its storage freed or resized by the backward
            raise fail(SavedTensorMutated, f"the backward freed or resized {what}: {exc}") from None
        if torch.equal(old, now):
            continue
        n = int((old != now).reshape(t.numel(), -1).any(1).sum())  # a complex element is two parts
        dtype = str(t.dtype).replace("torch.", "")
        consume = "" if what.startswith("output") else (
            ", or declare retain_graph=False for a backward meant to consume what its forward saved")
        raise fail(
            SavedTensorMutated,
            f"the backward wrote into {what} (shape {tuple(t.shape)} {dtype}, {n} of "
            f"{t.numel()} elements changed): the caller holds the forward's outputs, and a second backward "
            "over the same graph (retain_graph=True) reads what the forward saved; write gradients into new "
            f"tensors{consume}",
        )


def _differentiated_outputs(
    outs: Sequence[Any], grad_outputs: Sequence[torch.Tensor | None], fail: FailureMessages
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(output, its upstream gradient) for each floating output; :class:`BadOutput` for one that
    carries no autograd history (a forward-only kernel, or one that detached its result)."""
    pairs = []
    for i, (o, g) in enumerate(zip(outs, grad_outputs, strict=True)):
        if g is None:
            continue
        if not (isinstance(o, torch.Tensor) and o.requires_grad):
            where = f"output {i}" if len(outs) > 1 else "the output"
            raise fail(
                BadOutput,
                f"backward=True, but {where} of the kernel carries no autograd history (requires_grad is "
                "False with its inputs requiring grad): a forward-only kernel? wrap it in a "
                "torch.autograd.Function with a backward",
            )
        pairs.append((o, g))
    return pairs


def _check_gradient(
    spec: KernelSpec, name: str, k: Any, g: torch.Tensor, e: torch.Tensor, m: torch.Tensor | None,
    terms: int, seed: int, fail: FailureMessages, layouts: str = "",
) -> Comparison:
    """Input ``name``'s gradient ``k`` against golden ``g`` under the spec's budget (eager's
    gradient ``e``, magnitude ``m``); :class:`GradientMismatch` naming the input when it fails,
    its message naming the upstream gradients' seed and ``layouts`` (:func:`upstream_geometry`)."""
    where = f"gradient of {name!r}"
    upstream = f"  upstream  N(0, 1) gradient of each floating output, drawn from seed {seed}" + (
        f"; layouts: {layouts}" if layouts else "")
    if not isinstance(k, torch.Tensor):
        raise fail(GradientMismatch, f"the kernel's backward gives no {where}; the reference has one")
    if tuple(k.shape) != tuple(g.shape) or k.dtype != e.dtype:
        raise fail(
            GradientMismatch,
            f"{where} has shape {tuple(k.shape)} and dtype {k.dtype}; the reference's has "
            f"{tuple(g.shape)} and {e.dtype} (backward)",
        )
    c = compare(k, g, e, magnitude=m, terms=terms, error_multiple=spec.error_multiple, ulps=spec.ulps,
                atol=spec.atol, rtol=spec.rtol)
    if c.mismatches:
        raise fail(
            GradientMismatch,
            f"{where}: {c.mismatches} of {c.numel} elements outside the error budget (backward)",
            mismatch_detail(c, k) + "\n" + upstream,
        )
    return c
