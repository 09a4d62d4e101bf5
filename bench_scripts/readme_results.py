"""Turn one `pytest --fusion-bench --fusion-json` run into the README's results: a Markdown table of
the whole-MLP kernels and one plot of speedup against M. Numbers are copied from the records,
nothing is computed but their selection and layout.

    python3 bench_scripts/readme_results.py RUN.json[.gz] docs/
"""

from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from pytest_fusion.bench.record import BenchRecord  # noqa: E402
from pytest_fusion.report import plot_series  # noqa: E402

MLP_KERNELS = ("test_mlp_gpt2", "test_gated_mlp_swiglu", "test_gated_mlp_geglu")


def main(run_json: str, out_dir: str) -> None:
    raw = Path(run_json).read_bytes()
    if run_json.endswith(".gz"):  # the committed runs are gzipped (docs/runs/)
        raw = gzip.decompress(raw)
    records = [BenchRecord.from_dict(r) for r in json.loads(raw)["records"]]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lines = ["| kernel | case | dtype | kernel ms | eager ms | compile ms | vs eager | vs compile | TFLOP/s | % peak |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    mlp = [r for r in records if r.kernel.split("::")[-1] in MLP_KERNELS]
    for r in sorted(mlp, key=lambda r: (r.kernel, r.case.rsplit("-M", 1)[0], r.dims.get("M", 0), r.dtype)):
        p = r.providers
        sp = {name: r.speedups().get(name) for name in ("eager", "compile")}
        cell = lambda s: f"{s.speedup:.2f}x [{s.low:.2f}, {s.high:.2f}]" if s else "-"  # noqa: E731
        lines.append(
            f"| {r.kernel.split('::')[-1]} | {r.case} | {r.dtype} | {r.kernel_ms:.4f} | {p['eager'].median_ms:.4f} | "
            f"{p['compile'].median_ms:.4f} | {cell(sp['eager'])} | {cell(sp['compile'])} | "
            f"{(r.tflops or 0):.0f} | {(r.pct_peak_flops or 0):.0f} |"
        )
    (out / "h200-mlp-table.md").write_text("\n".join(lines) + "\n")
    print_slower(records)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5))
    for kernel, series in plot_series(mlp).items():
        for label, pts in series.items():
            if label.startswith("vs eager, bfloat16"):
                xs, ys = zip(*pts)
                ax.plot(xs, ys, marker="o", label=f"{kernel.split('::')[-1]} {label.split(', ', 2)[-1]}")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("M (tokens)")
    ax.set_ylabel("speedup over eager (eager ms / kernel ms)")
    ax.set_title("Whole MLPs, bf16, H200, CUDA-graph GPU time", fontsize=10)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "h200-mlp-speedup.png", dpi=100)


def print_slower(records: list[BenchRecord]) -> None:
    """For the README's plain statement: per provider and M class, how many cases the kernel is
    slower than (median speedup < 1; in brackets, those whose whole 95% interval is below 1), and
    the worst case."""
    for provider in ("eager", "compile"):
        for label, in_class in (("M <= 128", lambda m: m <= 128), ("M >= 1024", lambda m: m >= 1024)):
            rows = [(r, r.speedups()[provider]) for r in records
                    if in_class(r.dims.get("M", 0)) and provider in r.speedups()]
            slower = [(r, sp) for r, sp in rows if sp.speedup < 1]
            sure = [(r, sp) for r, sp in slower if sp.high < 1]
            worst = min(rows, key=lambda x: x[1].speedup)
            print(f"vs {provider}, {label}: slower in {len(slower)} of {len(rows)} cases "
                  f"({len(sure)} with the whole interval below 1); worst {worst[1].speedup:.2f}x: "
                  f"{worst[0].kernel.split('::')[-1]} {worst[0].case} {worst[0].dtype}")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
