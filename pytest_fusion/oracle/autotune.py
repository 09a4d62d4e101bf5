"""Which config an autotuned Triton kernel runs while the oracle checks it.

``@triton.autotune`` picks a config by timing every candidate on the first call with a new key and
caches the winner in the ``Autotuner`` object. For the oracle that is a problem three ways: under
the Triton interpreter timing needs a GPU driver ("0 active drivers"); the winner depends on
timing noise and on which shapes earlier cases tuned, so a failure would not replay; and every
candidate but the winner is never checked. So, while the kernel runs under :func:`choose`:

- each case starts from empty autotune caches (:func:`reset`), so its calls tune (or not) exactly
  as a repro of that case does;
- under the interpreter every autotuned kernel runs its first config (after the kernel's own
  ``prune_configs_by``) unless a config is pinned;
- ``choose(i)`` pins config ``i`` of every autotuned kernel (its last, when it has fewer): the
  "check every config" option runs a case once per index up to :func:`config_count`. The
  indices count the configs left after the kernel's own ``prune_configs_by`` for the last call's
  arguments (a kernel that tunes fp32 over other tiles than bf16 has fewer candidates there).

Only ``triton.runtime.autotuner.Autotuner`` is patched, and only inside :func:`choose`; nothing is
imported from triton unless the kernel's module already imported it.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from typing import Any, Iterator

from pytest_fusion.machine.devices import interpreter_active

_seen: weakref.WeakSet[Any] = weakref.WeakSet()
_last: list[Any] = []
_pruned: weakref.WeakKeyDictionary[Any, list[Any]] = weakref.WeakKeyDictionary()


def _candidates(tuner: Any) -> list[Any]:
    """The configs ``tuner`` chose among at its last call inside :func:`choose`, after its pruning."""
    return _pruned.get(tuner, tuner.configs)


def _autotuner_class() -> Any:
    module = sys.modules.get("triton.runtime.autotuner")
    return getattr(module, "Autotuner", None)


def reset() -> None:
    """Forget every tuning result of the autotuned kernels seen so far (their in-memory caches)."""
    for tuner in list(_seen):
        tuner.cache.clear()


def config_count() -> int:
    """The most configs any autotuned kernel run in the last :func:`choose` block has (0: none ran)."""
    return max((len(_candidates(t)) for t in _last), default=0)


def describe(index: int) -> str:
    """Config ``index`` of each autotuned kernel run in the last :func:`choose` block, e.g.
    ``"_kernel: BLOCK_M: 32, num_warps: 4, ..."``; one line per kernel."""
    lines = []
    for t in _last:
        name = getattr(getattr(t, "base_fn", None), "__name__", type(t).__name__)
        configs = _candidates(t)
        i = min(index, len(configs) - 1)
        lines.append(f"{name}: config {i + 1} of {len(configs)} ({configs[i]})")
    return "; ".join(lines)


@contextlib.contextmanager
def choose(index: int | None = None) -> Iterator[None]:
    """Run autotuned Triton kernels with config ``index`` pinned (see the module docstring);
    ``None``: the first config under the interpreter, the autotuner's own choice otherwise."""
    cls = _autotuner_class()
    if cls is None:
        yield
        return
    if index is None and interpreter_active():
        index = 0
    original_run = cls.run
    _last.clear()

    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        _seen.add(self)
        if self not in _last:
            _last.append(self)
        self.nargs = dict(zip(self.arg_names, args, strict=False))  # what its own pruning reads
        configs = _pruned[self] = self.prune_configs(kwargs)
        if index is None:
            return original_run(self, *args, **kwargs)
        # The pinned config is made the only one for this call: with one config the autotuner
        # neither benchmarks (which needs a GPU driver) nor reads its cache. Triton 3.9 also skips
        # benchmarking when pruning leaves one config, but 3.6 benchmarks even that one.
        all_configs, self.configs = self.configs, [configs[min(index, len(configs) - 1)]]
        try:
            return original_run(self, *args, **kwargs)
        finally:
            self.configs = all_configs

    cls.run = run
    try:
        yield
    finally:
        cls.run = original_run
