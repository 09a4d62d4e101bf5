"""Compile the reference kernels for a GPU architecture on any machine, GPU or not, and print one
JSON line per result. Triton's CUDA backend compiles to PTX and a cubin without a GPU; run by
tests/kernels/test_kernels_compile.py in a process without TRITON_INTERPRET (the interpreter replaces
the kernels with Python functions).

    python3 tests/kernels/arch_compile.py tma-variants   # every TMA variant for sm_90 in fp16
    python3 tests/kernels/arch_compile.py all            # every target of TARGETS, one line each
    python3 tests/kernels/arch_compile.py sm_89 [--every] [--kernel K] [--dtype D] [--m-class C]

A target's run (:func:`violations`) asks the selection logic (configs.candidates, for the
target of reference_kernels.gemm.targets) which configs it offers that GPU for each kernel, dtype and
M class at a real shape (:data:`KERNELS`, :data:`M_CLASSES`), compiles the first of each (with
``--every``, every distinct one; a config offered at several M once, at the first) and reports
what breaks the GPU's rules: a TMA config offered before sm_90, a compiled kernel needing more
shared memory than the GPU lets a block have (:data:`TARGETS`), a config that does not compile.
Each kernel is built as linear_act and gated_act launch it on contiguous inputs
(reference_kernels.kernels.dispatch): the same kernel, meta-parameters and arguments, specialised
as Triton's JIT specialises them (:func:`specialize`)."""

from __future__ import annotations

import argparse
import json
import re
import time

import torch
import triton
from triton._C.libtriton import native_specialize_impl  # the JIT's own rule (Triton >= 3.5)
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource, make_backend
from triton.tools.tensor_descriptor import TensorDescriptor

from reference_kernels.gemm import configs, pointer_tile, targets, tile_loop
from reference_kernels.models import shapes

TARGETS = {
    "sm_80": ((8, 0), 166912),
    "sm_89": ((8, 9), 101376),
    "sm_90": ((9, 0), 232448),
    "sm_100": ((10, 0), 232448),
    "sm_120": ((12, 0), 101376),
}
"""The GPUs checked: compute capability and the shared memory one block may opt in to there, in
bytes (CUDA C++ Programming Guide, technical specifications per compute capability; A100, L4,
H100, B200, RTX 50xx), the limit Triton checks a compiled kernel's ``metadata.shared`` against
when it loads it. Stated here, not read from reference_kernels.gemm.targets: this is what the code
is checked against."""

TMA_SINCE = (9, 0)
"""The first compute capability with the TMA unit (Hopper): before it no TMA config may run."""

_SHAPES = {s.slug: s for s in shapes.CATALOG}
KERNELS = {
    # GPT-2 small's up projection (K 768, N 3072, bias, GELU tanh)
    "linear": dict(shape=_SHAPES["gpt2"], configs=configs.LINEAR_CONFIGS, weights=1),
    # Llama-3-8B's gate/up (K 4096, N 14336, SwiGLU)
    "gated": dict(shape=_SHAPES["llama3-8b"], configs=configs.GATED_CONFIGS, weights=2),
}
"""Each kernel at a real shape of reference_kernels.models.shapes: its configs and weight tiles per K step."""

M_CLASSES = {"decode": 1, "small": 128, "prefill": 8192}
"""An M of each class of configs.candidates (decode, small batches, prefill)."""

DTYPES = {"float16": torch.float16, "bfloat16": torch.bfloat16, "float32": torch.float32}

TYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def gpu_target(capability: tuple[int, int]) -> GPUTarget:
    return GPUTarget("cuda", capability[0] * 10 + capability[1], 32)


def cannot_target(capability: tuple[int, int]) -> str | None:
    """Why this Triton cannot compile for ``capability``, or None: a one-line kernel compiled."""

    @triton.jit
    def _one(x_ptr):
        triton.language.store(x_ptr, 1.0)

    try:
        triton.compile(ASTSource(_one, {"x_ptr": "*fp32"}), target=gpu_target(capability))
    except Exception as exc:  # noqa: BLE001 - any failure means it cannot
        return f"{type(exc).__name__}: {exc}"[:500]
    return None


def specialize(fn, backend, args: dict) -> ASTSource:
    """The source Triton's JIT compiles for ``fn`` called with ``args`` (by name): each argument
    typed and specialised by the JIT's own rule (native_specialize_impl: an int of 1 becomes a
    constant, one divisible by 16 and a 16-byte aligned pointer carry tt.divisibility), so the
    compile is the launch's (vector widths, and with them which loads are pipelined)."""
    if set(args) != set(fn.arg_names):
        raise TypeError(f"arguments out of date with the kernel: {sorted(set(args) ^ set(fn.arg_names))}")
    signature, constexprs, attrs = {}, {}, {}
    for i, p in enumerate(fn.params):
        value = args[p.name]
        if p.is_constexpr:
            signature[p.name], constexprs[(i,)] = "constexpr", value
            continue
        ty, spec = native_specialize_impl(
            backend, value, p.is_const, not p.do_not_specialize, not p.do_not_specialize_on_alignment
        )
        signature[p.name] = ty
        if ty == "constexpr":
            constexprs[(i,)] = spec
        elif isinstance(spec, str):
            attrs[(i,)] = backend.parse_attr(spec)
    return ASTSource(fn, signature, constexprs, attrs)


