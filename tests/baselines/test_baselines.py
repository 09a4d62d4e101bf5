"""Baseline files: format, merge, atomic save, malformed files, links and modes."""

import dataclasses
import json
import os
import stat

import pytest

from pytest_fusion.baselines import store
from pytest_fusion.baselines import environment, schema
from pytest_fusion.machine import devices
from pytest_fusion.measure.record import BenchRecord, ProviderResult
from pytest_fusion.declare.spec import FusionUsageError


def record(kernel="tests/test_k.py::test_k", case="c1", dtype="float32", kernel_ms=1.0, eager_ms=2.0):
    k = ProviderResult(kernel_ms, [kernel_ms], kernel_ms, 0.1, None, "fake")
    e = ProviderResult(eager_ms, [eager_ms], eager_ms, 0.1, None, "fake", eager_ms / kernel_ms,
                       eager_ms / kernel_ms * 0.99, eager_ms / kernel_ms * 1.01)
    return BenchRecord(kernel, case, dtype, {"M": 16}, "dev", {"kernel": k, "eager": e}, 30,
                       env={"torch": "2.13.0", "method": "fake"})


def test_slugify():
    assert devices.slugify("NVIDIA H200") == "nvidia-h200"
    assert devices.slugify("AMD EPYC 7R13 Processor") == "amd-epyc-7r13-processor"
    assert devices.slugify("  ") == "unknown-device"


def cpuinfo(model_name, family, model, stepping, vendor="AuthenticAMD", processors=2):
    """A /proc/cpuinfo text of ``processors`` identical x86 blocks."""
    block = (f"processor\t: {{i}}\nvendor_id\t: {vendor}\ncpu family\t: {family}\nmodel\t\t: {model}\n"
             f"model name\t: {model_name}\nstepping\t: {stepping}\ncpu MHz\t\t: 2600.000\n"
             f"flags\t\t: fpu vme de pse\npower management:\n")
    return "\n".join(block.format(i=i) for i in range(processors))


EPYC_MILAN = cpuinfo("AMD EPYC", 25, 1, 1)  # two cloud VMs' CPUs that name themselves alike
EPYC_GENOA = cpuinfo("AMD EPYC", 25, 17, 0)
ARM_NEOVERSE = ("processor\t: 0\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\n"
                "CPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n"
                "processor\t: 1\nCPU implementer\t: 0x41\nCPU variant\t: 0x1\nCPU part\t: 0xd40\n"
                "CPU revision\t: 0\n")


def test_cpu_slug_tells_machines_of_one_model_name_apart():
    milan = devices.cpu_slug(EPYC_MILAN, cpus=8)
    assert milan == "amd-epyc-25-1-1-8cpu"
    assert devices.cpu_slug(EPYC_GENOA, cpus=8) == "amd-epyc-25-17-0-8cpu"
    assert devices.cpu_slug(EPYC_MILAN, cpus=2) == "amd-epyc-25-1-1-2cpu"  # a smaller VM of the same part
    assert devices.cpu_slug(EPYC_MILAN, cpus=8) == milan
    assert devices.legacy_slug(devices.cpu_model(EPYC_MILAN)) == "amd-epyc"  # the name they shared


def test_cpu_slug_vendor_trademarks_and_other_platforms(monkeypatch):
    xeon = cpuinfo("Intel(R) Xeon(R) Platinum 8488C", 6, 143, 8, vendor="GenuineIntel")
    assert devices.cpu_slug(xeon, cpus=2) == "intel-xeon-platinum-8488c-6-143-8-2cpu"
    assert devices.cpu_model(xeon) == "Intel(R) Xeon(R) Platinum 8488C"  # the human name keeps its marks
    qemu = cpuinfo("QEMU Virtual CPU version 2.5+", 15, 107, 1)  # the name holds no vendor: added
    assert devices.cpu_slug(qemu, cpus=4) == "qemu-virtual-cpu-version-2-5-amd-15-107-1-4cpu"
    monkeypatch.setattr("platform.processor", lambda: "")
    monkeypatch.setattr("platform.machine", lambda: "aarch64")
    assert devices.cpu_slug(ARM_NEOVERSE, cpus=64) == "aarch64-41-d0c-3-1-64cpu"  # the first processor's ids
    assert devices.cpu_slug("", cpus=4) == "aarch64-4cpu"  # no cpuinfo, no model name
    monkeypatch.setattr("platform.processor", lambda: "arm")
    assert devices.cpu_slug("", cpus=10, machine="arm64") == "arm-arm64-10cpu"
    assert devices.cpu_slug("", cpus=10, machine="ARM") == "arm-10cpu"  # the name already says it


