"""bench_scripts/tune_kernels.py --resume refuses a run it cannot finish faithfully: the table it
writes must hold only checked configs, measured by the code and versions that checked them."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

_spec = importlib.util.spec_from_file_location(
    "tune_kernels", Path(__file__).parent.parent / "bench_scripts" / "tune_kernels.py")
tune_kernels = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tune_kernels)

META = {"torch": "2.11.0", "triton": "3.6.0", "device": "NVIDIA H200", "argv": ["tune_kernels.py"]}
CONFIGS = {"linear": ["a", "b"], "gated": ["c"]}


def run(correctness=None, configs=CONFIGS, **meta):
    rows = correctness if correctness is not None else [
        {"kernel": k, "config": i, "ok": True} for k, names in CONFIGS.items() for i in range(len(names))]
    return {"meta": {**META, **meta}, "configs": configs, "correctness": rows, "timing": [], "picks": {}}


def test_a_checked_run_of_the_same_code_resumes():
    assert tune_kernels.resume_refusal(run(), META, CONFIGS) is None


@pytest.mark.parametrize("field", ["torch", "triton", "device"])
def test_other_versions_or_device_are_refused(field):
    why = tune_kernels.resume_refusal(run(**{field: "other"}), META, CONFIGS)
    assert why is not None and field in why and "other" in why


@pytest.mark.parametrize("configs", [{"linear": ["a", "x"], "gated": ["c"]}, None])
def test_other_or_unrecorded_config_lists_are_refused(configs):
    # check rows name configs by index: under another list they would name other configs
    assert "other configs" in tune_kernels.resume_refusal(run(configs=configs), META, CONFIGS)


def test_a_run_cut_in_its_check_is_refused():
    rows = [{"kernel": "linear", "config": 0, "ok": True}]
    why = tune_kernels.resume_refusal(run(correctness=rows), META, CONFIGS)
    assert why == "its check did not finish: no rows for linear:b, gated:c"


def test_a_run_that_skipped_its_check_may_resume_without_rows():
    skipped = run(correctness=[], argv=["tune_kernels.py", "--skip-check"])
    assert tune_kernels.resume_refusal(skipped, META, CONFIGS) is None