def launch_args(kernel: str, config: triton.Config, dtype: torch.dtype, M: int, split: bool = True):
    """``(kernel function, arguments by name)`` as the wrapper launches ``config`` on contiguous
    inputs of ``dtype`` with M rows at the kernel's shape (:data:`KERNELS`): the TMA kernel for
    a TMA config (the wrappers run it where targets.supports_tma), else the pointer kernel. A
    split-tail config compiles split (``split``: its code holds the unsplit tile loop too) or,
    with ``split=False``, as it runs when its plan splits nothing."""
    shape = KERNELS[kernel]["shape"]
    K, N = shape.hidden, shape.intermediate
    kw = configs.launch_kwargs(config)
    del kw["num_warps"], kw["num_stages"]  # compile options, not kernel arguments
    bm, bn, bk = kw["BLOCK_M"], kw["BLOCK_N"], kw["BLOCK_K"]
    # the JIT reads only a tensor's dtype and address: a small one stands for each operand
    t = torch.empty(64, dtype=dtype)
    meta = dict(
        DOT_PRECISION="tf32" if dtype != torch.float32 else "ieee",  # allow_tf32=False
        OUT_16BIT=dtype != torch.float32,
        ACTIVATION=shape.activation,
        **kw,
    )
    gated = kernel == "gated"
    if configs.uses_tma(config):
        sw = configs.tma_switches(config)
        split = split and sw["SPLIT_TAIL"]
        args = dict(
            x_desc=TensorDescriptor(t, [M, K], [K, 1], [bm, bk]),
            out=TensorDescriptor(t, [M, N], [N, 1], [bm, bn]) if sw["TMA_STORE"] else t,
            workspace=torch.empty(64, dtype=torch.float32) if split else None,
            counters=torch.empty(64, dtype=torch.int32) if split else None,
            M=M, N=N, K=K, stride_om=N,
            dp_tiles=triton.cdiv(M, bm) * triton.cdiv(N, bn),
            splits=4 if split else 1,
            **meta, **{**sw, "SPLIT_TAIL": split},
        )
        if gated:
            # the two weights as one (2, N, K) tensor, separate allocations a gap apart
            w = TensorDescriptor(t, [2, N, K], [N * K + 64, K, 1], [2, bn, bk])
            args.update(w_desc=w, b_ptr=t, bu_ptr=t, stride_b=0, stride_bu=0, HAS_BIAS=shape.bias,
                        HAS_BIAS_UP=shape.bias, GATED=True, UP_FIRST=False)
        else:
            args.update(w_desc=TensorDescriptor(t, [N, K], [K, 1], [bn, bk]), b_ptr=t, bu_ptr=None, stride_b=1,
                        stride_bu=None, HAS_BIAS=shape.bias, HAS_BIAS_UP=False, GATED=False, UP_FIRST=False)
        return tile_loop.tma_gemm, args
    args = dict(x_ptr=t, w_ptr=t, b_ptr=t, out_ptr=t, M=M, N=N, K=K, stride_xm=K, stride_xk=1, stride_wn=K,
                stride_wk=1, stride_om=N, stride_on=1, HAS_BIAS=shape.bias, GATED=gated, EVEN_K=K % bk == 0, **meta)
    if gated:
        args.update(wu_ptr=t, bu_ptr=t, stride_un=K, stride_uk=1, stride_b=0, stride_bu=0, HAS_BIAS_UP=shape.bias)
    else:
        args.update(wu_ptr=None, bu_ptr=None, stride_un=None, stride_uk=None, stride_b=1, stride_bu=None,
                    HAS_BIAS_UP=False)
    return pointer_tile.pointer_gemm, args


def compile_config(kernel, config, dtype, M, capability, split=True):
    """The compiled kernel (``triton.compile``, no launch) of :func:`launch_args` for a GPU of
    ``capability``."""
    target = gpu_target(capability)
    fn, args = launch_args(kernel, config, dtype, M, split)
    src = specialize(fn, make_backend(target), args)
    options = dict(num_warps=config.num_warps, num_stages=config.num_stages)
    return triton.compile(src, target=target, options=options)


def offered(target: targets.Target, kernel: str, dtype: torch.dtype, M: int) -> list[triton.Config]:
    """What the selection logic offers ``target`` (configs.candidates): the inputs of
    :func:`launch_args` allow descriptors (contiguous rows of 16-byte multiples), the target
    decides whether TMA configs run."""
    k = KERNELS[kernel]
    return configs.candidates(k["configs"], M, dtype.itemsize, k["weights"], True, target)


