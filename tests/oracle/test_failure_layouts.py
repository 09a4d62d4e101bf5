"""A failure names each input's layout with its shape, strides and storage offset: the strides the
kernel was handed, not just the layout's name."""

from __future__ import annotations

import pytest

from pytest_fusion import Case, KernelMismatch, check_case, make_spec
from pytest_fusion.oracle.failures import tensor_layout
from pytest_fusion.oracle.tensors import guard_elements

SPEC = make_spec(
    lambda x, w, b: x @ w.T + b,
    inputs={"x": ("M", "K"), "w": ("N", "K"), "b": ("N",)},
    dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)},
    dtypes=("float32",),
    triton=False,
)


def test_tensor_layout_reads_like_the_tensor():
    assert tensor_layout("x", "transposed", (3, 5), (1, 3), 0) == "x: transposed (shape 3x5, strides (1, 3), offset 0)"
    assert tensor_layout("b", "padded", (4,), (2,), 0) == "b: padded (shape 4, strides (2,), offset 0)"
    assert tensor_layout("s", "contiguous", (), (), 0) == "s: contiguous (shape (), strides (), offset 0)"


def test_a_drawn_cases_failure_names_the_strides_the_kernel_was_handed():
    seen = {}

    def wrong(x, w, b):  # records what it was given, then computes a wrong result
        seen.update({n: (tuple(t.shape), t.stride(), t.storage_offset() - guard_elements(t.dtype))
                     for n, t in (("x", x), ("w", w), ("b", b))})
        return (x @ w.T + b) * 1.5

    case = Case({"M": 3, "K": 5, "N": 4}, "float32", {"x": "transposed", "w": "offset", "b": "padded"}, seed=1)
    with pytest.raises(KernelMismatch) as failed:
        check_case(SPEC, wrong, case, device="cpu")
    message = str(failed.value)
    assert ("  layouts  x: transposed (shape 3x5, strides (1, 3), offset 0)\n"
            "           w: offset (shape 4x5, strides (5, 1), offset 1)\n"
            "           b: padded (shape 4, strides (2,), offset 0)\n") in message, message
    for name, (shape, strides, offset) in seen.items():  # the message is the tensors' own geometry
        dims = "x".join(map(str, shape))
        assert f"{name}: {case.layouts[name]} (shape {dims}, strides {strides}, offset {offset})" in message


def test_a_given_inputs_failure_names_their_strides_and_storage_offset(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_given='''
import torch

def test_given(fusion):
    buf = torch.randn(40)
    x = buf[1:36].view(5, 7)               # a slice: storage offset 1
    w = torch.randn(7, 3).t()              # transposed
    b = torch.randn(3, 2)[:, 0]            # every other element
    fusion.check(lambda x, w, b: (x @ w.t() + b) * 1.5, lambda x, w, b: x @ w.t() + b, x, w, b)
''')
    result = pytester.runpytest_subprocess("-p", "no:randomly")
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        "  layouts  input0: offset (shape 5x7, strides (7, 1), offset 1)",
        "           input1: transposed (shape 3x7, strides (1, 3), offset 0)",
        "           input2: strided (shape 3, strides (2,), offset 0)",
    ])
