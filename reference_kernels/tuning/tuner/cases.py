"""The tuner's sweep cases: every projection of the model catalog at its token counts, and each
case's inputs, reference and candidate kernels, called as the bench case calls them."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Collection, Iterator, Sequence

from reference_kernels.tuning.tuner.correctness import _dtype

if TYPE_CHECKING:
    import torch
    import triton

    from reference_kernels.gemm.targets import Target

SweepCase = tuple[str, str, int, int, int, str, bool]
"""One sweep case: (kernel, case name, M, K, N, activation, bias)."""

KernelCall = Callable[..., Any]
"""A kernel or its reference, called as the bench case calls it: ``(*inputs, activation=...)``."""

CaseSetup = tuple[
    KernelCall, tuple[Any, ...], Sequence["triton.Config"], int, Callable[["triton.Config"], KernelCall], bool
]
"""What :func:`case_setup` returns: reference, inputs, configs, weights, kernel factory, TMA path."""


def sweep_cases(smoke: bool) -> Iterator[SweepCase]:
    """(kernel, case, M, K, N, activation, bias) of every projection in the catalog at its token
    counts: each model's up projection (gated or plain), then its down projection (linear, no
    activation, K = intermediate, N = hidden), which the MLP modules run with ``down="triton"``
    (the default, ``"torch"``, is cuBLAS)."""
    from reference_kernels.models import shapes

    for s in shapes.CATALOG:
        for m in s.tokens:
            M, H, inter = (min(m, 40), 48, 80) if smoke else (m, s.hidden, s.intermediate)
            yield (
                ("gated" if s.kind == "gated" else "linear"),
                f"{s.slug}-M{m}",
                M,
                H,
                inter,
                s.activation,
                s.bias,
            )
    for s in shapes.CATALOG:
        for m in s.tokens:
            M, H, inter = (min(m, 40), 48, 80) if smoke else (m, s.hidden, s.intermediate)
            yield "linear", f"{s.slug}-down-M{m}", M, inter, H, "none", s.bias


def gated_with(config: triton.Config) -> KernelCall:
    """gated_act forced to ``config``, called as the bench case calls the kernel."""
    from reference_kernels.kernels.gated_mlp import gated_act

    def call(x: torch.Tensor, w_gate: torch.Tensor, w_up: torch.Tensor, activation: str) -> torch.Tensor:
        return gated_act(x, w_gate, w_up, activation=activation, config=config)

    return call


def linear_with(config: triton.Config) -> KernelCall:
    """linear_act forced to ``config``, called as the bench case calls the kernel."""
    from reference_kernels.kernels.linear_act import linear_act

    def call(
        x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, activation: str
    ) -> torch.Tensor:
        return linear_act(x, weight, bias, activation, config=config)

    return call


def case_setup(kernel: str, M: int, K: int, N: int, bias: bool, device: str, tdt: torch.dtype) -> CaseSetup:
    """One sweep case's inputs (seed set by the caller), reference, configs and kernel factory,
    called as the bench case calls them: ``reference(*inputs, **constants)``
    (tests/kernels/test_reference_kernels.py)."""
    import torch

    from reference_kernels.gemm import configs as C
    from reference_kernels.gemm.tma import tma_ready
    from reference_kernels.kernels import eager

    x = torch.randn(M, K, device=device, dtype=tdt)
    reference: KernelCall
    inputs: tuple[Any, ...]
    if kernel == "gated":
        wg = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
        wu = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
        out = torch.empty(M, N, device=device, dtype=tdt)
        tma = tma_ready(x, wg, wu, out)
        reference, inputs = eager.gated_act_eager, (x, wg, wu)
        cfgs, weights = C.GATED_CONFIGS, 2
        make = gated_with
    else:
        w = torch.randn(N, K, device=device, dtype=tdt) / K**0.5
        b = torch.randn(N, device=device, dtype=tdt) if bias else None
        out = torch.empty(M, N, device=device, dtype=tdt)
        tma = tma_ready(x, w, out)
        reference, inputs = eager.linear_act_eager, (x, w, b)
        cfgs, weights = C.LINEAR_CONFIGS, 1
        make = linear_with
    return reference, inputs, cfgs, weights, make, tma


def selected_configs(
    smoke: bool, dtypes: Sequence[str], cases: Collection[str], target: Target
) -> set[tuple[str, int]]:
    """``{(kernel, config index)}`` that the sweep may time on ``target`` (a targets.Target) for
    the cases named in ``cases`` (case_names) in ``dtypes``: their candidates with and without
    the TMA path, a config with fewer stages (configs.shallower) counting as the one it came
    from. The check of a ``--cases`` run covers only these."""
    from reference_kernels.gemm import configs as C
    from reference_kernels.tuning.tuner.correctness import runnable_form

    out: set[tuple[str, int]] = set()
    for kernel, case, M, *_ in sweep_cases(smoke):
        if case not in cases:
            continue
        cfgs, weights = (C.GATED_CONFIGS, 2) if kernel == "gated" else (C.LINEAR_CONFIGS, 1)
        for dt in dtypes:
            itemsize = _dtype(dt).itemsize
            for tma in (True, False):
                cands = C.candidates(cfgs, M, itemsize, weights, tma, target)
                for i, c in enumerate(cfgs):
                    if runnable_form(c, itemsize, weights, target, cands) is not None:
                        out.add((kernel, i))
    return out
