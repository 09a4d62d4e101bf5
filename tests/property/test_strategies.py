"""The dims the oracle tries: edge tiers clipped to the declared ranges, the CPU caps, the edge cases,
and which of two failing cases it reports."""

from __future__ import annotations

import math
import re

import pytest
from hypothesis import Phase, assume, given, settings
from hypothesis import strategies as st

from pytest_fusion.declare.spec import DEFAULT_CPU_MAX_DIM
from pytest_fusion.property.check import DEFAULT_CPU_MAX_ELEMENTS, run_property, size_limits
from pytest_fusion import make_spec
from pytest_fusion.oracle.failures import KernelMismatch
from pytest_fusion.property.strategies import cases, dims, edge_cases, edge_dims, element_cap, powers_of_two
from pytest_fusion.oracle.tensors import AMPLITUDES, make_inputs


def linear(x, weight):
    return x @ weight.T


def spec(**kwargs):
    kwargs.setdefault("dims", {"M": (1, 4096), "K": (1, 4096), "N": (1, 4096)})
    return make_spec(linear, inputs={"x": ("M", "K"), "weight": ("N", "K")}, **kwargs)


def test_powers_of_two_and_their_successors_in_range():
    assert powers_of_two(5, 40) == [5, 8, 9, 16, 17, 32, 33]
    assert powers_of_two(1, 1) == [1]


def test_edge_tier_has_bucket_boundaries_and_stays_in_range():
    edges = edge_dims(low=1, high=300)
    assert {1, 2, 3, 4, 8, 9, 128, 129, 256, 257, 300} <= set(edges)
    assert edges == sorted(set(edges)) and max(edges) == 300
    clipped = edge_dims(low=100, high=200)
    assert clipped[0] == 100 and clipped[-1] == 200 and all(100 <= v <= 200 for v in clipped)
    assert {127, 128, 129} <= set(clipped)
    assert edge_dims(low=7, high=7) == [7]


def test_element_cap_counts_inputs_and_two_dim_outputs():
    s = spec()
    # x = M x K: with M = 64 chosen, K may reach 2**18 / 64 = 4096 (w = N x K with N at its low 1).
    assert element_cap(s, "K", {"M": 64}, 2**18) == 4096
    # N: w = N x K and the M x N output both bound it; K = 4096 leaves 64.
    assert element_cap(s, "N", {"M": 1, "K": 4096}, 2**18) == 64
    assert element_cap(s, "N", {"M": 8192, "K": 1}, 2**18) == 32  # the M x N output
    assert element_cap(s, "M", {}, None) is None


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_drawn_dims_respect_the_element_budget(data):
    s = spec()
    d = data.draw(dims(s, max_elements=2**12))
    assert all(1 <= v <= 4096 for v in d.values())
    assert d["M"] * d["K"] <= 2**12 and d["N"] * d["K"] <= 2**12 and d["M"] * d["N"] <= 2**12, d


def test_edge_cases_give_eight_distinct_values_per_dim():
    for limits in ({"max_dim": 64}, {"max_elements": 2**18}):
        found = edge_cases(spec(), dtype="float16", **limits)
        for sym in "MKN":
            assert len({c.dims[sym] for c in found}) >= 8, (limits, sym, [c.dims for c in found])
        for c in found:
            assert all(1 <= v <= (64 if "max_dim" in limits else 4096) for v in c.dims.values())
            assert math.prod((c.dims["M"], c.dims["K"])) <= 2**18
        assert {c.amplitude for c in found} == set(AMPLITUDES["float16"])
    small = edge_cases(spec(dims={"M": (1, 4), "K": (2, 3), "N": (5, 5)}), dtype="float32")
    assert {c.dims["M"] for c in small} == {1, 2, 3, 4} and {c.dims["K"] for c in small} == {2, 3}


def test_one_case_above_the_cap_per_symbol_for_triton():
    found = edge_cases(spec(dims={"M": (1, 4096), "K": (16, 64), "N": (1, 100)}), dtype="float32",
                       max_dim=64, above_cap=True)
    above = [c.dims for c in found if max(c.dims.values()) > 64]
    assert above == [{"M": 129, "K": 16, "N": 1}, {"M": 1, "K": 16, "N": 100}]


def test_size_limits_by_device_and_kernel_kind():
    triton_spec, torch_spec = spec(), spec(triton=False)
    assert size_limits(triton_spec, "cpu", None) == (DEFAULT_CPU_MAX_DIM, None)
    assert size_limits(torch_spec, "cpu", None) == (None, DEFAULT_CPU_MAX_ELEMENTS)
    assert size_limits(torch_spec, "cpu", 20) == (20, DEFAULT_CPU_MAX_ELEMENTS)
    assert size_limits(triton_spec, "cpu", 0) == (None, None)
    assert size_limits(triton_spec, "cuda", None) == (None, None)


@settings(max_examples=30, deadline=None)
@given(data=st.data())
def test_amplitude_tier_scales_the_activations_only(data):
    s = spec(dims={"M": (64, 64), "K": (64, 64), "N": (8, 8)}, special_values=False)
    case = data.draw(cases(s, dtype="float16"))
    assume(not case.exact)  # the exact tier draws small dyadic values, not amplitudes: its own test
    x, w = make_inputs(s, case, "cpu").values()
    assert case.amplitude in AMPLITUDES["float16"]
    assert bool(x.isfinite().all())  # 2**14 x N(0, 1) is clamped to float16's finite range
    assert 0.5 * case.amplitude < float(x.float().std()) < 2 * case.amplitude
    assert 0.5 / 8 < float(w.float().std()) < 2 / 8  # weights stay 1/sqrt(K)


