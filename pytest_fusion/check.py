"""The property test: a kernel checked by Hypothesis over many cases, usable without pytest.

    from pytest_fusion import check_kernel, make_spec
    spec = make_spec(linear_gelu, inputs={...}, dims={...})
    check_kernel(spec, fused_linear_gelu, dtypes=("float16",), max_examples=50)

Without a GPU a Triton kernel runs only under the Triton interpreter, which ``@triton.jit`` reads
when the kernel's module is imported: call :func:`pytest_fusion.interpret_if_no_gpu` (or set
``TRITON_INTERPRET=1``) before that import. pytest does this by itself (``--fusion-interpret``).
"""

from __future__ import annotations

import os
import warnings
from typing import Any, Callable

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hypothesis_seed

from pytest_fusion.oracle import FusionFailure, NondeterminismWarning, check_case, describe_case
from pytest_fusion.spec import FusionUsageError, KernelSpec
from pytest_fusion.strategies import cases, edge_cases
from pytest_fusion.tensors import Case

DEFAULT_MAX_EXAMPLES = 25
"""Hypothesis examples per (kernel, dtype) when neither the spec nor the command line says."""

DEFAULT_CPU_MAX_DIM = 64
"""On the CPU (and so under the Triton interpreter) every dim is capped to this: the interpreter
runs each program instance in Python, so an 8192-wide dim would take minutes per example."""

INTERPRETER_BF16_REASON = (
    "bfloat16 not checked: the Triton interpreter computes bf16 arithmetic and tl.dot wrongly "
    "(triton issue 11584); run on a GPU to check it (a kernel with no Triton code: mark it triton=False)"
)


TRITON_BENCH_REASON = (
    "bench of a Triton kernel needs a CUDA device: timings under the Triton interpreter are not "
    "kernel timings (a kernel with no Triton code: mark it triton=False to time it on the CPU)"
)
"""Why a Triton kernel's bench is skipped where no CUDA device is visible (marker and fixture)."""


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET=1``)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def default_device(spec: KernelSpec) -> str:
    """``spec.device``, else ``"cuda"`` when a CUDA device is visible, else ``"cpu"``."""
    if spec.device:
        return spec.device
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def skip_reason(spec: KernelSpec, dtype: str, device: str) -> str | None:
    """Why this (spec, dtype) cannot be checked here, or None."""
    if dtype == "bfloat16" and spec.triton and interpreter_active():
        return INTERPRETER_BF16_REASON
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA device; none is visible"
    return None


def run_property(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    *,
    dtype: str,
    device: str,
    max_dim: int | None = None,
    max_examples: int | None = None,
    database_key: bytes | None = None,
    repro: Callable[[Case], str] | None = None,
    parent_settings: settings | None = None,
    seed: int | None = None,
) -> None:
    """Check ``kernel`` on the edge cases (:func:`strategies.edge_cases`), then on Hypothesis-drawn
    cases, in one ``dtype``.

    Settings suit JIT kernels: no deadline (a first compile or autotune can take seconds), the
    too-slow and data-too-large health checks off; everything else, derandomization in CI included,
    comes from the active Hypothesis profile. Hypothesis shrinks a failure to the smallest case and
    re-raises it. ``seed`` fixes Hypothesis' random seed (as ``--hypothesis-seed`` does).

    Raises:
        pytest_fusion.oracle.FusionFailure: the shrunk failing case (see oracle.check_case).
    """
    base = parent_settings or settings.default
    budget = max_examples or spec.max_examples or DEFAULT_MAX_EXAMPLES
    run_settings = settings(
        base,
        max_examples=budget,
        deadline=None,
        suppress_health_check=[*base.suppress_health_check, HealthCheck.too_slow,
                               HealthCheck.data_too_large, HealthCheck.filter_too_much,
                               HealthCheck.differing_executors],
        print_blob=True,
    )

    # Edge cases run first. Hypothesis does not shrink a failing explicit @example, so a failing edge
    # case is held back while the random search runs: if that finds the fault it is shrunk to the
    # smallest case and raised; if not, the edge case's own failure is raised.
    edge_failure: FusionFailure | None = None
    nondeterministic: list[Case] = []
    checked = 0

    def check(case: Case) -> None:
        nonlocal checked
        checked += 1
        if not check_case(spec, kernel, case, device=device, repro=repro, warn=False).deterministic:
            nondeterministic.append(case)

    for edge in edge_cases(spec, dtype=dtype, max_dim=max_dim):
        try:
            check(edge)
        except FusionFailure as exc:
            edge_failure = exc
            break

    @run_settings
    @given(case=cases(spec, dtype=dtype, max_dim=max_dim))
    def fused_kernel_property(case: Case) -> None:
        check(case)

    if seed is not None:
        fused_kernel_property = hypothesis_seed(seed)(fused_kernel_property)
    if database_key is not None:
        # One database entry per test item, as Hypothesis' own pytest plugin keys parametrized tests.
        fused_kernel_property.hypothesis.inner_test._hypothesis_internal_add_digest = database_key  # type: ignore[attr-defined]
    fused_kernel_property()
    if edge_failure is not None:
        note = "Found by an edge case; the random search did not reproduce it, so it is not shrunk."
        if hasattr(edge_failure, "add_note"):  # Python >= 3.11
            edge_failure.add_note(note)
        raise edge_failure
    if nondeterministic:  # warned once here, outside Hypothesis' runs of the property
        warnings.warn(NondeterminismWarning(
            f"two runs of the kernel on the same inputs differ bitwise in {len(nondeterministic)} of "
            f"{checked} cases (pass deterministic=True to fail on it); first:\n{describe_case(nondeterministic[0])}"
        ), stacklevel=2)


def check_kernel(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    *,
    dtypes: tuple[str, ...] | None = None,
    device: str | None = None,
    max_dim: int | None = None,
    max_examples: int | None = None,
) -> dict[str, str]:
    """Plain-Python entry point: :func:`run_property` for each dtype of ``dtypes`` (default the
    spec's). On the CPU dims are capped to :data:`DEFAULT_CPU_MAX_DIM` unless ``max_dim`` says.

    Returns:
        ``{dtype: "passed" | "skipped: <reason>"}``.

    Raises:
        pytest_fusion.oracle.FusionFailure: the first dtype that fails, with its shrunk case.
        pytest_fusion.FusionUsageError: a Triton kernel (``spec.triton``, the default) on the CPU
            with the Triton interpreter off: it could not launch ("0 active drivers").
    """
    device = device or default_device(spec)
    if spec.triton and device == "cpu" and not interpreter_active():
        raise FusionUsageError(
            "check_kernel: no CUDA device is visible and the Triton interpreter is off, so a Triton "
            "kernel cannot run. Call pytest_fusion.interpret_if_no_gpu() (or set TRITON_INTERPRET=1) "
            "before importing the kernel's module; a kernel with no Triton code: "
            "make_spec(..., triton=False).")
    if max_dim is None and device == "cpu":
        max_dim = DEFAULT_CPU_MAX_DIM
    results = {}
    for dtype in dtypes or spec.dtypes:
        reason = skip_reason(spec, dtype, device)
        if reason:
            results[dtype] = f"skipped: {reason}"
            continue
        run_property(spec, kernel, dtype=dtype, device=device, max_dim=max_dim, max_examples=max_examples)
        results[dtype] = "passed"
    return results
