"""Power- and clock-aware timing (pytest_fusion.measure.power): SM clock, power draw
and NVML's throttle state over each bench case's timed rounds, a capped case flagged (not failed),
the power limit in the environment and the gate's note when it differs from the baseline's. NVML
is a fake module throughout: no GPU, no nvidia-ml-py needed."""

import json
import sys
import types

import pytest

import pytest_fusion.measure.power as power
from pytest_fusion import make_spec
from pytest_fusion.baselines import environment, store
from pytest_fusion.measure.record import BenchRecord
from pytest_fusion.bench.timed_case import BenchSettings
from pytest_fusion.bench.api import bench_case

from fakes import bench, write_project

SW_POWER_CAP = 0x4


class FakeNvml(types.ModuleType):
    """The pynvml calls bench.power makes, on one device: a fixed clock and power draw (the 1 s
    average ``power_mw``; with ``instant``, ``nvmlDeviceGetFieldValues`` too, answering the
    instantaneous power field with ``instant``: mW, or an NVML error code as a string), the given
    clock-event reason bits, and a power violation counter growing by ``violation_ns`` per read."""

    def __init__(self, reasons=0, violation_ns=0, limit_mw=700_000, power_mw=650_000, instant=None):
        super().__init__("pynvml")
        self.reasons, self.violation_ns, self.limit_mw, self.power_mw = reasons, violation_ns, limit_mw, power_mw
        if instant is not None:
            self.nvmlDeviceGetFieldValues = lambda handle, ids: [self._field(ids[0], instant)]
        self.counter = {0: 0, 1: 0}
        self.looked_up = []

    def nvmlInit(self):
        pass

    def nvmlDeviceGetHandleByPciBusId(self, bus):
        self.looked_up.append(bus)
        return "handle"

    def nvmlDeviceGetHandleByUUID(self, uuid):
        self.looked_up.append(uuid)
        return "handle"

    def nvmlDeviceGetClockInfo(self, handle, clock):
        return 1980 if self.reasons == 0 else 1410

    def nvmlDeviceGetMaxClockInfo(self, handle, clock):
        return 1980

    def nvmlDeviceGetPowerUsage(self, handle):
        return self.power_mw

    @staticmethod
    def _field(field_id, instant):
        assert field_id == 186  # nvml.h's NVML_FI_DEV_POWER_INSTANT
        error = int(instant) if isinstance(instant, str) else 0  # 3: NVML_ERROR_NOT_SUPPORTED
        value = types.SimpleNamespace(uiVal=0 if error else instant, dVal=0.0)
        return types.SimpleNamespace(fieldId=field_id, nvmlReturn=error, valueType=1, value=value)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        return self.limit_mw

    def nvmlSystemGetDriverVersion(self):
        return "570.124.06"

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        return self.reasons

    def nvmlDeviceGetViolationStatus(self, handle, policy):
        if policy == power.NVML_PERF_POLICY_POWER:
            self.counter[policy] += self.violation_ns
        return types.SimpleNamespace(referenceTime=0, violationTime=self.counter[policy])


@pytest.fixture(autouse=True)
def fresh_nvml(monkeypatch):
    """bench.power finds each device once per process: every test starts with nothing found."""
    monkeypatch.setattr(power, "_found", {})
    monkeypatch.setattr(power, "_initialized", [])


def use_fake(monkeypatch, fake):
    """``fake`` as the pynvml module, and torch's device ids without a GPU."""
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    monkeypatch.setattr(power, "_torch_ids", lambda device: ("00000000:19:00.0", "GPU-0a1b"))


def test_torch_device_maps_to_nvml_by_pci_bus_id_then_uuid(monkeypatch):
    import torch

    props = types.SimpleNamespace(pci_domain_id=0, pci_bus_id=0x19, pci_device_id=0, uuid="0a1b")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert power._torch_ids("cuda:1") == ("00000000:19:00.0", "GPU-0a1b")
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: types.SimpleNamespace(uuid="0a1b"))
    assert power._torch_ids("cuda:1") == (None, "GPU-0a1b")  # a torch without pci_*_id

    fake = FakeNvml()
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert isinstance(power.nvml_device("cuda:1"), power.NvmlDevice)
    assert fake.looked_up == ["GPU-0a1b"]


