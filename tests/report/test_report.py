"""Reports agree with the records they are made from."""

import json
import re
import subprocess
import sys

import pytest

from pytest_fusion.report import files
from pytest_fusion.measure.record import BenchRecord, ProviderResult


def make_record(kernel, case, dtype, M, kernel_ms, eager_ms, compile_ms=None, K=768, N=3072):
    def prov(ms, base=None):
        s = None if base is None else ms / base
        return ProviderResult(ms, [ms * f for f in (0.99, 1.0, 1.01)], ms * 1.2, 0.5, 1 << 20, "fake",
                              s, None if s is None else s * 0.98, None if s is None else s * 1.02)
    provs = {"kernel": prov(kernel_ms), "eager": prov(eager_ms, kernel_ms)}
    if compile_ms is not None:
        provs["compile"] = prov(compile_ms, kernel_ms)
    return BenchRecord(kernel, case, dtype, {"M": M, "K": K, "N": N}, "dev", provs, 3,
                       flops=2.0 * M * K * N, tflops=2.0 * M * K * N / (kernel_ms * 1e-3) / 1e12,
                       gbps=10.0, pct_peak_flops=42.0, status="pass")


@pytest.fixture
def records():
    return [
        make_record("t.py::test_a", "decode", "float16", 1, 0.02, 0.05, 0.03),
        make_record("t.py::test_a", "prefill", "float16", 1024, 0.5, 0.9, 0.6),
        make_record("t.py::test_a", "prefill", "float32", 1024, 1.0, 1.5),
        make_record("t.py::test_b", "x", "float16", 16, 0.1, 0.4, K=384, N=1536),
    ]


def test_the_fresh_process_cold_starts_of_kernel_and_compile_get_a_column(records):
    records[1].cold_start = {"kernel": {"cold_s": 12.414, "warm_s": 0.931}, "compile": {"cold_s": 31.02, "warm_s": 2.1},
                             "eager": {"cold_s": 0.5, "warm_s": 0.4}}
    header, rows = files.rows(records)
    column = header.index("cold/warm s kernel, compile")
    assert [r[column] for r in rows] == ["-, -", "12.41/0.93, 31.02/2.10", "-, -", "-, -"]
    records[1].cold_start = None
    assert not any(h.startswith("cold/warm") for h in files.rows(records)[0])  # none measured: no column


def test_a_wild_speedup_interval_keeps_the_column_narrow(records):
    s = records[0].providers["eager"]
    s.speedup, s.low, s.high = 196.934, 26.58, 268.29
    header, rows = files.rows(records)
    assert rows[0][header.index("vs eager")] == "197x [26.6, 268]"


def test_markdown_rows_match_records(records):
    md = files.markdown(records)
    tables, headers = {}, {}
    kernel = None
    for line in md.splitlines():
        m = re.match(r"### `(.+)`", line)
        cells = [c.strip() for c in line.strip("|").split("|")]
        if m:
            kernel = m.group(1)
            tables[kernel] = []
        elif line.startswith("| case"):
            headers[kernel] = cells
        elif line.startswith("| ") and kernel:
            tables[kernel].append(cells)
    assert set(tables) == {"t.py::test_a", "t.py::test_b"}
    assert "vs compile" not in headers["t.py::test_b"]  # no column for a provider never timed
    for rec in records:
        row = next(r for r in tables[rec.kernel] if r[0] == rec.case and r[1] == rec.dtype)
        cell = dict(zip(headers[rec.kernel], row))
        assert float(cell["kernel ms"]) == pytest.approx(rec.kernel_ms, abs=5e-5)
        assert float(cell["eager ms"]) == pytest.approx(rec.providers["eager"].median_ms, abs=5e-5)
        s = rec.providers["eager"]
        assert cell["vs eager"] == f"{s.speedup:.2f}x [{s.low:.2f}, {s.high:.2f}]"
        assert float(cell["TFLOP/s"]) == pytest.approx(rec.tflops, abs=5e-3)
        assert cell["gate"] == rec.status
        if "compile" not in rec.providers and "vs compile" in cell:
            assert cell["vs compile"] == "-"
    assert sum(len(v) for v in tables.values()) == len(records)


