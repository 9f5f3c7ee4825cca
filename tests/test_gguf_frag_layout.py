"""The GGUF frag layout (pyquant.formats.gguf_frag, qg_gguf_repack) on the CPU: every GGUF format.

1. The numpy reference against its definition: the weights plane is the W4A16 frag qweight
   plane (pyquant.formats.int4_frag, itself checked against the PTX fragment layout in
   tests/test_int4_frag_layout.py) of the block codes q in element order, the scales plane the
   W4A16 scales plane of G = 32 holding each block's fp16 d bit for bit; so a q4_0 frag weight
   is the W4A16 frag weight of G = 32, symmetric, fp16 scales, whose kernels read it.
2. Round trips: unpack(repack(raw)) == raw for every fp16 d bit pattern (NaN and inf too),
   shapes whose N and K need padding, and the padding is exactly code 0 and scale 0.
3. The library's CPU repack writes the reference bytes, rows of any even stride ldw included.
4. The CPU tier on a frag weight gives the block weight's output bit for bit (every x and
   output dtype, with and without a bias).
Q4_K, IQ4_XS, Q6_K and IQ3_XXS (their section): their planes against their definition (the codes
plane as Q4_0's, IQ3_XXS's codes derived element by element from its grid and signs; the records
(sc | m << 8, ls) where the W4A16 scales are, then d and dmin (or 0) per super-block), round trips
for every byte pattern of their blocks, the library's repack and the CPU tier on a frag weight;
IQ3_XXS's codebook times its scale is the gguf package's weight bit for bit, and planes no block
gives are refused. Q8_0 (its section): the byte plane against the PTX A-fragment layout,
round trips of every byte and fp16 pattern, the library's repack, the CPU tier, shards.
5. Refusals: bad repack arguments (nothing written), fp32 x is
   fine on the CPU; pyquant's GGUFWeight(layout="frag") checks its planes.
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import aligned_bytes, set_repack_fields
from pyquant import _lib
from pyquant.formats import gguf_frag as GF
from pyquant.formats import int4
from pyquant.formats import int4_frag as FR
from pyquant.formats import iq3_xxs
from pyquant.formats import iq4_xs
from pyquant.formats import q4_0
from pyquant.formats import q4_k
from pyquant.formats import q6_k
from pyquant.formats import q8_0
from pyquant.formats.iq_tables import IQ3XXS_GRID, KSIGNS_IQ2XS

BF16 = np.dtype(ml_dtypes.bfloat16)
# N = 40 pads to 48 rows, K = 224 (seven blocks) to 256; N = 1; K one chunk; a real K plus a block
AWKWARD = [(40, 224), (1, 32), (16, 128), (7, 4096 + 32)]


def _raw(rng, n, k):
    """Random blocks: every nibble, every fp16 d bit pattern (NaN and inf included)."""
    raw = q4_0.random_blocks(rng, n, k).reshape(n, k // 32, 18)
    raw[..., 0:2] = rng.integers(0, 256, size=(n, k // 32, 2), dtype=np.uint8)
    return raw.reshape(n, -1)


@pytest.mark.parametrize("n,k", AWKWARD)
def test_planes_are_the_w4a16_planes_of_g32_symmetric(rng, n, k):
    raw = _raw(rng, n, k)
    fw, fs = GF.repack("q4_0", raw)
    blocks = raw.reshape(n, k // 32, 18)
    codes = q4_0.unpack_quants(blocks).reshape(n, k)
    d_bits = np.ascontiguousarray(blocks[..., 0:2]).view("<u2")[..., 0]
    np.testing.assert_array_equal(fw, FR.pack_nibbles(codes))
    np.testing.assert_array_equal(fs.view(np.uint16), FR.pack_scales(d_bits, k, 32))
    assert fw.shape == GF.plane_shapes("q4_0", n, k)["w"] and fs.dtype == np.float16
    if n % 8 == 0:  # the same weight as W4A16 (canonical int4 wants whole qzeros words)
        want_q, want_s, _ = FR.repack(int4.pack_k(codes), d_bits.view(np.float16), None, 32)
        np.testing.assert_array_equal(fw, want_q)
        np.testing.assert_array_equal(fs.view(np.uint16), want_s.view(np.uint16))
        finite = np.isfinite(d_bits.view(np.float16)).all(axis=1)
        with np.errstate(invalid="ignore"):  # inf d times q - 8 = 0
            w4 = int4.dequantize(int4.pack_k(codes), d_bits.view(np.float16), None, 32)
            np.testing.assert_array_equal(w4[finite], q4_0.dequantize(raw)[finite])


@pytest.mark.parametrize("n,k", AWKWARD)
def test_round_trip_and_padding(rng, n, k):
    raw = _raw(rng, n, k)
    fw, fs = GF.repack("q4_0", raw)
    np.testing.assert_array_equal(GF.unpack("q4_0", fw, fs, n, k), raw)
    row, kk = FR.fragment_coords(n, k)
    nib = (fw.view(np.uint32)[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15
    assert not nib[(row >= n) | (kk >= k)].any(), "a padded code is not 0"
    srow, sgrp = FR._scale_coords(n, k, 32)
    assert not fs.view(np.uint16)[(srow >= n) | (sgrp >= k // 32)].any(), "a padded scale is not 0"


@pytest.mark.parametrize("n,k", AWKWARD)
def test_library_cpu_repack_matches_reference(rng, n, k, assert_bitwise_equal):
    raw = _raw(rng, n, k)
    w = pyquant.from_gguf("q4_0", raw, shape=(n, k))
    r = w.repack()
    fw, fs = GF.repack("q4_0", raw)
    assert r.layout == "frag" and r.shape == (n, k) and r.ldw == 0
    assert_bitwise_equal(np.asarray(r.raw).reshape(fw.shape), fw, f"weights plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(fs.shape).view(np.uint16), fs.view(np.uint16),
                         f"scales plane {n}x{k}")
    back = r.repack("canonical")
    assert back.layout == "canonical"
    assert_bitwise_equal(np.asarray(back.raw), raw, "round trip")
    assert r.repack("frag") is r


@pytest.mark.parametrize("fmt,n,k,ldw", [("q4_0", 24, 96, 64), ("q4_K", 9, 512, 304)])
def test_library_cpu_repack_reads_strided_rows(rng, fmt, n, k, ldw, assert_bitwise_equal):
    """Rows of stride ldw > row bytes (to_device pads GGUF rows to 16 bytes): the same planes."""
    raw = _raw(rng, n, k) if fmt == "q4_0" else _raw_k(rng, n, k)
    padded = np.zeros((n, ldw), np.uint8)
    padded[:, :raw.shape[1]] = raw
    r = pyquant.from_gguf(fmt, padded[:, :raw.shape[1]], shape=(n, k)).repack()
    fw, fs = GF.repack(fmt, raw)
    assert_bitwise_equal(np.asarray(r.raw).reshape(fw.shape), fw, f"weights plane, ldw = {ldw}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(-1).view(np.uint16), fs.reshape(-1).view(np.uint16),
                         f"scales plane, ldw = {ldw}")


X_DTYPES = [np.float32, np.float16, BF16]


@pytest.mark.parametrize("x_dt", X_DTYPES, ids=["fp32", "fp16", "bf16"])
@pytest.mark.parametrize("bias", [False, True], ids=["nobias", "bias"])
def test_cpu_tier_on_frag_is_the_block_result(rng, x_dt, bias, assert_bitwise_equal):
    n, k = 40, 224
    raw = q4_0.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    b = rng.standard_normal(n).astype(np.float32) if bias else None
    w = pyquant.from_gguf("q4_0", raw, shape=(n, k)).with_bias(b)
    f = w.repack()
    assert (f.bias is None) == (not bias)
    for m in (1, 3, 17):
        x = rng.standard_normal((m, k)).astype(np.float32).astype(x_dt)
        for out_dtype in (None, np.float32):
            assert_bitwise_equal(pyquant.gemm(x, f, out_dtype=out_dtype), pyquant.gemm(x, w, out_dtype=out_dtype),
                                 f"frag vs blocks m={m} x={np.dtype(x_dt)} out={out_dtype}")
    assert_bitwise_equal(f.dequantize(), w.dequantize(), "dequantize frag vs blocks")


def test_every_gguf_format_has_a_frag_layout():
    """Since iq3_xxs's (2026-12-06) no GGUF format is left on the block layout alone: the spec,
    the library's repack size query and the registry agree."""
    gguf = [name for name in pyquant.formats.names() if pyquant.formats.get(name).kind == "gguf"]
    assert sorted(GF.FORMATS) == sorted(gguf)
    for fmt in gguf:
        a = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG,
                                     format=pyquant.formats.get(fmt).qg_format, n=16, k=256)
        nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(nw), ctypes.byref(ns))
        shapes = GF.plane_shapes(fmt, 16, 256)
        assert nw.value == 4 * np.prod(shapes["w"]) and ns.value == 2 * np.prod(shapes["scales"]), fmt