def test_without_pynvml_or_on_a_cpu_nothing_is_recorded_and_nothing_fails(monkeypatch):
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    result = power.open_monitor("cuda:0").result()
    assert result == {"recorded": False, "why": f"nvidia-ml-py is not installed ({power.INSTALL_HINT})"}
    assert power.device_env("cuda:0") == {}
    assert power.open_monitor("cpu").result() == {"recorded": False, "why": "not a CUDA device"}
    assert power.marker(result) == "" and power.capped_note(result) is None


def test_capped_span_is_flagged_and_clean_one_is_not(monkeypatch):
    use_fake(monkeypatch, FakeNvml(reasons=SW_POWER_CAP, violation_ns=5_000_000))
    with power.open_monitor("cuda:0") as span:
        span.tick()
    capped = span.result()
    assert capped["recorded"] and capped["capped"] == ["power"]
    assert capped["reasons"] == {"SW power cap": 1.0}
    assert capped["power_violation_ms"] == 5.0 and capped["thermal_violation_ms"] == 0.0
    assert capped["sm_clock_min_mhz"] == 1410 and capped["power_max_w"] == 650.0
    assert power.marker(capped) == "power-capped"
    assert "power-capped during timing (SW power cap in 100% of samples; power violation 5.0 ms" in (
        power.capped_note(capped) or "")

    monkeypatch.setattr(power, "_found", {})
    use_fake(monkeypatch, FakeNvml())
    with power.open_monitor("cuda:0") as span:
        pass
    clean = span.result()
    assert clean["recorded"] and clean["capped"] == [] and clean["reasons"] == {}
    assert power.marker(clean) == "" and power.capped_note(clean) is None


@pytest.mark.parametrize("instant, watts, source", [
    (None, 290.0, "1 s average"),  # an NVML without the field
    ("3", 290.0, "1 s average"),  # the field not supported on this device
    (690_000, 690.0, "instant"),
])
def test_power_is_the_instantaneous_reading_where_nvml_has_one(monkeypatch, instant, watts, source):
    # The 1 s average reads low over a short span the power cap held down (docs/timing-and-gate.md, "Power and clocks")
    use_fake(monkeypatch, FakeNvml(reasons=SW_POWER_CAP, violation_ns=1_000_000, power_mw=290_000,
                                   instant=instant))
    with power.open_monitor("cuda:0") as span:
        pass
    result = span.result()
    assert result["power_max_w"] == watts and result["power_mean_w"] == watts
    assert result["power_source"] == source
    note = power.capped_note(result) or ""
    assert f"SM clock median 1410 MHz, down to 1410 MHz, up to {watts} W" in note
    assert ("(1 s average)" in note) == (source != "instant")


def test_violation_counter_alone_flags_a_cap_the_samples_missed(monkeypatch):
    use_fake(monkeypatch, FakeNvml(reasons=0, violation_ns=2_000_000))
    with power.open_monitor("cuda:0") as span:
        pass
    assert span.result()["capped"] == ["power"]


def test_environment_reads_limit_clock_and_driver(monkeypatch):
    use_fake(monkeypatch, FakeNvml(limit_mw=600_000))
    assert power.device_env("cuda:0") == {"power_limit_w": 600.0, "sm_clock_max_mhz": 1980,
                                          "driver": "570.124.06"}


def json_records(pytester):
    return [BenchRecord.from_dict(d) for d in json.loads((pytester.path / "r.json").read_text())["records"]]


def test_power_capped_round_flags_the_case_in_record_and_summary(pytester, monkeypatch):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    fake = FakeNvml(reasons=SW_POWER_CAP, violation_ns=3_000_000)
    monkeypatch.setattr(power, "nvml_device", lambda device: power.NvmlDevice(fake, "handle"))
    result = bench(pytester, "--fusion-json=r.json")
    result.assert_outcomes(passed=1)  # flagged, not failed
    result.stdout.fnmatch_lines(["*small*float32*new (power-capped)*",
                                 "*note small-float32: power-capped during timing (SW power cap*"])
    (rec,) = json_records(pytester)
    assert rec.power is not None and rec.power["capped"] == ["power"] and rec.power["samples"] >= 2


