"""The marker is one real signature: its help text, its unknown-argument errors and its per-argument
type and range checks all come from pytest_fusion.declare.marker.fused_kernel."""

from __future__ import annotations

import inspect

import pytest

from pytest_fusion import FusionUsageError, make_spec
from pytest_fusion.plugin.items import MARKER_HELP
from pytest_fusion.declare.marker import VALIDATORS, fused_kernel, signature_text


def linear(x, weight):
    return x @ weight.T


BASE = dict(inputs={"x": ("M", "K"), "weight": ("N", "K")}, dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)})


def test_help_text_is_the_signature():
    sig = inspect.signature(fused_kernel)
    assert MARKER_HELP.startswith(signature_text())
    assert list(sig.parameters) == list(VALIDATORS.keys()) or set(sig.parameters) == set(VALIDATORS)
    for name, param in sig.parameters.items():
        if param.default is not param.empty:
            assert f"{name}={param.default!r}" in MARKER_HELP


def test_unknown_argument_comes_from_bind_with_a_hint():
    with pytest.raises(FusionUsageError, match=r"unknown fused_kernel argument\(s\) baselines \(did you mean"):
        make_spec(linear, baselines={"x": linear}, **BASE)
    with pytest.raises(FusionUsageError, match="missing a required argument: 'dims'"):
        make_spec(linear, inputs=BASE["inputs"])
    with pytest.raises(FusionUsageError, match="multiple values for argument 'reference'"):
        make_spec(linear, reference=linear, **BASE)


@pytest.mark.parametrize("arg, value, message", [
    ("special_values", "no", "special_values must be True or False, got 'no'"),
    ("triton", "False", "triton must be True or False, got 'False'"),
    ("poison", 1, "poison must be True or False, got 1"),
    ("deterministic", None, "deterministic must be True or False"),
    ("device", "cuda:abc", "device must be 'cuda', 'cuda:N' or 'cpu', got 'cuda:abc'"),
    ("device", "cudax", "device must be"),
    ("fp32_precision", "highest", "fp32_precision must be one of 'ieee', 'tf32', got 'highest'"),
    ("fp32_precision", True, "fp32_precision must be one of 'ieee', 'tf32', got True"),
    ("max_examples", True, "max_examples must be an int >= 1, got True"),
    ("ulps", float("nan"), "ulps must be a finite number"),
    ("error_multiple", -1, "error_multiple must be >= 0"),
    ("tolerance", 5, r"tolerance must be a fraction in \[0, 1\), got 5"),
    ("tolerance", True, "tolerance must be a fraction"),
    ("min_speedup", 0, "min_speedup must be > 0"),
])
def test_each_argument_is_checked_for_type_and_range(arg, value, message):
    with pytest.raises(FusionUsageError, match=message):
        make_spec(linear, **BASE, **{arg: value})


@pytest.mark.parametrize("size, message", [
    (True, r"bench\['big'\]\['M'\] must be an int >= 1, got True"),
    (10**12, r"bench\['big'\]\['M'\] = 1000000000000 exceeds 2147483647"),
    (2.0, "must be an int >= 1, got 2.0"),
])
def test_bench_dims_are_ints_in_range(size, message):
    with pytest.raises(FusionUsageError, match=message):
        make_spec(linear, **BASE, bench={"big": dict(M=size, K=8, N=8)})


def test_valid_arguments_give_the_spec_with_work_evaluated_once_per_case():
    calls = []

    def flops(M, K, N):
        calls.append((M, K, N))
        return 2 * M * K * N

    spec = make_spec(linear, **BASE, bench={"a": dict(M=4, K=8, N=8), "b": dict(M=2, K=8, N=8, dtypes=("float16",))},
                     flops=flops, bytes=lambda M, N, itemsize: M * N * itemsize, device="cuda:1",
                     providers={"unfused": linear}, min_speedup={"unfused": 0.5}, special_values=True)
    a, b = spec.bench
    assert calls == [(4, 8, 8), (2, 8, 8)]
    assert a.flops == 512 and b.flops == 256
    assert a.bytes == {"float16": 64, "bfloat16": 64, "float32": 128} and b.bytes == {"float16": 32}
    assert spec.device == "cuda:1" and spec.providers == {"unfused": linear} and spec.special_values is True
    assert spec.fp32_precision == "ieee" and make_spec(linear, **BASE, fp32_precision="tf32").fp32_precision == "tf32"