def test_device_slug_of_the_cpu_reads_this_machine_and_a_gpus_is_its_name(tmp_path, monkeypatch):
    import torch

    fake = tmp_path / "cpuinfo"
    fake.write_text(EPYC_GENOA)
    monkeypatch.setattr("pytest_fusion.machine.devices.CPUINFO", str(fake))
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.setattr("os.cpu_count", lambda: 4)
    assert devices.device_slug("cpu") == "amd-epyc-25-17-0-4cpu"
    assert devices.device_slug("cpu") == "amd-epyc-25-17-0-4cpu"  # the same machine, the same file
    assert devices.device_name("cpu") == "AMD EPYC"
    names = {0: "NVIDIA H200", 1: "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device: names[device.index or 0])
    assert devices.device_slug("cuda") == "nvidia-h200"  # the committed baselines/nvidia-h200.json
    assert devices.device_slug("cuda:1") == "nvidia-h100-80gb-hbm3"


def test_legacy_file_is_the_bare_model_name_file_when_it_differs(tmp_path):
    assert store.legacy_file(tmp_path, "amd-epyc-25-1-1-8cpu", name="AMD EPYC") is None  # no such file
    (tmp_path / "amd-epyc.json").write_text("{}")
    assert store.legacy_file(tmp_path, "amd-epyc-25-1-1-8cpu", name="AMD EPYC") == tmp_path / "amd-epyc.json"
    assert store.legacy_file(tmp_path / "missing", "amd-epyc-25-1-1-8cpu", name="AMD EPYC") is None
    (tmp_path / "nvidia-h200.json").write_text("{}")
    assert store.legacy_file(tmp_path, "nvidia-h200", name="NVIDIA H200") is None  # a GPU's slug is its name's


def test_save_creates_directory_and_round_trips(tmp_path):
    d = tmp_path / "no" / "such" / "dir"
    path = store.save(d, "dev", [record()])
    assert path == d / "dev.json"
    data = store.load(path)
    assert data["schema"] == schema.SCHEMA_VERSION and data["device"] == "dev"
    sc = store.stored_case(data, kernel="tests/test_k.py::test_k", case="c1", dtype="float32")
    assert sc.kernel_ms == 1.0
    assert sc.providers["eager"].ms == 2.0 and sc.providers["eager"].speedup == 2.0
    assert sc.env["torch"] == "2.13.0" and sc.dims == {"M": 16}
    assert store.stored_case(data, kernel="tests/test_k.py::test_k", case="c1", dtype="float16") is None


def test_save_merges_and_is_sorted_and_stable(tmp_path):
    store.save(tmp_path, "dev", [record(case="b"), record(case="a", eager_ms=3.0)])
    store.save(tmp_path, "dev", [record(case="b", eager_ms=4.0)])  # re-measure only b
    text = (tmp_path / "dev.json").read_text()
    data = json.loads(text)
    cases = data["cases"]["tests/test_k.py::test_k"]
    assert list(cases) == ["a", "b"]
    assert cases["a"]["float32"]["providers"]["eager"]["ms"] == 3.0  # kept from the first run
    assert cases["b"]["float32"]["providers"]["eager"]["speedup"] == 4.0  # updated
    assert text == schema.dumps(data)  # canonical: sorted keys, indent 2, newline
    before = text
    store.save(tmp_path, "dev", [record(case="b", eager_ms=4.0)])
    assert (tmp_path / "dev.json").read_text() == before  # same numbers, byte-identical file


def test_a_re_save_keeps_other_providers_only_from_the_same_environment(tmp_path):
    first = record(eager_ms=3.0)
    both = dataclasses.replace(first, providers={**first.providers, "unfused": first.providers["eager"]},
                               env={"torch": "2.13.0", "method": "perf_counter"})
    store.save(tmp_path, "dev", [both])  # wall clock, eager and unfused
    again = dataclasses.replace(record(eager_ms=4.0), env={"torch": "2.13.0", "method": "perf_counter"})
    store.save(tmp_path, "dev", [again])  # same clock, eager only: unfused kept
    entry = store.load(tmp_path / "dev.json")["cases"]["tests/test_k.py::test_k"]["c1"]["float32"]
    assert set(entry["providers"]) == {"eager", "unfused"}
    other = dataclasses.replace(record(eager_ms=4.0), env={"torch": "2.13.0", "method": "process_time"})
    store.save(tmp_path, "dev", [other])  # another clock: the wall-clock unfused is not kept
    entry = store.load(tmp_path / "dev.json")["cases"]["tests/test_k.py::test_k"]["c1"]["float32"]
    assert set(entry["providers"]) == {"eager"} and entry["env"]["method"] == "process_time"


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
        store.load(path)
    assert str(path) in str(exc.value) and problem in str(exc.value)
    with pytest.raises(FusionUsageError):
        store.save(tmp_path, "dev", [record()])
    assert path.read_text() == content


def valid_file_text(tmp_path):
    """Text of a file that save() wrote, for tests that break one field of it."""
    path = store.save(tmp_path / "src", "dev", [record()])
    return json.loads(path.read_text())


def entry(data):
    return data["cases"]["tests/test_k.py::test_k"]["c1"]["float32"]


@pytest.mark.parametrize(
    "field, value, problem",
    [
        ("env", [1, 2, 3], ".env must be an object of strings, numbers or null, got [1, 2, 3]"),
        ("env", {"torch": {"nested": 1}}, ".env must be an object"),
        ("dims", {"M": 999.5}, ".dims must be an object of sizes"),
        ("dims", [16], ".dims must be an object of sizes"),
        ("kernel_ms", "1.0", ".kernel_ms must be a positive number, got '1.0'"),
        ("providers", [], ".providers must be an object"),
        ("eager.low", "x", ".providers['eager'].low must be a positive number or null, got 'x'"),
        ("eager.high", -1, ".providers['eager'].high must be a positive number or null, got -1"),
        ("eager.speedup", True, "needs positive numbers 'ms' and 'speedup'"),
        ("eager.low", 3.0, "has low 3.0 > high"),
        ("entry", [1], "cases['tests/test_k.py::test_k']['c1']['float32'] must be an object, got list"),
    ],
)
def test_malformed_entry_field_names_the_field_and_is_never_overwritten(tmp_path, field, value, problem):
    data = valid_file_text(tmp_path)
    if field == "entry":
        data["cases"]["tests/test_k.py::test_k"]["c1"]["float32"] = value
    elif field.startswith("eager."):
        entry(data)["providers"]["eager"][field.split(".", 1)[1]] = value
    else:
        entry(data)[field] = value
    path = tmp_path / "dev.json"
    content = json.dumps(data)
    path.write_text(content)
    with pytest.raises(FusionUsageError) as exc:
        store.load(path)
    message = str(exc.value)
    assert message.startswith(f"baseline file {path}: cases['tests/test_k.py::test_k']['c1']['float32']")
    assert problem in message and message.endswith("(fix or delete it; it was not changed)")
    with pytest.raises(FusionUsageError):
        store.save(tmp_path, "dev", [record()])
    assert path.read_text() == content


def test_optional_entry_fields_may_be_absent_or_null(tmp_path):
    data = valid_file_text(tmp_path)
    del entry(data)["dims"]
    entry(data)["env"] = None
    entry(data)["providers"]["eager"]["low"] = None
    path = tmp_path / "dev.json"
    path.write_text(json.dumps(data))
    sc = store.stored_case(store.load(path), kernel="tests/test_k.py::test_k", case="c1", dtype="float32")
    assert sc.dims is None and sc.env == {}


@pytest.mark.parametrize("device", ["nvidia-h200", None, 7])
def test_device_other_than_the_files_slug_is_refused(tmp_path, device):
    data = valid_file_text(tmp_path)
    data["device"] = device
    if device is None:
        del data["device"]
    path = tmp_path / "amd-epyc.json"
    content = json.dumps(data)
    path.write_text(content)
    with pytest.raises(FusionUsageError) as exc:
        store.load(path)
    assert f"baseline file {path}: 'device' is {device!r} but this file holds baselines for 'amd-epyc'" in str(exc.value)
    with pytest.raises(FusionUsageError):
        store.save(tmp_path, "amd-epyc", [record()])
    assert path.read_text() == content


def test_a_file_renamed_without_its_device_says_what_to_set(tmp_path):
    data = valid_file_text(tmp_path)
    data["device"] = "amd-epyc"  # git mv'd from the model-name slug, "device" left as it was
    path = tmp_path / "amd-epyc-25-1-1-8cpu.json"
    path.write_text(json.dumps(data))
    with pytest.raises(FusionUsageError, match="renamed to this device's name on purpose needs its 'device' "
                                               "set to 'amd-epyc-25-1-1-8cpu'"):
        store.load(path)
    data["device"] = "amd-epyc-25-1-1-8cpu"
    path.write_text(json.dumps(data))
    assert store.load(path)["cases"] == data["cases"]


def test_load_error_does_not_chain_the_json_error(tmp_path):
    path = tmp_path / "dev.json"
    path.write_text("{not json")
    with pytest.raises(FusionUsageError) as exc:
        store.load(path)
    # Chained, pytest prints the JSON error and then this message again.
    assert exc.value.__cause__ is None and exc.value.__suppress_context__


def test_save_keeps_an_existing_files_mode(tmp_path):
    path = store.save(tmp_path, "dev", [record(case="a")])
    os.chmod(path, 0o640)
    store.save(tmp_path, "dev", [record(case="b")])
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o640
    assert sorted(json.loads(path.read_text())["cases"]["tests/test_k.py::test_k"]) == ["a", "b"]


@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002], ids=oct)
def test_new_file_gets_the_default_mode(tmp_path, umask):
    old = os.umask(umask)
    try:
        path = store.save(tmp_path, "dev", [record()])
        assert os.umask(umask) == umask  # save put the umask back
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~umask


