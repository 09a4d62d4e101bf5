"""The gate rule at its edges (pure functions, no timing)."""

import dataclasses
import math

import pytest

import pytest_fusion
from pytest_fusion.gate import rule as gate
from pytest_fusion.measure.record import BenchRecord, ProviderResult
from pytest_fusion.measure.stats import Speedup
from pytest_fusion.measure.timers import GRAPH_METHOD, SYNC_METHOD
from pytest_fusion.gate.comparable import StoredCase, StoredProvider
from pytest_fusion.gate.rule import CaseGate, verdict

TOL = 0.05


def stored(speedup=2.0, kernel_ms=1.0, env=None, dims=None):
    return StoredCase(kernel_ms=kernel_ms, providers={"eager": StoredProvider(kernel_ms * speedup, speedup)},
                      env=env or {}, dims=dims)


def measured(speedup, kernel_ms=1.0, width=0.0):
    return {"eager": Speedup(speedup, speedup * (1 - width / 2), speedup * (1 + width / 2), kernel_ms, kernel_ms * speedup)}


def test_threshold_formula():
    assert gate.threshold(2.0, 0.05) == pytest.approx(1.9)
    assert gate.threshold(1.0, 0.0) == 1.0


@pytest.mark.parametrize(
    "factor, status",
    [
        (1.0, "pass"),            # unchanged
        (1 - TOL, "pass"),        # exactly at the threshold passes
        (1 - TOL + 1e-6, "pass"),  # just above
        (1 - TOL - 1e-6, "fail"),  # just below
        (0.5, "fail"),
        (1.5, "pass"),            # faster than stored never fails
    ],
)
def test_rule_edges(factor, status):
    v = verdict(measured(2.0 * factor, kernel_ms=1.0 / factor), stored(2.0), tolerance=TOL)
    assert v.status == status, v


def test_zero_tolerance_fails_any_drop():
    assert verdict(measured(2.0), stored(2.0), tolerance=0.0).status == "pass"
    assert verdict(measured(2.0 * (1 - 1e-6)), stored(2.0), tolerance=0.0).status == "fail"


def test_below_threshold_at_the_edge():
    # 1.1 x (1 - 0.1) rounds to 0.9900000000000001: a speedup of 0.99 is at the threshold, not below it.
    limit = gate.threshold(1.1, 0.1)
    assert 0.99 < limit and not gate.below_threshold(0.99, limit)
    assert not gate.below_threshold(limit, limit)
    assert gate.below_threshold(0.99 * (1 - 1e-6), limit)
    # The rules that compare against a threshold all use it: the verdict and the wholly-below interval.
    m = {"eager": Speedup(0.99, 0.99, 0.99, 1.0, 0.99)}
    at_edge = StoredCase(kernel_ms=1.0, providers={"eager": StoredProvider(1.1, 1.1)})
    assert verdict(m, at_edge, tolerance=0.1).status == "pass"
    assert not gate.wholly_below(m["eager"], limit)


def test_kernel_slower_is_blamed_on_the_kernel_with_both_times():
    # eager unchanged at 2 ms, kernel 1.0 -> 1.1 ms
    m = {"eager": Speedup(2.0 / 1.1, 1.8, 1.82, 1.1, 2.0)}
    v = verdict(m, stored(2.0), tolerance=TOL)
    assert v.failed
    (reason,) = v.reasons
    assert "the kernel got slower" in reason
    assert "kernel 1.1 ms (was 1 ms, +10.0%)" in reason
    assert "eager 2 ms (was 2 ms, +0.0%)" in reason


def test_baseline_faster_is_blamed_on_the_baseline():
    # kernel unchanged at 1 ms, eager 2.0 -> 1.8 ms
    m = {"eager": Speedup(1.8, 1.79, 1.81, 1.0, 1.8)}
    v = verdict(m, stored(2.0), tolerance=TOL)
    assert v.failed
    assert "the baseline (eager) got faster" in v.reasons[0]
    assert "eager 1.8 ms (was 2 ms, -10.0%)" in v.reasons[0]
    # one provider: absolute times decided, and they move with the machine, so a re-save waits
    assert "judged from absolute times, which move with the machine's speed between runs: rule out a " \
           "slower kernel before re-saving" in v.reasons[0]


