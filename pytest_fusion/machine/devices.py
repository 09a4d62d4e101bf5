"""Where kernels run: environment switches, visible GPUs, xdist worker pinning, device names.

No torch import at module level: this module is on the plugin's import path, and importing torch
would fix ``CUDA_VISIBLE_DEVICES`` for the process before an xdist worker is pinned to its GPU.

``@triton.jit`` reads ``TRITON_INTERPRET`` when a kernel is decorated, that is when its module is
imported; so the plugin calls :func:`apply_interpreter` in ``pytest_load_initial_conftests``,
before conftest.py files and test modules load.
"""

from __future__ import annotations

import glob
import os
import platform
import re
from contextlib import AbstractContextManager
from typing import Any, Callable

from pytest_fusion.machine.locks import DEFAULT_TIMING_LOCK_TIMEOUT_S, timing_lock

INTERPRET_ENV = "TRITON_INTERPRET"

TRUE_WORDS = ("1", "true", "yes", "on", "y")
"""Values an environment switch reads as on (case-insensitive), as Triton's ``knobs.env_bool``
reads them; anything else (unset, empty, ``0``, ``false``, ``off``...) is off."""


def env_flag(name: str) -> bool:
    """Whether environment switch ``name`` is on: one rule for every switch (:data:`TRUE_WORDS`)."""
    return os.environ.get(name, "").strip().lower() in TRUE_WORDS


def interpreter_active() -> bool:
    """True when Triton kernels run under the interpreter (``TRITON_INTERPRET`` on)."""
    return env_flag(INTERPRET_ENV)


def visible_gpus() -> list[str]:
    """CUDA device ids visible to this process, judged without importing torch.

    ``CUDA_VISIBLE_DEVICES`` when set: its comma-separated ids up to the first ``-1`` (CUDA stops
    reading the list there; ``none`` and ``NoDevFiles``, which batch schedulers set, hide all).
    Unset: the NVIDIA driver's device nodes ``/dev/nvidiaN``.
    """
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is None:
        return sorted((p[len("/dev/nvidia") :] for p in glob.glob("/dev/nvidia[0-9]*")), key=int)
    ids = []
    for part in env.split(","):
        part = part.strip()
        if part in ("-1", "none", "NoDevFiles"):
            break
        if part:
            ids.append(part)
    return ids


