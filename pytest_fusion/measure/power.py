"""SM clock, power draw and NVML's throttle state over a bench case's timed rounds, and the power
limit, maximum SM clock and driver of the device's environment (NVML through ``pynvml``, the
optional ``nvidia-ml-py`` package: ``pip install "pytest-fusion[nvml]"``).

What a timed span records (:meth:`PowerMonitor.result`, the record's ``power`` field):

- ``sm_clock_min_mhz``/``sm_clock_median_mhz`` and ``power_mean_w``/``power_max_w`` over NVML
  samples taken at the start of the span, after a round whenever :data:`SAMPLE_INTERVAL_S` has
  passed since the last sample, and at its end; ``power_source`` says which reading the watts are
  (:meth:`NvmlDevice.power_w`): ``"instant"``, or ``"1 s average"`` where the device has no
  instantaneous reading;
- ``reasons``: per clock-event (throttle) reason of :data:`REASONS` seen in a sample, the
  fraction of samples that showed it;
- ``power_violation_ms``/``thermal_violation_ms``: growth over the span of NVML's violation
  counters (``nvmlDeviceGetViolationStatus``, ns of clock reduction by the power or thermal
  policy), which cover the whole span, not only the sampled instants;
- ``capped``: the kinds (``power``, ``thermal``, ``slowdown``) that either showed.

Why samples at round boundaries and no polling thread: an NVML query costs no GPU time either
way, but a thread polling every few ms takes the GIL from the thread launching the timed work,
and a case timed by the host clock (``cuda-sync-clean-l2``) would count those stalls. A sample between
rounds is outside every timed span; the violation counters see what falls between samples.

A capped case is flagged (a note and ``power-capped`` beside its verdict), never failed nor
re-measured: a cap is the steady state of a power-bound case on that device (docs/timing-and-gate.md).
Without ``pynvml``, without NVML, or on a CPU, ``result()`` says why nothing was recorded.
"""

from __future__ import annotations

import statistics
import time
from typing import Any, Callable

SAMPLE_INTERVAL_S = 0.01
"""Least seconds between two samples within a span (10 ms): at most ~100 samples per second of
timing, each a handful of NVML queries taken between rounds."""

REASONS = {
    0x4: ("SW power cap", "power"),
    0x80: ("HW power brake slowdown", "power"),
    0x8: ("HW slowdown", "slowdown"),
    0x20: ("SW thermal slowdown", "thermal"),
    0x40: ("HW thermal slowdown", "thermal"),
}
"""nvml.h's clock-event reason bits (``nvmlClocksEventReason*``, the same values as the older
``nvmlClocksThrottleReason*``) that mean the clock was held down: name and kind. HW slowdown is
raised by power brake or temperature, so it is its own kind."""

NVML_FI_DEV_POWER_INSTANT = 186
NVML_VALUE_TYPE_DOUBLE = 0
"""nvml.h's field id of the instantaneous power draw (mW) and the value type read as a double;
every other type of the field's value is an integer."""

NVML_CLOCK_SM = 1
NVML_PERF_POLICY_POWER = 0
NVML_PERF_POLICY_THERMAL = 1
"""nvml.h's ``NVML_CLOCK_SM`` and ``NVML_PERF_POLICY_*`` values."""

INSTALL_HINT = 'pip install "pytest-fusion[nvml]"'


def _read(fn: Callable[..., Any] | None, *args: Any) -> Any:
    """``fn(*args)``, or None when ``fn`` is missing or NVML says it cannot (not supported on
    this device, no permission, an old driver): a query that fails must not fail a bench case."""
    if fn is None:
        return None
    try:
        return fn(*args)
    except Exception:
        return None


Sample = tuple[int | None, float | None, int | None, str | None]
"""One NVML sample: (SM clock MHz, power W, clock-event reason bits, the watts' source), each None
when unreadable (:meth:`NvmlDevice.sample`)."""