def test_a_width_just_over_the_tolerance_reads_over_it():
    # 5.04% wide against 5%: at one decimal both read 5.0%, "5.0% wide > tolerance 5.0%".
    (reason,) = gate.noise_reasons(measured(2.0, width=0.0504), ["eager"], TOL)
    assert "is 5.04% wide > tolerance 5.00%" in reason
    (reason,) = gate.noise_reasons(measured(2.0, width=0.06), ["eager"], TOL)
    assert "is 6.0% wide > tolerance 5.0%" in reason


def test_noise_reasons_and_noisy_verdict():
    m = measured(2.0, width=0.06)  # 6% wide > 5%
    reasons = gate.noise_reasons(m, ["eager"], TOL, rounds=120)
    assert len(reasons) == 1 and "too noisy to judge" in reasons[0] and "after 120 rounds" in reasons[0]
    assert gate.noise_reasons(measured(2.0, width=0.04), ["eager"], TOL) == []
    # a noisy case fails even though its point estimate would pass: never fail open
    v = verdict(m, stored(2.0), tolerance=TOL, noisy=reasons)
    assert v.failed and v.reasons == tuple(reasons)


def test_interval_exactly_tolerance_wide_is_judgeable():
    s = Speedup(2.0, 1.95, 2.05, 1.0, 2.0)  # width 0.1 / 2.0 = 5%
    assert s.rel_width == pytest.approx(0.05)
    assert gate.noise_reasons({"eager": s}, ["eager"], 0.05 + 1e-12) == []


def test_new_case_passes_unless_strict():
    v = verdict(measured(2.0), None, tolerance=TOL, where="baselines/x.json")
    assert v.status == "new" and not v.failed and "baselines/x.json" in v.notes[0]
    v = verdict(measured(2.0), None, tolerance=TOL, strict=True, where="baselines/x.json")
    assert v.failed and "--fusion-strict" in v.reasons[0]


def test_min_speedup_floor_whatever_the_baseline():
    v = verdict(measured(1.2), stored(1.2), tolerance=TOL, min_speedup={"eager": 1.5})
    assert v.failed and "below min_speedup 1.500" in v.reasons[0]
    assert verdict(measured(1.5), None, tolerance=TOL, min_speedup={"eager": 1.5}).status == "new"
    with pytest.raises(ValueError, match="not timed"):
        verdict(measured(1.5), None, tolerance=TOL, min_speedup={"liger": 1.0})


def test_env_differences_are_noted_not_failed():
    v = verdict(measured(2.0), stored(2.0, env={"torch": "2.11.0", "triton": "3.6.0", "date": "x"}),
              tolerance=TOL, env={"torch": "2.13.0", "triton": "3.6.0", "date": "y"})
    assert v.status == "pass"
    assert v.notes == ("baseline environment differs: torch 2.11.0 -> 2.13.0",)


@pytest.mark.parametrize("bad", [-0.01, 1.0, 2, math.nan])
def test_bad_tolerance(bad):
    # Checked where a tolerance enters the gate: a case's gate, which the bench and judge build.
    with pytest.raises(ValueError, match="tolerance"):
        CaseGate(stored(2.0), bad)
    record = BenchRecord("k", "c", "float32", {}, "dev", {"kernel": ProviderResult(1.0, [1.0], 1.0, 0.0, None, "m"),
                                                           "eager": ProviderResult(2.0, [2.0], 2.0, 0.0, None, "m", 2.0)},
                         rounds=1)
    with pytest.raises(ValueError, match="tolerance"):
        pytest_fusion.judge(record, stored(2.0), tolerance=bad)


def two_providers(eager_speedup=2.0, compile_speedup=1.5):
    return StoredCase(kernel_ms=1.0, providers={"eager": StoredProvider(eager_speedup, eager_speedup),
                                                "compile": StoredProvider(compile_speedup, compile_speedup)})


