"""Loaders: .gguf and .safetensors files written here, read back through pyquant.

GGUF: one tensor of every registered GGUF-typed format, quantized by the `gguf` package
where it can (q8_0, q4_0, mxfp4) and by pyquant's reference quantizers otherwise, written
with gguf.GGUFWriter, loaded with load_gguf, dequantized and compared with
gguf.quants.dequantize, and multiplied against the float64 reference GEMM.
safetensors: each checkpoint convention (AWQ, GPTQ, compressed-tensors, GPT-OSS MXFP4) is
packed here, by hand, from known integers following the convention's published layout, so
that the importers are checked against an independent packer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import gguf
import ml_dtypes
import numpy as np
import pytest
from safetensors.numpy import save_file

import pyquant
from pyquant import formats
from pyquant.formats import reference
from pyquant.loaders import inspect as qinspect
from pyquant.loaders import load_gguf, load_safetensors

from conftest import cancelling_gemm_bound

_T = gguf.GGMLQuantizationType

# GGUF-typed formats of the registry: every one gets a tensor in the test file.
GGUF_FORMATS = [s.name for s in formats.FORMATS.values() if s.gguf_type is not None]
# Types whose quantizer the gguf package itself implements (the rest raise NotImplementedError).
GGUF_PACKAGE_QUANTIZES = {"q8_0", "q4_0", "mxfp4"}


def assert_values_equal(a: np.ndarray, b: np.ndarray, what: str) -> None:
    """Equal values (so -0.0 == +0.0); names the first differing element."""
    a = np.asarray(a, np.float32)
    b = np.asarray(b, np.float32)
    assert a.shape == b.shape, f"{what}: shape {a.shape} != {b.shape}"
    diff = ~((a == b) | (np.isnan(a) & np.isnan(b)))
    if diff.any():
        idx = tuple(int(i[0]) for i in np.nonzero(diff))
        raise AssertionError(f"{what}: first mismatch at {idx}: {a[idx]!r} != {b[idx]!r} "
                             f"({int(diff.sum())} of {diff.size} differ)")


# ---------------------------------------------------------------------------------- GGUF


def _gguf_raw(fmt: str, W: np.ndarray) -> np.ndarray:
    """Raw GGUF block bytes [N, K/block * block_bytes] of W, by the gguf package if it can."""
    spec = formats.get(fmt)
    if fmt in GGUF_PACKAGE_QUANTIZES:
        return gguf.quants.quantize(W, _T(spec.gguf_type))
    return spec.module.quantize(W)


@pytest.fixture
def gguf_file(tmp_path, rng):
    """A .gguf with one tensor per supported type, float tensors, and unsupported ones."""
    path = tmp_path / "all_types.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    meta = {"test.answer": int(rng.integers(1, 1000)), "test.name": "loaders"}
    writer.add_uint32("test.answer", meta["test.answer"])
    writer.add_string("test.name", meta["test.name"])
    quantized = {}
    for fmt in GGUF_FORMATS:
        spec = formats.get(fmt)
        n = int(rng.choice([1, 8, 19, 33]))        # awkward row counts, one row included
        k = 256 * int(rng.integers(1, 4))           # whole super-blocks for the K-quants
        W = rng.standard_normal((n, k)).astype(np.float32)
        raw = _gguf_raw(fmt, W)
        assert raw.dtype == np.uint8 and raw.shape == (n, k // spec.block_elems * spec.block_bytes)
        name = f"blk.0.{fmt}.weight"
        writer.add_tensor(name, raw, raw_dtype=_T(spec.gguf_type))
        quantized[name] = (fmt, raw, (n, k))
    plain = {
        "token_embd.f32": rng.standard_normal((5, 64)).astype(np.float32),
        "norm.f32": rng.standard_normal(64).astype(np.float32),
        "blk.0.f16.weight": rng.standard_normal((7, 32)).astype(np.float16),
    }
    for name, arr in plain.items():
        writer.add_tensor(name, arr)
    bf16 = rng.standard_normal((3, 32)).astype(ml_dtypes.bfloat16)
    writer.add_tensor("blk.0.bf16.weight", bf16.view(np.uint8), raw_dtype=_T.BF16)
    plain["blk.0.bf16.weight"] = bf16
    # Types pyquant has no format for: written as valid bytes, must be reported, not fatal.
    unsupported = {"blk.0.q4_1.weight": _T.Q4_1, "blk.0.q5_k.weight": _T.Q5_K}
    q4_1 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), _T.Q4_1)
    writer.add_tensor("blk.0.q4_1.weight", q4_1, raw_dtype=_T.Q4_1)
    blk, size = gguf.GGML_QUANT_SIZES[_T.Q5_K]
    writer.add_tensor("blk.0.q5_k.weight", np.zeros((2, size), np.uint8), raw_dtype=_T.Q5_K)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dict(path=path, meta=meta, quantized=quantized, plain=plain, unsupported=unsupported)


def test_gguf_every_type_reads_back_bit_exact(gguf_file, assert_bitwise_equal):
    ckpt = load_gguf(gguf_file["path"])
    for key, value in gguf_file["meta"].items():
        assert ckpt.metadata[key] == value, key
    for name, (fmt, raw, shape) in gguf_file["quantized"].items():
        w = ckpt[name]
        assert w.format == fmt, name
        assert tuple(w.shape) == shape, f"{name}: shape {w.shape} != {shape}"
        expected = gguf.quants.dequantize(raw, _T(formats.get(fmt).gguf_type))
        if fmt == "mxfp4":
            # OCP E2M1 code 8 is -0.0 where gguf's integer table has 0: only the sign of
            # zero may differ, every value must match.
            assert_values_equal(w.dequantize(), expected, name)
        else:
            assert_bitwise_equal(w.dequantize(), expected, name)
        assert w.nbytes >= raw.nbytes, f"{name}: nbytes {w.nbytes} < the file's {raw.nbytes}"


def test_gguf_plain_tensors_are_memory_mapped_views(gguf_file):
    ckpt = load_gguf(gguf_file["path"])
    for name, arr in gguf_file["plain"].items():
        got = ckpt[name]
        assert isinstance(got, np.ndarray) and got.dtype == arr.dtype, (name, got.dtype)
        assert got.shape == arr.shape, (name, got.shape, arr.shape)
        assert np.array_equal(got.view(np.uint8), arr.view(np.uint8)), name
        base = got
        while base is not None and not isinstance(base, np.memmap):
            base = base.base
        assert isinstance(base, np.memmap), f"{name} was copied out of the file"


def test_gguf_unsupported_types_are_reported_not_raised(gguf_file):
    ckpt = load_gguf(gguf_file["path"])
    for name, qtype in gguf_file["unsupported"].items():
        assert name not in ckpt
        assert qtype.name in ckpt.unsupported[name], ckpt.unsupported[name]
    with pytest.raises(ValueError, match="Q4_1|Q5_K"):
        load_gguf(gguf_file["path"], strict=True)


def test_gguf_expert_tensors(tmp_path, rng, assert_bitwise_equal):
    """[E, N, K] MoE tensors: MXFP4 stays stacked (what pyquant.moe takes), a GGUF block
    format is folded to [E*N, K] with expert e's rows at e*N .. e*N+N-1."""
    e, n, k = 3, int(rng.integers(1, 9)), 64
    path = tmp_path / "experts.gguf"
    writer = gguf.GGUFWriter(str(path), "gpt-oss")
    raws = {}
    for fmt in ("mxfp4", "q8_0"):
        qtype = _T(formats.get(fmt).gguf_type)
        raws[fmt] = gguf.quants.quantize(rng.standard_normal((e, n, k)).astype(np.float32), qtype)
        writer.add_tensor(f"blk.0.ffn_up_exps.{fmt}", raws[fmt], raw_dtype=qtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    ckpt = load_gguf(path)
    w = ckpt["blk.0.ffn_up_exps.mxfp4"]
    assert tuple(w.shape) == (e, n, k)
    assert_values_equal(w.dequantize(), gguf.quants.dequantize(raws["mxfp4"], _T.MXFP4),
                        "mxfp4 experts")
    w = ckpt["blk.0.ffn_up_exps.q8_0"]
    assert tuple(w.shape) == (e * n, k)
    assert_bitwise_equal(w.dequantize(),
                         gguf.quants.dequantize(raws["q8_0"], _T.Q8_0).reshape(e * n, k),
                         "q8_0 experts")


@pytest.mark.usefixtures("fp32_exact")  # cancelling_gemm_bound is the fp32-exact path's
def test_gguf_loaded_weights_multiply_like_the_reference(gguf_file, rng, assert_close):
    # The bound scales with |x| @ |w|^T: the fixture draws N from 1, and one output of k terms
    # can cancel far below its terms (a seed of stop 22's CI: y = 0.0059 from terms of ~1,
    # err 3.3e-4 against a |y|-relative bound of 1.2e-4). A wrong layout (rows, nibble order,
    # block order) still gives an error of order 1.
    ckpt = load_gguf(gguf_file["path"])
    for name, (fmt, _raw, (n, k)) in gguf_file["quantized"].items():
        w = ckpt[name]
        w_deq = w.dequantize()
        for m in (1, 5):
            x = rng.standard_normal((m, k)).astype(np.float32)
            y = pyquant.gemm(x, w)
            assert y.shape == (m, n) and y.dtype == np.float32
            ref = reference.gemm(x, w_deq)
            assert_close(y, ref, cancelling_gemm_bound(x, w_deq, ref, np.float32), f"{name} m={m}")


# ---------------------------------------------------------------------------- safetensors

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ: nibble i of a word holds column 8j + AWQ_ORDER[i]


def _pack_rows(v: np.ndarray, order=tuple(range(8))) -> np.ndarray:
    """uint [R, 8C] -> int32 [R, C]: nibble i of word c holds v[:, 8c + order[i]]."""
    r, c8 = v.shape
    v = v.astype(np.uint32).reshape(r, c8 // 8, 8)
    word = np.zeros((r, c8 // 8), np.uint32)
    for i, src in enumerate(order):
        word |= v[:, :, src] << np.uint32(4 * i)
    return word.view(np.int32)


def _known_int4(rng, group_size: int, symmetric: bool, scale_dtype, zero_min: int = 0,
                min_groups: int = 1):
    """Integer codes, zero points and scales, and the dequantized matrix they define."""
    n = 8 * int(rng.integers(1, 5))
    k = group_size * int(rng.integers(min_groups, 4))
    q = rng.integers(0, 16, (n, k), dtype=np.uint8)
    z = (np.full((n, k // group_size), 8, np.uint8) if symmetric
         else rng.integers(zero_min, 16, (n, k // group_size), dtype=np.uint8))
    s = (rng.uniform(0.5, 2.0, (n, k // group_size)) * 2.0**-6).astype(scale_dtype)
    g = np.arange(k) // group_size
    expected = (q.astype(np.float32) - z[:, g].astype(np.float32)) * s.astype(np.float32)[:, g]
    return q, z, s, expected


def _check_int4(w, expected, group_size, what, assert_bitwise_equal):
    assert w.format == "int4", what
    assert tuple(w.shape) == expected.shape, (what, w.shape, expected.shape)
    assert w.group_size == group_size, what
    assert_bitwise_equal(w.dequantize(), expected, what)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("scale_dtype", [np.float16, ml_dtypes.bfloat16])
def test_awq_file(tmp_path, group_size, scale_dtype, rng, assert_bitwise_equal):
    q, z, s, expected = _known_int4(rng, group_size, False, scale_dtype)
    bias = rng.standard_normal(q.shape[0]).astype(np.float16)
    tensors = {
        "model.layers.0.mlp.down_proj.qweight": _pack_rows(q.T, AWQ_ORDER),  # [K, N/8]
        "model.layers.0.mlp.down_proj.qzeros": _pack_rows(z.T, AWQ_ORDER),   # [K/G, N/8]
        "model.layers.0.mlp.down_proj.scales": np.ascontiguousarray(s.T),    # [K/G, N]
        "model.layers.0.mlp.down_proj.bias": bias,
        "model.embed_tokens.weight": rng.standard_normal((11, 16)).astype(np.float16),
    }
    path = tmp_path / "awq.safetensors"
    save_file(tensors, str(path), metadata={"format": "pt"})
    ckpt = load_safetensors(path)
    assert ckpt.unsupported == {}
    assert ckpt.source["model.layers.0.mlp.down_proj.weight"] == "awq"
    _check_int4(ckpt["model.layers.0.mlp.down_proj.weight"], expected, group_size, "awq",
                assert_bitwise_equal)
    assert np.array_equal(ckpt["model.layers.0.mlp.down_proj.bias"], bias)
    assert np.array_equal(ckpt["model.embed_tokens.weight"], tensors["model.embed_tokens.weight"])
    assert ckpt.metadata["format"] == "pt"


def _gptq_tensors(prefix, q, z, s, g_idx):
    # GPTQ v1 (AutoGPTQ): qweight packed along K (word r holds k = 8r..8r+7), zero points
    # stored minus one and packed along N.
    return {
        f"{prefix}.qweight": np.ascontiguousarray(_pack_rows(q).T),           # [K/8, N]
        f"{prefix}.qzeros": _pack_rows((z - 1).T),                            # [K/G, N/8]
        f"{prefix}.scales": np.ascontiguousarray(s.T),                        # [K/G, N]
        f"{prefix}.g_idx": g_idx.astype(np.int32),                            # [K]
    }


@pytest.mark.parametrize("group_size", [32, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_gptq_file(tmp_path, group_size, symmetric, rng, assert_bitwise_equal):
    # zero_min=1: GPTQ v1 stores zero - 1 in 4 bits, so a zero point of 0 cannot be stored.
    q, z, s, expected = _known_int4(rng, group_size, symmetric, np.float16, zero_min=1)
    k = q.shape[1]
    prefix = "model.layers.3.self_attn.q_proj"
    path = tmp_path / "gptq.safetensors"
    save_file(_gptq_tensors(prefix, q, z, s, np.arange(k) // group_size), str(path))
    ckpt = load_safetensors(path)
    assert ckpt.unsupported == {}
    assert ckpt.source[f"{prefix}.weight"] == "gptq"
    _check_int4(ckpt[f"{prefix}.weight"], expected, group_size, "gptq", assert_bitwise_equal)


def test_gptq_act_order_is_rejected_with_a_reason(tmp_path, rng):
    group_size = 32
    q, z, s, _ = _known_int4(rng, group_size, False, np.float16, zero_min=1, min_groups=2)
    k = q.shape[1]
    # desc_act: the groups follow the activation order, so g_idx is a permutation of k // G;
    # one that leaves k = 0 in another group than 0 is certainly not trivial.
    g_idx = rng.permutation(np.arange(k) // group_size)
    if g_idx[0] == 0:
        j = int(np.flatnonzero(g_idx != 0)[0])
        g_idx[0], g_idx[j] = g_idx[j], g_idx[0]
    prefix = "model.layers.0.mlp.up_proj"
    path = tmp_path / "gptq_act_order.safetensors"
    save_file(_gptq_tensors(prefix, q, z, s, g_idx), str(path))
    ckpt = load_safetensors(path)
    assert f"{prefix}.weight" not in ckpt
    assert "act-order" in ckpt.unsupported[f"{prefix}.weight"]
    with pytest.raises(ValueError, match="act-order"):
        load_safetensors(path, strict=True)


@pytest.mark.parametrize("group_size", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_file(tmp_path, group_size, symmetric, rng, assert_bitwise_equal):
    q, z, s, expected = _known_int4(rng, group_size, symmetric, ml_dtypes.bfloat16)
    n, k = q.shape
    prefix = "model.layers.1.mlp.gate_proj"
    # pack-quantized: signed values v stored as v + 8, eight per int32 along K; asymmetric
    # zero points stored the same way but packed along N (dim 0). Our unsigned q and z are
    # exactly those stored nibbles.
    tensors = {
        f"{prefix}.weight_packed": _pack_rows(q),                              # [N, K/8]
        f"{prefix}.weight_scale": s,                                           # [N, K/G]
        f"{prefix}.weight_shape": np.array([n, k], np.int64),
    }
    if not symmetric:
        tensors[f"{prefix}.weight_zero_point"] = np.ascontiguousarray(_pack_rows(z.T).T)  # [N/8, K/G]
    path = tmp_path / "ct.safetensors"
    save_file(tensors, str(path))
    ckpt = load_safetensors(path)
    assert ckpt.unsupported == {}
    assert ckpt.source[f"{prefix}.weight"] == "compressed-tensors"
    w = ckpt[f"{prefix}.weight"]
    _check_int4(w, expected, group_size, "compressed-tensors", assert_bitwise_equal)
    assert (w.qzeros is None) == symmetric


def test_compressed_tensors_8bit_is_reported(tmp_path, rng):
    n, k = 16, 64
    tensors = {
        "x.weight_packed": rng.integers(-2**31, 2**31, (n, k // 4), dtype=np.int64).astype(np.int32),
        "x.weight_scale": np.ones((n, k // 32), np.float16),
        "x.weight_shape": np.array([n, k], np.int64),
    }
    path = tmp_path / "ct8.safetensors"
    save_file(tensors, str(path))
    ckpt = load_safetensors(path)
    assert "8 bits" in ckpt.unsupported["x.weight"], ckpt.unsupported


# E2M1 code -> value (OCP MX spec v1.0, table of FP4 E2M1): sign bit 3, magnitudes below.
E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)


def test_gpt_oss_mxfp4_experts_file(tmp_path, rng):
    e, n, k = 3, 2 * int(rng.integers(1, 6)), 32 * int(rng.integers(1, 5))
    codes = rng.integers(0, 16, (e, n, k), dtype=np.uint8)
    exps = rng.integers(117, 137, (e, n, k // 32), dtype=np.uint8)  # E8M0: 2^(e - 127)
    # GPT-OSS: byte j of a 16-byte block holds element 2j (low nibble) and 2j+1 (high).
    blocks = (codes[..., 0::2] | (codes[..., 1::2] << 4)).reshape(e, n, k // 32, 16)
    scale = np.exp2(exps.astype(np.float32) - 127)
    expected = E2M1[codes] * np.repeat(scale, 32, axis=-1)
    bias = rng.standard_normal((e, n)).astype(ml_dtypes.bfloat16)
    prefix = "model.layers.0.mlp.experts.gate_up_proj"
    tensors = {f"{prefix}_blocks": blocks, f"{prefix}_scales": exps, f"{prefix}_bias": bias}
    path = tmp_path / "gpt_oss.safetensors"
    save_file(tensors, str(path))
    ckpt = load_safetensors(path)
    assert ckpt.unsupported == {}
    assert ckpt.source[prefix] == "gpt-oss mxfp4"
    w = ckpt[prefix]
    assert w.format == "mxfp4"
    assert tuple(w.shape) == (e, n, k)
    assert_values_equal(w.dequantize(), expected, "gpt-oss experts")
    assert ckpt[f"{prefix}_bias"].dtype == ml_dtypes.bfloat16
    assert np.array_equal(ckpt[f"{prefix}_bias"].view(np.uint16), bias.view(np.uint16))


def test_config_json_mismatch_is_reported(tmp_path, rng):
    q, z, s, _ = _known_int4(rng, 32, False, np.float16)
    tensors = {"m.qweight": _pack_rows(q.T, AWQ_ORDER), "m.qzeros": _pack_rows(z.T, AWQ_ORDER),
               "m.scales": np.ascontiguousarray(s.T)}
    save_file(tensors, str(tmp_path / "model.safetensors"))
    (tmp_path / "config.json").write_text(json.dumps(
        {"quantization_config": {"quant_method": "gptq", "bits": 4}}))
    ckpt = load_safetensors(tmp_path)  # a directory: every *.safetensors in it
    assert ckpt.metadata["quantization_config"]["quant_method"] == "gptq"
    assert "quant_method='gptq'" in ckpt.unsupported["m.weight"], ckpt.unsupported


# -------------------------------------------------------------------------------- inspect


def test_tier_for_follows_build_info():
    info = "quantgemm 0.1.0 format 2; backends: cpu cuda(sm_90a); tiers: w4a16=cpu,cuda:simt," \
           "cuda:decode_frag,cuda:prefill_wgmma gguf=cpu,cuda:float,cuda:int8_mma mxfp4=cpu moe=cpu; " \
           "build: Release g++"
    for fmt in formats.names():
        assert qinspect.tier_for(fmt, info, "cpu") == "cpu"
    assert qinspect.tier_for("int4", info, "cuda") == "cuda:simt / cuda:decode_frag / cuda:prefill_wgmma"
    assert qinspect.tier_for("q4_K", info, "cuda") == "cuda:float / cuda:int8_mma"
    assert qinspect.tier_for("mxfp4", info, "cuda").startswith("cpu only")
    assert "moe" in qinspect.tier_for("mxfp4", info, "cuda", experts=True)
    assert qinspect.tier_for("int4", info, "hip").startswith("cpu only")


def test_inspect_lists_every_tensor(gguf_file, capsys):
    path = str(gguf_file["path"])
    assert qinspect.main([path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    rows = {r["name"]: r for r in report["tensors"]}
    ckpt = load_gguf(path)
    backend = pyquant.default_context().backend
    for name, (fmt, _raw, (n, k)) in gguf_file["quantized"].items():
        w = ckpt[name]
        r = rows[name]
        assert r["format"] == fmt and r["shape"] == [n, k]
        assert r["bytes"] == w.nbytes
        assert r["bits_per_weight"] == pytest.approx(w.nbytes * 8 / (n * k))
        assert r["tier"] == qinspect.tier_for(fmt, pyquant.build_info(), backend)
    for name in gguf_file["plain"]:
        assert rows[name]["tier"] == "-"
    assert set(report["unsupported"]) == set(gguf_file["unsupported"])

    assert qinspect.main([path]) == 0
    text = capsys.readouterr().out
    for name in list(gguf_file["quantized"]) + list(gguf_file["unsupported"]):
        assert name in text


def test_inspect_missing_file_is_an_error(tmp_path, capsys):
    assert qinspect.main([str(tmp_path / "nope.gguf")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_python_m_pyquant_inspect(gguf_file):
    out = subprocess.run([sys.executable, "-m", "pyquant", "inspect", str(gguf_file["path"])],
                         capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert out.returncode == 0, out.stderr
    for name in gguf_file["quantized"]:
        assert name in out.stdout
