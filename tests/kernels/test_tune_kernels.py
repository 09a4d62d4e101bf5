"""The tuner (``python3 -m reference_kernels.tune``), imported as a package: ``--resume`` refuses a run it cannot finish faithfully (the table
it writes must hold only checked configs, measured by the code and versions that checked them);
the benchmark-mode ranking of the longest keys; ``--cases`` with ``--base-table``, which re-times
some keys and keeps the table's other picks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from reference_kernels.tuning.tuner import cases, cli, correctness, sweep, table

META = {"torch": "2.11.0", "triton": "3.6.0", "device": "NVIDIA H200", "argv": ["tune_kernels.py"]}
CONFIGS = {"linear": ["a", "b"], "gated": ["c"]}
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # on the CPU the plugin turned the interpreter on


def run(correctness=None, configs=CONFIGS, **meta):
    rows = correctness if correctness is not None else [
        {"kernel": k, "config": i, "ok": True} for k, names in CONFIGS.items() for i in range(len(names))]
    return {"meta": {**META, **meta}, "configs": configs, "correctness": rows, "timing": [], "picks": {}}


def test_a_checked_run_of_the_same_code_resumes():
    assert correctness.resume_refusal(run(), META, CONFIGS) is None


@pytest.mark.parametrize("field", ["torch", "triton", "device"])
def test_other_versions_or_device_are_refused(field):
    why = correctness.resume_refusal(run(**{field: "other"}), META, CONFIGS)
    assert why is not None and field in why and "other" in why


@pytest.mark.parametrize("configs", [{"linear": ["a", "x"], "gated": ["c"]}, None])
def test_other_or_unrecorded_config_lists_are_refused(configs):
    # check rows name configs by index: under another list they would name other configs
    assert "other configs" in correctness.resume_refusal(run(configs=configs), META, CONFIGS)


def test_a_run_cut_in_its_check_is_refused():
    rows = [{"kernel": "linear", "config": 0, "ok": True}]
    why = correctness.resume_refusal(run(correctness=rows), META, CONFIGS)
    assert why == "its check did not finish: no rows for linear:b, gated:c"


def test_a_run_that_skipped_its_check_may_resume_without_rows():
    skipped = run(correctness=[], argv=["tune_kernels.py", "--skip-check"])
    assert correctness.resume_refusal(skipped, META, CONFIGS) is None


def test_a_run_of_some_cases_is_refused():
    why = correctness.resume_refusal(run(base_table={"path": "t.json"}), META, CONFIGS)
    assert why is not None and "--cases" in why


def _matmul(x, w, activation):
    return torch.nn.functional.linear(x, w)


def _slow(x, w, activation):  # the same result, 8 times the work
    for _ in range(7):
        torch.nn.functional.linear(x, w)
    return torch.nn.functional.linear(x, w)


def test_benchmark_mode_ranking_gives_each_kernels_speedup_over_eager():
    from pytest_fusion.measure.timers import CpuTimer

    x, w = torch.randn(64, 256), torch.randn(256, 256)
    # The plugin's default rounds and time floor (about 1000 rounds here), not smoke's 3 a pass: on a
    # loaded 2-core CI machine a median of 6 samples once put the same matmul at 8x eager's time.
    sp = sweep.time_benchmark_mode({"slow": _slow, "same": _matmul}, _matmul, (x, w), {"activation": "none"},
                                          CpuTimer(clock="process"), passes=2, compile_ok=False)
    assert list(sp) == ["slow", "same"]
    assert sp["slow"].speedup < 0.5 < sp["same"].speedup  # 8x the work: about 0.125
    assert sp["slow"].low <= sp["slow"].speedup <= sp["slow"].high


def test_other_ranking_regimes_are_refused():
    # a run cut under other regimes (say, before benchmark-mode ranking) would mix rankings
    why = correctness.resume_refusal(run(regimes={"bench_top": 0}), {**META, "regimes": {"bench_top": 4}}, CONFIGS)
    assert why is not None and "regimes" in why


@pytest.mark.parametrize("argv, message", [
    (["--cases", "^gpt2-M1$"], "--cases and --base-table go together"),
    (["--cases", "^gpt2-M1$", "--base-table", "t.json", "--resume", "r.json"], "--cases cannot resume"),
    (["--bench-passes", "0"], "--bench-passes must be >= 1"),
])
def test_bad_argument_combinations_are_refused(monkeypatch, capsys, argv, message):
    monkeypatch.setattr("sys.argv", ["tune_kernels.py", *argv])
    with pytest.raises(SystemExit):
        cli.main()
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("cases, message", [("(", "not a regular expression"), ("^no-such-case$", "matches no sweep case")])
def test_a_cases_regex_that_selects_nothing_is_refused(cases, message):
    with pytest.raises(SystemExit, match=message):
        table.case_names(False, cases)


def test_an_unanchored_cases_regex_matches_every_case_it_contains():
    assert table.case_names(False, "^llama3-8b-M1$") == ["llama3-8b-M1"]
    assert "llama3-8b-M16" in table.case_names(False, "llama3-8b-M1")


def test_a_base_table_of_another_device_is_refused():
    assert table.base_table_refusal({"device": "NVIDIA H200"}, "NVIDIA H200") is None
    why = table.base_table_refusal({"device": "NVIDIA H200"}, "NVIDIA H100 80GB HBM3")
    assert "NVIDIA H200" in why and "H100" in why


def test_only_picks_set_by_the_re_timed_cases_are_replaceable():
    base = {"a": {"config": "x", "case": "llama3-8b-M1"}, "b": {"config": "y", "case": "llama3-8b-M16"},
            "c": {"config": "z"}}
    assert table.replaceable_keys(base, ["llama3-8b-M16"]) == {"b"}


def test_the_check_of_some_cases_covers_their_candidates_only():
    from reference_kernels.gemm import configs as C
    from reference_kernels.gemm import targets

    decode = cases.selected_configs(False, ["bfloat16"], {"llama3-8b-M1"}, targets.HOPPER)
    assert decode and {k for k, _ in decode} == {"gated"}
    assert all(C.GATED_CONFIGS[i].kwargs["BLOCK_M"] == 16 for _, i in decode)
    assert cases.selected_configs(False, ["bfloat16"], set(), targets.HOPPER) == set()


def test_a_base_table_that_is_not_a_table_is_refused(tmp_path):
    bad = tmp_path / "t.json"
    bad.write_text(json.dumps({"picks": {"gated/float16/M16/N128/K64/tma": "16x64x128-w4-s4"}}))
    with pytest.raises(SystemExit, match=r"--base-table .*t\.json: not a tuned table"):
        table.load_base_table(str(bad))
    bad.write_text("{")
    with pytest.raises(SystemExit, match="not a tuned table"):
        table.load_base_table(str(bad))


def test_a_benchmark_mode_failure_keeps_the_back_to_back_ranking(tmp_path, monkeypatch):
    def broken(*args, **kwargs):
        raise RuntimeError("graph capture failed")

    monkeypatch.setattr(sweep, "time_benchmark_mode", broken)
    rec = sweep.Recorder(str(tmp_path / "tune.json"))
    sweep.run_sweep(rec, DEVICE, True, ("float16",), sustained_ms=0.0, sustained_s=0.01,
                           cases={"llama3-8b-M1"}, bench_top=2, bench_passes=1, compile_ok=False)
    (row,) = rec.data["timing"]
    assert row["regime"] == "sustained" and "benchmark_mode" not in row
    assert row["errors"]["benchmark mode"] == "RuntimeError: graph capture failed"
    assert rec.data["picks"][row["key"]]["config"] == min((n for n in row["ms"] if n != "eager"), key=row["ms"].get)


@pytest.mark.parametrize("replaceable", [True, False])
def test_a_re_timed_case_replaces_only_a_base_tables_pick(tmp_path, replaceable):
    """The smoke sweep (interpreter, tiny dims) of one decode case, ranked in all three regimes
    (--sustained-ms 0): its key's pick is replaced when it came from a base table, kept when an
    earlier case of the run (or of the run it resumes) set it; other keys are never touched."""
    from reference_kernels.tuning.pick import table_key

    key = table_key("gated", torch.float16, 1, 80, 48, True)  # llama3-8b-M1 at smoke dims
    other = "linear/float16/M8192/N4096/K1024/tma"
    rec = sweep.Recorder(str(tmp_path / "tune.json"))
    rec.data["picks"] = {key: {"config": "stale"}, other: {"config": "kept"}}
    sweep.run_sweep(rec, DEVICE, True, ("float16",), sustained_ms=0.0, sustained_s=0.01,
                           cases={"llama3-8b-M1"}, replaceable={key, other} if replaceable else set(),
                           bench_top=2, bench_passes=1, compile_ok=False)
    assert rec.data["errors"] == []
    (row,) = rec.data["timing"]
    assert row["key"] == key and row["regime"] == "benchmark"
    assert len(row["benchmark_mode"]) == 2 and row["best"] in row["benchmark_mode"]
    assert rec.data["picks"][other] == {"config": "kept"}
    if replaceable:
        pick = rec.data["picks"][key]
        assert pick["config"] == row["best"] and pick["regime"] == "benchmark"
        # its times are benchmark mode's, the regime that decided
        assert pick["ms"] == row["benchmark_mode"][row["best"]]["kernel_ms"]
        assert pick["eager_ms"] == row["benchmark_mode"][row["best"]]["eager_ms"]
    else:
        assert rec.data["picks"][key] == {"config": "stale"}


def test_the_tuner_is_a_module_with_a_python_m_entry():
    import importlib.util
    import os
    import subprocess
    import sys

    assert importlib.util.find_spec("reference_kernels.tune") is not None
    assert cli.main.__module__ == "reference_kernels.tuning.tuner.cli"
    # the documented command itself, in a fresh process: it parses its arguments and prints its usage
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = str(Path(__file__).resolve().parents[2])  # this checkout's packages, whatever is installed
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
    run = subprocess.run([sys.executable, "-m", "reference_kernels.tune", "--help"], capture_output=True,
                         text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "--from-cache" in run.stdout and "Check every config of the reference kernels" in run.stdout
    # its interleaved ranking is the plugin's round loop (bench.timing.measure), not a copy of it
    assert not hasattr(sweep, "time_interleaved")
