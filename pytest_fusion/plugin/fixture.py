"""The ``fusion`` fixture: the oracle and the bench for hand-written tests, and
:func:`assert_close`, the oracle on an output already computed (usable without pytest); and
:func:`repro_target`, how a failure names its test on a command line (the marker's items use it too)."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pytest
import torch

from pytest_fusion.declare.marker import make_spec
from pytest_fusion.declare.spec import (
    DEFAULT_ERROR_MULTIPLE,
    DEFAULT_ULPS,
    FWDBWD_SUFFIX,
    BenchCase,
    FusionUsageError,
    KernelSpec,
)
from pytest_fusion.oracle.case import check_inputs
from pytest_fusion.oracle.failures import FusionFailure, layouts_field, tensor_layout

PYTEST_COMMAND = "python3 -m pytest"
"""How a printed command runs pytest: as a module of the ``python3`` on the user's PATH, the
interpreter they installed pytest-fusion into, rather than a bare ``pytest`` script, which may be
another environment's (with another pytest-fusion, or none)."""


def repro_location(item: pytest.Item) -> tuple[str, str]:
    """Where and how a command run where the user ran pytest names ``item``: ``("", <path::rest>)``,
    or ``("cd <rootdir> && ", <node id>)``, each part shell-quoted.

    Node ids are relative to the rootdir, which need not be the invocation directory: the file
    part is made relative to the invocation directory when the file lies under it; otherwise the
    command changes to the rootdir first, where the node id resolves.
    """
    nodeid = item.nodeid
    invocation = Path(item.config.invocation_params.dir)
    path, sep, rest = nodeid.partition("::")
    try:
        relative = Path(item.path).relative_to(invocation).as_posix()
    except ValueError:
        return f"cd {shlex.quote(str(item.config.rootpath))} && ", shlex.quote(nodeid)
    return "", shlex.quote(relative + sep + rest)


def repro_target(item: pytest.Item) -> str:
    """The command that runs ``item`` from where the user ran pytest:
    ``[cd <rootdir> && ]python3 -m pytest <node id>`` (:data:`PYTEST_COMMAND`, :func:`repro_location`)."""
    cd, node = repro_location(item)
    return f"{cd}{PYTEST_COMMAND} {node}"


def layout_name(t: Any) -> str:
    """How a given tensor lies in memory, in the words of ``spec.LAYOUTS`` where one fits
    (``contiguous``, ``transposed``, ``offset``), else ``strided``; a non-tensor's type name."""
    if not isinstance(t, torch.Tensor):
        return type(t).__name__
    offset = t.storage_offset()
    if t.is_contiguous():
        return "offset" if offset else "contiguous"
    if t.dim() >= 2 and not offset and t.transpose(-1, -2).is_contiguous():
        return "transposed"
    return "strided"


def describe_given(inputs: Sequence[Any]) -> str:
    """The lines naming given inputs in a failure message, as
    :func:`pytest_fusion.oracle.case.describe_case` names a drawn
    case: each input's shape (``dims``), dtype, and layout with its shape, strides and storage
    offset (:func:`~pytest_fusion.oracle.failures.tensor_layout`), by position (``input0``, ...)."""
    tensors = [(f"input{i}", t) for i, t in enumerate(inputs)]
    dims = " ".join(f"{n}={tuple(t.shape)}" for n, t in tensors if isinstance(t, torch.Tensor))
    kinds = {str(t.dtype).replace("torch.", "") for _, t in tensors if isinstance(t, torch.Tensor)}
    dtype = kinds.pop() if len(kinds) == 1 else " ".join(
        f"{n}={str(t.dtype).replace('torch.', '')}" for n, t in tensors if isinstance(t, torch.Tensor))
    layouts = [
        tensor_layout(n, layout_name(t), tuple(t.shape), t.stride(), int(t.storage_offset()))
        if isinstance(t, torch.Tensor) else f"{n}: {layout_name(t)}"
        for n, t in tensors
    ]
    return f"  dims     {dims}\n  dtype    {dtype}\n{layouts_field(layouts)}"


def caller_line(item: pytest.Item, depth: int) -> str:
    """``file:line`` of the frame ``depth`` levels above this one's caller (the test's call of a
    fixture method), the file relative to where pytest was invoked when it lies under it."""
    frame = sys._getframe(depth + 1)
    path = Path(frame.f_code.co_filename)
    try:
        path = path.relative_to(Path(item.config.invocation_params.dir))
    except ValueError:
        pass
    return f"{path.as_posix()}:{frame.f_lineno}"


def spec_for(
    reference: Callable[..., Any],
    inputs: Sequence[torch.Tensor],
    constants: Mapping[str, Any] | None,
    **policy: Any,
) -> KernelSpec:
    """A spec describing concrete inputs: fixed shapes, no symbols to draw."""
    shapes = {f"input{i}": tuple(t.shape) for i, t in enumerate(inputs)}
    return make_spec(reference, inputs=shapes, dims={}, constants=constants or {}, **policy)