def cuda_visible() -> bool:
    """Whether a CUDA device is likely visible (see :func:`visible_gpus`); without the variable,
    the driver's control node alone also counts."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") is None and os.path.exists("/dev/nvidiactl"):
        return True
    return bool(visible_gpus())


def apply_interpreter(mode: str) -> str:
    """Set ``TRITON_INTERPRET`` for ``mode`` (``auto``, ``on`` or ``off``) and say what was decided.

    ``on``/``off`` force it; ``auto`` keeps a value the user set, else turns the interpreter on
    exactly when no CUDA device is visible.

    Returns:
        a one-line description for the test-run header, naming Triton kernels (a run of plain
        PyTorch kernels is not emulated).
    """
    if mode == "on":
        os.environ[INTERPRET_ENV] = "1"
        return "Triton kernels: interpreted (forced)"
    if mode == "off":
        os.environ[INTERPRET_ENV] = "0"
        return "Triton kernels: compiled (forced)"
    if INTERPRET_ENV in os.environ:
        state = "interpreted" if interpreter_active() else "compiled"
        return f"Triton kernels: {state} ({INTERPRET_ENV}={os.environ[INTERPRET_ENV]} set by the user)"
    if cuda_visible():
        return "Triton kernels: compiled (a CUDA device is visible)"
    os.environ[INTERPRET_ENV] = "1"
    return "Triton kernels: interpreted (no CUDA device visible)"


def pin_worker(config: Any) -> str | None:
    """On an xdist worker with several GPUs visible, keep one: ``gwN`` gets the N-th (mod count).

    Returns the device id kept, or None when nothing was changed (no xdist, <= 1 GPU). The worker
    id comes from ``config.workerinput`` or, before that exists (``pytest_load_initial_conftests``,
    the point at which no conftest can have touched CUDA yet), from ``$PYTEST_XDIST_WORKER``,
    which xdist sets before the worker's config is made. Pinning twice is harmless: the second
    call sees one GPU and changes nothing.
    """
    workerinput = getattr(config, "workerinput", None) or {}
    worker = workerinput.get("workerid") or os.environ.get("PYTEST_XDIST_WORKER")
    if not worker:
        return None
    gpus = visible_gpus()
    if len(gpus) <= 1:
        return None
    index = int(re.sub(r"\D", "", str(worker)) or 0)
    chosen = gpus[index % len(gpus)]
    os.environ["CUDA_VISIBLE_DEVICES"] = chosen
    return chosen


def device_lock(
    device: str,
    *,
    timeout: float = DEFAULT_TIMING_LOCK_TIMEOUT_S,
    holder: str = "",
    reentrant: bool = False,
    notify: Callable[[str], None] | None = None,
) -> AbstractContextManager[None]:
    """An inter-process lock for ``device`` (:func:`pytest_fusion.machine.locks.timing_lock`: per user,
    waits ``timeout`` seconds, then raises :class:`~pytest_fusion.machine.locks.LockTimeout` naming the
    holder), so that two xdist workers sharing a GPU, or the CPU, never time at the same moment.
    ``holder`` (a test id) is who this process is, for another waiter's message; ``reentrant``:
    a thread that holds it already passes at once (a kernel tuned inside a bench case's timing);
    ``notify``: told of a long wait, its holder and its end (``timing_lock``'s)."""
    return timing_lock(device_ident(device), timeout=timeout, holder=holder, reentrant=reentrant,
                       notify=notify)


def device_ident(device: str) -> str:
    """``"gpu-<id>"`` for a CUDA device (its id as CUDA_VISIBLE_DEVICES names it), else ``"cpu"``:
    the name of the device's timing lock and memory ledger (:mod:`pytest_fusion.oracle.memory`)."""
    if not str(device).startswith("cuda"):
        return "cpu"
    index = str(device).partition(":")[2] or "0"
    ids = visible_gpus() if "CUDA_VISIBLE_DEVICES" in os.environ else []
    return "gpu-" + (ids[int(index)] if index.isdigit() and int(index) < len(ids) else index)


def default_device(device: str | None = None) -> str:
    """``device`` when given, else ``"cuda"`` when torch sees a CUDA device, else ``"cpu"``."""
    if device:
        return str(device)
    import torch

    return "cuda" if torch.cuda.is_available() else "cpu"


def slugify(name: str) -> str:
    """``"NVIDIA H200"`` -> ``"nvidia-h200"``: lower case, runs of other characters -> ``-``."""
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    return slug or "unknown-device"


CPUINFO = "/proc/cpuinfo"


def _cpuinfo_text() -> str:
    """The text of :data:`CPUINFO`, or ``""`` where it cannot be read (not Linux)."""
    try:
        with open(CPUINFO, encoding="utf8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError):
        return ""


def cpu_model(cpuinfo: str | None = None) -> str:
    """The CPU model name: the first ``model name`` line of ``cpuinfo`` (default: the text of
    Linux ``/proc/cpuinfo``), else ``platform.processor()``, else ``platform.machine()``, else
    ``"cpu"``."""
    text = _cpuinfo_text() if cpuinfo is None else cpuinfo
    for line in text.splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def usable_cpus() -> int:
    """How many CPUs this process may run on: its affinity mask where the OS has one (Linux),
    else ``os.cpu_count()``, else 1."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_VENDORS = {
    "GenuineIntel": "intel", "AuthenticAMD": "amd", "HygonGenuine": "hygon", "CentaurHauls": "centaur"
}
"""x86 ``vendor_id`` -> the word a model name would hold for it."""
_TRADEMARKS = re.compile(r"\((?:r|tm|c)\)", re.IGNORECASE)
_X86_IDS = ("cpu family", "model", "stepping")
_ARM_IDS = ("cpu implementer", "cpu part", "cpu variant", "cpu revision")


def _first_processor(text: str) -> dict[str, str]:
    """``{field: value}`` of the first processor block of a ``/proc/cpuinfo`` text, keys lower case."""
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if fields and not line.strip():  # a blank line ends the block
                break
            continue
        fields.setdefault(key.strip().lower(), value.strip())
    return fields


def cpu_slug(cpuinfo: str | None = None, cpus: int | None = None, machine: str | None = None) -> str:
    """File stem naming this machine's CPU in baselines/, e.g. ``intel-xeon-processor-6-143-8-2cpu``.

    Format: ``<model>[-<vendor>]-<ids>-<N>cpu``, all :func:`slugify`-ed:

    - ``<model>``: :func:`cpu_model` without trademark marks (``(R)``, ``(TM)``).
    - ``<vendor>``: the x86 ``vendor_id`` (``intel``, ``amd``, ...) when the model name does not
      already hold it (a hypervisor's ``QEMU Virtual CPU`` can sit on either).
    - ``<ids>``: what names the silicon, from the first processor of ``cpuinfo``: x86 ``cpu family``,
      ``model`` and ``stepping`` (decimal, as the kernel prints them); else Arm's ``CPU
      implementer``, ``part``, ``variant`` and ``revision``; else ``machine`` (default
      ``platform.machine()``) when the model name does not already hold it.
    - ``<N>``: ``cpus``, default :func:`usable_cpus`.

    Why: cloud VMs report generic model names (``AMD EPYC``, ``Intel(R) Xeon(R) Processor``) for
    different parts, and a CPU kernel's time also depends on how many cores the process may use,
    so the model name alone let one machine's baseline gate another's run. The ids say which
    silicon, the count which share of it; a changed affinity (``taskset``) or VM size is a new
    device, as its timings are. The model name, which older pytest-fusions used alone
    (:func:`legacy_slug`), stays first so that files still sort and read by model.

    ``cpuinfo`` defaults to the text of ``/proc/cpuinfo`` (``""`` where there is none).
    Raises nothing: a field that is missing is left out.
    """
    text = _cpuinfo_text() if cpuinfo is None else cpuinfo
    fields = _first_processor(text)
    name = slugify(_TRADEMARKS.sub(" ", cpu_model(text)))

    def named(word: str) -> bool:  # whole words of the name: "amd" is not in "amdahl"
        return f"-{slugify(word)}-" in f"-{name}-"

    parts = [name]
    vendor = _VENDORS.get(fields.get("vendor_id", ""), fields.get("vendor_id", ""))
    if vendor and not named(vendor):
        parts.append(vendor)
    ids = next((keys for keys in (_X86_IDS, _ARM_IDS) if all(fields.get(k) for k in keys)), None)
    if ids is not None:
        parts += [fields[k].removeprefix("0x") for k in ids]
    else:
        arch = platform.machine() if machine is None else machine
        if arch and not named(arch):
            parts.append(arch)
    parts.append(f"{usable_cpus() if cpus is None else cpus}cpu")
    return slugify("-".join(parts))


def device_name(device: Any) -> str:
    """Human name of ``device`` (``cuda[:i]`` or a torch.device via torch, ``cpu`` via
    :func:`cpu_model`); reports show it, and each stored entry's ``env.device`` holds it."""
    if str(device).startswith("cuda"):
        import torch

        return str(torch.cuda.get_device_name(torch.device(device)))
    return cpu_model()


def device_slug(device: Any) -> str:
    """File stem naming ``device`` in baselines/ and reference_kernels/tuning/tables/: a GPU's
    :func:`slugify`-ed name (``nvidia-h200``), the CPU's :func:`cpu_slug`."""
    if str(device).startswith("cuda"):
        return slugify(device_name(device))
    return cpu_slug()


def legacy_slug(name: str) -> str:
    """The file stem older pytest-fusions gave the device named ``name`` (:func:`device_name`),
    the name alone slugified: ``"AMD EPYC"`` -> ``"amd-epyc"``. For a GPU it is its slug still; a
    CPU's differs from :func:`cpu_slug`, and a file under it may hold another machine's timings."""
    return slugify(name)


def interpret_if_no_gpu() -> str:
    """For the plain API without pytest: turn the Triton interpreter on when no CUDA device is
    visible (a ``TRITON_INTERPRET`` the user set is kept), as the plugin does at start-up.

    Call it before importing any module that defines ``@triton.jit`` kernels (``@triton.jit``
    reads the switch when the module is imported)::

        import pytest_fusion
        pytest_fusion.interpret_if_no_gpu()
        from mykernels import fused_linear_gelu   # now decorated for the interpreter

    Returns:
        what was decided, e.g. ``"Triton kernels: interpreted (no CUDA device visible)"``.
    """
    return apply_interpreter("auto")
