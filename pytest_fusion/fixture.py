"""The ``fusion`` fixture: the oracle and the bench for hand-written tests."""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import pytest
import torch

from pytest_fusion.oracle import FusionFailure, KernelMismatch, _as_tuple, check_inputs, compare, magnitudes, upcast
from pytest_fusion.spec import DEFAULT_ERROR_MULTIPLE, DEFAULT_ULPS, make_spec


def _spec_for(reference: Callable[..., Any], inputs: Sequence[torch.Tensor], constants: Mapping[str, Any] | None,
              **policy: Any) -> Any:
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
) -> None:
    """Check ``actual`` (a kernel's output: a tensor or a tuple) against ``reference(*inputs)``
    under the oracle's policy: golden in float64, budget from eager's own error plus ulps, or
    explicit ``atol``/``rtol``. Usable without pytest.

    Raises:
        KernelMismatch: an output outside the budget, with the worst element and the budget.
        ValueError: ``actual`` and the reference disagree in output count or shape.
    """
    constants = dict(constants or {})
    golden = _as_tuple(reference(*[upcast(t) for t in inputs], **constants))
    eager = _as_tuple(reference(*[t.clone() for t in inputs], **constants))
    scale = _as_tuple(reference(*[magnitudes(t) for t in inputs], **constants))
    actual = _as_tuple(actual)
    if len(actual) != len(golden):
        raise ValueError(f"actual has {len(actual)} output(s), the reference {len(golden)}")
    for i, (k, g, e, m) in enumerate(zip(actual, golden, eager, scale)):
        if tuple(k.shape) != tuple(g.shape):
            raise ValueError(f"output {i}: actual shape {tuple(k.shape)}, reference {tuple(g.shape)}")
        c = compare(k, g, e, magnitude=m, error_multiple=error_multiple, ulps=ulps, atol=atol, rtol=rtol)
        if c.mismatches:
            raise KernelMismatch(
                f"[pytest-fusion] mismatch: {c.mismatches} of {c.numel} elements of output {i} outside the "
                f"error budget\n  worst    {list(c.worst_index or ())}: actual={c.kernel:.6g} "
                f"golden={c.golden:.6g} eager={c.eager:.6g} = {c.ulps:.1f} ulp\n  budget   {c.budget_text}"
                f" (here {c.budget:.3g})\n  NaN/inf misplaced: {c.nonfinite_mismatches}"
            )


class Fusion:
    """What the ``fusion`` fixture returns. Each method fails the test with the oracle's message."""

    def __init__(self, item: pytest.Item) -> None:
        self._item = item

    def assert_close(self, actual: Any, reference: Callable[..., Any], *inputs: torch.Tensor, **policy: Any) -> None:
        """:func:`assert_close`, failing the test cleanly (no plugin traceback)."""
        try:
            assert_close(actual, reference, *inputs, **policy)
        except FusionFailure as exc:
            failure = str(exc)
        else:
            return
        pytest.fail(failure, pytrace=False)

    def check(self, kernel: Callable[..., Any], reference: Callable[..., Any], *inputs: torch.Tensor,
              constants: Mapping[str, Any] | None = None, **policy: Any) -> None:
        """Run ``kernel`` and ``reference`` on these inputs with the full hygiene of the marker
        (poisoned allocations, mutation check, determinism run). ``policy``: atol, rtol,
        error_multiple, ulps, deterministic, poison."""
        spec = _spec_for(reference, inputs, constants, **policy)
        try:
            check_inputs(spec, kernel, inputs)
        except FusionFailure as exc:
            failure = str(exc)
        else:
            return
        pytest.fail(failure, pytrace=False)

    def bench(self, name: str, kernel: Callable[..., Any], *inputs: torch.Tensor, reference: Callable[..., Any],
              triton: bool = True, **kwargs: Any) -> Any:
        """Time ``kernel(*inputs)`` against ``reference`` (eager), its torch.compile and
        ``baselines``, and gate it, as a bench item of the marker does; only under
        ``--fusion-bench`` (skips otherwise). ``triton``: the kernel runs Triton code (default,
        as the marker's): skipped where no CUDA device is visible, since it would be timed under
        the interpreter; ``triton=False`` times a plain PyTorch kernel on the CPU. kwargs:
        baselines, constants, flops, bytes, min_speedup, tolerance, dims. Returns the bench record."""
        from pytest_fusion import bench_plugin
        from pytest_fusion.check import TRITON_BENCH_REASON

        if not bench_plugin.enabled(self._item.config):
            pytest.skip("timing runs only with --fusion-bench")
        if triton and not torch.cuda.is_available():
            pytest.skip(TRITON_BENCH_REASON)
        return bench_plugin.bench_call(self._item, name, kernel, inputs, reference=reference, **kwargs)
