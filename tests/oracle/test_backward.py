"""Backward checks (``backward=True``): a kernel's autograd gradients against the float64 golden's.

Dogfood first: a ``torch.autograd.Function`` whose forward is the reference gated kernel (Triton,
interpreted on the CPU) and whose backward is plain torch math from the saved inputs, checked
through the marker. Then the plugin's own behaviour on plain-torch kernels (``triton=False``, tiny
dims): a backward that drops a row's gradient fails naming the input, one that writes its
gradient into a forward input, the forward's output or an intermediate it saved fails naming it
(the intermediate passes with ``retain_graph=False``, the other two still fail), a correct one
passes, and ``--fusion-bench`` times forward + backward as its own ``-fwdbwd`` case on the CPU.
"""

from __future__ import annotations

import json
import re

import pytest
import torch
import torch.nn.functional as F

from pytest_fusion import FusionUsageError, GradientMismatch, make_spec
from pytest_fusion.oracle.backward import UPSTREAM_LAYOUTS, upstream_gradients, upstream_layouts
from reference_kernels.models import shapes
from reference_kernels.kernels.eager import gated_act_eager
from reference_kernels.kernels.gated_mlp import gated_act

SEED = "--hypothesis-seed=1"


class GatedAct(torch.autograd.Function):
    """``act(x @ w_gate.T) * (x @ w_up.T)`` (``reference_kernels.kernels.gated_mlp.gated_act``, one Triton
    kernel) with a backward in plain torch from the saved inputs: gate and up are recomputed
    (cheaper to store than to keep, as activation checkpointing does), then d_gate = g * up *
    act'(gate), d_up = g * act(gate), dx = d_gate @ w_gate + d_up @ w_up, dw = d^T @ x.
    x: (M, K), w_gate and w_up: (N, K); every gradient in the input's dtype."""

    @staticmethod
    def forward(ctx, x, w_gate, w_up, activation):  # type: ignore[override]
        ctx.save_for_backward(x, w_gate, w_up)
        ctx.activation = activation
        return gated_act(x, w_gate, w_up, activation=activation)

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        x, w_gate, w_up = ctx.saved_tensors
        gate, up = F.linear(x, w_gate), F.linear(x, w_up)
        if ctx.activation == "silu":
            act, d_gate = F.silu(gate), torch.ops.aten.silu_backward(grad * up, gate)
        else:  # gelu_tanh
            act = F.gelu(gate, approximate="tanh")
            d_gate = torch.ops.aten.gelu_backward(grad * up, gate, approximate="tanh")
        d_up = grad * act
        dx = d_gate @ w_gate + d_up @ w_up
        return dx, d_gate.t() @ x, d_up.t() @ x, None


def gated_act_autograd(x, w_gate, w_up, activation="silu"):
    """The reference gated kernel with a backward: x (M, K), w_gate, w_up (N, K) -> (M, N)."""
    return GatedAct.apply(x, w_gate, w_up, activation)


GATED_BACKWARD = dict(
    reference=gated_act_eager,
    inputs={"x": ("M", "K"), "w_gate": ("N", "K"), "w_up": ("N", "K")},
    # Small on purpose: under the interpreter every case runs the Triton forward three times
    # (two oracle calls and the autograd run); on a GPU the bench cases below are the real shapes.
    dims={"M": (1, 48), "K": (1, 48), "N": (1, 48)},
    max_examples=6,
    backward=True,
    flops=shapes.gated_flops,
)


@pytest.mark.fused_kernel(
    **GATED_BACKWARD, constants={"activation": "silu"},
    bench={"llama3-8b-m1024": dict(M=1024, K=4096, N=14336, dtypes=("bfloat16",))},
)
def test_gated_swiglu_backward():
    """SwiGLU gate/up with its gradients (Llama-3-8B's 4096 -> 14336 on a GPU bench)."""
    return gated_act_autograd


@pytest.mark.fused_kernel(
    **GATED_BACKWARD, constants={"activation": "gelu_tanh"},
    bench={"gemma-2b-m1024": dict(M=1024, K=2048, N=16384, dtypes=("bfloat16",))},
)
def test_gated_geglu_backward():
    """GeGLU (tanh) gate/up with its gradients (Gemma-2B's 2048 -> 16384 on a GPU bench)."""
    return gated_act_autograd


