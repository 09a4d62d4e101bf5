"""How a linear_act or gated_act call runs, written once for both: the checks and the output
(:func:`run_gemm`), the config (forced, or picked by :func:`reference_kernels.tuning.pick.choose`),
the compile-time arguments (:func:`gemm_meta`), and one launch of the pointer kernel
(:func:`launch_tiles`, :mod:`reference_kernels.gemm.pointer_tile`) or of the TMA kernel
(:func:`launch_tma`, :mod:`reference_kernels.gemm.tile_loop`) with a given config.

A call is linear when it has one weight (``act(x @ w.T + b)``) and gated when it has two
(``act(x @ w.T + b) * (x @ w_up.T + b_up)``, w the gate's weight): the kernels' ``GATED``. The
linear launch passes None for the up projection's pointers and strides, so they are constants of
its compile, not kernel arguments.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch
import triton

from reference_kernels.gemm import targets
from reference_kernels.gemm.configs import (
    GATED_CONFIGS,
    LINEAR_CONFIGS,
    check_forced,
    launch_kwargs,
    tma_switches,
    uses_tma,
)
from reference_kernels.gemm.epilogue import ACTIVATIONS
from reference_kernels.gemm.pointer_tile import pointer_kernel
from reference_kernels.gemm.schedule import tile_grid
from reference_kernels.gemm.tile_loop import tma_gemm
from reference_kernels.gemm.tma import Launch, descriptor, pair_descriptor, pair_layout, tma_ready
from reference_kernels.kernels.validate import check_activation, check_tensors, flatten_rows
from reference_kernels.tuning.pick import choose


def gemm_meta(dtype: torch.dtype, activation: str, allow_tf32: bool) -> dict[str, Any]:
    """The kernels' ``ACTIVATION``, ``DOT_PRECISION`` and ``OUT_16BIT`` for inputs of ``dtype``:
    fp32 multiplies in IEEE FMA (``"ieee"``) unless ``allow_tf32``, fp16 and bf16 on the tensor
    cores whatever it says (``"tf32"``); ``OUT_16BIT`` for fp16 and bf16 outputs."""
    return dict(
        ACTIVATION=activation,
        DOT_PRECISION="tf32" if (allow_tf32 or dtype != torch.float32) else "ieee",
        OUT_16BIT=dtype != torch.float32,
    )


@dataclasses.dataclass(frozen=True)
class GemmCall:
    """The checked operands of one call: x (M, K) with rows of any stride, w (N, K) and w_up
    (N, K) or None (linear), b and b_up (N,) or None, out (M, N) contiguous, all of one dtype
    and device; ``meta`` from :func:`gemm_meta`."""

    x: torch.Tensor
    w: torch.Tensor
    w_up: torch.Tensor | None
    b: torch.Tensor | None
    b_up: torch.Tensor | None
    out: torch.Tensor
    meta: dict[str, Any]

    def flags(self) -> dict[str, Any]:
        """The compile-time arguments both kernels take: HAS_BIAS, HAS_BIAS_UP, GATED and ``meta``."""
        gated = self.w_up is not None
        return dict(HAS_BIAS=self.b is not None, HAS_BIAS_UP=self.b_up is not None, GATED=gated, **self.meta)

    def biases(self) -> tuple[Any, Any, Any, Any]:
        """``(b_ptr, stride_b, bu_ptr, stride_bu)`` as the kernels take them: a missing bias is
        ``out`` and stride 0 (any pointer: not read without HAS_BIAS / HAS_BIAS_UP); a linear
        call's up bias is None and None."""
        b, sb = (self.b, self.b.stride(0)) if self.b is not None else (self.out, 0)
        if self.w_up is None:
            return b, sb, None, None
        bu, sbu = (self.b_up, self.b_up.stride(0)) if self.b_up is not None else (self.out, 0)
        return b, sb, bu, sbu


