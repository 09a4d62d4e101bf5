"""Speedup statistics and the interleaved measurement loop."""

import numpy as np
import pytest

from pytest_fusion.measure import stats, timing
from pytest_fusion.measure import timers

from fakes import ScriptedTimer


def test_speedup_point_is_ratio_of_medians():
    k = [1.0, 1.1, 0.9, 1.0, 5.0]  # one outlier
    p = [2.0, 2.0, 2.2, 1.8, 2.0]
    s = stats.speedup_interval(k, p)
    assert s.speedup == pytest.approx(np.median(p) / np.median(k))
    assert s.low <= s.speedup <= s.high
    assert s.kernel_ms == 1.0 and s.provider_ms == 2.0


def test_interval_is_seeded_and_narrows_with_rounds():
    rng = np.random.default_rng(1)
    def series(n):
        k = 1.0 + 0.05 * rng.standard_normal(n)
        return k, 2.0 * (1.0 + 0.05 * rng.standard_normal(n))
    k, p = series(20)
    assert stats.speedup_interval(k, p) == stats.speedup_interval(k, p)
    wide = stats.speedup_interval(k, p).rel_width
    k4, p4 = series(320)
    assert stats.speedup_interval(k4, p4).rel_width < wide / 2


def test_identical_samples_give_zero_width():
    s = stats.speedup_interval([1.0] * 10, [3.0] * 10)
    assert (s.speedup, s.low, s.high, s.rel_width) == (3.0, 3.0, 3.0, 0.0)


@pytest.mark.parametrize("k, p", [([], []), ([1.0], [1.0, 2.0]), ([0.0], [1.0]), ([float("nan")], [1.0])])
def test_bad_series(k, p):
    with pytest.raises(ValueError):
        stats.speedup_interval(k, p)


def test_throughput_units():
    assert stats.tflops(2e12, 1000.0) == pytest.approx(2.0)  # 2 TFLOP in 1 s
    assert stats.gbps(1e9, 1.0) == pytest.approx(1000.0)     # 1 GB in 1 ms


class RecordingTimer:
    method = "recording"

    def __init__(self):
        self.order = []

    def sync(self):
        pass

    def peak_memory(self, name, fn):
        return 123

    def prepare(self, name, fn):
        def run():
            fn()
            self.order.append(name)
            return {"kernel": 1.0, "eager": 2.0, "compile": 3.0}[name]
        return run


def test_measure_interleaves_and_rotates():
    calls = {"kernel": 0, "eager": 0, "compile": 0}

    def counter(name):
        def f():
            calls[name] += 1
        return f

    t = RecordingTimer()
    out = timing.measure({n: counter(n) for n in calls}, t, rounds=3, warmup=2, host_calls=1)
    assert t.order == ["kernel", "eager", "compile", "eager", "compile", "kernel", "compile", "kernel", "eager"]
    assert out["eager"].samples_ms == [2.0] * 3 and out["kernel"].method == "recording"
    assert out["kernel"].peak_bytes == 123
    # cold start 1 + warm-up 2 + host 1 + timed 3 calls each
    assert calls == {"kernel": 7, "eager": 7, "compile": 7}


def test_measure_uses_given_cold_start():
    out = timing.measure({"kernel": lambda: None}, RecordingTimer(), rounds=1, warmup=0,
                         cold_start={"kernel": 12.5})
    assert out["kernel"].cold_start_s == 12.5


def test_cpu_timer_measures_real_work():
    import time

    timer = timers.CpuTimer()
    run = timer.prepare("sleep", lambda: time.sleep(0.002))
    assert 1.9 <= run() < 20.0  # ms
    with pytest.raises(ValueError):
        timing.measure({"k": lambda: None}, timer, rounds=0, warmup=0)


def rounds_run(ms, **kw):
    out = timing.measure({n: (lambda: None) for n in ms}, ScriptedTimer(ms), warmup=0, host_calls=1, **kw)
    lengths = {len(t.samples_ms) for t in out.values()}
    assert len(lengths) == 1  # every provider gets the same number of samples
    return lengths.pop()


def test_time_floor_adds_rounds_until_each_provider_has_min_time():
    one_ms = {"kernel": 1.0, "eager": 1.0}
    assert rounds_run(one_ms, rounds=10, min_time_s=0.05) == 50      # 50 x 1 ms
    assert rounds_run(one_ms, rounds=10, min_time_s=0.05, max_rounds=20) == 20
    assert rounds_run(one_ms, rounds=10, min_time_s=0.0) == 10
    assert rounds_run(one_ms, rounds=80, min_time_s=0.05) == 80      # rounds stays the minimum
    # The slowest provider to reach the floor decides: 0.25 ms needs 200 rounds, 2 ms only 25.
    assert rounds_run({"kernel": 0.25, "eager": 2.0}, rounds=10, min_time_s=0.05) == 200
    assert rounds_run({"kernel": 1.0}, rounds=3, min_time_s=0.05, max_rounds=timing.DEFAULT_MAX_ROUNDS) == 50


def test_rounds_past_the_minimum_keep_rotating():
    t = ScriptedTimer({"kernel": 1.0, "eager": 1.0, "compile": 1.0})
    timing.measure({n: (lambda: None) for n in t.times}, t, rounds=1, warmup=0, host_calls=1, min_time_s=0.003)
    assert t.order == ["kernel", "eager", "compile", "eager", "compile", "kernel", "compile", "kernel", "eager"]


@pytest.mark.parametrize("kw, message", [
    (dict(min_time_s=-0.01), "min_time_s"),
    (dict(min_time_s=float("nan")), "min_time_s"),
    (dict(min_time_s=float("inf")), "min_time_s"),
    (dict(rounds=30, max_rounds=20), "max_rounds"),
])
def test_bad_time_floor_arguments(kw, message):
    args = dict(rounds=5, warmup=0)
    args.update(kw)
    with pytest.raises(ValueError, match=message):
        timing.measure({"k": lambda: None}, ScriptedTimer({"k": 1.0}), **args)
