"""Baseline files: format, merge, atomic save, malformed files."""

import json
import os

import pytest

from pytest_fusion import baselines
from pytest_fusion.bench.record import BenchRecord, ProviderResult
from pytest_fusion.spec import FusionUsageError


def record(kernel="tests/test_k.py::test_k", case="c1", dtype="float32", kernel_ms=1.0, eager_ms=2.0):
    k = ProviderResult(kernel_ms, [kernel_ms], kernel_ms, 0.1, None, "fake")
    e = ProviderResult(eager_ms, [eager_ms], eager_ms, 0.1, None, "fake", eager_ms / kernel_ms,
                       eager_ms / kernel_ms * 0.99, eager_ms / kernel_ms * 1.01)
    return BenchRecord(kernel, case, dtype, {"M": 16}, "dev", {"kernel": k, "eager": e}, 30,
                       env={"torch": "2.13.0", "method": "fake"})


def test_slugify():
    assert baselines.slugify("NVIDIA H200") == "nvidia-h200"
    assert baselines.slugify("AMD EPYC 7R13 Processor") == "amd-epyc-7r13-processor"
    assert baselines.slugify("  ") == "unknown-device"


def test_save_creates_directory_and_round_trips(tmp_path):
    d = tmp_path / "no" / "such" / "dir"
    path = baselines.save(d, "dev", [record()])
    assert path == d / "dev.json"
    data = baselines.load(path)
    assert data["schema"] == baselines.SCHEMA_VERSION and data["device"] == "dev"
    sc = baselines.stored_case(data, "tests/test_k.py::test_k", "c1", "float32")
    assert sc.kernel_ms == 1.0
    assert sc.providers["eager"].ms == 2.0 and sc.providers["eager"].speedup == 2.0
    assert sc.env["torch"] == "2.13.0"
    assert baselines.stored_case(data, "tests/test_k.py::test_k", "c1", "float16") is None


def test_save_merges_and_is_sorted_and_stable(tmp_path):
    baselines.save(tmp_path, "dev", [record(case="b"), record(case="a", eager_ms=3.0)])
    baselines.save(tmp_path, "dev", [record(case="b", eager_ms=4.0)])  # re-measure only b
    text = (tmp_path / "dev.json").read_text()
    data = json.loads(text)
    cases = data["cases"]["tests/test_k.py::test_k"]
    assert list(cases) == ["a", "b"]
    assert cases["a"]["float32"]["providers"]["eager"]["ms"] == 3.0  # kept from the first run
    assert cases["b"]["float32"]["providers"]["eager"]["speedup"] == 4.0  # updated
    assert text == baselines.dumps(data)  # canonical: sorted keys, indent 2, newline
    before = text
    baselines.save(tmp_path, "dev", [record(case="b", eager_ms=4.0)])
    assert (tmp_path / "dev.json").read_text() == before  # same numbers, byte-identical file


@pytest.mark.parametrize(
    "content, problem",
    [
        ("{not json", "is not valid JSON"),
        ("[]", "top level must be an object"),
        ('{"schema": 99, "cases": {}}', "schema is 99"),
        ('{"schema": 1}', "'cases' must be an object"),
        ('{"schema": 1, "cases": {"k": {"c": {"float32": {"kernel_ms": -1, "providers": {}}}}}}', "kernel_ms must be a positive number"),
        ('{"schema": 1, "cases": {"k": {"c": {"float32": {"kernel_ms": 1, "providers": {"eager": {"ms": 1}}}}}}}', "needs positive numbers"),
    ],
)
def test_malformed_file_is_a_usage_error_and_never_overwritten(tmp_path, content, problem):
    path = tmp_path / "dev.json"
    path.write_text(content)
    with pytest.raises(FusionUsageError) as exc:
        baselines.load(path)
    assert str(path) in str(exc.value) and problem in str(exc.value)
    with pytest.raises(FusionUsageError):
        baselines.save(tmp_path, "dev", [record()])
    assert path.read_text() == content


def test_save_killed_mid_write_leaves_old_file_intact(tmp_path, monkeypatch):
    baselines.save(tmp_path, "dev", [record(case="old")])
    before = (tmp_path / "dev.json").read_text()

    def killed(src, dst):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        baselines.save(tmp_path, "dev", [record(case="new")])
    assert (tmp_path / "dev.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]  # temp file cleaned up


def test_other_device_files(tmp_path):
    assert baselines.other_device_files(tmp_path / "missing", "dev") == []
    (tmp_path / "nvidia-h200.json").write_text("{}")
    (tmp_path / "dev.json").write_text("{}")
    assert baselines.other_device_files(tmp_path, "dev") == ["nvidia-h200.json"]


def test_current_env_cpu_fields():
    env = baselines.current_env("cpu", "perf_counter")
    assert set(env) == {"device", "capability", "driver", "cuda", "torch", "triton", "method", "date", "commit"}
    import torch

    assert env["torch"] == torch.__version__ and env["method"] == "perf_counter" and env["capability"] is None
