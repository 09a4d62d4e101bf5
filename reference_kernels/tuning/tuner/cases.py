"""The tuner's sweep cases: every projection of the model catalog at its token counts, and each
case's inputs, reference and candidate kernels, called as the bench case calls them."""

from __future__ import annotations

from reference_kernels.tuning.tuner.correctness import _dtype


def sweep_cases(smoke):
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


def gated_with(config):
    """gated_act forced to ``config``, called as the bench case calls the kernel."""
    from reference_kernels.kernels.gated_mlp import gated_act

    def call(x, w_gate, w_up, activation):
        return gated_act(x, w_gate, w_up, activation=activation, config=config)

    return call


def linear_with(config):
    """linear_act forced to ``config``, called as the bench case calls the kernel."""
    from reference_kernels.kernels.linear_act import linear_act

    def call(x, weight, bias, activation):
        return linear_act(x, weight, bias, activation, config=config)

    return call


def case_setup(kernel, M, K, N, bias, device, tdt):
    """One sweep case's inputs (seed set by the caller), reference, configs and kernel factory,
    called as the bench case calls them: ``reference(*inputs, **constants)``
    (tests/test_reference_kernels.py)."""
    import torch

    from reference_kernels.gemm import configs as C
    from reference_kernels.gemm.tma import tma_ready
    from reference_kernels.kernels import eager

    x = torch.randn(M, K, device=device, dtype=tdt)
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


def selected_configs(smoke, dtypes, cases, target):
    """``{(kernel, config index)}`` that the sweep may time on ``target`` (a targets.Target) for
    the cases named in ``cases`` (case_names) in ``dtypes``: their candidates with and without
    the TMA path, a config with fewer stages (configs.shallower) counting as the one it came
    from. The check of a ``--cases`` run covers only these."""
    from reference_kernels.gemm import configs as C
    from reference_kernels.tuning.tuner.correctness import runnable_form

    out = set()
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
