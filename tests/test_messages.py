"""Messages a new user meets (issue 17): a refused file says whether it is truncated, of
another type, or contradicts itself; inspect lists every tensor the file holds; the bench
refuses a case its format cannot hold before it measures anything; a single run's report
does not call its rows irreproducible; long work shows progress on a terminal."""
from __future__ import annotations

import io
import json
import os
import struct

import gguf
import numpy as np
import pytest
from safetensors.numpy import save_file

import pyquant
from pyquant import bench, progress
from pyquant.bench import cases as C
from pyquant.bench.timing import FakeRunner, FakeTimer
from pyquant.loaders import inspect as qinspect
from pyquant.loaders import load_gguf, load_safetensors

USAGE = 2
_T = gguf.GGMLQuantizationType


def _write_gguf(path, rng, n=16, k=256):
    W = rng.standard_normal((n, k)).astype(np.float32)
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tensor("blk.0.q4k.weight", pyquant.quantize(W, "q4_K").raw, raw_dtype=_T.Q4_K)
    writer.add_tensor("blk.0.f32.weight", W)
    writer.add_tensor("blk.0.q4_1.weight", gguf.quants.quantize(W, _T.Q4_1), raw_dtype=_T.Q4_1)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path.read_bytes()


# ---------------------------------------------------------------- files say which it is

def test_gguf_truncated_mistyped_inconsistent(tmp_path, rng):
    good = _write_gguf(tmp_path / "good.gguf", rng)
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(good[:-1000])   # the reader said "cannot reshape array of size ..."
    with pytest.raises(ValueError, match=r"cut.gguf: truncated: the header places tensor "
                                         r"'blk.0.q4_1.weight' .* 1000 bytes of tensor data are missing"):
        load_gguf(cut)
    head = tmp_path / "head.gguf"
    head.write_bytes(good[:good.index(b"blk.0.f32.weight") + 5])  # cut inside the tensor infos
    with pytest.raises(ValueError, match=r"head.gguf: truncated, or a corrupt length: tensor"):
        load_gguf(head)

    st = tmp_path / "model.safetensors"
    save_file({"w": np.zeros((2, 2), np.float32)}, str(st))
    named = tmp_path / "model.gguf"
    named.write_bytes(st.read_bytes())
    with pytest.raises(ValueError, match=r"not a GGUF file: it starts like a .safetensors file"):
        load_gguf(named)

    # the header lies: the q4_K tensor declares 8 more columns than whole blocks
    i = good.index(b"blk.0.q4k.weight") + len(b"blk.0.q4k.weight")
    n_dims = struct.unpack_from("<I", good, i)[0]
    assert n_dims == 2
    lying = bytearray(good)
    struct.pack_into("<Q", lying, i + 4, 256 + 8)
    bad = tmp_path / "lying.gguf"
    bad.write_bytes(bytes(lying))
    with pytest.raises(ValueError, match=r"inconsistent header: tensor 'blk.0.q4k.weight' has 264 "
                                         r"elements per row, not whole Q4_K blocks of 256"):
        load_gguf(bad)
    # and overlapping tensors: the f32 tensor's offset moved onto the q4_K one
    j = good.index(b"blk.0.f32.weight") + len(b"blk.0.f32.weight")
    lying = bytearray(good)
    struct.pack_into("<Q", lying, j + 4 + 2 * 8 + 4, 0)
    bad.write_bytes(bytes(lying))
    with pytest.raises(ValueError, match=r"inconsistent header: tensor .* overlaps tensor"):
        load_gguf(bad)


def _st_with_header(path, header: dict, data: bytes):
    blob = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + data)


def test_safetensors_truncated_mistyped_inconsistent(tmp_path, rng):
    st = tmp_path / "m.safetensors"
    save_file({"w": rng.standard_normal((8, 8)).astype(np.float32)}, str(st))
    cut = tmp_path / "cut.safetensors"
    cut.write_bytes(st.read_bytes()[:-10])   # safetensors: "incomplete metadata, file not fully covered"
    with pytest.raises(ValueError, match=r"truncated: the header places tensor 'w' at data bytes "
                                         r"0..256, but the file holds 246 bytes of data \(10 bytes missing\)"):
        load_safetensors(cut)
    g = tmp_path / "g.safetensors"
    g.write_bytes(_write_gguf(tmp_path / "x.gguf", rng))  # safetensors: "header too large"
    with pytest.raises(ValueError, match=r"not a .safetensors file: it is a GGUF file \(GGUF magic\): "
                                         r"use load_gguf"):
        load_safetensors(g)
    lying = tmp_path / "lying.safetensors"
    _st_with_header(lying, {"w": {"dtype": "F32", "shape": [8, 16], "data_offsets": [0, 256]}}, bytes(256))
    with pytest.raises(ValueError, match=r"inconsistent header: tensor 'w' declares F32 \[8, 16\] "
                                         r"\(512 bytes\) but its data_offsets \[0, 256\] span 256 bytes"):
        load_safetensors(lying)
    _st_with_header(lying, {"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]},
                            "b": {"dtype": "F32", "shape": [4], "data_offsets": [8, 24]}}, bytes(24))
    with pytest.raises(ValueError, match=r"inconsistent header: tensor 'a' \(data bytes 0..16\) overlaps "
                                         r"tensor 'b'"):
        load_safetensors(lying)
    head = tmp_path / "head.safetensors"
    head.write_bytes(st.read_bytes()[:20])
    with pytest.raises(ValueError, match=r"truncated: its header declares \d+ bytes of JSON"):
        load_safetensors(head)


