"""A GPU timer's L2 flush is held against the device's L2 size: a flush no larger than the L2 is a
warning, a note and a record field; the baseline entry keeps the figures."""

import json
import textwrap
import types
import warnings

import pytest
import torch

import pytest_fusion.plugin.bench_session  # noqa: F401  (imported once, before the pytester runs)
from pytest_fusion import BenchSettings, bench_case, make_spec
from pytest_fusion.baselines import store
from pytest_fusion.declare.spec import BenchCase
from pytest_fusion.measure import cold_l2

from fakes import FAKE_TIMER_CONFTEST, ScriptedTimer, set_times

MIB = 1 << 20
H100_L2 = 50 * MIB


class FlushingTimer(ScriptedTimer):
    """A GPU-like timer: the kernel 1 ms and eager 2 ms a sample, and an L2 flush of ``flush_bytes``."""

    method = "fake-gpu"

    def __init__(self, flush_bytes):
        super().__init__({"kernel": 1.0, "eager": 2.0})
        self.flush_bytes = flush_bytes


def timed(timer, monkeypatch, l2=H100_L2):
    monkeypatch.setattr(cold_l2, "device_l2_bytes", lambda device: l2)  # a fake device's L2 size
    spec = make_spec(torch.relu, inputs={"x": (4, 8)}, dims={})
    return bench_case(spec, torch.relu, BenchCase("c", {"M": 4}, ("float32",)), "float32", kernel_id="k",
                      slug="dev", device="cpu", inputs=(torch.ones(4, 8),), timer=timer,
                      settings=BenchSettings(rounds=5, warmup=0, min_time_s=0.0, providers=("eager",)))


def test_a_flush_larger_than_the_l2_is_recorded_cold(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error", cold_l2.L2NotCold)
        rec = timed(FlushingTimer(256 * MIB), monkeypatch)
    assert rec.l2 == {"l2_bytes": H100_L2, "flush_bytes": 256 * MIB, "cold": True}
    assert (rec.env["l2_bytes"], rec.env["l2_flush_bytes"], rec.env["l2_cold"]) == (H100_L2, 256 * MIB, True)
    assert not any("L2" in n for n in rec.notes)


def test_a_flush_smaller_than_the_l2_warns_and_says_so_in_the_record(monkeypatch):
    with pytest.warns(cold_l2.L2NotCold, match=r"flush reads 32 MiB, the device's L2 holds 50 MiB"):
        rec = timed(FlushingTimer(32 * MIB), monkeypatch)
    assert rec.l2 == {"l2_bytes": H100_L2, "flush_bytes": 32 * MIB, "cold": False}
    assert rec.env["l2_cold"] is False
    assert any(n.startswith("L2 not cold between timed calls") for n in rec.notes)
    assert rec.status == "new"  # a note, not a failure


def test_a_flush_the_size_of_the_l2_is_not_cold():
    assert not cold_l2.ColdL2(l2_bytes=H100_L2, flush_bytes=H100_L2).cold
    assert cold_l2.ColdL2(l2_bytes=H100_L2, flush_bytes=H100_L2 + 1).cold


def test_a_timer_without_a_flush_or_a_device_without_an_l2_is_not_checked(monkeypatch):
    class NoFlush(FlushingTimer):
        def __init__(self):
            ScriptedTimer.__init__(self, {"kernel": 1.0, "eager": 2.0})

    assert timed(NoFlush(), monkeypatch).l2 is None
    rec = timed(FlushingTimer(MIB), monkeypatch, l2=None)  # the CPU: no L2 size known
    assert rec.l2 is None and "l2_cold" not in rec.env


def test_the_l2_size_is_the_cuda_device_property(monkeypatch):
    assert cold_l2.device_l2_bytes("cpu") is None
    asked = []

    def props(device):
        asked.append(device)
        return types.SimpleNamespace(L2_cache_size=H100_L2)

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", props)
    assert cold_l2.device_l2_bytes("cuda:1") == H100_L2
    assert asked == [torch.device("cuda:1")]


def test_the_cuda_graph_timer_says_how_much_it_flushes():
    from pytest_fusion.measure.timers import L2_FLUSH_BYTES, CudaGraphTimer

    timer = CudaGraphTimer("cpu")  # its buffer on the CPU: only its size is asked
    assert timer.flush_bytes == L2_FLUSH_BYTES == 256 * MIB
    assert cold_l2.check(timer, "cuda:0", l2_bytes=H100_L2).cold


def test_the_baseline_entry_keeps_the_l2_figures(monkeypatch, tmp_path):
    with pytest.warns(cold_l2.L2NotCold):
        rec = timed(FlushingTimer(32 * MIB), monkeypatch)
    store.save(tmp_path, "dev", [rec])
    entry = store.load(tmp_path / "dev.json")["cases"]["k"]["c"]["float32"]
    assert (entry["env"]["l2_bytes"], entry["env"]["l2_flush_bytes"], entry["env"]["l2_cold"]) == (
        H100_L2, 32 * MIB, False)


CONFTEST = FAKE_TIMER_CONFTEST + textwrap.dedent(
    """
    import pytest_fusion.measure.cold_l2 as cold_l2

    cold_l2.device_l2_bytes = lambda device: 50 << 20  # a fake device's L2 size
    FakeTimer.flush_bytes = 8 << 20  # a GPU-like timer's L2 flush, no larger than that L2
    """
)

KERNEL = textwrap.dedent(
    """
    import pytest, torch

    def reference(x, w):
        return torch.relu(x @ w.t())

    @pytest.mark.fused_kernel(
        reference=reference, inputs={"x": ("M", "K"), "w": ("N", "K")},
        dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)}, dtypes=("float32",), triton=False,
        bench={"small": dict(M=16, K=32, N=32)},
    )
    def test_relu_linear():
        return lambda x, w: torch.mm(x, w.t()).clamp_min_(0)
    """
)


def test_a_bench_run_warns_of_a_flush_that_leaves_the_l2_warm(pytester):
    pytester.makeconftest(CONFTEST)
    pytester.makepyfile(test_kernel=KERNEL)
    set_times(pytester, kernel=1.0, eager=2.0)
    result = pytester.runpytest_subprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                           "--fusion-rounds=5", "--fusion-min-time=0", "-k", "bench",
                                           "-p", "no:randomly", "--fusion-json=records.json")
    result.assert_outcomes(passed=1)
    result.stdout.fnmatch_lines(["*L2NotCold: L2 not cold between timed calls: the timer's flush reads 8 MiB, "
                                 "the device's L2 holds 50 MiB*"])
    (record,) = json.loads((pytester.path / "records.json").read_text())["records"]
    assert record["l2"] == {"l2_bytes": 50 << 20, "flush_bytes": 8 << 20, "cold": False}
