"""Spread of speedups across repeated `pytest --fusion-bench --fusion-json` runs (issue 4's check).

Prints, per (kernel, case, dtype, provider), the median speedup over the runs and each run's
deviation from it, then the worst deviation.

    python3 bench_scripts/stability.py docs/runs/2026-11-29b/stab*.json.gz   # plain or gzipped JSON
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys


def main(paths: list[str]) -> None:
    table: dict[tuple[str, str, str, str], list[float]] = {}
    for path in paths:
        with (gzip.open(path, "rt") if path.endswith(".gz") else open(path)) as fh:
            for r in json.load(fh)["records"]:
                for provider, result in r["providers"].items():
                    if provider != "kernel" and result.get("speedup") is not None:
                        key = (r["kernel"].split("::")[-1], r["case"], r["dtype"], provider)
                        table.setdefault(key, []).append(result["speedup"])
    worst = 0.0
    print(f"{'kernel':24} {'case':18} {'dtype':9} {'vs':8} {'median':>7} {'min dev':>8} {'max dev':>8}   runs")
    for (kernel, case, dtype, provider), values in sorted(table.items()):
        median = statistics.median(values)
        devs = [v / median - 1 for v in values]
        worst = max(worst, *(abs(d) for d in devs))
        print(f"{kernel:24} {case:18} {dtype:9} {provider:8} {median:7.3f} {min(devs) * 100:+7.2f}% "
              f"{max(devs) * 100:+7.2f}%   " + " ".join(f"{v:.3f}" for v in values))
    print(f"worst deviation from the median: {worst * 100:.2f}% over {len(table)} (case, provider) pairs, "
          f"{len(paths)} runs")


if __name__ == "__main__":
    main(sys.argv[1:])