def test_clean_run_is_not_flagged_and_cpu_run_says_not_recorded(pytester, monkeypatch, cpu_only):
    write_project(pytester, times={"kernel": 1.0, "eager": 2.0})
    result = bench(pytester, "--fusion-json=r.json")  # the CPU, no NVML: nothing recorded
    result.assert_outcomes(passed=1)
    assert "capped" not in result.stdout.str()
    (rec,) = json_records(pytester)
    assert rec.power == {"recorded": False, "why": "not a CUDA device"}

    fake = FakeNvml()
    monkeypatch.setattr(power, "nvml_device", lambda device: power.NvmlDevice(fake, "handle"))
    result = bench(pytester, "--fusion-json=r.json")
    result.assert_outcomes(passed=1)
    assert "capped" not in result.stdout.str()
    (rec,) = json_records(pytester)
    assert rec.power is not None and rec.power["recorded"] and rec.power["capped"] == []


OLD_ENTRY_ENV = {"device": "NVIDIA H200", "capability": "9.0", "driver": "570.124.06", "cuda": "12.8",
                 "torch": "2.11.0", "triton": "3.6.0", "method": "fake", "date": "2026-11-30", "commit": None}


def gate_against_file(tmp_path, stored_env, env):
    """A case benched on the CPU with a fake timer and judged against a baseline file whose entry
    has ``stored_env``, with this run's environment ``env``."""
    entry = {"kernel_ms": 1.0, "dims": {"M": 4, "K": 4, "N": 4}, "env": stored_env,
             "providers": {"eager": {"ms": 2.0, "speedup": 2.0, "low": 2.0, "high": 2.0}}}
    path = tmp_path / "nvidia-h200.json"
    path.write_text(json.dumps({"schema": 2, "device": "nvidia-h200", "cases": {"k": {"c": {"float32": entry}}}}))
    stored = store.stored_case(store.load(path), kernel="k", case="c", dtype="float32")
    spec = make_spec(lambda x, w: x @ w.t(), inputs={"x": ("M", "K"), "w": ("N", "K")},
                     dims={"M": (1, 8), "K": (1, 8), "N": (1, 8)}, dtypes=("float32",), triton=False,
                     bench={"c": dict(M=4, K=4, N=4)})

    class Fake:
        method = "fake"

        def sync(self):
            pass

        def peak_memory(self, name, fn):
            return None

        def prepare(self, name, fn):
            return lambda: 1.0 if name == "kernel" else 2.0

    settings = BenchSettings(rounds=3, warmup=0, min_time_s=0.0, providers=("eager",))
    return bench_case(spec, lambda x, w: x @ w.t(), "c", "float32", stored=stored, settings=settings,
                      kernel_id="k", timer=Fake(), env=env, device="cpu")


def test_gate_notes_a_power_limit_that_differs_from_the_baselines(tmp_path):
    now = {**OLD_ENTRY_ENV, "power_limit_w": 600.0, "sm_clock_max_mhz": 1980}
    rec = gate_against_file(tmp_path, {**OLD_ENTRY_ENV, "power_limit_w": 700.0, "sm_clock_max_mhz": 1980}, now)
    assert rec.status == "pass"  # a note, not a failure
    assert "baseline environment differs: power_limit_w 700.0 -> 600.0" in rec.notes


def test_old_baseline_without_power_fields_loads_and_gates(tmp_path):
    now = {**OLD_ENTRY_ENV, "power_limit_w": 700.0, "sm_clock_max_mhz": 1980}
    rec = gate_against_file(tmp_path, OLD_ENTRY_ENV, now)
    assert rec.status == "pass" and rec.env["power_limit_w"] == 700.0
    assert not [n for n in rec.notes if "environment differs" in n]


def test_cuda_environment_has_the_power_limit_only_when_nvml_read_it(monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device: (9, 0))
    monkeypatch.setattr("pytest_fusion.baselines.environment.device_name", lambda device: "NVIDIA H200")
    use_fake(monkeypatch, FakeNvml(limit_mw=700_000))
    env = environment.current_env("cuda:0", "cuda-graph")
    assert (env["power_limit_w"], env["sm_clock_max_mhz"], env["driver"]) == (700.0, 1980, "570.124.06")

    monkeypatch.setattr(power, "_found", {})
    monkeypatch.setitem(sys.modules, "pynvml", None)
    env = environment.current_env("cuda:0", "cuda-graph")
    assert "power_limit_w" not in env and "sm_clock_max_mhz" not in env and env["capability"] == "9.0"