def run_gemm(
    x: torch.Tensor,
    weights: Sequence[tuple[str, torch.Tensor]],
    biases: Sequence[tuple[str, torch.Tensor | None]],
    activation: str,
    allow_tf32: bool,
    config: triton.Config | None,
) -> torch.Tensor:
    """The linear (one weight) or gated (two) GEMM of x (..., K): check the arguments
    (validate.check_activation, validate.check_tensors; ``weights`` and ``biases`` are
    ``(name, tensor)`` pairs, the names the errors give), flatten x's leading dims into M rows,
    and compute the (M, N) output, viewed as (..., N), with ``config``, or with the config
    ``choose`` picks when None (kind ``"linear"`` or ``"gated"``, from LINEAR_CONFIGS or
    GATED_CONFIGS); on the TMA kernel where the tensors allow descriptors (gemm.tma.tma_ready;
    gated: the two weights read as one tensor, gemm.tma.pair_layout) and the config asks for
    it, else on the pointer kernel with the same tiles. M = 0 or N = 0: an empty output, no
    launch.

    Raises:
        TypeError, ValueError: as the checks do; a forced ``config`` that is malformed or does
        not fit the shared memory of x's GPU (configs.check_forced); ValueError when no config
        fits at all (configs.candidates).
    """
    check_activation(activation, ACTIVATIONS)
    K, N = check_tensors(x, weights, biases)
    x2 = flatten_rows(x)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0 or N == 0:
        return out.view(*x.shape[:-1], N)
    ws = [w for _, w in weights]
    w_up = ws[1] if len(ws) > 1 else None
    b_up = biases[1][1] if len(biases) > 1 else None
    call = GemmCall(x2, ws[0], w_up, biases[0][1], b_up, out, gemm_meta(x.dtype, activation, allow_tf32))
    tma = tma_ready(x2, *ws, out) and (w_up is None or pair_layout(ws[0], w_up) is not None)

    def run(cfg: triton.Config) -> None:
        launch = launch_tma if tma and uses_tma(cfg) else launch_tiles
        launch(call, cfg)

    if config is None:
        kind, configs = ("linear", LINEAR_CONFIGS) if w_up is None else ("gated", GATED_CONFIGS)
        config = choose(kind, configs, x2, N, K, len(ws), tma, run)
    else:
        check_forced(config, x.element_size(), weights=len(ws), target=targets.of_device(x.device))
    run(config)
    return out.view(*x.shape[:-1], N)


def launch_tiles(call: GemmCall, cfg: triton.Config) -> None:
    """Launch the pointer kernel for ``call`` with config ``cfg``: one program per output tile,
    the operands read through their strides.

    Raises:
        TypeError, ValueError: a malformed ``cfg`` (configs.launch_kwargs)."""
    x, w, w_up, out = call.x, call.w, call.w_up, call.out
    b, sb, bu, sbu = call.biases()
    stride_un, stride_uk = (w_up.stride(0), w_up.stride(1)) if w_up is not None else (None, None)
    pointer_kernel[tile_grid](
        x, w, w_up, b, bu, out,
        x.shape[0], w.shape[0], x.shape[1],
        x.stride(0), x.stride(1), w.stride(0), w.stride(1), stride_un, stride_uk,
        sb, sbu, out.stride(0), out.stride(1),
        **call.flags(), **launch_kwargs(cfg),
    )


def launch_tma(call: GemmCall, cfg: triton.Config) -> None:
    """Launch the TMA kernel for ``call`` with config ``cfg``: descriptors, and the persistent
    and split-tail schedule of :class:`reference_kernels.gemm.tma.Launch`. The tensors must allow
    descriptors (gemm.tma.tma_ready), and a gated call's two weights must read as one (2, N, K)
    tensor (gemm.tma.pair_layout).

    Raises:
        TypeError, ValueError: a malformed ``cfg`` (configs.launch_kwargs); ValueError when the
        two weights do not pair (gemm.tma.pair_descriptor)."""
    kw = launch_kwargs(cfg)
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    sw = tma_switches(cfg)
    x, w, w_up, out = call.x, call.w, call.w_up, call.out
    M, K = x.shape
    N = w.shape[0]
    launch = Launch.of(x.device, M, N, K, bm, bn, bk, sw, parts=1 if w_up is None else 2)
    if w_up is None:
        w_desc, up_first = descriptor(w, [bn, bk]), False
    else:
        w_desc, up_first = pair_descriptor(w, w_up, [bn, bk])
    b, sb, bu, sbu = call.biases()
    out_arg = descriptor(out, [bm, bn]) if sw["TMA_STORE"] else out
    tma_gemm[launch.grid](
        descriptor(x, [bm, bk]), w_desc, b, bu, out_arg, launch.workspace, launch.counters,
        M, N, K, sb, sbu, out.stride(0), launch.dp_tiles, launch.splits,
        UP_FIRST=up_first, **call.flags(), **kw, **launch.switches,
    )
