"""The ``fused_kernel`` marker's arguments: one signature (:func:`fused_kernel`) and one
validator per argument, giving a :class:`~pytest_fusion.declare.spec.KernelSpec`.

``inspect.signature(fused_kernel)`` is the marker's help text, and binding the marker's arguments
to it is what reports an unknown or missing one. Each validator checks type and range and names
the argument in its :class:`~pytest_fusion.declare.spec.FusionUsageError`. Plain Python, no torch import.
"""

from __future__ import annotations

import difflib
import inspect
import re
from typing import Any, Callable, Mapping, Sequence

from pytest_fusion.declare.arguments import (
    check_bench,
    check_bytes,
    check_flops,
    did_you_mean,
    dtype_names,
    flag,
    is_int,
    mapping,
    number,
    optional_number,
)
from pytest_fusion.declare.inputs import (
    check_dims,
    check_multiple_of,
    check_mutates,
    check_tiles,
    validate_inputs,
)
from pytest_fusion.declare.spec import (
    DEFAULT_ERROR_MULTIPLE,
    DEFAULT_ULPS,
    SUPPORTED_DTYPES,
    FusionUsageError,
    KernelSpec,
    backward_cases,
    check_tolerance,
    compile_mode_of,
    is_builtin,
)

DEVICE_PATTERN = re.compile(r"cpu|cuda(:\d+)?")

RENAMED = {"baselines": "providers"}
"""Former argument names, hinted at when used."""


def fused_kernel(
    reference: Callable[..., Any],
    *,
    inputs: Mapping[str, Any],
    dims: Mapping[str, tuple[int, int]],
    dtypes: Sequence[str] = SUPPORTED_DTYPES,
    constants: Mapping[str, Any] | None = None,
    mutates: Sequence[str] = (),
    tiles: Mapping[str, Sequence[int]] | Sequence[int] | None = None,
    multiple_of: Mapping[str, int] | None = None,
    atol: float | None = None,
    rtol: float | None = None,
    error_multiple: float = DEFAULT_ERROR_MULTIPLE,
    ulps: float = DEFAULT_ULPS,
    special_values: bool = True,
    deterministic: bool = False,
    eager_parity: bool = False,
    backward: bool = False,
    retain_graph: bool = True,
    poison: bool = True,
    output_views: bool = False,
    triton: bool = True,
    fp32_precision: str = "ieee",
    device: str | None = None,
    max_examples: int | None = None,
    bench: Mapping[str, Mapping[str, Any]] | None = None,
    flops: Callable[..., float] | None = None,
    bytes: Callable[..., float] | None = None,
    providers: Mapping[str, Callable[..., Any]] | None = None,
    min_speedup: float | Mapping[str, float] | None = None,
    tolerance: float | None = None,
) -> KernelSpec:
    """``@pytest.mark.fused_kernel(...)``: validate the arguments into a KernelSpec.

    Args:
        reference: eager PyTorch callable computing what the kernel must compute.
        inputs: ``{name: shape tuple or pytest_fusion.Tensor}``: the tensor arguments, in call order.
        dims: ``{symbol: (low, high)}``: inclusive ranges Hypothesis draws each shape symbol from.
        dtypes: test dtypes, a subset of float16, bfloat16, float32.
        constants: ``{name: value}``: non-tensor keyword arguments passed to kernel and reference.
        mutates: names of inputs the kernel may write into (an in-place kernel, e.g. rotary on
            q and k). Each call then gets its own copies of them; its outputs are what it returns
            or, when it returns None, those inputs' final values in ``mutates`` order (the
            reference's likewise, on copies); writes into any other input still fail.
        tiles: ``{symbol: (sizes...)}`` or ``(sizes...)``: tile sizes whose +-1 neighbours are edge dims.
        multiple_of: ``{symbol: m}``: draw that symbol only as multiples of ``m`` (a kernel that
            requires K % 16 == 0); its edge values become the nearest multiples. Bench cases and
            repros must give multiples too.
        atol, rtol: explicit tolerances against golden, given together (replace the error budget).
        error_multiple: kernel error may be this multiple of eager's worst error against golden.
        ulps: plus this many ulps of the output dtype at golden's magnitude.
        special_values: plant NaN, +-inf and -0.0 in inputs, in half the drawn cases (a bool;
            False opts out, e.g. for a kernel documented to require finite inputs).
        deterministic: fail when two runs on the same inputs differ bitwise (False: warn).
        eager_parity: also fail unless each output is eager's, bitwise, in the test dtype (NaN ==
            NaN at the same place; -0.0 != 0.0), for elementwise and normalisation kernels meant
            to replace eager exactly; not for a kernel containing a GEMM, whose summation order
            (cuBLAS's, Triton's) eager does not fix. The error budget is still checked first.
        backward: also check the kernel's autograd gradients of every floating input against
            the float64 golden's, under the same budget (eager's gradient error), with upstream
            gradients drawn N(0, 1) from the case's seed, backward's allocations poisoned and its
            inputs unchanged (:mod:`pytest_fusion.oracle.backward`); and time each bench case's forward
            + backward as its own case ``<case>-fwdbwd``.
        retain_graph: with ``backward``, whether the tensors the forward saved must come through
            the backward unchanged, so that a second backward over the same graph
            (``retain_graph=True``) still works. False declares a backward that consumes them (it
            stores its gradients into the forward's saved intermediates to save memory, as
            Liger-Kernel's GLU ops do): those writes are then allowed, into every tensor any node
            of the graph saved; writes into the inputs and the forward's outputs still fail.
            torch's own ``retain_graph`` defaults to False too: declare it when the kernel is
            never run under ``backward(retain_graph=True)``, which it would then break.
        poison: fill tensors the kernel allocates with NaN / 0x7F.. before it writes.
        output_views: the kernel may return views into larger buffers it allocated (a buffer
            padded to the tile, one workspace holding several outputs). Without it such an output
            warns (:class:`~pytest_fusion.oracle.failures.OutputViewWarning`): the bytes outside
            the view stay allocated as long as the caller holds the output.
        triton: the kernel runs Triton code: bf16 is skipped under the interpreter.
        fp32_precision: ``"ieee"`` or ``"tf32"``: the precision of the kernel's float32 matmuls.
            ``"tf32"`` (Triton's ``tl.dot`` default for float32 operands, torch's ``allow_tf32``)
            lets a float32 bench case reach the device's TF32 matmul peak before it counts as
            implausible; the oracle's budget is unchanged, so a TF32 kernel still declares its
            tolerance (``atol``/``rtol``: each operand is rounded to 2^-11 relative).
        device: ``"cuda"``, ``"cuda:N"`` or ``"cpu"`` (None: cuda when visible, else cpu).
        max_examples: Hypothesis examples for this test (None: --fusion-examples).
        bench: ``{case: {symbol: size, "dtypes": (...)}}``: shapes timed by --fusion-bench.
        flops: ``callable(**dims)`` -> floating-point operations of one call (for TFLOP/s).
        bytes: ``callable(**dims, itemsize)`` -> bytes one call must move (None: inputs + outputs).
        providers: ``{name: callable}``: extra providers timed beside eager and compile.
        min_speedup: float (against eager) or ``{provider: float}``: a floor whatever the baseline.
        tolerance: gate tolerance for this kernel, a fraction in [0, 1) (None: --fusion-tolerance).

    Raises:
        FusionUsageError: the first bad argument, named.
    """
    args = dict(locals())
    done: dict[str, Any] = {}
    for name in ORDER:
        done[name] = VALIDATORS[name](args[name], done)
    if (done["atol"] is None) != (done["rtol"] is None):
        raise FusionUsageError("give atol and rtol together (as torch.testing.assert_close does), or neither")
    if done["backward"]:
        done["bench"] = backward_cases(done["bench"])
    return KernelSpec(**done)


