"""The property test: a kernel checked by Hypothesis over many cases, usable without pytest.

    from pytest_fusion import check_kernel, make_spec
    spec = make_spec(linear_gelu, inputs={...}, dims={...})
    check_kernel(spec, fused_linear_gelu, dtypes=("float16",), max_examples=50)

Without a GPU a Triton kernel runs only under the Triton interpreter, which ``@triton.jit`` reads
when the kernel's module is imported: call :func:`pytest_fusion.interpret_if_no_gpu` (or set
``TRITON_INTERPRET=1``) before that import. pytest does this by itself (``--fusion-interpret``).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable

from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.errors import Flaky

from pytest_fusion.declare.spec import DEFAULT_CPU_MAX_DIM, DEFAULT_MAX_EXAMPLES, FusionUsageError, KernelSpec
from pytest_fusion.machine.devices import default_device, interpreter_active
from pytest_fusion.oracle.failures import FusionFailure
from pytest_fusion.oracle.tensors import Case
from pytest_fusion.property.config_tier import ConfigTier
from pytest_fusion.property.examples import (
    CaseRunner,
    check_fits,
)
from pytest_fusion.property.strategies import cases, edge_cases, smaller_cases

DEFAULT_CPU_MAX_ELEMENTS = 2**18
"""Kernels with no Triton code (``triton=False``) run at full speed on the CPU: instead of a cap
per dim, no input and no two-dim matrix over the dims (such as an M x N output) may hold more
than this many elements. 2**18 allows K = 4096 with M, N up to 64, or M = 4096 with K, N up to 64:
a GEMM of at most 2 * 2**27 flops (M * K * N <= (2**18)**1.5), run about five times per case
(golden, eager, magnitude, kernel twice)."""


def size_limits(spec: KernelSpec, device: str, max_dim: int | None) -> tuple[int | None, int | None]:
    """``(max_dim, max_elements)`` for drawing ``spec``'s dims on ``device``, from the
    ``--fusion-max-dim`` value ``max_dim`` (None: unset; 0: no cap at all).

    On a GPU nothing is capped unless the option says. On the CPU, Triton kernels are capped to
    :data:`DEFAULT_CPU_MAX_DIM` per dim (or the option's value), and ``triton=False`` kernels to
    :data:`DEFAULT_CPU_MAX_ELEMENTS` per tensor (and the option's per-dim cap when given).
    """
    if max_dim == 0:
        return None, None
    if device != "cpu":
        return max_dim, None
    if spec.triton:
        return max_dim or DEFAULT_CPU_MAX_DIM, None
    return max_dim, DEFAULT_CPU_MAX_ELEMENTS


INTERPRETER_BF16_REASON = (
    "bfloat16 not checked: the Triton interpreter computes bf16 arithmetic and tl.dot wrongly "
    "(triton issue 11584); run on a GPU to check it (a kernel with no Triton code: mark it triton=False)"
)


TRITON_BENCH_REASON = (
    "bench of a Triton kernel needs a CUDA device: timings under the Triton interpreter are not "
    "kernel timings (a kernel with no Triton code: mark it triton=False to time it on the CPU)"
)
"""Why a Triton kernel's bench is skipped where no CUDA device is visible (marker and fixture)."""


def skip_reason(spec: KernelSpec, dtype: str, device: str) -> str | None:
    """Why this (spec, dtype) cannot be checked here, or None."""
    if dtype == "bfloat16" and spec.triton and interpreter_active():
        return INTERPRETER_BF16_REASON
    if device.startswith("cuda"):
        import torch

        if not torch.cuda.is_available():
            return "needs a CUDA device; none is visible"
    return None


def shrink_edge_failure(
    spec: KernelSpec, case: Case, failure: FusionFailure, check: Callable[[Case], None]
) -> tuple[Case, FusionFailure]:
    """Greedy shrink of a failing edge case over :func:`strategies.smaller_cases`: move to the first
    smaller case that fails the same way (same failure class) and start over from it, until no
    smaller case fails. Returns the last failing case and its failure (Hypothesis does not shrink
    explicit cases)."""
    improved = True
    while improved:
        improved = False
        for smaller in smaller_cases(spec, case):
            try:
                check(smaller)
            except FusionFailure as exc:
                if type(exc) is type(failure):
                    case, failure, improved = smaller, exc, True
                    break
    return case, failure


def strictly_smaller(case: Case, other: Case) -> bool:
    """Whether ``case`` is no larger than ``other`` in every dim and smaller in at least one (two
    cases smaller in different dims are not ordered: Hypothesis' pick is kept)."""
    pairs = [(case.dims[sym], other.dims[sym]) for sym in case.dims]
    return all(a <= b for a, b in pairs) and any(a < b for a, b in pairs)


def example_budget(declared: int | None, run: int | None) -> int:
    """Examples per test and dtype, edge cases included: the one rule of marker against option.
    The marker's (or spec's) explicit ``max_examples`` wins; the run's (``--fusion-examples``)
    sets it for a marker that declares none; else :data:`DEFAULT_MAX_EXAMPLES`. Both are ints
    >= 1 or None, as their validators leave them."""
    return declared or run or DEFAULT_MAX_EXAMPLES


def run_property(
    spec: KernelSpec,
    kernel: Callable[..., Any],
    *,
    dtype: str,
    device: str,
    max_dim: int | None = None,
    max_elements: int | None = None,
    max_examples: int | None = None,
    database_key: bytes | None = None,
    repro: Callable[[Case], str] | None = None,
    parent_settings: settings | None = None,
    seed: int | None = None,
    every_config: bool = False,
    config_tier: ConfigTier | None = None,
    notify: Callable[[str], None] | None = None,
) -> None:
    """Check ``kernel`` on the edge cases (:func:`strategies.edge_cases`), then on Hypothesis-drawn
    cases, in one ``dtype``; ``max_dim`` and ``max_elements`` bound the dims (:func:`size_limits`).

    The example budget (:func:`example_budget`: the spec's ``max_examples``, else ``max_examples``
    here, the run's ``--fusion-examples``, else :data:`DEFAULT_MAX_EXAMPLES`) counts the edge
    cases: up to half of it (at least 3) goes to edge cases, the rest (at least 1) to Hypothesis.
    Triton kernels with a per-dim cap also run one case per symbol above it. A failing edge case
    is shrunk over the edge values (:func:`shrink_edge_failure`); when Hypothesis also fails the
    same way at a case larger in some dim and smaller in none, the edge case is raised.

    Settings suit JIT kernels: no deadline (a first compile or autotune can take seconds), the
    too-slow and data-too-large health checks off; everything else, derandomization in CI included,
    comes from the active Hypothesis profile. Hypothesis shrinks a failure to the smallest case and
    re-raises it. ``seed`` fixes Hypothesis' random seed (as ``--hypothesis-seed`` does).
    Hypothesis' explain phase is off: its "lines always run by failing examples" point into
    this plugin, not at the kernel. ``every_config``: see :func:`pytest_fusion.oracle.case.check_case`.
    ``config_tier``: once the search passes, its smallest cases at pinned configs
    (:class:`~pytest_fusion.property.config_tier.ConfigTier`, filled in with what ran).
    ``notify``: told when a case queues long for its GPU's memory (``examples.CaseRunner``).

    A failing case is run a second time at once: when that passes, the case is not given to
    Hypothesis as a failure (it would replay it, see it pass and raise a FlakyFailure group);
    the run goes on, and unless a case that fails every time turns up, ends with
    :class:`~pytest_fusion.oracle.failures.NondeterministicFailure` carrying the first failure's message.

    Raises:
        pytest_fusion.oracle.failures.FusionFailure: the shrunk failing case (see
            :func:`pytest_fusion.oracle.case.check_case`), or NondeterministicFailure.
        pytest_fusion.FusionUsageError: on a GPU, the largest case is too large to check there
            (:func:`~pytest_fusion.property.examples.check_fits`).
    """
    budget = example_budget(spec.max_examples, max_examples)
    edges = edge_cases(spec, dtype=dtype, max_dim=max_dim, max_elements=max_elements,
                       count=max(3, (budget + 1) // 2), above_cap=spec.triton and max_dim is not None)
    check_fits(spec, device, max_dim=max_dim, max_elements=max_elements)
    runner = CaseRunner(spec, kernel, device=device, repro=repro, every_config=every_config, notify=notify)
    # Edge cases run first. Hypothesis does not shrink a failing explicit @example, so a failing edge
    # case is held back while the random search runs: if that finds the fault it is shrunk to the
    # smallest case and raised; if not, the edge case's own failure is raised.
    edge_case, edge_failure = first_edge_failure(spec, edges, runner.check)
    run_settings = property_settings(parent_settings, max_examples=max(1, budget - len(edges)))
    fused_kernel_property = property_test(
        spec, runner.check, dtype=dtype, max_dim=max_dim, max_elements=max_elements,
        run_settings=run_settings, seed=seed, database_key=database_key,
    )
    search(fused_kernel_property, runner, edge_case, edge_failure)
    if edge_failure is not None:
        _add_note(edge_failure, "Found by an edge case; the random search did not reproduce it, so it was "
                                "shrunk over the edge values only.")
        raise edge_failure
    runner.report()
    if config_tier is not None and not every_config:
        config_tier.run(spec, kernel, runner.cases, device=device)


def property_settings(parent: settings | None, *, max_examples: int) -> settings:
    """The property's Hypothesis settings: ``parent`` (else the active profile) with ``max_examples``,
    no deadline, the slow-test and data-size health checks off, no explain phase, and one failure
    reported when several distinct ones were found (see :func:`run_property`)."""
    base = parent or settings.default or settings()  # settings.default is typed Optional
    return settings(
        base,
        max_examples=max_examples,
        deadline=None,
        suppress_health_check=[
            *base.suppress_health_check,
            HealthCheck.too_slow,
            HealthCheck.data_too_large,
            HealthCheck.filter_too_much,
            HealthCheck.differing_executors,
        ],
        print_blob=True,
        phases=[p for p in base.phases if p != Phase.explain],
        # Two distinct faults would reach the user as an ExceptionGroup traceback through this
        # plugin; one failure message, the one with the smallest case, says what to fix first.
        report_multiple_bugs=False,
    )


def property_test(
    spec: KernelSpec,
    check: Callable[[Case], None],
    *,
    dtype: str,
    max_dim: int | None,
    max_elements: int | None,
    run_settings: settings,
    seed: int | None,
    database_key: bytes | None,
) -> Callable[[], None]:
    """The Hypothesis test that draws ``spec``'s cases in ``dtype`` (:func:`strategies.cases`) and
    gives each to ``check``, with ``seed`` and ``database_key`` applied when given."""

    @run_settings
    @given(case=cases(spec, dtype=dtype, max_dim=max_dim, max_elements=max_elements))
    def fused_kernel_property(case: Case) -> None:
        check(case)

    if seed is not None:
        fused_kernel_property = hypothesis_seed(seed)(fused_kernel_property)
    if database_key is not None:
        # One database entry per test item, as Hypothesis' own pytest plugin keys parametrized tests.
        fused_kernel_property.hypothesis.inner_test._hypothesis_internal_add_digest = database_key  # type: ignore[attr-defined]
    return fused_kernel_property


def first_edge_failure(
    spec: KernelSpec, edges: list[Case], check: Callable[[Case], None]
) -> tuple[Case | None, FusionFailure | None]:
    """The first of ``edges`` that fails ``check``, shrunk (:func:`shrink_edge_failure`), and its
    failure; ``(None, None)`` when all pass."""
    for edge in edges:
        try:
            check(edge)
        except FusionFailure as exc:
            return shrink_edge_failure(spec, edge, exc, check)
    return None, None


def search(
    fused_kernel_property: Callable[[], None],
    runner: CaseRunner,
    edge_case: Case | None,
    edge_failure: FusionFailure | None,
) -> None:
    """Run the random search. Its shrunk failure is raised, unless the edge case failed the same way
    and is smaller in every dim: then the edge case's failure is. A failure Hypothesis saw pass on
    replay (``Flaky``) goes to ``runner.flaky`` instead."""
    try:
        fused_kernel_property()
    except FusionFailure as exc:
        # Hypothesis' shrinker can stop above a case the edge values already reached: the user gets
        # the smaller edge case (docs/oracle.md#when-an-edge-case-beats-the-shrink).
        drawn = runner.failed_cases.get(id(exc))
        if (edge_failure is None or edge_case is None or drawn is None or type(exc) is not type(edge_failure)
                or not strictly_smaller(edge_case, drawn)):
            raise
        _add_note(edge_failure, "Found by the random search and by an edge case; the edge case, shrunk over "
                                "the edge values, is the smaller one.")
        raise edge_failure from None
    except Flaky as exc:  # a case failed, then passed when Hypothesis replayed it
        found = [e for e in getattr(exc, "exceptions", ()) if isinstance(e, FusionFailure)]
        if not found:
            raise
        runner.flaky.append(found[0])


def _add_note(failure: FusionFailure, note: str) -> None:
    """Attach ``note`` to ``failure`` where Python can (``__notes__``, printed under its message)."""
    if hasattr(failure, "add_note"):  # Python >= 3.11
        failure.add_note(note)


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
    spec's), with dims bounded by :func:`size_limits` (``max_dim`` as ``--fusion-max-dim``).
    ``max_examples``: examples per dtype, over the spec's own (None: the spec's, else
    :data:`DEFAULT_MAX_EXAMPLES`).

    Returns:
        ``{dtype: "passed" | "skipped: <reason>"}``.

    Raises:
        pytest_fusion.oracle.failures.FusionFailure: the first dtype that fails, with its shrunk case.
        pytest_fusion.FusionUsageError: a Triton kernel (``spec.triton``, the default) on the CPU
            with the Triton interpreter off: it could not launch ("0 active drivers").
    """
    device = default_device(device or spec.device)
    if spec.triton and device == "cpu" and not interpreter_active():
        raise FusionUsageError(
            "check_kernel: no CUDA device is visible and the Triton interpreter is off, so a Triton "
            "kernel cannot run. Call pytest_fusion.interpret_if_no_gpu() (or set TRITON_INTERPRET=1) "
            "before importing the kernel's module; a kernel with no Triton code: "
            "make_spec(..., triton=False)."
        )
    max_dim, max_elements = size_limits(spec, device, max_dim)
    if max_examples is not None:  # this call's own budget, more specific than the spec it checks
        spec = dataclasses.replace(spec, max_examples=max_examples)
    results = {}
    for dtype in dtypes or spec.dtypes:
        reason = skip_reason(spec, dtype, device)
        if reason:
            results[dtype] = f"skipped: {reason}"
            continue
        run_property(
            spec,
            kernel,
            dtype=dtype,
            device=device,
            max_dim=max_dim,
            max_elements=max_elements,
        )
        results[dtype] = "passed"
    return results