def test_plot_series_match_records(records):
    series = files.plot_series(records)
    assert series["t.py::test_a"]["vs eager, float16, K=768 N=3072"] == [(1, 2.5), (1024, pytest.approx(1.8))]
    assert series["t.py::test_a"]["vs compile, float16, K=768 N=3072"] == [(1, pytest.approx(1.5)), (1024, pytest.approx(1.2))]
    assert series["t.py::test_a"]["vs eager, float32, K=768 N=3072"] == [(1024, 1.5)]
    assert series["t.py::test_b"] == {"vs eager, float16, K=384 N=1536": [(16, 4.0)]}
    points = sum(len(p) for s in series.values() for p in s.values())
    assert points == sum(len(r.speedups()) for r in records)


def test_write_plots_draws_each_series(tmp_path, records):
    pytest.importorskip("matplotlib")
    drawn = files.write_plots(tmp_path, records)
    assert sorted(p.name for p in drawn) == ["t.py__test_a.png", "t.py__test_b.png"]
    for path, series in drawn.items():
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert series == files.plot_series(records)[next(k for k in ("t.py::test_a", "t.py::test_b") if k.replace("::", "__") in path.name)]


def test_terminal_lines_grouped_by_kernel(records):
    records[0].status = "fail"
    records[0].reasons = ["speedup over eager dropped"]
    lines = files.terminal_lines(records, wide=True)
    assert lines[0].startswith("t.py::test_a") and any(l.startswith("t.py::test_b") for l in lines)
    assert any("FAIL decode-float16: speedup over eager dropped" in l for l in lines)
    assert any("1.0/1.0/1.0" in l and "0.500/0.500/0.500" in l for l in lines)  # peak MiB, cold s per provider
    assert any("peak MiB kernel/eager/compile" in l for l in lines)


def test_terminal_table_fits_120_columns_unless_wide(records):
    records[0].case = "llama3-70b-M8192"  # the catalog's longest case name
    records[0].dtype = "bfloat16"
    narrow = files.terminal_lines(records)
    table = [l for l in narrow if l.startswith("  ") and not l.lstrip().startswith(("FAIL", "note"))]
    assert table and max(map(len, table)) <= 120, max(table, key=len)
    assert any("vs eager" in l and "vs compile" in l and "TFLOP/s" in l for l in table)
    assert not any("host ms" in l or "cold s" in l for l in narrow)
    wide = files.terminal_lines(records, wide=True)
    assert any("host ms" in l and "eager ms" in l and "cold s" in l for l in wide)
    assert max(map(len, wide)) > 120  # what the narrow default leaves out


def test_json_round_trip(tmp_path, records):
    path = files.write_json(tmp_path / "out" / "r.json", records)
    data = json.loads(path.read_text())
    back = [BenchRecord.from_dict(d) for d in data["records"]]
    assert sorted(back, key=lambda r: r.key) == sorted(records, key=lambda r: r.key)


def test_benchmark_json_is_read_by_pytest_benchmark_compare(tmp_path, records):
    path = files.write_benchmark_json(tmp_path / "bench.json", records)
    data = json.loads(path.read_text())
    assert len(data["benchmarks"]) == sum(len(r.providers) for r in records)
    b = next(b for b in data["benchmarks"] if b["name"] == "test_a[bench-decode-float16-kernel]")
    assert b["stats"]["median"] == pytest.approx(0.02e-3)  # seconds, as pytest-benchmark stores
    out = subprocess.run([sys.executable, "-m", "pytest_benchmark", "compare", str(path), "--columns=median"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "test_a[bench-decode-float16-kernel]" in out.stdout


def test_markdown_and_terminal_name_the_same_device_and_clock(records):
    heading = f"{records[0].device}, {records[0].providers['kernel'].method}"
    assert f"### `t.py::test_a` ({heading})" in files.markdown(records)
    assert f"t.py::test_a  ({heading})" in files.terminal_lines(records)