class NvmlDevice:
    """One NVML device: its samples, violation counters and limits (each None when unreadable)."""

    def __init__(self, nvml: Any, handle: Any) -> None:
        self.nvml = nvml
        self.handle = handle
        self._reasons = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )

    def sample(self) -> Sample:
        """(SM clock MHz, power W, clock-event reason bits, the power reading's source) now."""
        n, h = self.nvml, self.handle
        mhz = _read(n.nvmlDeviceGetClockInfo, h, NVML_CLOCK_SM)
        watts, source = self.power_w()
        return (None if mhz is None else int(mhz), watts, _read(self._reasons, h), source)

    def power_w(self) -> tuple[float | None, str | None]:
        """(power draw in W, its source). The instantaneous reading (``NVML_FI_DEV_POWER_INSTANT``
        through ``nvmlDeviceGetFieldValues``) where the device gives one: on Ampere (except GA100)
        and newer GPUs ``nvmlDeviceGetPowerUsage`` returns power averaged over the last second
        (the NVML API reference), which over a span of a few tenths of a second mixes in what
        ran before it (docs/timing-and-gate.md, "Power and clocks"). Else that 1 s average, or
        None."""
        n, h = self.nvml, self.handle
        found = _read(getattr(n, "nvmlDeviceGetFieldValues", None), h, [NVML_FI_DEV_POWER_INSTANT])
        if found is not None and len(found) == 1 and int(found[0].nvmlReturn) == 0:
            v = found[0].value
            mw = v.dVal if int(found[0].valueType) == NVML_VALUE_TYPE_DOUBLE else v.uiVal
            if mw and mw > 0:
                return mw / 1000.0, "instant"
        mw = _read(n.nvmlDeviceGetPowerUsage, h)
        return (None, None) if mw is None else (mw / 1000.0, "1 s average")

    def violations_ns(self) -> dict[str, int | None]:
        """``{"power": ns, "thermal": ns}``: NVML's cumulative violation times."""
        get = getattr(self.nvml, "nvmlDeviceGetViolationStatus", None)
        out: dict[str, int | None] = {}
        for kind, policy in (("power", NVML_PERF_POLICY_POWER), ("thermal", NVML_PERF_POLICY_THERMAL)):
            status = _read(get, self.handle, policy)
            out[kind] = None if status is None else int(status.violationTime)
        return out

    def env(self) -> dict[str, Any]:
        """``power_limit_w`` (the enforced limit), ``sm_clock_max_mhz`` and ``driver``, only the
        ones NVML could read."""
        n, h = self.nvml, self.handle
        mw = _read(getattr(n, "nvmlDeviceGetEnforcedPowerLimit", None), h)
        mhz = _read(getattr(n, "nvmlDeviceGetMaxClockInfo", None), h, NVML_CLOCK_SM)
        drv = _read(getattr(n, "nvmlSystemGetDriverVersion", None))
        found = {
            "power_limit_w": None if mw is None else round(mw / 1000.0, 1),
            "sm_clock_max_mhz": None if mhz is None else int(mhz),
            "driver": drv.decode() if isinstance(drv, bytes) else drv,
        }
        return {k: v for k, v in found.items() if v is not None}


_found: dict[str, NvmlDevice | str] = {}
_initialized: list[Any] = []


def _torch_ids(device: str) -> tuple[str | None, str | None]:
    """The PCI bus id (``domain:bus:device.0``, as NVML writes it) and UUID of a torch CUDA
    device. torch numbers the devices CUDA_VISIBLE_DEVICES leaves visible, NVML every device of
    the machine: the bus id (torch >= 2.6 has ``pci_*_id``) or the UUID names the same one in both."""
    import torch

    dev = torch.device(device)
    index = dev.index if dev.index is not None else torch.cuda.current_device()
    props = torch.cuda.get_device_properties(index)
    domain, bus_no, dev_no = (getattr(props, f"pci_{a}_id", None) for a in ("domain", "bus", "device"))
    bus = None if None in (domain, bus_no, dev_no) else f"{domain:08x}:{bus_no:02x}:{dev_no:02x}.0"
    uuid = str(getattr(props, "uuid", "") or "") or None
    if uuid is not None and not uuid.startswith("GPU-"):
        uuid = "GPU-" + uuid
    return bus, uuid


def _open(device: str) -> NvmlDevice | str:
    if not str(device).startswith("cuda"):
        return "not a CUDA device"
    try:
        import pynvml
    except ImportError:
        return f"nvidia-ml-py is not installed ({INSTALL_HINT})"
    if not _initialized:
        try:
            pynvml.nvmlInit()
        except Exception as exc:  # NVMLError: no driver library, no permission
            return f"NVML could not start ({type(exc).__name__}: {str(exc)[:80]})"
        _initialized.append(pynvml)
    bus, uuid = _read(_torch_ids, device) or (None, None)
    handle = _read(pynvml.nvmlDeviceGetHandleByPciBusId, bus) if bus else None
    if handle is None and uuid:
        handle = _read(pynvml.nvmlDeviceGetHandleByUUID, uuid)
    if handle is None:
        return f"NVML has no device at PCI bus id {bus} or UUID {uuid} (the torch device {device})"
    return NvmlDevice(pynvml, handle)


def nvml_device(device: str) -> NvmlDevice | str:
    """The NVML device of the torch device ``device`` (``cuda``, ``cuda:1``), or why there is
    none (a CPU, no ``pynvml``, NVML failing to start, no device with torch's bus id). Found once
    per process and device."""
    if device not in _found:
        _found[device] = _open(device)
    return _found[device]


def device_env(device: str) -> dict[str, Any]:
    """:meth:`NvmlDevice.env` of ``device``; empty when NVML cannot read it."""
    found = nvml_device(device)
    return found.env() if isinstance(found, NvmlDevice) else {}


