"""tools/bars.py: the issues' bar rows read from a golden file, on a hand-made one whose rows
sit either side of each kind of bar."""
from __future__ import annotations

import importlib.util
import pathlib

_path = pathlib.Path(__file__).resolve().parents[1] / "tools" / "bars.py"
_spec = importlib.util.spec_from_file_location("bars", _path)
bars = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bars)


def _row(family, fmt, variant, n, k, m, us, gbps=0.0, roof=0.0, peers=None):
    return dict(family=family, format=fmt, variant=variant, n=n, k=k, m=m, median_us=us, GBps=gbps,
                roofline_pct=roof, peers=peers or {})


def _by_what(doc):
    return {what: (value, threshold, holds) for _, what, value, threshold, holds in bars.bars(bars.Golden(doc))}


def test_each_kind_of_bar_reads_its_rows():
    doc = {"copy_GBps": 1000.0, "noise_band": 0.03, "rows": [
        # issue 12: 86 % of copy at M = 1 holds, 79 % at M = 4 fails; g128 2 % below g32 is noise
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 1, 10.0, gbps=860.0),
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 4, 10.0, gbps=790.0),
        _row("w4a16", "int4", "g32-asym-bf16", 43008, 5376, 1, 10.0, gbps=877.0),
        # issue 14: 0.9x cuBLAS holds at M = 512; M = 517 at 1.2x M = 512's time a token fails
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 512, 100.0, peers={"cublas_bf16": 90.0}),
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 517, 121.2),
        # issue 15: M = 64 at 61 % of the roofline and 1.1x faster than cuBLAS
        _row("gguf", "q4_0", "bf16", 43008, 5376, 64, 100.0, roof=61.0, peers={"cublas_bf16": 110.0}),
        # issue 16: a MoE row slower than torch._grouped_mm
        _row("moe", "mxfp4", "gpt-oss-20b", 5760, 2880, 2048, 100.0, roof=55.0, peers={"torch_grouped_mm": 90.0}),
    ]}
    got = _by_what(doc)
    assert got["w4a16 g128-asym-bf16 43008x5376 M=1 % of copy"][2] is True
    assert got["w4a16 g128-asym-bf16 43008x5376 M=4 % of copy"][2] is False
    assert got["w4a16 g128-asym-bf16 43008x5376 M=8 % of copy"] == (None, 80, None)  # no row
    ratio, threshold, holds = got["w4a16 43008x5376 M=1 GB/s g128 / g32 (no group-size regression)"]
    assert abs(ratio - 860 / 877) < 1e-12 and threshold == 0.97 and holds is True
    assert got["w4a16 g128-asym-bf16 43008x5376 M=512 x cuBLAS"][2] is True
    cliff = got["w4a16 int4 g128-asym-bf16 43008x5376 t(M=517) / (1.15 t(512) 517/512), at most 1"]
    assert abs(cliff[0] - 121.2 / (1.15 * 100.0 * 517 / 512)) < 1e-12 and cliff[2] is False
    assert got["gguf q4_0 bf16 43008x5376 M=64 roofline %"][2] is True
    assert got["gguf q4_0 bf16 43008x5376 M=64 x cuBLAS (faster)"][2] is True
    assert got["moe gpt-oss-20b T=2048 roofline %"][2] is True
    assert got["moe gpt-oss-20b T=2048 x torch._grouped_mm (faster)"][2] is False


def test_a_cliff_past_the_bound_fails():
    doc = {"copy_GBps": 1000.0, "rows": [
        _row("w4a16", "int4", "g32-asym-bf16", 4096, 14336, 256, 50.0),
        _row("w4a16", "int4", "g32-asym-bf16", 4096, 14336, 300, 70.0),  # 1.19x the bound
    ]}
    value, _, holds = _by_what(doc)["w4a16 int4 g32-asym-bf16 4096x14336 t(M=300) / (1.15 t(256) 300/256), at most 1"]
    assert abs(value - 70.0 / (1.15 * 50.0 * 300 / 256)) < 1e-12 and holds is False


def test_main_prints_each_issue_and_only_failures_when_asked(tmp_path, capsys):
    import json
    doc = {"device": "test", "copy_GBps": 1000.0, "rows": [
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 1, 10.0, gbps=860.0),
        _row("w4a16", "int4", "g128-asym-bf16", 43008, 5376, 4, 10.0, gbps=790.0)]}
    path = tmp_path / "g.json"
    path.write_text(json.dumps(doc))
    assert bars.main([str(path), "--issue", "12", "--failing"]) == 0
    out = capsys.readouterr().out
    assert "issue 12: 1 of 61 bar rows hold, 1 fail, 59 have no row" in out  # the g128 / g32 rows too
    assert "FAIL" in out and "M=4 % of copy" in out
    assert "  ok " not in out and "issue 13" not in out