# ---------------------------------------------------------------- inspect lists every tensor

def test_inspect_names_every_tensor_of_a_gguf_file(tmp_path, rng, capsys):
    path = tmp_path / "m.gguf"
    _write_gguf(path, rng)
    assert qinspect.main([str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["file_tensors"] == 3
    rows = {r["name"]: r for r in report["tensors"]}
    assert set(rows) == {"blk.0.q4k.weight", "blk.0.f32.weight", "blk.0.q4_1.weight"}
    assert rows["blk.0.q4_1.weight"]["format"] == "unsupported"
    assert rows["blk.0.q4_1.weight"]["tier"].startswith("unsupported: GGML type Q4_1")
    assert qinspect.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert "3 tensors in the file -> 1 quantized weights, 1 other tensors, 1 unsupported" in text
    assert "blk.0.q4_1.weight" in text.split("by format:")[0]   # in the table, not a footnote


def test_inspect_names_every_tensor_of_a_grouped_safetensors_file(tmp_path, rng, capsys):
    """AWQ's three tensors are one weight; an 8-bit AWQ layer cannot load; all are named."""
    n, k, g = 16, 128, 64
    w = pyquant.quantize(rng.standard_normal((n, k)).astype(np.float32), "int4", group_size=g,
                         scale_dtype="fp16")
    from pyquant.formats import int4
    qweight, qzeros, scales = int4.to_awq(w.qweight, w.scales, w.qzeros, g)
    tensors = {"l0.qweight": qweight, "l0.qzeros": qzeros, "l0.scales": scales,
               "l1.qweight": np.zeros((k, n // 4), np.int32), "l1.qzeros": np.zeros((k // g, n // 4), np.int32),
               "l1.scales": np.ones((k // g, n), np.float16), "norm": np.ones(k, np.float32)}
    path = tmp_path / "awq.safetensors"
    save_file(tensors, str(path))
    assert qinspect.main([str(path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["file_tensors"] == len(tensors)
    named = {m for r in report["tensors"] for m in r["members"]}
    assert named == set(tensors), set(tensors) ^ named
    rows = {r["name"]: r for r in report["tensors"]}
    assert rows["l0.weight"]["members"] == ["l0.qweight", "l0.qzeros", "l0.scales"]
    assert rows["l1.weight"]["format"] == "unsupported" and "8-bit" in rows["l1.weight"]["tier"]
    assert qinspect.main([str(path)]) == 0
    text = capsys.readouterr().out
    assert f"{len(tensors)} tensors in the file -> 1 quantized weights, 1 other tensors, 1 unsupported" in text
    assert "awq (qweight, qzeros, scales)" in text


# ---------------------------------------------------------------- bench checks first

class _CpuNoRunner:
    """A CPU runner that must not measure: every argument is refused before."""
    backend = "cpu"

    def __getattr__(self, name):
        raise AssertionError(f"bench used the runner ({name}) before refusing its arguments")


@pytest.mark.parametrize("argv, says", [
    (["--format", "q4_K", "--shape", "100x100", "--m", "1"],
     "gguf q4_K bf16 m=1 100x100: q4_K needs K a multiple of its block of 256 elements; K=100"),
    (["--format", "int4", "--shape", "64x100", "--m", "1"],
     "int4 needs K a multiple of the group size 128 and N a multiple of 8"),
    (["--family", "mxfp4", "--shape", "64x48", "--m", "1"], "mxfp4 needs K a multiple of its block of 32"),
    (["--family", "w4a16", "--variant", "g64-sym-fp16", "--shape", "12x256", "--m", "2"], "N=12"),
])
def test_bench_refuses_a_shape_its_format_cannot_hold_before_measuring(argv, says, capsys):
    assert bench.main(argv + ["--no-peers"], runner=_CpuNoRunner()) == USAGE
    assert says in capsys.readouterr().err


def test_single_run_report_does_not_call_rows_irreproducible(tmp_path, capsys):
    cases = C.build_suite(quick=True, cpu=True)
    timer = FakeTimer(lambda case, call: 1e-4)
    html_path, json_path = tmp_path / "r.html", tmp_path / "r.json"
    assert bench.main(["--quick", "--html", str(html_path), "--json", str(json_path), "--no-peers"],
                      runner=FakeRunner(timer)) == 0
    doc = json.loads(json_path.read_text())
    assert doc["rows"] and all(r["reproducible"] is None for r in doc["rows"])
    page = html_path.read_text()
    cells = page.split("<tbody>")[1]
    assert "<td>False</td>" not in cells and "<td>no</td>" not in cells
    assert cells.count("<td>not checked</td>") == len(doc["rows"])
    assert "reproducible: not checked, every entry is one measurement" in page
    # a run's JSON used as a golden: its rows are untrusted, not an error
    assert bench.main(["--compare", str(json_path), "--no-peers"], runner=FakeRunner(timer)) == 0
    assert "untrusted" in capsys.readouterr().out


# ---------------------------------------------------------------- progress on a terminal

class _Terminal(io.StringIO):
    def isatty(self):
        return True


def test_progress_line_on_a_terminal_only_for_large_work(tmp_path, rng, monkeypatch):
    path = tmp_path / "m.gguf"
    _write_gguf(path, rng)
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    load_gguf(path)                             # small file: quiet by default
    assert term.getvalue() == ""
    monkeypatch.setattr(progress, "LARGE_BYTES", 1)
    load_gguf(path)                             # "large": a redrawn line, ended once
    out = term.getvalue()
    assert out.startswith("\rload_gguf m.gguf: [") and out.endswith("\n") and out.count("\n") == 1
    assert "blk.0.q4_1.weight" in out
    piped = io.StringIO()
    monkeypatch.setattr("sys.stderr", piped)
    load_gguf(path)                             # not a terminal: nothing unless asked
    assert piped.getvalue() == ""
    load_gguf(path, progress=False)
    assert piped.getvalue() == ""


def test_quantize_with_progress_gives_the_same_bits(rng, monkeypatch):
    from pyquant import api
    monkeypatch.setattr(api, "_QUANTIZE_SLICE_BYTES", 8 * 256 * 4)   # 8-row slices
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    W = rng.standard_normal((40, 256)).astype(np.float32)
    for fmt in pyquant.formats():
        plain = pyquant.quantize(W, fmt, progress=False)
        sliced = pyquant.quantize(W, fmt, progress=True)
        for name, a in plain._components().items():
            assert np.asarray(a).tobytes() == np.asarray(sliced._components()[name]).tobytes(), (fmt, name)
    assert f"quantize mxfp4 [40, 256]: [" in term.getvalue()
    stacked = rng.standard_normal((3, 8, 64)).astype(np.float32)
    a, b = pyquant.quantize(stacked, "mxfp4"), pyquant.quantize(stacked, "mxfp4", progress=True)
    assert a.blocks.tobytes() == b.blocks.tobytes() and a.scales.tobytes() == b.scales.tobytes()


def test_loaders_take_progress_for_safetensors(tmp_path, rng, monkeypatch):
    n, k, g = 16, 128, 64
    w = pyquant.quantize(rng.standard_normal((n, k)).astype(np.float32), "int4", group_size=g,
                         scale_dtype="fp16")
    from pyquant.formats import int4
    qweight, qzeros, scales = int4.to_awq(w.qweight, w.scales, w.qzeros, g)
    path = tmp_path / "awq.safetensors"
    save_file({"l0.qweight": qweight, "l0.qzeros": qzeros, "l0.scales": scales}, str(path))
    term = _Terminal()
    monkeypatch.setattr("sys.stderr", term)
    load_safetensors(path, progress=True)
    assert term.getvalue().startswith("\rload_safetensors awq.safetensors: [") and "l0.weight" in term.getvalue()
    assert os.path.basename(str(path)) in term.getvalue()


def test_inspect_reads_a_misnamed_file_by_its_content_and_says_so(tmp_path, rng, capsys):
    st = tmp_path / "model.gguf"            # a .safetensors file under a .gguf name
    save_file({"w": np.zeros((2, 2), np.float32)}, str(st))
    assert qinspect.main([str(st)]) == 0
    out, err = capsys.readouterr()
    assert "model.gguf is named .gguf but holds a safetensors file" in err and "w " in out
    g = tmp_path / "model.safetensors"      # and the reverse
    g.write_bytes(_write_gguf(tmp_path / "x.gguf", rng))
    assert qinspect.main([str(g)]) == 0
    assert "is named .safetensors but holds a gguf file" in capsys.readouterr().err