def test_frag_weight_checks_its_planes(rng):
    n, k = 16, 128
    fw, fs = GF.repack("q4_0", _raw(rng, n, k))
    w = pyquant.GGUFWeight("q4_0", fw.reshape(-1).view(np.uint32), shape=(n, k), layout="frag", scales=fs)
    assert w.raw.dtype == np.int32 and w.nbytes == fw.nbytes + fs.nbytes
    with pytest.raises(pyquant.InvalidArgumentError, match=r"needs shape=\(N, K\)"):
        pyquant.GGUFWeight("q4_0", fw, layout="frag", scales=fs)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"scales is None"):
        pyquant.GGUFWeight("q4_0", fw, shape=(n, k), layout="frag")
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag raw plane holds \d+ elements"):
        pyquant.GGUFWeight("q4_0", fw.reshape(-1)[:-1], shape=(n, k), layout="frag", scales=fs)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag scales plane has dtype bfloat16"):
        pyquant.GGUFWeight("q4_0", fw, shape=(n, k), layout="frag", scales=fs.view(np.uint16).view(BF16))
    with pytest.raises(pyquant.InvalidArgumentError, match=r"scales= is the frag layout's"):
        pyquant.GGUFWeight("q4_0", np.zeros((n, k // 32 * 18), np.uint8), scales=fs)


def _repack_args(n=24, k=96, **over):
    src = aligned_bytes(n * k // 32 * 18)
    out = aligned_bytes(1 << 16)
    base = out.ctypes.data
    fields = dict(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG, format=_lib.Format.QG_FORMAT_Q4_0, n=n, k=k,
                  w=src.ctypes.data, ldw=k // 32 * 18, out_w=base, out_scales=base + 32768)
    fields.update(over)
    return _lib.qg_gguf_repack_args(**fields), (src, out), base


def test_repack_size_is_the_plane_size():
    for n, k in AWKWARD:
        a, _, _ = _repack_args(n, k)
        nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(nw), ctypes.byref(ns))
        shapes = GF.plane_shapes("q4_0", n, k)
        assert (nw.value, ns.value) == (4 * np.prod(shapes["w"]), 2 * np.prod(shapes["scales"]))


@pytest.mark.parametrize("change,pattern", [
    (dict(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_BLOCKS),
     r"layout=QG_GGUF_LAYOUT_BLOCKS: qg_gguf_repack produces QG_GGUF_LAYOUT_FRAG \(1\) or QG_GGUF_LAYOUT_ROWS8 \(2\)"),
    (dict(layout=7), r"layout=7: qg_gguf_repack produces QG_GGUF_LAYOUT_FRAG"),
    (dict(format=_lib.Format.QG_FORMAT_INT4), r"is not a GGUF block format"),
    (dict(k=100), r"k=100 is not a multiple of the Q4_0 block \(32 elements\)"),
    (dict(n=0), r"n=0 must be positive"),
    (dict(ldw=53), r"ldw=53 < 54 bytes per row"),
    (dict(ldw=55), r"ldw=55 is odd"),
    (dict(w=None), r"w is NULL"),
    (dict(out_w="+4"), r"out_w=0x[0-9a-f]+ is not aligned to 16 bytes \(frag layout"),
    (dict(out_scales="+8"), r"out_scales=0x[0-9a-f]+ is not aligned to 16 bytes"),
    (dict(out_scales="+64"), r"out_scales overlaps out_w"),
    (dict(out_w="src"), r"out_w overlaps w"),
])
def test_repack_refuses_bad_arguments_and_writes_nothing(change, pattern):
    a, (src, out), base = _repack_args()
    set_repack_fields(a, change, src, base)  # "+N": N bytes past out_w's start
    with pytest.raises(pyquant.InvalidArgumentError, match=pattern):
        _lib.qg_gguf_repack(pyquant.cpu_context().handle, ctypes.byref(a), None)
    assert not out.any(), "a refused repack wrote its output"
    assert not src.any(), "a refused repack wrote its input"
    if not any(f.startswith(("out_", "w", "ldw")) for f in change):  # the size query reads no pointer or stride
        with pytest.raises(pyquant.InvalidArgumentError, match=pattern):
            _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(ctypes.c_size_t()), ctypes.byref(ctypes.c_size_t()))


def test_gemm_refuses_a_bad_layout_and_misaligned_planes(rng, poisoned_output):
    """qg_gguf_gemm: a layout that is not a qg_gguf_layout value and frag planes off 16 bytes are
    refused before anything is written."""
    n, k, m = 16, 128, 2
    fw, fs = GF.repack("q4_0", q4_0.random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4)))
    x = rng.standard_normal((m, k)).astype(np.float16)
    y = np.full((m, n), np.nan, np.float16)
    planes = aligned_bytes(fw.nbytes + 16 + fs.nbytes)

    def call(**over):
        fields = dict(format=_lib.Format.QG_FORMAT_Q4_0, m=m, n=n, k=k, x_dtype=_lib.DType.QG_DTYPE_F16,
                      y_dtype=_lib.DType.QG_DTYPE_F16, x=x.ctypes.data, ldx=k, w=planes.ctypes.data, ldw=0,
                      y=y.ctypes.data, ldy=n, w_scales=planes.ctypes.data + fw.nbytes,
                      layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG)
        fields.update(over)
        a = _lib.qg_gguf_gemm_args(**fields)
        _lib.qg_gguf_gemm(pyquant.cpu_context().handle, ctypes.byref(a), None)

    for over, pattern in ((dict(layout=3), r"layout=3 is not a qg_gguf_layout value"),
                          (dict(w=planes.ctypes.data + 8), r"w=0x[0-9a-f]+ is not aligned to 16 bytes"),
                          (dict(w_scales=planes.ctypes.data + fw.nbytes + 2), r"w_scales=0x[0-9a-f]+ is not aligned"),
                          (dict(w_scales=None), r"w_scales is NULL")):
        with pytest.raises(pyquant.InvalidArgumentError, match=pattern):
            call(**over)
        assert np.isnan(y).all(), f"{pattern}: a refused call wrote y"
    planes[: fw.nbytes] = fw.reshape(-1).view(np.uint8)
    planes[fw.nbytes: 2 * fw.nbytes] = 0
    planes[fw.nbytes: fw.nbytes + fs.nbytes] = fs.reshape(-1).view(np.uint8)
    call()
    assert np.isfinite(y).all()


def test_frag_shard_is_the_repack_of_the_canonical_shard(rng, assert_bitwise_equal):
    """As for int4 and mxfp4 frag (tests/test_shard.py, tests/test_mxfp4_frag_layout.py): cuts on
    16-row blocks and 128-k chunks; N = 40 and K = 352 are padded in the planes (to 48 and 384)
    and the last part keeps that padding, as the repack of its canonical shard pads it. The
    shard keeps the layout, the bias goes with n parts and to k part 0. Other cuts are refused,
    naming the rule."""
    n, k = 40, 352
    w = pyquant.from_gguf("q4_0", _raw(rng, n, k), shape=(n, k)).with_bias(rng.standard_normal(n).astype(np.float32))
    f = w.repack()
    for axis, parts in (("n", [16, 24]), ("n", [32, 8]), ("k", [128, 224]), ("k", [256, 96]), ("k", 1)):
        for i in range(parts if isinstance(parts, int) else len(parts)):
            got, canon = f.shard(axis, parts, i), w.shard(axis, parts, i)
            assert got.layout == "frag" and got.shape == canon.shape
            ref_w, ref_s = GF.repack("q4_0", np.asarray(canon.raw))
            assert_bitwise_equal(np.asarray(got.raw).reshape(ref_w.shape), ref_w, f"{axis} {parts} part {i} w")
            assert_bitwise_equal(np.asarray(got.scales).reshape(ref_s.shape).view(np.uint16), ref_s.view(np.uint16),
                                 f"{axis} {parts} part {i} scales")
            assert (got.bias is None) == (canon.bias is None)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag-layout q4_0 weight must cut K at multiples of 128"):
        f.shard("k", [96, 256], 0)


# ---------------------------------------------------------------- Q4_K, IQ4_XS, Q6_K, IQ3_XXS (super-block planes)

K_AWKWARD = [(40, 256), (1, 512), (16, 256), (7, 4096 + 256)]
SUPER = {"q4_K": q4_k, "iq4_xs": iq4_xs, "q6_K": q6_k, "iq3_xxs": iq3_xxs}


def _raw_k(rng, n, k, fmt="q4_K"):
    """Blocks of random bytes: every code, scale and min bit pattern, every fp16 d and dmin
    (NaN and inf included): the layout moves bits, so every pattern must survive."""
    return rng.integers(0, 256, size=(n, k // 256 * SUPER[fmt].BLOCK_BYTES), dtype=np.uint8)


def _definition(fmt, blocks):
    """(records [N, nb * 8] uint16, fields [N, nb, 2] uint16) from their definition: q4_K's
    sc | m << 8 and (d, dmin); iq4_xs's and iq3_xxs's ls and (d, 0); q6_K's int8 scales of
    sub-blocks 2j and 2j + 1 as the low and high byte, and (d, 0)."""
    n, nb = blocks.shape[:2]
    if fmt == "q4_K":
        sc, m = q4_k.unpack_scales_mins(blocks)
        return (sc.astype(np.uint16) | (m.astype(np.uint16) << 8)).reshape(n, -1), blocks[..., 0:4].copy().view("<u2")
    fields = np.zeros((n, nb, 2), np.uint16)
    if fmt == "q6_K":
        sc = blocks[..., 192:208].astype(np.uint16)
        fields[..., 0] = blocks[..., 208:210].copy().view("<u2")[..., 0]
        return (sc[..., 0::2] | (sc[..., 1::2] << 8)).reshape(n, -1), fields
    fields[..., 0] = blocks[..., 0:2].copy().view("<u2")[..., 0]
    if fmt == "iq3_xxs":  # the top 4 bits of each sub-block's sign / scale word
        return (blocks[..., 66:].copy().view("<u4") >> 28).astype(np.uint16).reshape(n, -1), fields
    return iq4_xs.unpack_scales(blocks).astype(np.uint16).reshape(n, -1), fields


def _iq3_xxs_codes(blocks, n, k):
    """iq3_xxs's codes element by element from the block format (src/formats/blocks.h): element e
    is byte e % 4 of grid entry qs[e // 4], negative where bit e % 8 of KSIGNS_IQ2XS[the 7-bit sign
    index (e // 8) % 4 of sub-block e // 32's word] is set; its code is that signed magnitude's
    index in gguf_frag.IQ3_CODEBOOK."""
    codebook = [int(v) for v in GF.IQ3_CODEBOOK]
    codes = np.zeros((n, k), np.uint8)
    for row in range(n):
        for e in range(k):
            b = blocks[row, e // 256]
            mag = int(IQ3XXS_GRID[b[2 + (e % 256) // 4], e % 4])
            word = int(b[66 + 4 * ((e % 256) // 32):][:4].copy().view("<u4")[0])
            neg = (int(KSIGNS_IQ2XS[(word >> (7 * ((e // 8) % 4))) & 127]) >> (e % 8)) & 1
            codes[row, e] = codebook.index(-mag if neg else mag)
    return codes


def _codes_plane(fmt, blocks, n, k):
    """The weights plane from its definition: the 4-bit codes' nibble plane, or q6_K's q - 32
    (int8) in the byte plane."""
    if fmt == "iq3_xxs":
        return GF.place_codebook_nibbles(FR.pack_nibbles(_iq3_xxs_codes(blocks, n, k)))
    if fmt == "q6_K":
        return GF.pack_bytes((q6_k.unpack_quants(blocks).reshape(n, k).astype(np.int16) - 32).astype(np.int8))
    w = FR.pack_nibbles(SUPER[fmt].unpack_quants(blocks).reshape(n, k))
    return GF.place_codebook_nibbles(w) if fmt in GF.CODEBOOK_FORMATS else w


@pytest.mark.parametrize("fmt", list(SUPER))
@pytest.mark.parametrize("n,k", K_AWKWARD)
def test_superblock_planes_are_their_definition(rng, fmt, n, k):
    raw = _raw_k(rng, n, k, fmt)
    fw, fs = GF.repack(fmt, raw)
    blocks = raw.reshape(n, k // 256, SUPER[fmt].BLOCK_BYTES)
    np.testing.assert_array_equal(fw, _codes_plane(fmt, blocks, n, k))
    assert fs.dtype == np.uint16 and fs.shape == GF.plane_shapes(fmt, n, k)["scales"]
    rec, fields = _definition(fmt, blocks)
    nrec = int(np.prod(FR.plane_shapes(n, k, 32)["scales"]))
    np.testing.assert_array_equal(fs[:nrec], FR.pack_scales(rec, k, 32).reshape(-1))
    # the super-block part, element by element: [rb, sb, g, f, h] = field f of row 16 rb + g + 8 h
    sb = fs[nrec:].reshape(-1, k // 256, 8, 2, 2)
    for row in range(n):
        for f in range(2):
            np.testing.assert_array_equal(sb[row // 16, :, row % 8, f, (row % 16) // 8], fields[row, :, f])
    pad = np.ones(sb.shape[0] * 16, bool)
    pad[:n] = False
    for row in np.nonzero(pad)[0]:
        assert not sb[row // 16, :, row % 8, :, (row % 16) // 8].any(), f"padded row {row} has a field"


@pytest.mark.parametrize("fmt", list(SUPER))
@pytest.mark.parametrize("n,k", K_AWKWARD)
def test_superblock_round_trip_and_library_repack(rng, fmt, n, k, assert_bitwise_equal):
    raw = _raw_k(rng, n, k, fmt)
    fw, fs = GF.repack(fmt, raw)
    np.testing.assert_array_equal(GF.unpack(fmt, fw, fs, n, k), raw)
    r = pyquant.from_gguf(fmt, raw, shape=(n, k)).repack()
    assert r.layout == "frag" and r.scales.dtype == np.uint16
    assert_bitwise_equal(np.asarray(r.raw).reshape(fw.shape), fw, f"{fmt} weights plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(-1), fs, f"{fmt} scales plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.repack("canonical").raw), raw, f"{fmt} round trip through the library")
    a = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG, format=pyquant.formats.get(fmt).qg_format,
                                 n=n, k=k)
    nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(nw), ctypes.byref(ns))
    assert (nw.value, ns.value) == (fw.nbytes, fs.nbytes)


@pytest.mark.parametrize("fmt", list(SUPER))
@pytest.mark.parametrize("x_dt", X_DTYPES, ids=["fp32", "fp16", "bf16"])
def test_superblock_cpu_tier_on_frag_is_the_block_result(rng, fmt, x_dt, assert_bitwise_equal):
    n, k = 40, 512
    raw = SUPER[fmt].random_blocks(rng, n, k, d_range=(2.0 ** -8, 2.0 ** -4))
    w = pyquant.from_gguf(fmt, raw, shape=(n, k)).with_bias(rng.standard_normal(n).astype(np.float32))
    f = w.repack()
    for m in (1, 3, 17):
        x = rng.standard_normal((m, k)).astype(np.float32).astype(x_dt)
        assert_bitwise_equal(pyquant.gemm(x, f), pyquant.gemm(x, w), f"{fmt} frag vs blocks m={m} x={np.dtype(x_dt)}")
    assert_bitwise_equal(f.dequantize(), w.dequantize(), "dequantize frag vs blocks")


@pytest.mark.parametrize("fmt", list(SUPER))
def test_superblock_frag_refusals(rng, fmt):
    n, k = 16, 256
    fw, fs = GF.repack(fmt, _raw_k(rng, n, k, fmt))
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag scales plane has dtype float16"):
        pyquant.GGUFWeight(fmt, fw, shape=(n, k), layout="frag", scales=fs.view(np.float16))
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag scales plane holds \d+ elements"):
        pyquant.GGUFWeight(fmt, fw, shape=(n, k), layout="frag", scales=fs[:-4])
    f = pyquant.GGUFWeight(fmt, fw, shape=(n, k), layout="frag", scales=fs)
    with pytest.raises(pyquant.InvalidArgumentError, match=rf"frag-layout {fmt} weight does not shard"):
        f.shard("n", 1, 0)


@pytest.mark.parametrize("fmt", GF.CODEBOOK_FORMATS)
def test_codebook_nibbles_are_placed_by_a_register(rng, fmt):
    """The codebook formats' words: byte p holds the codes of A register p (m16n8k16: rows g /
    g + 8, k 2t / 2t + 8 of the k16 step), its low half in the low nibble, the high half (k + 1)
    in the high one; the byte the GPU decode indexes its table of value pairs with."""
    n, k = 32, 512
    raw = _raw_k(rng, n, k, fmt)
    fw, _ = GF.repack(fmt, raw)
    codes = (_iq3_xxs_codes(raw.reshape(n, k // 256, -1), n, k) if fmt == "iq3_xxs"
             else SUPER[fmt].unpack_quants(raw.reshape(n, k // 256, -1)).reshape(n, k))
    words = fw.view(np.uint32).reshape(n // 16, k // 64, 32, 4)
    for lane in (0, 5, 31):
        g, t = lane // 4, lane % 4
        for p in range(4):
            row, kk = g + 8 * (p % 2), 2 * t + 8 * (p // 2)
            byte = (words[:, :, lane, :] >> np.uint32(8 * p)) & np.uint32(255)  # [rb, kt, step]
            lo = codes[row::16, :].reshape(n // 16, k // 64, 4, 16)[..., kk]
            hi = codes[row::16, :].reshape(n // 16, k // 64, 4, 16)[..., kk + 1]
            np.testing.assert_array_equal(byte, lo | (hi.astype(np.uint32) << 4), f"lane {lane} register {p}")
    np.testing.assert_array_equal(GF.unplace_codebook_nibbles(GF.place_codebook_nibbles(fw)), fw)


def test_iq3_xxs_codes_value_the_weight(rng):
    """The kernels' model of an iq3_xxs frag weight: IQ3_CODEBOOK[code] times the group's
    (d * (0.5 + ls)) * 0.5 is the gguf package's float32 weight bit for bit (every product is
    exact: 11 x 5 x 6 bits)."""
    gguf_quants = pytest.importorskip("gguf.quants")
    n, k = 24, 512
    raw = iq3_xxs.random_blocks(rng, n, k)
    fw, fs = GF.repack("iq3_xxs", raw)
    codes = FR.unpack_nibbles(GF.unplace_codebook_nibbles(fw), n, k)
    rec, d, second = GF.split_superblocks(fs, n, k)
    assert not second.any() and rec.max() <= 15
    d32 = np.repeat(d.view(np.float16).astype(np.float32), 8, axis=1)
    s = (d32 * (np.float32(0.5) + rec.astype(np.float32))) * np.float32(0.5)
    got = GF.IQ3_CODEBOOK[codes].astype(np.float32) * np.repeat(s, 32, axis=1)
    want = gguf_quants.dequantize(raw, gguf_quants.GGMLQuantizationType.IQ3_XXS).reshape(n, k)
    np.testing.assert_array_equal(got.view(np.uint32), want.astype(np.float32).view(np.uint32))


@pytest.mark.parametrize("bad", ["grid", "parity", "record"])
def test_iq3_xxs_planes_no_block_gives_are_refused(rng, bad, poisoned_output):
    """unpack (the spec) and the CPU tier on a frag weight refuse iq3_xxs planes that no block
    gives, naming the row, and write nothing."""
    n, k = 16, 256
    fw, fs = GF.repack("iq3_xxs", iq3_xxs.random_blocks(rng, n, k))
    codes = FR.unpack_nibbles(GF.unplace_codebook_nibbles(fw), n, k)
    rec, d, second = GF.split_superblocks(fs, n, k)
    row = 5
    if bad == "grid":  # 4 magnitudes that no grid entry has (3840 of the 4096 quads)
        grid = {tuple(int(v) for v in g) for g in IQ3XXS_GRID}
        quad = next(q for q in np.ndindex(8, 8, 8, 8) if tuple(4 + 8 * i - 2 * (i == 7) for i in q) not in grid)
        codes[row, 0:4] = (codes[row, 0:4] & 8) | np.array(quad, np.uint8)
    elif bad == "parity":  # one sign flipped: 8 signs of odd parity
        codes[row, 0] ^= 8
    else:
        rec[row, 0] = 16
    fw2 = GF.place_codebook_nibbles(FR.pack_nibbles(codes))
    nrec = int(np.prod(FR.plane_shapes(n, k, 32)["scales"]))
    fs2 = fs.copy()
    fs2[:nrec] = FR.pack_scales(rec, k, 32).reshape(-1)
    what = {"grid": "4 magnitudes outside the grid", "parity": "8 signs of odd parity", "record": "a record above 15"}[bad]
    with pytest.raises(ValueError, match=rf"row {row} is not an iq3_xxs frag weight \({what}"):
        GF.unpack("iq3_xxs", fw2, fs2, n, k)
    f = pyquant.GGUFWeight("iq3_xxs", fw2, shape=(n, k), layout="frag", scales=fs2)
    x = rng.standard_normal((3, k)).astype(np.float32)
    y = poisoned_output(3, n, np.float32)
    with pytest.raises(pyquant.InvalidArgumentError, match=rf"row {row} is not an iq3_xxs frag weight"):
        pyquant.gemm(x, f, out=y.y)
    assert y.unchanged(), "a refused call wrote its output"


# ---------------------------------------------------------------- Q8_0 (the byte plane)

def _raw8(rng, n, k):
    """Q8_0 blocks of random bytes: every code byte, every fp16 d (NaN and inf included)."""
    return rng.integers(0, 256, size=(n, k // 32 * q8_0.BLOCK_BYTES), dtype=np.uint8)


@pytest.mark.parametrize("n,k", AWKWARD)
def test_q8_0_byte_plane_is_the_a_fragment_layout(rng, n, k):
    """Byte b of word w of lane l = 4 g + t in tile (rb, kb) is A register p = 2 (w % 2) + b % 2
    of k16 step w // 2, half b // 2: row g + 8 (p % 2), k 2 t + half + 8 (p // 2) of the step
    (the PTX m16n8k16 A layout, as tests/test_int4_frag_layout.py states it for nibbles)."""
    raw = _raw8(rng, n, k)
    fw, fs = GF.repack("q8_0", raw)
    blocks = raw.reshape(n, k // 32, q8_0.BLOCK_BYTES)
    codes = blocks[..., 2:].reshape(n, k)
    assert fw.shape == GF.plane_shapes("q8_0", n, k)["w"] == (-(-n // 16), -(-k // 128) * 4, 32, 4)
    words = fw.view(np.uint32)
    for rb, kb, lane, w in [(0, 0, 0, 0), (0, 0, 31, 3), (fw.shape[0] - 1, fw.shape[1] - 1, 13, 1),
                            (0, min(3, fw.shape[1] - 1), 22, 2)]:
        g, t = lane // 4, lane % 4
        for b in range(4):
            p, half = 2 * (w % 2) + b % 2, b // 2
            row, kk = 16 * rb + g + 8 * (p % 2), 32 * kb + 16 * (w // 2) + 2 * t + half + 8 * (p // 2)
            want = codes[row, kk] if row < n and kk < k else 0
            assert (words[rb, kb, lane, w] >> (8 * b)) & 255 == want, (rb, kb, lane, w, b)
    d_bits = np.ascontiguousarray(blocks[..., 0:2]).view("<u2")[..., 0]
    np.testing.assert_array_equal(fs.view(np.uint16), FR.pack_scales(d_bits, k, 32))
    row, kk = GF.byte_coords(n, k)
    byte = (words[..., None] >> (np.arange(4, dtype=np.uint32) * 8)) & 255
    assert not byte[(row >= n) | (kk >= k)].any(), "a padded code is not 0"


@pytest.mark.parametrize("n,k", AWKWARD)
def test_q8_0_round_trip_and_library_repack(rng, n, k, assert_bitwise_equal):
    raw = _raw8(rng, n, k)
    fw, fs = GF.repack("q8_0", raw)
    np.testing.assert_array_equal(GF.unpack("q8_0", fw, fs, n, k), raw)
    r = pyquant.from_gguf("q8_0", raw, shape=(n, k)).repack()
    assert r.layout == "frag" and r.scales.dtype == np.float16
    assert_bitwise_equal(np.asarray(r.raw).reshape(fw.shape), fw, f"q8_0 weights plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(fs.shape).view(np.uint16), fs.view(np.uint16),
                         f"q8_0 scales plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.repack("canonical").raw), raw, "q8_0 round trip through the library")
    a = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG, format=_lib.Format.QG_FORMAT_Q8_0,
                                 n=n, k=k)
    nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
    _lib.qg_gguf_repack_size(ctypes.byref(a), ctypes.byref(nw), ctypes.byref(ns))
    assert (nw.value, ns.value) == (fw.nbytes, fs.nbytes)
    assert fw.nbytes == 2 * 4 * np.prod(GF.plane_shapes("q4_0", n, k)["w"]), "the byte plane is twice the nibble plane"


def test_q8_0_library_repack_reads_strided_rows(rng, assert_bitwise_equal):
    n, k, ldw = 9, 160, 176
    raw = _raw8(rng, n, k)
    padded = np.zeros((n, ldw), np.uint8)
    padded[:, :raw.shape[1]] = raw
    r = pyquant.from_gguf("q8_0", padded[:, :raw.shape[1]], shape=(n, k)).repack()
    fw, fs = GF.repack("q8_0", raw)
    assert_bitwise_equal(np.asarray(r.raw).reshape(fw.shape), fw, f"weights plane, ldw = {ldw}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(fs.shape).view(np.uint16), fs.view(np.uint16), "scales plane")


@pytest.mark.parametrize("x_dt", X_DTYPES, ids=["fp32", "fp16", "bf16"])
def test_q8_0_cpu_tier_on_frag_is_the_block_result(rng, x_dt, assert_bitwise_equal):
    n, k = 40, 224
    raw = q8_0.random_blocks(rng, n, k, d_range=(2.0 ** -10, 2.0 ** -6))
    w = pyquant.from_gguf("q8_0", raw, shape=(n, k)).with_bias(rng.standard_normal(n).astype(np.float32))
    f = w.repack()
    for m in (1, 3, 17):
        x = rng.standard_normal((m, k)).astype(np.float32).astype(x_dt)
        assert_bitwise_equal(pyquant.gemm(x, f), pyquant.gemm(x, w), f"q8_0 frag vs blocks m={m} x={np.dtype(x_dt)}")
    assert_bitwise_equal(f.dequantize(), w.dequantize(), "dequantize frag vs blocks")


def test_q8_0_frag_shard_is_the_repack_of_the_canonical_shard(rng, assert_bitwise_equal):
    """As q4_0's: 16-row blocks and 128-k chunks (four 32-k byte tiles a chunk)."""
    n, k = 40, 352
    w = pyquant.from_gguf("q8_0", _raw8(rng, n, k), shape=(n, k))
    f = w.repack()
    for axis, parts in (("n", [16, 24]), ("k", [128, 224]), ("k", [256, 96])):
        for i in range(len(parts)):
            got, canon = f.shard(axis, parts, i), w.shard(axis, parts, i)
            ref_w, ref_s = GF.repack("q8_0", np.asarray(canon.raw))
            assert_bitwise_equal(np.asarray(got.raw).reshape(ref_w.shape), ref_w, f"{axis} {parts} part {i} w")
            assert_bitwise_equal(np.asarray(got.scales).reshape(ref_s.shape).view(np.uint16), ref_s.view(np.uint16),
                                 f"{axis} {parts} part {i} scales")
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag-layout q8_0 weight must cut K at multiples of 128"):
        f.shard("k", [96, 256], 0)