def test_with_two_providers_a_slower_kernel_lowers_every_speedup():
    # kernel 1.0 -> 1.2 ms, providers unchanged
    m = {"eager": Speedup(2.0 / 1.2, 1.66, 1.67, 1.2, 2.0), "compile": Speedup(1.5 / 1.2, 1.24, 1.26, 1.2, 1.5)}
    v = verdict(m, two_providers(), tolerance=TOL)
    assert len(v.reasons) == 2
    assert all("the kernel got slower (the speedups over every provider fell)" in r for r in v.reasons)


def test_with_two_providers_one_faster_baseline_is_blamed_despite_machine_drift():
    # The whole machine ran 8% slower (kernel 1.0 -> 1.08 ms, compile 1.5 -> 1.62 ms) while eager
    # got faster (2.0 -> 1.94 ms): absolute times alone would blame the kernel.
    m = {"eager": Speedup(1.94 / 1.08, 1.79, 1.80, 1.08, 1.94), "compile": Speedup(1.5, 1.49, 1.51, 1.08, 1.62)}
    v = verdict(m, two_providers(), tolerance=TOL)
    (reason,) = v.reasons
    assert "the baseline (eager) got faster (the speedups over the other providers held)" in reason
    assert "kernel 1.08 ms (was 1 ms, +8.0%), eager 1.94 ms (was 2 ms, -3.0%)" in reason
    assert "the kernel got slower" in gate.blame("eager", m["eager"], two_providers())  # one-provider rule


def test_a_provider_kept_from_an_older_save_is_judged_against_its_own_kernel_time():
    # eager re-saved alone with the kernel at 1.5 ms; compile kept, timed against 1.0 ms (2.1 / 2.1).
    kept = StoredCase(kernel_ms=1.5, providers={"eager": StoredProvider(2.0, 2.0 / 1.5),
                                                "compile": StoredProvider(2.1, 2.1)})
    assert gate.older_pairing(kept.providers["compile"], kept)
    assert not gate.older_pairing(kept.providers["eager"], kept)
    # compile 29% faster, the kernel back at 1.0 ms: eager's speedup rose, so "others held" would
    # say nothing; judged against 1.0 ms the baseline got faster, and the message says both times.
    m = {"eager": Speedup(2.0, 1.99, 2.01, 1.0, 2.0), "compile": Speedup(1.5, 1.49, 1.51, 1.0, 1.5)}
    (reason,) = verdict(m, kept, tolerance=TOL).reasons
    assert ("the baseline (compile) got faster (judged from absolute times: the stored speedup over compile "
            "was measured against the kernel at 1 ms, and a later save that did not time compile kept it "
            "beside its own kernel time, 1.5 ms; absolute times move with the machine's speed between runs: "
            "rule out a slower kernel before re-saving): kernel 1 ms (was 1 ms, +0.0%), "
            "compile 1.5 ms (was 2.1 ms, -28.6%)") in reason


def test_new_case_too_noisy_to_record_says_so_instead_of_promising_a_save():
    v = verdict(measured(2.0), None, tolerance=TOL, where="baselines/x.json", recordable=False)
    assert v.status == "new"
    assert v.notes == ("new case: no baseline in baselines/x.json; too noisy for --fusion-save to record it",)


def test_changed_dims_fail_naming_both_and_asking_for_a_re_save():
    # Same case name, same speedup: compared, it would pass; it must not be compared at all.
    v = verdict(measured(2.0), stored(2.0, dims={"M": 999, "K": 64}), tolerance=TOL, dims={"M": 1, "K": 64})
    assert v.failed
    (reason,) = v.reasons
    assert "measured at dims {K=64, M=999} but this case now runs at {K=64, M=1}" in reason
    assert "not compared" in reason and "re-save it with --fusion-save" in reason
    # A slower kernel at the new shape is not blamed against the old shape's numbers.
    v = verdict(measured(1.0, kernel_ms=2.0), stored(2.0, dims={"M": 999}), tolerance=TOL, dims={"M": 1})
    assert len(v.reasons) == 1 and "the kernel got slower" not in v.reasons[0]