# --- the plugin's behaviour, on plain-torch kernels -----------------------------------------------

KERNELS = '''
import pytest
import torch
import torch.nn.functional as F


def silu_mul(gate, up):
    return F.silu(gate) * up


class SiluMul(torch.autograd.Function):
    BUG = None

    @staticmethod
    def forward(ctx, gate, up):
        act = F.silu(gate)
        out = act * up
        ctx.save_for_backward(gate, up, act, out)
        return out

    @staticmethod
    def backward(ctx, grad):
        gate, up, act, out = ctx.saved_tensors
        if SiluMul.BUG == "grad as contiguous":  # a kernel indexing grad by its shape, not its strides
            grad = torch.as_strided(grad, grad.shape, (grad.shape[-1], 1), grad.storage_offset())
        if SiluMul.BUG == "grad row 0":  # every row reads the first row's gradient
            grad = grad[:1].expand_as(grad)
        d_gate = torch.ops.aten.silu_backward(grad * up, gate)
        d_up = grad * act
        if SiluMul.BUG == "write into act":  # memory saving: d_up computed in the saved activation
            d_up = act.mul_(grad)
        if SiluMul.BUG == "write into out":  # the saved output reused as scratch
            out.zero_()
        if SiluMul.BUG == "drop last row":  # a launch grid one row short
            out = torch.empty_like(d_gate)
            out[:-1] = d_gate[:-1]
            d_gate = out
        if SiluMul.BUG in ("write into up", "write into both"):  # Liger's memory saving: the gradient
            up.copy_(d_up)                                      # stored into an input
            d_up = up
        if SiluMul.BUG == "write into both":  # as Liger's GLU backward does: both inputs
            gate.copy_(d_gate)
            d_gate = gate
        return d_gate, d_up


def kernel(gate, up):
    return SiluMul.apply(gate, up)


@pytest.mark.fused_kernel(reference=silu_mul, inputs={{"gate": ("M", "N"), "up": ("M", "N")}},
                          dims={{"M": (1, 16), "N": (1, 16)}}, dtypes=("float32",), triton=False,
                          max_examples=8, backward=True{extra}, bench={{"tiny": dict(M=8, N=16)}})
def test_silu_mul():
    SiluMul.BUG = {bug!r}
    return kernel
'''


def run(pytester: pytest.Pytester, bug: str | None, *args: str, extra: str = "") -> pytest.RunResult:
    pytester.makepyfile(test_glu=KERNELS.format(bug=bug, extra=extra))
    return pytester.runpytest("-p", "no:cacheprovider", SEED, *args)


def test_correct_backward_passes(pytester: pytest.Pytester, cpu_only: None) -> None:
    run(pytester, None).assert_outcomes(passed=1)


def test_backward_dropping_a_row_fails_naming_the_input(pytester: pytest.Pytester, cpu_only: None) -> None:
    result = run(pytester, "drop last row")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "*[[]pytest-fusion] gradient mismatch: gradient of 'gate': * elements outside the error budget"
        " (backward)",
        "*worst    [[]*]: kernel=nan golden=* (NaN where golden is finite: an unwritten element? "
        "it holds the poison NaN*",
        "*upstream  N(0, 1) gradient of each floating output, drawn from seed *",
    ])
    # shrunk as forward failures are: one row is the whole gradient at M = 1
    result.stdout.fnmatch_lines(["*dims     M=1 N=1*"])


def test_backward_reading_the_upstream_gradient_as_contiguous_fails(
    pytester: pytest.Pytester, cpu_only: None
) -> None:
    result = run(pytester, "grad as contiguous")
    result.assert_outcomes(failed=1)
    # a mismatch on a transposed gradient, or a crash on an expanded one (its storage is one row)
    out = result.stdout.str()
    # the mismatch names the gradient's strides: a transposed one is column-major
    assert (re.search(r"drawn from seed \d+; layouts: output 0: transposed \(shape (\d+)x\d+, strides \(1, \1\), "
                      r"offset 0\)", out)
            or "(backward; upstream gradient layouts: output 0 expanded)" in out), out


