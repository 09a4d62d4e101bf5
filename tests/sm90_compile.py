"""Compile every TMA kernel variant for Hopper (sm_90) and print one JSON line per variant:
``{"id", "ok", "error"}``, the split tail's synchronisation (:func:`split_tail_sync`) and the
wgmma widths (:func:`wgmma_widths`). Run by tests/test_kernels_compile.py in a process
without TRITON_INTERPRET (the interpreter replaces the kernels with Python functions)."""

from __future__ import annotations

import json
import re
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

import reference_kernels  # noqa: F401 - loads the kernel modules, which the package shadows by name
from reference_kernels import configs

HOPPER = GPUTarget("cuda", 90, 32)


def variants():
    """(id, kernel, config, split) of every TMA config; a split-tail config twice, since it also
    runs unsplit when its plan splits nothing (reference_kernels._tma.Launch)."""
    for kernel, cfgs in (("linear", configs.LINEAR_CONFIGS), ("gated", configs.GATED_CONFIGS)):
        for cfg in cfgs:
            if not configs.uses_tma(cfg):
                continue
            has_split = configs.tma_switches(cfg)["SPLIT_TAIL"]
            for split in sorted({False, has_split}):
                suffix = "-unsplit" if has_split and not split else ""
                yield f"{kernel}-{configs.config_name(cfg)}{suffix}", kernel, cfg, split


def compile_variant(kernel, config, split):
    """The PTX of one variant, with fp16 operands and the arguments the wrappers pass."""
    kw = configs.launch_kwargs(config)
    sw = configs.tma_switches(config)
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    desc = lambda rows, cols: f"tensordesc<fp16[{rows}, {cols}]>"  # noqa: E731
    sig = dict(x_desc=desc(bm, bk), out=desc(bm, bn) if sw["TMA_STORE"] else "*fp16",
               workspace="*fp32", counters="*i32", M="i32", N="i32", K="i32", stride_om="i32",
               dp_tiles="i32", splits="i32")
    const = dict(DOT_PRECISION="tf32", OUT_16BIT=True, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                 GROUP_M=kw["GROUP_M"], PERSISTENT=sw["PERSISTENT"], TMA_STORE=sw["TMA_STORE"], SPLIT_TAIL=split)
    if not split:  # what the wrappers pass without a split
        const.update(workspace=None, counters=None)
    if kernel == "linear":
        fn = sys.modules["reference_kernels.linear_act"]._linear_act_tma_kernel
        sig.update(w_desc=desc(bn, bk), b_ptr="*fp16", stride_b="i32")
        const.update(HAS_BIAS=True, ACTIVATION="gelu")
    else:
        fn = sys.modules["reference_kernels.gated_mlp"]._gated_act_tma_kernel
        sig.update(w_desc=f"tensordesc<fp16[2, {bn}, {bk}]>", bg_ptr="*fp16", bu_ptr="*fp16",
                   stride_bg="i32", stride_bu="i32")
        const.update(HAS_BIAS_GATE=True, HAS_BIAS_UP=False, ACTIVATION="silu", UP_FIRST=False)
    sig.update({name: "constexpr" for name in const})
    if set(sig) != set(fn.arg_names):
        raise TypeError(f"signature out of date with the kernel: {sorted(set(sig) ^ set(fn.arg_names))}")
    src = ASTSource(fn, {name: sig[name] for name in fn.arg_names}, const)
    opts = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    return triton.compile(src, target=HOPPER, options=opts).asm["ptx"]


def split_tail_sync(ptx: str) -> dict:
    """What the split tail's handoff compiled to: the acquire-release atomic add on the counter,
    whether a CTA barrier (bar.sync) comes within the 12 lines before it (every thread's partials
    stored before the one thread's release), and whether the partials are read with
    L1-bypassing ld.global.cg loads."""
    lines = ptx.splitlines()
    atomic = [i for i, line in enumerate(lines) if "atom.global.gpu.acq_rel.add" in line]
    barrier = bool(atomic) and any("bar.sync" in line for line in lines[max(0, atomic[0] - 12):atomic[0]])
    return dict(acq_rel_atomic=bool(atomic), barrier_before_atomic=barrier, cg_loads="ld.global.cg" in ptx)


def wgmma_widths(ptx: str) -> list[int]:
    """The distinct N of the wgmma instructions (``wgmma.mma_async...m64nNk16``) in ``ptx``."""
    return sorted({int(n) for n in re.findall(r"wgmma\.mma_async\.sync\.aligned\.m64n(\d+)k", ptx)})


def main() -> None:
    for vid, kernel, cfg, split in variants():
        try:
            ptx = compile_variant(kernel, cfg, split)
            row = dict(id=vid, ok=".target sm_90" in ptx, error=None, **split_tail_sync(ptx),
                       kernel=kernel, block_m=cfg.kwargs["BLOCK_M"], block_n=cfg.kwargs["BLOCK_N"],
                       wgmma_n=wgmma_widths(ptx))
        except Exception as exc:  # noqa: BLE001 - a failed compile is the result
            row = dict(id=vid, ok=False, error=f"{type(exc).__name__}: {exc}"[-2000:])
        print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