def signature_text() -> str:
    """``fused_kernel(reference, *, inputs, dims, dtypes=(...), ...)``: the signature without types."""
    sig = inspect.signature(fused_kernel)
    params = [p.replace(annotation=p.empty) for p in sig.parameters.values()]
    return "fused_kernel" + str(sig.replace(parameters=params, return_annotation=sig.empty))


def make_spec(*args: Any, **kwargs: Any) -> KernelSpec:
    """Bind ``args``/``kwargs`` to :func:`fused_kernel` and validate them.

    Raises:
        FusionUsageError: an unknown argument (with the closest known name), a missing one, or
            any argument :func:`fused_kernel` rejects.
    """
    sig = inspect.signature(fused_kernel)
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError as exc:
        problem = f"{exc}; the marker's signature is {signature_text()}"
        known = list(sig.parameters)
        unknown = [k for k in kwargs if k not in known]
        if unknown:
            hints = [
                f"{u} -> {RENAMED.get(u) or m[0]}?"
                for u in unknown
                if u in RENAMED or (m := difflib.get_close_matches(u, known, n=1))
            ]
            problem = (
                f"unknown fused_kernel argument(s) {', '.join(unknown)}"
                + (f" (did you mean: {', '.join(hints)})" if hints else "")
                + f"; accepted: {', '.join(known)}"
            )
        raise FusionUsageError(problem) from None
    return fused_kernel(*bound.args, **bound.kwargs)


# ---- validators: (value, the arguments validated so far) -> the KernelSpec field ---------------

def check_reference(value: Any, done: dict[str, Any]) -> Callable[..., Any]:
    if not callable(value):
        raise FusionUsageError(f"reference must be a callable (the eager PyTorch code), got {value!r}")
    return value


def check_device(value: Any, done: dict[str, Any]) -> str | None:
    if value is not None and not (isinstance(value, str) and DEVICE_PATTERN.fullmatch(value)):
        raise FusionUsageError(f"device must be 'cuda', 'cuda:N' or 'cpu', got {value!r}")
    return value