def test_a_dim_added_or_dropped_is_a_change():
    assert verdict(measured(2.0), stored(2.0, dims={"M": 1}), tolerance=TOL, dims={"M": 1, "N": 8}).failed
    assert verdict(measured(2.0), stored(2.0, dims={"M": 1, "N": 8}), tolerance=TOL, dims={"M": 1}).failed


def test_same_dims_or_unknown_dims_are_compared_as_before():
    assert verdict(measured(2.0), stored(2.0, dims={"M": 1, "K": 8}), tolerance=TOL, dims={"K": 8, "M": 1}).status == "pass"
    assert verdict(measured(2.0), stored(2.0, dims=None), tolerance=TOL, dims={"M": 1}).status == "pass"  # old entry
    assert verdict(measured(2.0), stored(2.0, dims={"M": 1}), tolerance=TOL).status == "pass"  # caller gave none
    assert verdict(measured(1.0), stored(2.0, dims={"M": 1}), tolerance=TOL, dims={"M": 1}).failed  # still gated


def test_floor_still_applies_when_dims_changed():
    v = verdict(measured(1.2), stored(1.2, dims={"M": 2}), tolerance=TOL, dims={"M": 1}, min_speedup={"eager": 1.5})
    assert len(v.reasons) == 2 and "below min_speedup 1.500" in v.reasons[0] and "re-save" in v.reasons[1]


def test_stored_interval_low_end_sets_the_threshold():
    then = StoredProvider(2.0, 2.0, low=1.9, high=2.1)
    assert gate.stored_threshold(then, TOL) == pytest.approx(1.9 * 0.95)
    assert gate.stored_threshold(StoredProvider(2.0, 2.0), TOL) == pytest.approx(1.9)  # no interval stored
    case = StoredCase(kernel_ms=1.0, providers={"eager": then})
    assert verdict(measured(1.85), case, tolerance=TOL).status == "pass"  # 1.85 >= 1.805
    v = verdict(measured(1.80), case, tolerance=TOL)
    assert v.status == "fail" and "< 1.805 = stored interval's low end 1.900 (speedup 2.000) x (1 - 0.05)" in v.reasons[0]


def test_interval_wholly_below_threshold_is_a_slowdown_even_when_noisy():
    m = measured(1.0, kernel_ms=2.0, width=0.3)  # [0.85, 1.15]: 30% wide, all of it < 1.9
    assert gate.wholly_below(m["eager"], 1.9)
    v = verdict(m, stored(2.0), tolerance=TOL, noisy=[])
    assert v.status == "fail" and "the kernel got slower" in v.reasons[0]
    # judge still fails a straddling provider on noise and reports the wholly-below one as slower
    noisy = gate.noise_reasons(measured(1.9, width=0.3), ["eager"], TOL)
    assert not gate.wholly_below(measured(1.9, width=0.3)["eager"], 1.9) and noisy


def first(m, entry, floors=None, method=None, **gated):
    """Why the first measurement ``m`` is measured again (None: it is not), as the bench asks the gate."""
    return gate.needs_remeasure(CaseGate(entry, TOL, min_speedup=floors or {}, **gated).apply(m, method=method))


def test_needs_remeasure_before_any_failure():
    assert not first(measured(2.0), stored(2.0))
    assert first(measured(1.8), stored(2.0))  # below the threshold
    assert first(measured(2.0, width=0.2), stored(2.0))  # too wide
    assert first(measured(1.2), None, {"eager": 1.5})  # below a floor
    assert not first(measured(1.2), None)  # new case, quiet
    # the reason, for the record's note
    assert "< min_speedup 1.5" in first(measured(1.2), None, {"eager": 1.5})
    assert "95% interval" in first(measured(2.0, width=0.2), stored(2.0))
    assert "speedup over eager 1.800 < threshold" in first(measured(1.8), stored(2.0))


