"""What several test files share: a scripted timer for in-process bench calls, a fake timer and a
project of one kernel for pytester bench runs, bench records, and a test file of planted kernel
faults."""

import json
import textwrap

import pytest

from pytest_fusion.baselines import store
from pytest_fusion.declare.spec import FusionUsageError
from pytest_fusion.measure.record import BenchRecord, ProviderResult

KERNEL = "tests/test_k.py::test_k"
"""The kernel id of :func:`record`'s records."""

TEST_FILE = '''
import pytest
import torch.nn.functional as F
import faulty_linear


def linear_act(x, weight, bias, activation):
    y = F.linear(x, weight, bias)
    if activation == "relu":
        return F.relu(y)
    if activation == "gelu_tanh":
        return F.gelu(y, approximate="tanh")
    return y


@pytest.mark.fused_kernel(
    reference=linear_act,
    inputs={{"x": ("M", "K"), "weight": ("N", "K"), "bias": ("N",)}},
    dims={{"M": (1, 4096), "K": (1, 4096), "N": (1, 4096)}},
    dtypes=("float16", "float32"),
    constants={{"activation": "{activation}"}},
    tiles=faulty_linear.TILES,
    special_values={special},
)
def test_linear_act():
    def kernel(x, weight, bias, activation):
        return faulty_linear.linear_act(x, weight, bias, activation, fault={fault!r})
    return kernel
'''


def record(case="c1", kernel=KERNEL, dtype="float32", kernel_ms=1.0, providers=None, dims=None):
    """A tiny record: ``providers`` is ``{name: ms}`` (default eager 2 ms)."""
    provs = {"kernel": ProviderResult(kernel_ms, [kernel_ms], kernel_ms, 0.1, None, "fake")}
    for name, ms in (providers if providers is not None else {"eager": 2.0}).items():
        s = ms / kernel_ms
        provs[name] = ProviderResult(ms, [ms], ms, 0.1, None, "fake", s, s * 0.99, s * 1.01)
    return BenchRecord(kernel, case, dtype, dims or {"M": 16}, "dev", provs, 30, env={"method": "fake"})


def assert_malformed_entry_field_refused(tmp_path, field, bad):
    """Saves one :func:`record` to a baseline file in ``tmp_path``, sets its entry's ``field`` to
    ``bad``, and asserts that loading the file raises FusionUsageError saying ``.<field> must be``
    and leaves the file's text as it was."""
    path = store.save(tmp_path, "dev", [record()])
    data = json.loads(path.read_text())
    data["cases"][KERNEL]["c1"]["float32"][field] = bad
    text = json.dumps(data)
    path.write_text(text)
    with pytest.raises(FusionUsageError, match=rf"\.{field} must be"):
        store.load(path)
    assert path.read_text() == text


class ScriptedTimer:
    """A timer whose samples are scripted, not measured: ``times`` maps each provider to its ms per
    sample, a number or a list cycled through. Samples do not run the call (``measure()`` still
    runs it for cold start, warm-up and host latency). ``prepared`` lists the providers in the order
    they were prepared, ``order`` the provider of each sample taken."""

    method = "scripted"

    def __init__(self, times):
        self.times = times
        self.prepared = []
        self.order = []

    def sync(self):
        pass

    def peak_memory(self, name, fn):
        return None

    def prepare(self, name, fn):
        self.prepared.append(name)
        seq = self.times[name] if isinstance(self.times[name], list) else [self.times[name]]
        state = [0]

        def run():
            self.order.append(name)
            state[0] += 1
            return seq[(state[0] - 1) % len(seq)]

        return run


FAKE_TIMER_CONFTEST = textwrap.dedent(
    """
    import json, pathlib

    class FakeTimer:
        '''Per-provider times from times.json: a number, or a list cycled through per sample, or
        {"measurements": [m1, m2, ...]} where the k-th prepare of that provider (the first
        measurement, then a re-measure) takes m_k, the last one repeating, each a number or a list.
        Timed samples do not run the call (measure() still runs it for cold start, warm-up and
        host latency), which keeps these runs fast. Each prepare's name is appended to ``log``
        (prepared.txt from the hook below; a session makes one timer per case).'''
        def __init__(self, times, log=None):
            self.method = times.pop("__method__", "fake")  # a GPU method where a test needs one
            self.times = times
            self.log = log
            self.count = {}

        def sync(self):
            pass

        def peak_memory(self, name, fn):
            return None

        def prepare(self, name, fn):
            if self.log is not None:
                with self.log.open("a") as f:
                    f.write(name + "\\n")
            seq = self.times.get(name, 1.0)
            if isinstance(seq, dict):  # this prepare's measurement, the last one repeating
                script = seq["measurements"]
                k = self.count[name] = self.count.get(name, 0) + 1
                seq = script[min(k, len(script)) - 1]
            seq = seq if isinstance(seq, list) else [seq]
            state = [0]

            def run():
                if self.method != "fake":  # a replay's output is verified: it must be this call's
                    fn()
                value = seq[state[0] % len(seq)]
                state[0] += 1
                return value

            return run

    def pytest_fusion_make_timer(config, device):
        path = pathlib.Path(config.rootpath, "times.json")
        log = pathlib.Path(config.rootpath, "prepared.txt")
        return FakeTimer(json.loads(path.read_text()), log) if path.exists() else None
    """
)


KERNEL_TEST = textwrap.dedent(
    """
    import os
    import pytest, torch

    def reference(x, w):
        return torch.relu(x @ w.t())

    def unfused(x, w):  # a second baseline: with two, the gate blames by which speedups fell
        return torch.relu(torch.matmul(x, w.t()))

    def kernel(x, w):
        out = torch.mm(x, w.t()).clamp_min_(0)
        for _ in range(int(os.environ.get("SLOWDOWN", "1")) - 1):  # a kernel made N times slower
            out = torch.mm(x, w.t()).clamp_min_(0)
        return out

    @pytest.mark.fused_kernel(
        reference=reference,
        inputs={"x": ("M", "K"), "w": ("N", "K")},
        dims={"M": (1, 512), "K": (1, 512), "N": (1, 512)},
        dtypes=("float32",),
        triton=False,
        bench=BENCH,
        providers={"unfused": unfused},
    )
    def test_relu_linear():
        return kernel
    """
)


def write_project(pytester, bench="{'small': dict(M=16, K=32, N=32)}", times=None, fake=True):
    if fake:
        pytester.makeconftest(FAKE_TIMER_CONFTEST)
    pytester.makepyfile(test_kernel=KERNEL_TEST.replace("BENCH", bench))
    if times is not None:
        set_times(pytester, **times)


def set_times(pytester, **times):
    (pytester.path / "times.json").write_text(json.dumps(times))


def bench(pytester, *args, **kwargs):
    return pytester.runpytest_inprocess("--fusion-bench", "--fusion-providers=eager", "--fusion-warmup=0",
                                        "-k", "bench", "-p", "no:randomly", *args, **kwargs)


def saved(pytester):
    (path,) = (pytester.path / "baselines").glob("*.json")
    return json.loads(path.read_text()), path