def test_backward_reading_the_first_rows_gradient_for_every_row_fails(
    pytester: pytest.Pytester, cpu_only: None
) -> None:
    result = run(pytester, "grad row 0")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] gradient mismatch: gradient of '*': * (backward)"])


def test_upstream_gradients_are_drawn_in_every_layout_from_the_seed() -> None:
    out = (torch.zeros(3, 5, dtype=torch.float32),)
    seen = {}
    for seed in range(40):
        (g,) = upstream_gradients(out, seed=seed, layouts=True)
        assert g is not None and g.shape == (3, 5)
        (again,) = upstream_gradients(out, seed=seed, layouts=True)
        assert again is not None and again.stride() == g.stride() and torch.equal(again, g)
        seen[upstream_layouts((g,))] = g
    assert set(seen) == {f"output 0 {layout}" for layout in UPSTREAM_LAYOUTS}
    expanded = seen["output 0 expanded"]
    assert expanded.stride() == (0, 1) and not torch.equal(expanded[0], torch.ones(5))
    offset = seen["output 0 offset"]
    assert offset.storage_offset() == 1 and torch.isnan(offset.as_strided((1,), (1,), 0)).all()
    assert not seen["output 0 transposed"].is_contiguous()
    # the values do not depend on the layout: contiguous draws give the same numbers
    (plain,) = upstream_gradients(out, seed=0)
    (laid,) = upstream_gradients(out, seed=0, layouts=True)
    assert plain is not None and laid is not None
    assert upstream_layouts((laid,)) == "output 0 expanded" or torch.equal(plain, laid)


def test_backward_writing_into_an_input_fails_naming_it(pytester: pytest.Pytester, cpu_only: None) -> None:
    result = run(pytester, "write into up")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*[[]pytest-fusion] input mutated: the kernel wrote into input 'up' (*; backward); "
         "a backward must leave the forward's inputs as they were*"]
    )


@pytest.mark.parametrize("bug, line", [
    ("write into both", "input mutated: the kernel wrote into input 'gate' (* of * elements changed) and input "
                        "'up' (* of * elements changed; backward); a backward must leave the forward's inputs*"),
    ("write into act", "saved tensor mutated: the backward wrote into saved tensor 2 of SiluMulBackward (* "
                       "elements changed): the caller holds the forward's outputs, and a second backward over "
                       "the same graph (retain_graph=True) reads what the forward saved; write gradients into "
                       "new tensors, or declare retain_graph=False for a backward meant to consume what its "
                       "forward saved"),
    ("write into out", "saved tensor mutated: the backward wrote into output 0 of the forward (*, * of * "
                       "elements changed)*"),
], ids=["two inputs", "saved intermediate", "forward output"])
def test_backward_writes_are_named(pytester: pytest.Pytester, cpu_only: None, bug: str, line: str) -> None:
    result = run(pytester, bug)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*[[]pytest-fusion] " + line])


@pytest.mark.parametrize("bug, line", [
    ("write into act", None),
    ("write into out", "saved tensor mutated: the backward wrote into output 0 of the forward (*, * of * "
                       "elements changed)*write gradients into new tensors"),
    ("write into up", "input mutated: the kernel wrote into input 'up' (*; backward)*"),
], ids=["saved intermediate", "forward output", "input"])
def test_retain_graph_false_lets_the_backward_consume_only_what_was_saved(
    pytester: pytest.Pytester, cpu_only: None, bug: str, line: str | None
) -> None:
    """retain_graph=False (Liger's GLU ops: gradients stored into the saved activations) allows
    writes into the forward's saved intermediates, and only those."""
    result = run(pytester, bug, extra=", retain_graph=False")
    if line is None:
        result.assert_outcomes(passed=1)
    else:
        result.assert_outcomes(failed=1)
        result.stdout.fnmatch_lines(["*[[]pytest-fusion] " + line])


def test_forward_only_kernel_with_backward_is_a_clear_failure(
    pytester: pytest.Pytester, cpu_only: None
) -> None:
    source = KERNELS.format(bug=None, extra="").replace("return kernel", "return silu_mul_no_grad")
    no_grad = "\n\ndef silu_mul_no_grad(gate, up):\n    return silu_mul(gate, up).detach()\n"
    pytester.makepyfile(test_fwd=source + no_grad)
    result = pytester.runpytest("-p", "no:cacheprovider", SEED)
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(
        ["*bad output: backward=True, but the output of the kernel carries no autograd history*"]
    )