@pytest.mark.parametrize("factor", [1.0, 1 - TOL, 1 - TOL - 1e-6, 0.5, 1.5])
@pytest.mark.parametrize("width", [0.0, 0.04, 0.06, 0.3])
@pytest.mark.parametrize("floor", [None, 1.5])
def test_the_re_measure_decision_agrees_with_the_verdict(factor, width, floor):
    # Measured again exactly when the verdict fails on timing or an interval is too wide to save.
    floors = {"eager": floor} if floor else {}
    for entry in (stored(2.0), stored(2.0, dims={"M": 8}), stored(2.0, env={"method": SYNC_METHOD}), None):
        case = CaseGate(entry, TOL, min_speedup=floors, dims={"M": 4}).apply(
            measured(2.0 * factor, kernel_ms=1.0 / factor, width=width), method=GRAPH_METHOD)
        on_timing = case.verdict.failed and (case.verdict.timing_only or bool(floor and 2.0 * factor < floor))
        assert bool(gate.needs_remeasure(case)) == (on_timing or case.noisy), (entry, case)


def test_an_entry_that_cannot_judge_the_case_sends_it_to_no_re_measure_for_its_thresholds():
    # Another shape's or another timer's speedups: the verdict does not hold the case to them, nor does the decision.
    assert first(measured(1.0), stored(2.0, dims={"M": 8}), dims={"M": 4}) is None
    assert first(measured(1.0), stored(2.0, env={"method": SYNC_METHOD}), method=GRAPH_METHOD) is None
    assert first(measured(1.0), stored(2.0, dims={"M": 4}), dims={"M": 4}) is not None


def test_an_interval_wholly_below_a_threshold_the_verdict_does_not_apply_is_noise():
    # 30% wide, wholly below 1.9: against a comparable entry a slowdown, against another shape's only noise,
    # which a re-measure may narrow and which --fusion-save must refuse.
    wide = measured(1.0, kernel_ms=2.0, width=0.3)
    slower = CaseGate(stored(2.0, dims={"M": 4}), TOL, dims={"M": 4}).apply(wide, method=None)
    assert "the kernel got slower" in slower.verdict.reasons[0] and not slower.too_wide
    for entry, at in ((stored(2.0, dims={"M": 8}), None), (stored(2.0, env={"method": SYNC_METHOD}), GRAPH_METHOD)):
        other = CaseGate(entry, TOL, dims={"M": 4}).apply(wide, method=at)
        assert other.noisy and other.too_wide and "too noisy to judge" in other.verdict.reasons[0]


def test_another_timing_method_is_not_comparable_and_missing_means_cuda_graph():
    v = verdict(measured(2.0), stored(2.0, env={"method": GRAPH_METHOD}), tolerance=TOL, method=SYNC_METHOD)
    assert v.status == "fail" and v.reasons[0].startswith(
        f"not comparable: the baseline entry was timed by {GRAPH_METHOD}, this run by {SYNC_METHOD}")
    assert verdict(measured(2.0), stored(2.0, env={}), tolerance=TOL, method="cuda-graph").status == "pass"
    assert verdict(measured(2.0), stored(2.0, env={}), tolerance=TOL, method="perf_counter").status == "fail"


def test_another_cpu_clock_names_the_option_that_compares_before_a_re_save():
    """A baseline saved with --fusion-cpu-clock=process and gated with the default wall clock: the
    fix is the option, and a re-save would replace a good baseline."""
    for saved_with, clock, run in (("process_time", "process", "perf_counter"), ("perf_counter", "wall", "process_time")):
        v = verdict(measured(2.0), stored(2.0, env={"method": saved_with}), tolerance=TOL, method=run)
        assert v.status == "fail"
        assert v.reasons[0].endswith(
            f"run with --fusion-cpu-clock={clock} to compare against it, or re-save it with --fusion-save")
    # A GPU entry gated on the CPU: no clock option makes them comparable.
    v = verdict(measured(2.0), stored(2.0, env={"method": GRAPH_METHOD}), tolerance=TOL, method="perf_counter")
    assert v.reasons[0].endswith("; re-save it with --fusion-save")


