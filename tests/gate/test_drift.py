"""Accuracy drift (pytest_fusion.gate.drift): a bench case's use of its error budget is
recorded, stored with the speedups, and gated against the stored figure."""

import json
import textwrap

import pytest

from pytest_fusion.baselines import store
from pytest_fusion.gate.drift import DRIFT_FACTOR, DRIFT_FLOOR, UNSTORED_NOTE, Accuracy, drift_verdict, usage

from fakes import FAKE_TIMER_CONFTEST, assert_malformed_entry_field_refused

# The kernel adds ERROR x mean|golden| to every element: 1e-6 uses about 0.10 of the float32
# budget at this case, 2e-6 about 0.21 (twice as much, still inside it), 1e-5 falls outside.
DRIFT_TEST = textwrap.dedent(
    """
    import os
    import pytest, torch

    def reference(x, w):
        return x @ w.t()

    def kernel(x, w):
        g = x.double() @ w.double().t()
        return (g + float(os.environ.get("ERROR", "1e-6")) * g.abs().mean()).to(x.dtype)

    @pytest.mark.fused_kernel(
        reference=reference,
        inputs={"x": ("M", "K"), "w": ("N", "K")},
        dims={"M": (1, 64), "K": (1, 64), "N": (1, 64)},
        dtypes=("float32",),
        triton=False,
        bench={"small": dict(M=16, K=32, N=32)},
    )
    def test_linear():
        return kernel
    """
)
KEY = ("test_drift_kernel.py::test_linear", "small", "float32")


@pytest.fixture
def project(pytester):
    pytester.makeconftest(FAKE_TIMER_CONFTEST)
    pytester.makepyfile(test_drift_kernel=DRIFT_TEST)
    (pytester.path / "times.json").write_text(json.dumps({"kernel": 1.0, "eager": 2.0}))
    return pytester


def bench(pytester, monkeypatch, error, *args):
    monkeypatch.setenv("ERROR", str(error))
    return pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                        "-k", "bench", "-p", "no:randomly", *args)


def stored_file(pytester):
    (path,) = (pytester.path / "baselines").glob("*.json")
    return path


def entry(pytester):
    kernel, case, dtype = KEY
    return json.loads(stored_file(pytester).read_text())["cases"][kernel][case][dtype]


def test_a_kernel_whose_error_doubles_inside_the_budget_fails_after_saving_the_accurate_one(project, monkeypatch):
    bench(project, monkeypatch, 1e-6, "--fusion-save").assert_outcomes(passed=1)
    acc = entry(project)["accuracy"]
    assert 0.05 < acc["budget_used"] < 0.2 and acc["ulps"] > 0

    bench(project, monkeypatch, 1e-6).assert_outcomes(passed=1)  # unchanged kernel: passes

    result = bench(project, monkeypatch, 2e-6, "--fusion-replay=on")  # twice the error, inside the budget
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines([
        f"*accuracy drift: the kernel used 0.2? of its error budget, 2.?x the stored {acc['budget_used']:.2f}*"
    ])
    result.stdout.no_fnmatch_line("*replayed in a fresh process*")  # drift is the same in any process: not replayed


def test_an_entry_saved_without_the_figure_is_gated_on_speed_alone_with_one_note(project, monkeypatch):
    bench(project, monkeypatch, 1e-6, "--fusion-save").assert_outcomes(passed=1)
    path = stored_file(project)
    data = json.loads(path.read_text())
    kernel, case, dtype = KEY
    del data["cases"][kernel][case][dtype]["accuracy"]  # as saved before the figure existed
    path.write_text(json.dumps(data))

    result = bench(project, monkeypatch, 4e-6)  # 4x the error: not judged without a figure
    result.assert_outcomes(passed=1)
    assert result.stdout.str().count(UNSTORED_NOTE) == 1

    (project.path / "times.json").write_text(json.dumps({"kernel": 2.0, "eager": 2.0}))
    result = bench(project, monkeypatch, 1e-6)  # the speed gate still holds
    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["*speedup over eager 1.000*"])


def test_the_figure_round_trips_through_save_and_load(tmp_path):
    from fakes import record

    rec = record()
    rec.accuracy = {"budget_used": 0.123456789, "ulps": 6.5}
    path = store.save(tmp_path, "dev", [rec])
    stored = store.stored_case(store.load(path), kernel=rec.kernel, case=rec.case, dtype=rec.dtype)
    assert stored is not None and stored.accuracy == {"budget_used": 0.12346, "ulps": 6.5}

    store.save(tmp_path, "dev", [record()])  # a re-save that did not measure it keeps the stored figure
    stored = store.stored_case(store.load(path), kernel=rec.kernel, case=rec.case, dtype=rec.dtype)
    assert stored is not None and stored.accuracy == {"budget_used": 0.12346, "ulps": 6.5}


@pytest.mark.parametrize("bad", [{"budget_used": -1}, {"ulps": 1.0}, {"budget_used": "x"}, [0.1]])
def test_a_malformed_figure_is_refused_naming_it_and_the_file_is_kept(tmp_path, bad):
    assert_malformed_entry_field_refused(tmp_path, "accuracy", bad)


class _Cmp:
    def __init__(self, abs_error, budget, ulps):
        self.abs_error, self.budget, self.ulps = abs_error, budget, ulps


def test_usage_is_the_worst_output_and_skips_exact_integer_outputs():
    acc = usage([_Cmp(1.0, 10.0, 2.0), _Cmp(3.0, 10.0, 1.0), _Cmp(None, 0.0, None)])
    assert acc == Accuracy(0.3, 2.0)
    assert usage([_Cmp(None, 0.0, None)]) is None


def test_drift_rule_factor_floor_and_notes():
    stored = Accuracy(0.2, 1.0)
    assert drift_verdict(Accuracy(0.2, 1.0), stored=stored) == ([], [])
    reasons, notes = drift_verdict(Accuracy(0.2 * DRIFT_FACTOR * 1.01, 2.0), stored=stored)
    assert reasons and reasons[0].startswith("accuracy drift: the kernel used") and not notes
    reasons, notes = drift_verdict(Accuracy(0.2 * DRIFT_FACTOR * 0.99), stored=stored)
    assert not reasons and notes[0].startswith("accuracy: the kernel used")
    # a stored figure below the floor is judged against the floor
    assert drift_verdict(Accuracy(DRIFT_FLOOR * DRIFT_FACTOR * 0.99), stored=Accuracy(0.0))[0] == []
    reasons, _ = drift_verdict(Accuracy(DRIFT_FLOOR * DRIFT_FACTOR * 1.01), stored=Accuracy(0.0))
    assert reasons and f"taken as the floor {DRIFT_FLOOR:g}" in reasons[0]
    assert drift_verdict(Accuracy(0.5), stored=None) == ([], [UNSTORED_NOTE])
    assert drift_verdict(None, stored=stored) == ([], [])
