"""An output that is a view into a larger buffer the kernel allocated warns, unless the marker
declares ``output_views=True``."""

from __future__ import annotations

import pytest

PADDED = '''
import pytest
import torch
import torch.nn.functional as F


def linear(x, weight):
    return F.linear(x, weight)


def padded_to_the_tile(x, weight):
    m = x.shape[0]
    buf = torch.empty(-(-m // 16) * 16 + 16, weight.shape[0], dtype=x.dtype)  # padded to a 16-row tile
    buf[:m] = F.linear(x, weight)
    return buf[:m]


@pytest.mark.fused_kernel(reference=linear, inputs={"x": ("M", "K"), "weight": ("N", "K")},
                          dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False,
                          max_examples=3OPTION)
def test_padded():
    return padded_to_the_tile
'''


def test_an_output_view_into_a_padded_buffer_warns_unless_declared(pytester: pytest.Pytester,
                                                                    cpu_only: None) -> None:
    pytester.makepyfile(test_padded=PADDED.replace("OPTION", ""))
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1")
    result.assert_outcomes(passed=1, warnings=1)
    result.stdout.fnmatch_lines([
        "*OutputViewWarning: kernel 'padded_to_the_tile': output 0 (shape (*), strides (*), storage offset 0) "
        "is a view into a larger buffer the kernel allocated: a storage of * bytes, * of them outside every "
        "output*output_views=True*",
    ])
    pytester.makepyfile(test_padded=PADDED.replace("OPTION", ", output_views=True"))
    result = pytester.runpytest("-p", "no:cacheprovider", "--hypothesis-seed=1")
    result.assert_outcomes(passed=1, warnings=0)