def test_fwdbwd_case_is_timed_on_the_cpu(pytester: pytest.Pytester, cpu_only: None) -> None:
    result = run(pytester, None, "--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                 "--fusion-rounds=3", "--fusion-min-time=0", "--fusion-json=out.json", "-k", "bench", "-v")
    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(["*[[]bench-tiny-fwdbwd-float32] PASSED*"])
    records = {r["case"]: r for r in json.loads((pytester.path / "out.json").read_text())["records"]}
    assert set(records) == {"tiny", "tiny-fwdbwd"}
    fwd_bwd = records["tiny-fwdbwd"]
    assert set(fwd_bwd["providers"]) == {"kernel", "eager"} and fwd_bwd["flops"] is None
    assert all(p["median_ms"] > 0 for p in fwd_bwd["providers"].values())


def test_backward_flag_and_twin_names_are_checked() -> None:
    common = dict(inputs={"x": ("N",)}, dims={"N": (1, 4)})
    with pytest.raises(FusionUsageError, match="backward must be True or False, got 'yes'"):
        make_spec(torch.relu, **common, backward="yes")
    with pytest.raises(FusionUsageError, match="bench declares 'a-fwdbwd', the name backward=True gives"):
        make_spec(torch.relu, **common, backward=True, bench={"a": dict(N=4), "a-fwdbwd": dict(N=4)})
    spec = make_spec(torch.relu, **common, backward=True, bench={"a": dict(N=4)})
    assert [(c.name, c.backward) for c in spec.bench] == [("a", False), ("a-fwdbwd", True)]
    assert [c.name for c in make_spec(torch.relu, **common, bench={"a": dict(N=4)}).bench] == ["a"]
    with pytest.raises(FusionUsageError, match="retain_graph=False declares .* it needs backward=True"):
        make_spec(torch.relu, **common, retain_graph=False)
    with pytest.raises(FusionUsageError, match="retain_graph must be True or False, got 'no'"):
        make_spec(torch.relu, **common, backward=True, retain_graph="no")
    with pytest.raises(FusionUsageError, match=r"backward=True cannot be combined with mutates=\('x',\)"):
        make_spec(torch.relu, **common, backward=True, mutates=("x",))


def test_upstream_gradients_follow_the_seed_and_the_outputs() -> None:
    out = (torch.zeros(3, 5, dtype=torch.float16), torch.zeros(2, dtype=torch.int64))
    first, none = upstream_gradients(out, seed=7)
    assert none is None and first is not None
    assert first.dtype == torch.float16 and first.shape == (3, 5) and first.is_contiguous()
    assert torch.equal(first, upstream_gradients(out, seed=7)[0])
    assert not torch.equal(first, upstream_gradients(out, seed=8)[0])


def test_gradient_mismatch_is_its_own_failure_kind() -> None:
    assert GradientMismatch.kind == "gradient mismatch"


def test_fusion_bench_backward_times_the_fwdbwd_case(pytester: pytest.Pytester, cpu_only: None) -> None:
    pytester.makepyfile(test_hand=KERNELS.format(bug=None, extra="") + '''

def test_hand_written(fusion):
    gate, up = torch.randn(8, 16), torch.randn(8, 16)
    rec = fusion.bench("glu", kernel, gate, up, reference=silu_mul, triton=False, backward=True)
    assert rec.case == "glu-fwdbwd" and set(rec.providers) == {"kernel", "eager"}
    assert all(p.median_ms > 0 for p in rec.providers.values())
''')
    result = pytester.runpytest("-p", "no:cacheprovider", "--fusion-bench", "--fusion-providers=eager",
                                "--fusion-warmup=0", "--fusion-rounds=3", "--fusion-min-time=0",
                                "-k", "hand_written")
    result.assert_outcomes(passed=1)


def _silu_mul(gate, up):
    return F.silu(gate) * up


SILU_MUL_SPEC = dict(inputs={"gate": ("M", "N"), "up": ("M", "N")}, dims={"M": (1, 8), "N": (1, 8)},
                     dtypes=("float32",), triton=False, backward=True, max_examples=4)


def test_a_forward_changing_a_saved_tensor_in_place_still_fails_as_autograd_would() -> None:
    # Reading the saved tensors must leave autograd's version-counter check on (saved_tensors_hooks
    # would switch it off, and this kernel would pass the test and raise in the user's backward).
    from pytest_fusion import KernelCrash, check_kernel

    def kernel(gate, up):
        s = torch.sigmoid(gate)
        out = (gate * s) * up  # saves s
        s.clamp_(0, 1)  # in place after the save, values unchanged
        return out

    with pytest.raises(KernelCrash, match="modified by an inplace operation"):
        check_kernel(make_spec(_silu_mul, **SILU_MUL_SPEC), kernel, device="cpu")


def test_saved_conjugate_views_are_compared_by_value() -> None:
    from pytest_fusion import check_kernel

    def fft_conv(x, w):  # mul saves the lazy conjugate view of rfft(w)
        return torch.fft.irfft(torch.fft.rfft(x) * torch.fft.rfft(w).conj(), n=x.shape[-1])

    def reference(x, w):
        return torch.fft.irfft(torch.fft.rfft(x) * torch.conj_physical(torch.fft.rfft(w)), n=x.shape[-1])

    spec = make_spec(reference, **{**SILU_MUL_SPEC, "inputs": {"x": ("M", "N"), "w": ("M", "N")},
                                   "dims": {"M": (1, 4), "N": (2, 16)}})
    assert check_kernel(spec, fft_conv, device="cpu") == {"float32": "passed"}


class SavesOddViews(torch.autograd.Function):
    """``gate * up`` whose forward saves, beside its inputs, a one-element int64 tensor with stride 2
    and an expanded (zero-stride) scale, and returns a transposed output; ``BUG`` names a write into one."""

    BUG: str | None = None

    @staticmethod
    def forward(ctx, gate, up):  # type: ignore[override]
        index = torch.zeros(2, dtype=torch.int64)[::2]  # shape (1,), stride (2,)
        scale = torch.ones(1, gate.shape[-1], dtype=gate.dtype).expand_as(gate)
        ctx.save_for_backward(gate, up, index, scale)
        return (gate * up).t().contiguous().t()

    @staticmethod
    def backward(ctx, grad):  # type: ignore[override]
        gate, up, index, scale = ctx.saved_tensors
        if SavesOddViews.BUG == "write into index":
            index.add_(1)
        if SavesOddViews.BUG == "write into scale":
            scale.select(0, 0).mul_(2)
        return grad * up * scale, grad * gate


@pytest.mark.parametrize("bug, match", [
    (None, None),
    ("write into index", r"saved tensor 2 of SavesOddViewsBackward \(shape \(1,\) int64, 1 of 1 elements"),
    ("write into scale", r"saved tensor 3 of SavesOddViewsBackward \(shape \(3, 4\) float32, 12 of 12"),
])
def test_odd_views_as_inputs_outputs_and_saved_tensors_are_checked_bitwise(
    bug: str | None, match: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Transposed and expanded inputs, a transposed output, and saved tensors a byte view cannot read
    # (one int64 element with stride 2): each compared element by element at its own width.
    from pytest_fusion import SavedTensorMutated
    from pytest_fusion.oracle.case import check_inputs

    monkeypatch.setattr(SavesOddViews, "BUG", bug)
    spec = make_spec(lambda gate, up: gate * up, inputs={"gate": ("M", "N"), "up": ("M", "N")},
                     dims={"M": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False, backward=True)
    gate = torch.randn(4, 3).t()  # transposed
    up = torch.randn(1, 4).expand(3, 4)  # zero stride
    if match is None:
        comparisons, same = check_inputs(spec, SavesOddViews.apply, [gate, up], warn=False)
        assert same and len(comparisons) == 3  # the output, then the gradients of gate and up
    else:
        with pytest.raises(SavedTensorMutated, match=match):
            check_inputs(spec, SavesOddViews.apply, [gate, up], warn=False)