class PowerMonitor:
    """Samples one device over a timed span: :meth:`start` (or ``with``), :meth:`tick` after
    every round, :meth:`stop`; :meth:`result` describes the last span (module docstring). Made by
    :func:`open_monitor`; with no device (``why``) every call is a no-op."""

    def __init__(self, device: NvmlDevice | None, why: str = "") -> None:
        self.device = device
        self.why = why
        self._samples: list[Sample] = []
        self._before: dict[str, int | None] = {}
        self._after: dict[str, int | None] = {}
        self._t0 = self._last = self._t1 = 0.0

    def __enter__(self) -> PowerMonitor:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        if self.device is None:
            return
        self._samples = []
        self._before = self.device.violations_ns()
        self._t0 = time.perf_counter()
        self._take()

    def _take(self) -> None:
        assert self.device is not None
        self._samples.append(self.device.sample())
        self._last = time.perf_counter()

    def tick(self) -> None:
        if self.device is not None and time.perf_counter() - self._last >= SAMPLE_INTERVAL_S:
            self._take()

    def stop(self) -> None:
        if self.device is None:
            return
        self._take()
        self._t1 = time.perf_counter()
        self._after = self.device.violations_ns()

    def result(self) -> dict[str, Any]:
        """The record's ``power`` field (module docstring): ``{"recorded": False, "why": ...}``
        when nothing was sampled."""
        if self.device is None or not self._samples:
            return {"recorded": False, "why": self.why or "no timed span was sampled"}
        return summarize(self._samples, self._before, self._after, self._t1 - self._t0)


def open_monitor(device: str) -> PowerMonitor:
    """A monitor of ``device`` (a no-op one, saying why, when NVML cannot read it)."""
    found = nvml_device(device)
    return PowerMonitor(found) if isinstance(found, NvmlDevice) else PowerMonitor(None, found)


def summarize(
    samples: list[Sample], before: dict[str, int | None], after: dict[str, int | None], span_s: float,
) -> dict[str, Any]:
    """The ``power`` field of a span from its samples (:data:`Sample`), its violation counters (ns)
    before and after, and its length in s. ``power_source`` is ``"instant"`` when every power
    reading was, ``"1 s average"`` when any was averaged, None when none was read."""
    mhz = [s[0] for s in samples if s[0] is not None]
    watts = [s[1] for s in samples if s[1] is not None]
    sources = {s[3] for s in samples if s[1] is not None}
    bits = [s[2] for s in samples if s[2] is not None]
    reasons = {name: sum(1 for b in bits if b & bit) / len(bits) for bit, (name, _) in REASONS.items()}
    reasons = {k: round(v, 3) for k, v in reasons.items() if v > 0}
    capped = {kind for bit, (name, kind) in REASONS.items() if name in reasons}
    violation_ms: dict[str, float | None] = {}
    for kind in ("power", "thermal"):
        b, a = before.get(kind), after.get(kind)
        violation_ms[kind] = None if a is None or b is None else max(0, a - b) / 1e6
        if violation_ms[kind]:
            capped.add(kind)
    return {
        "recorded": True,
        "samples": len(samples),
        "span_s": round(span_s, 4),
        "sm_clock_min_mhz": min(mhz) if mhz else None,
        "sm_clock_median_mhz": statistics.median(mhz) if mhz else None,
        "power_mean_w": round(statistics.fmean(watts), 1) if watts else None,
        "power_max_w": round(max(watts), 1) if watts else None,
        "power_source": None if not sources else "instant" if sources == {"instant"} else "1 s average",
        "power_violation_ms": violation_ms["power"],
        "thermal_violation_ms": violation_ms["thermal"],
        "reasons": reasons,
        "capped": sorted(capped),
    }


def marker(power: dict[str, Any] | None) -> str:
    """The label beside a verdict: ``power-capped``, ``thermal-capped``, ``hw-slowdown`` (joined
    by ``,``), or ``""`` for a clean or unrecorded span."""
    labels = {"power": "power-capped", "thermal": "thermal-capped", "slowdown": "hw-slowdown"}
    return ",".join(labels[k] for k in (power or {}).get("capped", ()) if k in labels)


def capped_note(power: dict[str, Any] | None) -> str | None:
    """The record's note for a capped span (None for a clean or unrecorded one)."""
    label = marker(power)
    if not label or power is None:
        return None
    seen = ", ".join(f"{name} in {frac:.0%} of samples" for name, frac in power["reasons"].items())
    counted = [
        f"{kind} violation {power[f'{kind}_violation_ms']:.1f} ms"
        for kind in ("power", "thermal") if power.get(f"{kind}_violation_ms")
    ]
    what = "; ".join(x for x in (seen, ", ".join(counted)) if x)
    median = power.get("sm_clock_median_mhz")
    clock = (f"SM clock median {'?' if median is None else f'{median:.0f}'} MHz, "
             f"down to {power.get('sm_clock_min_mhz')} MHz")
    source = power.get("power_source")
    watts = f"up to {power.get('power_max_w')} W" + (f" ({source})" if source and source != "instant" else "")
    return (
        f"{label.replace(',', ', ')} during timing ({what} over {power['span_s']:.2f} s; {clock}, "
        f"{watts}): flagged, not failed: a cap is this case's steady state on this device "
        f"(docs/timing-and-gate.md)"
    )