def assert_close(
    actual: Any,
    reference: Callable[..., Any],
    *inputs: torch.Tensor,
    constants: Mapping[str, Any] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    error_multiple: float = DEFAULT_ERROR_MULTIPLE,
    ulps: float = DEFAULT_ULPS,
    eager_parity: bool = False,
) -> None:
    """Check ``actual`` (a kernel's output: a tensor or a tuple) against ``reference(*inputs)``
    under the oracle's policy (:func:`pytest_fusion.oracle.case.check_inputs`, with ``actual`` as the
    kernel's output): golden in float64, budget from eager's own error plus ulps, or explicit
    ``atol``/``rtol``; NaN/inf placement; output count, shape and dtype; with ``eager_parity``,
    eager's bits too (:mod:`pytest_fusion.oracle.parity`). Usable without pytest.

    Raises:
        KernelMismatch: an output outside the budget, with the worst element and the budget.
        BadOutput: ``actual`` and the reference disagree in output count, shape or dtype.
        EagerMismatch: ``eager_parity`` and an output differs bitwise from eager's.
    """
    spec = spec_for(
        reference,
        inputs,
        constants,
        atol=atol,
        rtol=rtol,
        error_multiple=error_multiple,
        ulps=ulps,
        eager_parity=eager_parity,
        poison=False,
    )
    check_inputs(spec, lambda *args, **kwargs: actual, inputs, warn=False, n_calls=1)


def bench_case_for(
    name: str, inputs: Sequence[Any], dims: Mapping[str, int] | None, flops: Any, nbytes: Any,
    backward: bool = False,
) -> tuple[BenchCase, str]:
    """The bench case of a ``fusion.bench`` call and its dtype (the first floating input's);
    ``backward``: its forward + backward case, named ``<name>-fwdbwd``.

    Raises:
        FusionUsageError: no tensor among ``inputs``, bad ``dims``, or flops/bytes neither a
            number nor a callable of the dims.
    """
    from pytest_fusion.declare.arguments import flag, work_value

    backward = flag("backward")(backward, {})
    tensors = [t for t in inputs if hasattr(t, "dtype")]
    if not tensors:
        raise FusionUsageError("inputs must contain at least one tensor")
    floating = [t for t in tensors if t.dtype.is_floating_point] or tensors
    dtype = str(floating[0].dtype).replace("torch.", "")
    if dims is None:
        dims = {"M": int(tensors[0].shape[0])} if tensors[0].dim() else {}
    # Sizes are stored in the baseline and compared by the gate: anything else would be saved into
    # a file that the next run's load refuses.
    if not isinstance(dims, Mapping) or not all(
        isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in dims.values()
    ):
        raise FusionUsageError(f"dims must be a {{symbol: int >= 0}} mapping, got {dims!r}")
    case = BenchCase(name, dict(dims), (dtype,))

    def work(what: str, value: Any) -> float | None:
        return None if value is None else work_value(what, value, case) if callable(value) else float(value)

    nb = work("bytes", nbytes)
    return BenchCase(
        name + (FWDBWD_SUFFIX if backward else ""), dict(dims), (dtype,), work("flops", flops),
        {} if nb is None else {dtype: nb}, backward=backward,
    ), dtype


def bench_spec_for(
    reference: Callable[..., Any],
    n_inputs: int,
    constants: Mapping[str, Any] | None,
    providers: Mapping[str, Callable[..., Any]] | None,
    min_speedup: float | Mapping[str, float] | None,
    tolerance: float | None,
    fp32_precision: str = "ieee",
) -> KernelSpec:
    """The spec of a ``fusion.bench`` call with ``n_inputs`` tensors (a number ``min_speedup`` is
    the floor against eager).

    Raises:
        FusionUsageError: a bad ``tolerance`` (:func:`pytest_fusion.declare.spec.check_tolerance`) or
            ``fp32_precision`` (:func:`pytest_fusion.declare.marker.check_fp32_precision`).
    """
    from pytest_fusion.declare.marker import check_fp32_precision
    from pytest_fusion.declare.spec import Tensor, check_tolerance

    floors = (
        {"eager": float(min_speedup)} if isinstance(min_speedup, (int, float)) else dict(min_speedup or {})
    )
    return KernelSpec(
        reference=reference,
        inputs={f"input{i}": Tensor(()) for i in range(n_inputs)},
        dims={},
        constants=dict(constants or {}),
        providers=dict(providers or {}),
        min_speedup=floors,
        tolerance=None if tolerance is None else check_tolerance(tolerance),
        fp32_precision=check_fp32_precision(fp32_precision),
    )