def test_save_writes_through_a_symlink_and_keeps_it(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    target = shared / "real.json"
    store.save(tmp_path / "scratch", "dev", [record(case="a")])
    target.write_text((tmp_path / "scratch" / "dev.json").read_text())
    os.chmod(target, 0o644)
    link_dir = tmp_path / "baselines"
    link_dir.mkdir()
    (link_dir / "dev.json").symlink_to(target)

    path = store.save(link_dir, "dev", [record(case="b")])
    assert path == link_dir / "dev.json"
    assert path.is_symlink() and os.readlink(path) == str(target)  # the link itself is kept
    assert sorted(json.loads(target.read_text())["cases"]["tests/test_k.py::test_k"]) == ["a", "b"]
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o644
    assert sorted(p.name for p in shared.iterdir()) == ["real.json"]  # the temp file was renamed there
    assert sorted(p.name for p in link_dir.iterdir()) == ["dev.json"]


def test_save_killed_mid_write_leaves_old_file_intact(tmp_path, monkeypatch):
    store.save(tmp_path, "dev", [record(case="old")])
    before = (tmp_path / "dev.json").read_text()

    def killed(src, dst):
        raise KeyboardInterrupt("killed between write and rename")

    monkeypatch.setattr(os, "replace", killed)
    with pytest.raises(KeyboardInterrupt):
        store.save(tmp_path, "dev", [record(case="new")])
    assert (tmp_path / "dev.json").read_text() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dev.json"]  # temp file cleaned up


def test_other_device_files(tmp_path):
    assert store.other_device_files(tmp_path / "missing", "dev") == []
    (tmp_path / "nvidia-h200.json").write_text("{}")
    (tmp_path / "dev.json").write_text("{}")
    assert store.other_device_files(tmp_path, "dev") == ["nvidia-h200.json"]


def test_current_env_cpu_fields():
    env = environment.current_env("cpu", "perf_counter")
    assert set(env) == {"device", "capability", "driver", "cuda", "torch", "triton", "method", "date", "commit"}
    import torch

    assert env["torch"] == torch.__version__ and env["method"] == "perf_counter" and env["capability"] is None


def test_env_commit_says_dirty_when_tracked_files_differ_from_head(tmp_path):
    import shutil
    import subprocess

    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(tmp_path)]
    subprocess.run(git[:5] + ["init", "-q", str(tmp_path)], check=True)
    (tmp_path / "k.py").write_text("a = 1\n")
    subprocess.run(git + ["add", "k.py"], check=True)
    subprocess.run(git + ["commit", "-qm", "k"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    assert environment.current_env("cpu", "perf_counter", rootdir=str(tmp_path))["commit"] == head
    (tmp_path / "untracked.txt").write_text("not part of the code\n")
    assert environment.current_env("cpu", "perf_counter", rootdir=str(tmp_path))["commit"] == head
    # re-saving a tracked baseline (or deleting it first) is not a code change
    (tmp_path / "baselines").mkdir()
    (tmp_path / "baselines" / "dev.json").write_text("{}\n")
    subprocess.run(git + ["add", "baselines"], check=True)
    subprocess.run(git + ["commit", "-qm", "b"], check=True)
    head = subprocess.run(git + ["rev-parse", "--short=12", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()
    (tmp_path / "baselines" / "dev.json").unlink()
    env = environment.current_env("cpu", "perf_counter", rootdir=str(tmp_path), baseline_dir=str(tmp_path / "baselines"))
    assert env["commit"] == head
    (tmp_path / "k.py").write_text("a = 2\n")
    env = environment.current_env("cpu", "perf_counter", rootdir=str(tmp_path), baseline_dir=str(tmp_path / "baselines"))
    assert env["commit"] == head + "+dirty"