def check_max_examples(value: Any, done: dict[str, Any]) -> int | None:
    if value is not None and (not is_int(value) or value < 1):
        raise FusionUsageError(f"max_examples must be an int >= 1, got {value!r}")
    return value


def check_constants(value: Any, done: dict[str, Any]) -> dict[str, Any]:
    return dict(mapping("constants", value, "{name: value}"))


def check_providers(value: Any, done: dict[str, Any]) -> dict[str, Callable[..., Any]]:
    """An extra provider is called as the kernel is, ``fn(*inputs, **constants)``: check that binds."""
    providers = {str(n): fn for n, fn in mapping("providers", value, "{name: callable}").items()}
    for name, fn in providers.items():
        if is_builtin(name) or not callable(fn):
            raise FusionUsageError(
                f"providers[{name!r}] must be a callable under a name other than kernel, eager and "
                f"compile (or compile-<mode>)"
            )
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        try:
            sig.bind(*done["inputs"], **done["constants"])
        except TypeError as exc:
            call = ", ".join([*done["inputs"], *(f"{k}=..." for k in done["constants"])])
            raise FusionUsageError(
                f"providers[{name!r}] cannot be called as the kernel is, {name}({call}): {exc}"
            ) from None
    return providers


def check_min_speedup(value: Any, done: dict[str, Any]) -> dict[str, float]:
    if value is None:
        return {}
    floors = (
        {str(p): number(f"min_speedup[{p!r}]", v, False) for p, v in value.items()}
        if isinstance(value, Mapping)
        else {"eager": number("min_speedup", value, False)}
    )
    timed = ["eager", "compile", *done["providers"]]
    for p in floors:
        # a floor for a provider that is never timed would never be checked
        if p not in timed and compile_mode_of(p) is None:
            raise FusionUsageError(
                f"min_speedup names provider {p!r}, which is not one{did_you_mean(p, timed)}; "
                f"providers: {', '.join(timed)}"
            )
    return floors


FP32_PRECISIONS = ("ieee", "tf32")
"""The values of ``fp32_precision``, as torch names them (``torch.backends.cuda.matmul.fp32_precision``)."""


def check_backward(value: Any, done: dict[str, Any]) -> bool:
    """``backward`` as a flag; FusionUsageError beside ``mutates``: the gradients of a kernel that
    overwrites its inputs are not checked (autograd would differentiate the overwritten values)."""
    on = flag("backward")(value, done)
    if on and done["mutates"]:
        raise FusionUsageError(
            f"backward=True cannot be combined with mutates={done['mutates']!r}: the backward checks "
            "compare gradients of inputs the kernel leaves unchanged"
        )
    return on


def check_retain_graph(value: Any, done: dict[str, Any]) -> bool:
    """``retain_graph`` as a flag; FusionUsageError when it is False without ``backward``."""
    on = flag("retain_graph")(value, done)
    if not on and not done["backward"]:
        raise FusionUsageError("retain_graph=False declares how the kernel's backward treats what its "
                               "forward saved; it needs backward=True")
    return on


def check_fp32_precision(value: Any) -> str:
    """``value`` when it is one of :data:`FP32_PRECISIONS`; FusionUsageError otherwise."""
    if not isinstance(value, str) or value not in FP32_PRECISIONS:
        choices = ", ".join(map(repr, FP32_PRECISIONS))
        raise FusionUsageError(f"fp32_precision must be one of {choices}, got {value!r}")
    return value


VALIDATORS: dict[str, Callable[[Any, dict[str, Any]], Any]] = {
    "reference": check_reference,
    "dims": check_dims,
    "inputs": validate_inputs,
    "dtypes": lambda value, done: dtype_names("dtypes", value),
    "constants": check_constants,
    "mutates": check_mutates,
    "tiles": check_tiles,
    "multiple_of": check_multiple_of,
    "atol": optional_number("atol"),
    "rtol": optional_number("rtol"),
    "error_multiple": lambda value, done: number("error_multiple", value),
    "ulps": lambda value, done: number("ulps", value),
    "special_values": flag("special_values"),
    "deterministic": flag("deterministic"),
    "eager_parity": flag("eager_parity"),
    "backward": check_backward,
    "retain_graph": check_retain_graph,
    "poison": flag("poison"),
    "output_views": flag("output_views"),
    "triton": flag("triton"),
    "fp32_precision": lambda value, done: check_fp32_precision(value),
    "device": check_device,
    "max_examples": check_max_examples,
    "bench": check_bench,
    "flops": check_flops,
    "bytes": check_bytes,
    "providers": check_providers,
    "min_speedup": check_min_speedup,
    "tolerance": lambda value, done: None if value is None else check_tolerance(value),
}
"""One validator per argument, run in this order (each may read the ones before it)."""

ORDER = tuple(VALIDATORS)