def test_a_failure_both_paths_find_is_reported_at_the_smaller_case():
    # Hypothesis' shrinker can stop above the smallest failing case
    # (docs/oracle.md#when-an-edge-case-beats-the-shrink): here it does not shrink at all, and the
    # kernel is wrong from M=17 on (an edge value: 16 + 1), so the edge cases shrink to M=17 K=1 N=1.
    def wrong_somewhere(x, weight):
        out = x @ weight.T
        return out + 1 if x.shape[0] >= 17 else out

    small = spec(dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)}, triton=False)
    no_shrink = settings(phases=[Phase.explicit, Phase.generate], database=None, derandomize=True)
    with pytest.raises(KernelMismatch) as info:
        run_property(small, wrong_somewhere, dtype="float32", device="cpu", max_examples=40,
                     parent_settings=no_shrink)
    text = str(info.value)
    notes = "\n".join(getattr(info.value, "__notes__", []))
    assert "dims     M=17 K=1 N=1" in text, text + notes
    assert "edge case" in notes and "is the smaller one" in notes, notes


def test_a_large_case_draws_its_values_before_waiting_for_its_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    import contextlib

    from pytest_fusion.property import examples as case_runner

    from pytest_fusion.oracle import memory
    from pytest_fusion.property.examples import CaseRunner
    from pytest_fusion.oracle.tensors import Case

    events: list[str] = []

    @contextlib.contextmanager
    def admitted(device, need, holder="", notify=None):
        events.append(f"admitted {need > memory.TINY_BYTES}")
        yield

    def draw(spec, case):
        events.append("draw")
        return ["values"]

    def check(spec, kernel, case, *, values=None, **kwargs):
        events.append(f"check values={values}")
        return type("Result", (), {"deterministic": True})()

    monkeypatch.setattr(memory, "admitted", admitted)
    monkeypatch.setattr(case_runner, "draw_values", draw)
    monkeypatch.setattr(case_runner, "check_case", check)
    monkeypatch.setattr(case_runner, "release_cached_memory", lambda device: None)
    full = spec(dims={"M": (1, 8192), "K": (1, 8192), "N": (1, 28672)})
    runner = CaseRunner(full, lambda x, w: x, device="cuda:0")
    runner.run_case(Case({"M": 8192, "K": 8192, "N": 28672}, "bfloat16", {}, 0))
    assert events == ["draw", "admitted True", "check values=['values']"]
    events.clear()
    runner.run_case(Case({"M": 64, "K": 64, "N": 64}, "bfloat16", {}, 0))  # small: drawn inside check_case
    assert events == ["admitted False", "check values=None"]


def test_declared_dims_too_large_for_the_gpu_are_refused_before_any_case(monkeypatch: pytest.MonkeyPatch) -> None:
    from pytest_fusion.property import examples as case_runner
    from pytest_fusion.oracle import memory
    from pytest_fusion.declare.spec import FusionUsageError

    monkeypatch.setattr(memory, "device_total_bytes", lambda device: 141 * 10**9)  # an H200
    huge = spec(dims={"M": (1, 200000), "K": (1, 200000), "N": (1, 64)})
    ran = []
    with pytest.raises(FusionUsageError) as exc:  # the kernel never runs: no CUDA device here either
        run_property(huge, lambda x, w: ran.append(1), dtype="float32", device="cuda:0")
    assert not ran
    assert re.fullmatch(
        r"the declared dims reach a case too large to check on cuda:0: at M=200000 K=200000 N=64 \(float32\) "
        r"the check holds about (\d+\.\d) GB at its peak \(inputs, their float64 golden, eager, both kernel "
        r"calls' outputs and the comparison\) of the device's 141.0 GB. Declare smaller dims, or cap every "
        r"drawn dim with --fusion-max-dim \(check_kernel's max_dim\).", str(exc.value)), str(exc.value)
    # the inputs alone are 160 GB in float32 (twice: the oracle keeps a copy), 320 GB in float64
    assert float(re.search(r"about (\d+\.\d) GB", str(exc.value)).group(1)) > 2 * 160 + 320
    # The reference kernels' full dims fit; a per-dim cap makes the huge declaration fit too; on the
    # CPU nothing is refused here (its draws are capped by size_limits).
    case_runner.check_fits(spec(dims={"M": (1, 8192), "K": (1, 8192), "N": (1, 28672)}), "cuda:0")
    case_runner.check_fits(huge, "cuda:0", max_dim=16384)
    case_runner.check_fits(huge, "cpu")
    with pytest.raises(FusionUsageError, match=r"at M=150000 K=150000 N=64 \(float32\) the check holds about"):
        case_runner.check_fits(huge, "cuda:0", max_dim=150000)
    # Every dim at its high end at once, though no edge case puts them there together (the high end
    # of B is its first tile + 1, so it is not B's third edge pick).
    batched = make_spec(lambda x: x, inputs={"x": ("B", "M", "K")}, tiles={"B": (16,)},
                        dims={"B": (1, 17), "M": (1, 40000), "K": (1, 40000)})
    assert max(math.prod(c.dims.values()) for c in edge_cases(batched, dtype="float32")) < 17 * 40000**2
    with pytest.raises(FusionUsageError, match="at B=17 M=40000 K=40000 "):
        case_runner.check_fits(batched, "cuda:0")