@pytest.mark.parametrize("env", [{"method": "cuda-graph"}, {"method": "cuda-sync"}, {}])
def test_an_entry_timed_with_the_memset_flush_cannot_judge_the_clean_l2_timer(env):
    """The memset flush left the L2 dirty and timed its write-back (docs/timing-and-gate.md, "How it
    is timed"): an entry saved with it (method cuda-graph or cuda-sync, or none: files before the
    method was recorded) is not held against today's timer, in either direction."""
    for method in (GRAPH_METHOD, SYNC_METHOD):
        v = verdict(measured(2.0), stored(2.0, env=env), tolerance=TOL, method=method)
        assert v.status == "fail" and v.reasons[0].startswith("not comparable: the baseline entry was timed by cuda-")
        assert "its L2 flush was a memset" in v.reasons[0] and v.reasons[0].endswith("re-save it with --fusion-save")


def test_far_above_the_stored_speedup_is_listed_for_review():
    assert gate.suspicious(measured(3.9), stored(2.0)) == []
    (line,) = gate.suspicious(measured(4.2), stored(2.0))
    assert line.startswith("review: speedup over eager 4.200 is 2.1x the stored 2.000 (> 2x)")
    assert gate.suspicious(measured(4.2), None) == []


ENV = {"device": "NVIDIA H200", "capability": "9.0", "driver": "580.159.04", "cuda": "13.0",
       "torch": "2.11.0+cu130", "triton": "3.6.0", "method": GRAPH_METHOD}


def minilm_stored():
    """Linear + GELU erf at MiniLM's M=8192, bf16, as an H200 saved it: a slow torch.compile build
    (0.04429 ms) stored, eager's speedup beside it (docs/timing-and-gate.md, "The gate")."""
    return StoredCase(kernel_ms=0.03872, env=ENV, providers={
        "eager": StoredProvider(0.03988, 1.030, 1.028, 1.032),
        "compile": StoredProvider(0.04429, 1.1438, 1.142, 1.1447),
    })


def minilm_run(kernel_ms=0.03843, compile_ms=0.04026, eager_ms=0.03958):
    """The next gate run of the same code (a fast compile build), or a kernel slowed."""
    return {"eager": Speedup(eager_ms / kernel_ms, eager_ms / kernel_ms * 0.999, eager_ms / kernel_ms * 1.001,
                             kernel_ms, eager_ms),
            "compile": Speedup(compile_ms / kernel_ms, compile_ms / kernel_ms * 0.999,
                               compile_ms / kernel_ms * 1.001, kernel_ms, compile_ms)}


def judged(measured_now, stored_case, env=ENV):
    rebased, notes = gate.rebase_builds(stored_case, measured_now, env=env, tolerance=TOL)
    return verdict(measured_now, rebased, tolerance=TOL, env=env), notes


def test_a_faster_compile_build_in_the_same_environment_is_not_a_faster_baseline():
    # Raw, the unchanged kernel fails: 1.048 < 1.142 x 0.95 (the H200 gate run's false failure).
    raw = verdict(minilm_run(), minilm_stored(), tolerance=TOL)
    assert raw.failed and "the baseline (compile) got faster" in raw.reasons[0]
    v, notes = judged(minilm_run(), minilm_stored())
    assert v.status == "pass"
    (note,) = notes
    assert "compile timed 0.04026 ms against 0.04429 ms stored, in the same environment" in note
    assert "re-based onto this run's build (1.040)" in note
    assert "0.03843 ms (was 0.03872 ms, -0.7%)" in note and "1.048 < 1.085 would have failed" in note