def failing_cleanly(call: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
    """``call(*args, **kwargs)``; a FusionFailure fails the test with its message alone."""
    try:
        call(*args, **kwargs)
    except FusionFailure as exc:
        failure = str(exc)
    else:
        return
    pytest.fail(failure, pytrace=False)  # outside the except block: no chained traceback


class Fusion:
    """What the ``fusion`` fixture returns. Each method fails the test with the oracle's message."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    def assert_close(
        self, actual: Any, reference: Callable[..., Any], *inputs: torch.Tensor, **policy: Any
    ) -> None:
        """:func:`assert_close`, failing the test cleanly (no plugin traceback)."""
        failing_cleanly(assert_close, actual, reference, *inputs, **policy)

    def check(
        self,
        kernel: Callable[..., Any],
        reference: Callable[..., Any],
        *inputs: torch.Tensor,
        constants: Mapping[str, Any] | None = None,
        **policy: Any,
    ) -> None:
        """Run ``kernel`` and ``reference`` on these inputs with the full hygiene of the marker
        (poisoned allocations, mutation check, determinism run). ``policy``: atol, rtol,
        error_multiple, ulps, deterministic, eager_parity, backward (the gradients too,
        :mod:`pytest_fusion.oracle.backward`), retain_graph, poison."""
        where = caller_line(self._item, 1)
        spec = spec_for(reference, inputs, constants, **policy)
        repro = repro_target(self._item)
        context = f"  at       {where} (fusion.check)\n{describe_given(inputs)}\n  repro:\n    {repro}"
        failing_cleanly(check_inputs, spec, kernel, inputs, context=context, failure={"repro": repro})

    def _skip_unless_timed(self, triton: bool) -> None:
        """Skip the test unless this run times (``--fusion-bench``) and, for Triton code, a CUDA
        device is visible (the interpreter's timings mean nothing)."""
        from pytest_fusion.plugin import config

        if not config.of(self._item.config).bench:
            pytest.skip("timing runs only with --fusion-bench")
        if triton and not torch.cuda.is_available():
            from pytest_fusion.property.check import TRITON_BENCH_REASON

            pytest.skip(TRITON_BENCH_REASON)

    def bench(
        self,
        name: str,
        kernel: Callable[..., Any],
        *inputs: torch.Tensor,
        reference: Callable[..., Any],
        triton: bool = True,
        providers: Mapping[str, Callable[..., Any]] | None = None,
        constants: Mapping[str, Any] | None = None,
        flops: Any = None,
        bytes: Any = None,
        min_speedup: float | Mapping[str, float] | None = None,
        tolerance: float | None = None,
        dims: Mapping[str, int] | None = None,
        fp32_precision: str = "ieee",
        backward: bool = False,
    ) -> Any:
        """Time ``kernel(*inputs, **constants)`` as bench case ``name`` against ``reference``
        (eager), its torch.compile and ``providers``, and gate it, as a bench item of the marker
        does; only under ``--fusion-bench`` (skips otherwise). ``triton``: the kernel runs Triton
        code (default, as the marker's): skipped where no CUDA device is visible, since it would be
        timed under the interpreter; ``triton=False`` times a plain PyTorch kernel on the CPU.
        While timing, the inputs rotate through two further sets, each floating input's elements
        shuffled (:func:`pytest_fusion.bench.api.derived_sets`), and the kernel's timed output is
        checked against ``reference`` (a cached result fails "output not recomputed").

        Args:
            inputs: tensors, all on one device (it is the timing device); the first floating one's
                dtype names the case's dtype.
            flops, bytes: numbers, or callables of ``dims``; ``bytes`` None means inputs + outputs.
            min_speedup: a floor against eager, or ``{provider: floor}``.
            dims: sizes (ints >= 0) shown in reports and plots and stored with the baseline; a
                stored entry with other dims fails the gate until re-saved (default
                ``{"M": inputs[0].shape[0]}``).
            fp32_precision: ``"ieee"`` or ``"tf32"``, as the marker's (the peak that bounds a
                float32 case's TFLOP/s).
            backward: time forward + backward instead, as case ``<name>-fwdbwd``: every provider
                runs with the floating inputs requiring grad, then ``torch.autograd.grad`` with
                fixed N(0, 1) upstream gradients (the marker's ``backward=True`` twins);
                ``flops``/``bytes`` then count forward + backward.

        Returns:
            The :class:`~pytest_fusion.measure.record.BenchRecord`.

        Raises:
            pytest.fail.Exception: the gate failed, or bad arguments (named).
        """
        from pytest_fusion.plugin import bench_item

        self._skip_unless_timed(triton)
        try:
            case, _ = bench_case_for(name, inputs, dims, flops, bytes, backward)
            spec = bench_spec_for(
                reference, len(inputs), constants, providers, min_speedup, tolerance, fp32_precision
            )
        except FusionUsageError as exc:
            problem: str | None = f"fusion.bench({name!r}): {exc}"
        else:
            problem = None
        if problem:
            pytest.fail(problem, pytrace=False)
        device = str(next(t for t in inputs if hasattr(t, "device")).device)
        return bench_item.bench(
            self._item, spec, kernel, case, case.dtypes[0], device, inputs=list(inputs)
        )