def violations(name, kernels=tuple(KERNELS), dtypes=tuple(DTYPES), m_classes=tuple(M_CLASSES),
               every=False, report=None) -> list[str]:
    """What breaks the rules of GPU ``name`` (a key of :data:`TARGETS`) in what the selection
    logic offers it, each violation a line naming the kernel, dtype, M and config: a TMA config
    before sm_90, a planned budget above the GPU's limit, a compiled kernel whose shared memory
    exceeds that limit, a compile error. Compiles the first candidate of each kernel, dtype and
    M class, or with ``every`` every distinct candidate; ``report`` gets a dict per compile."""
    capability, limit = TARGETS[name]
    target = targets.for_capability(capability)
    out = []
    if target.smem_optin > limit:
        out.append(f"{name}: configs are planned for {target.smem_optin} bytes of shared memory per block, "
                   f"more than its {limit}")
    done: dict[tuple, int | str] = {}
    for kernel in kernels:
        for dt in dtypes:
            dtype = DTYPES[dt]
            for m_class in m_classes:
                M = M_CLASSES[m_class]
                where = f"{name} {kernel} {dt} M={M}"
                cands = offered(target, kernel, dtype, M)
                out += [f"{where}: {configs.config_name(c)} uses TMA before sm_90"
                        for c in cands if configs.uses_tma(c) and capability < TMA_SINCE]
                for c in cands if every else cands[:1]:
                    cname = configs.config_name(c)
                    # once per config and dtype: M (a constant at 1) moves no shared memory
                    key = (kernel, cname, dt)
                    if key not in done:
                        t0 = time.process_time()
                        try:
                            done[key] = compile_config(kernel, c, dtype, M, capability).metadata.shared
                        except Exception as exc:  # noqa: BLE001 - a failed compile is a result
                            done[key] = f"{type(exc).__name__}: {exc}"[:1000]
                        if report:
                            report(dict(target=name, kernel=kernel, config=cname, dtype=dt, M=M,
                                        shared=done[key], cpu_s=round(time.process_time() - t0, 2)))
                    shared = done[key]
                    if isinstance(shared, str):
                        out.append(f"{where}: {cname} does not compile: {shared}")
                    elif shared > limit:
                        out.append(f"{where}: {cname} needs {shared} bytes of shared memory, more than the "
                                   f"{limit} a block may have")
    return out


def tma_variants():
    """(id, kernel, config, split) of every TMA config; a split-tail config twice, since it also
    runs unsplit when its plan splits nothing (reference_kernels.gemm.tma.Launch)."""
    for kernel, k in KERNELS.items():
        for cfg in k["configs"]:
            if not configs.uses_tma(cfg):
                continue
            has_split = configs.tma_switches(cfg)["SPLIT_TAIL"]
            for split in sorted({False, has_split}):
                suffix = "-unsplit" if has_split and not split else ""
                yield f"{kernel}-{configs.config_name(cfg)}{suffix}", kernel, cfg, split


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


def main_tma_variants() -> None:
    """One line per TMA variant compiled for sm_90 in fp16 at M = 8192."""
    capability = TARGETS["sm_90"][0]
    for vid, kernel, cfg, split in tma_variants():
        try:
            compiled = compile_config(kernel, cfg, torch.float16, M_CLASSES["prefill"], capability, split)
            ptx = compiled.asm["ptx"]
            row = dict(id=vid, ok=".target sm_90" in ptx, error=None, **split_tail_sync(ptx),
                       kernel=kernel, block_m=cfg.kwargs["BLOCK_M"], block_n=cfg.kwargs["BLOCK_N"],
                       wgmma_n=wgmma_widths(ptx), shared=compiled.metadata.shared)
        except Exception as exc:  # noqa: BLE001 - a failed compile is a result
            row = dict(id=vid, ok=False, error=f"{type(exc).__name__}: {exc}"[-2000:])
        print(json.dumps(row), flush=True)


def check_target(name, every=False, kernels=tuple(KERNELS), dtypes=tuple(DTYPES), m_classes=tuple(M_CLASSES)):
    """Print target ``name``'s compiles and then its line: ``violations``, or ``cannot_target``
    with the reason where this Triton cannot compile for it."""
    why = cannot_target(TARGETS[name][0])
    if why is not None:
        print(json.dumps(dict(target=name, cannot_target=why)), flush=True)
        return
    found = violations(name, kernels, dtypes, m_classes, every,
                       report=lambda row: print(json.dumps(row), flush=True))
    print(json.dumps(dict(target=name, violations=found)), flush=True)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("what", choices=["tma-variants", "all", *TARGETS])
    ap.add_argument("--every", action="store_true",
                    help="compile every distinct candidate, not the first of each")
    ap.add_argument("--kernel", action="append", choices=list(KERNELS))
    ap.add_argument("--dtype", action="append", choices=list(DTYPES))
    ap.add_argument("--m-class", action="append", choices=list(M_CLASSES))
    args = ap.parse_args(argv)
    if args.what == "tma-variants":
        main_tma_variants()
        return
    for name in TARGETS if args.what == "all" else [args.what]:
        check_target(name, args.every, tuple(args.kernel or KERNELS), tuple(args.dtype or DTYPES),
                     tuple(args.m_class or M_CLASSES))


if __name__ == "__main__":
    main()