def test_re_based_the_kernel_own_time_is_judged_and_a_slower_kernel_still_fails():
    # 10% slower kernel, compile's fast build: eager's speedup falls too, and compile's re-based one.
    v, _ = judged(minilm_run(kernel_ms=0.03872 * 1.10), minilm_stored())
    compile_reason = next(r for r in v.reasons if "speedup over compile" in r)
    assert "= re-based stored interval's low end 1.038 (speedup 1.040) x (1 - 0.05); the kernel got slower (the stored speedup re-based onto this run's faster compile build)" in compile_reason
    assert "compile 0.04026 ms (was 0.04429 ms, -9.1%)" in compile_reason
    # Eager unchanged, kernel 6% slower: only the re-based comparison can see it, and does.
    slower = minilm_run(kernel_ms=0.03872 * 1.06, eager_ms=0.03988 * 1.06)
    v, _ = judged(slower, minilm_stored())
    assert [r for r in v.reasons if "speedup over compile" in r]
    # Kernel 4% slower, inside the tolerance: passes, as it would against an unchanged compile.
    assert judged(minilm_run(kernel_ms=0.03872 * 1.04, eager_ms=0.03988 * 1.04), minilm_stored())[0].status == "pass"


@pytest.mark.parametrize("changed", ["torch", "triton", "cuda", "driver", "device", "capability", "method"])
def test_in_another_environment_a_faster_compile_is_a_faster_baseline(changed):
    env = {**ENV, changed: "other"}
    v, notes = judged(minilm_run(), minilm_stored(), env=env)
    assert v.failed and notes == []
    assert "the baseline (compile) got faster" in v.reasons[0]
    assert f"{changed} {ENV[changed]} -> other" in v.notes[0]
    # An entry that does not record a field is not known to match.
    old = dataclasses.replace(minilm_stored(), env={k: x for k, x in ENV.items() if k != changed})
    assert judged(minilm_run(), old)[0].failed


def test_only_compile_providers_faster_than_stored_are_re_based():
    stored_case = minilm_stored()
    slower_build = minilm_run(compile_ms=0.0450)
    assert gate.rebase_builds(stored_case, slower_build, env=ENV, tolerance=TOL)[0] == stored_case  # stored stays
    rebased, _ = gate.rebase_builds(stored_case, minilm_run(eager_ms=0.035), env=ENV, tolerance=TOL)
    assert rebased.providers["eager"] == stored_case.providers["eager"]  # eager has no builds
    assert rebased.providers["compile"].rebased_ms == 0.04026
    assert rebased.providers["compile"].low == pytest.approx(1.142 * 0.04026 / 0.04429)
    assert gate.rebase_builds(None, minilm_run(), env=ENV, tolerance=TOL) == (None, [])
    assert gate.rebase_builds(stored_case, minilm_run(), env=None, tolerance=TOL) == (stored_case, [])
    cpu = {**ENV, "method": "process_time"}  # one build on the CPU: nothing to re-base onto
    cpu_case = dataclasses.replace(stored_case, env=cpu)
    assert gate.rebase_builds(cpu_case, minilm_run(), env=cpu, tolerance=TOL) == (cpu_case, [])


def test_only_a_failure_on_timing_alone_is_marked_for_a_replay():
    # Timing alone: a slowdown, a floor, noise. Another process can measure these differently.
    assert verdict(measured(1.0), stored(2.0), tolerance=TOL).timing_only
    assert verdict(measured(1.0), None, tolerance=TOL, min_speedup={"eager": 1.5}).timing_only
    assert verdict(measured(2.0, width=0.5), stored(2.0), tolerance=TOL, noisy=["too noisy"]).timing_only
    # Not timing: the same in any process.
    assert not verdict(measured(2.0), stored(2.0), tolerance=TOL).timing_only  # a pass
    assert not verdict(measured(1.0), None, tolerance=TOL, strict=True, min_speedup={"eager": 1.5}).timing_only
    reshaped = verdict(measured(1.0), stored(2.0, dims={"M": 8}), tolerance=TOL, dims={"M": 16})
    assert reshaped.failed and not reshaped.timing_only
    other_method = verdict(measured(1.0), stored(2.0, env={"method": SYNC_METHOD}), tolerance=TOL, method=GRAPH_METHOD)
    assert other_method.failed and not other_method.timing_only
