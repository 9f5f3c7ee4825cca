"""The MXFP4 frag layout (pyquant.formats.mxfp4_frag, qg_mxfp4_repack) on the CPU.

1. The numpy reference against its definition: the blocks plane is the W4A16 frag qweight
   plane (pyquant.formats.int4_frag, itself checked against the PTX fragment layout in
   tests/test_int4_frag_layout.py) of the canonical blocks read as little-endian int32
   words, each word's bits placed so that the GPU decode's rotates and masks (modelled here
   from hip/mma.h's e2m1_word) give every pair's sign at bit 15 and magnitude at bits 6..8;
   each scale is the bf16 number 2^(e - 127), NaN for e = 255.
2. Round trips: unpack(repack(w)) == w for shapes whose N and K need padding, and the
   padding is exactly code 0 and scale 0.
3. The library's CPU repack writes the reference bytes (every E8M0 byte 0..255, every code).
4. The CPU tier on a frag weight gives the canonical weight's output bit for bit (every x
   dtype and output dtype, with and without a bias), and the repack refuses bad arguments
   before it writes anything.
5. pyquant: MXFP4Weight(layout="frag") checks its planes; stacked experts repack only through
   pyquant.moe_repack (their MoE frag layout: tests/test_moe_frag_layout.py).
"""
from __future__ import annotations

import ctypes

import ml_dtypes
import numpy as np
import pytest

import pyquant
from conftest import aligned_bytes, set_repack_fields
from pyquant import _lib
from pyquant.formats import int4_frag as FR
from pyquant.formats import mxfp4 as MX
from pyquant.formats import mxfp4_frag as MF

BF16 = np.dtype(ml_dtypes.bfloat16)
# N = 40 pads to 48 rows, K = 224 (seven blocks, not a multiple of 128) pads to 256
AWKWARD = [(40, 224), (1, 32), (16, 128), (136, 96), (24, 4096 + 32)]


def _canonical(rng, n, k, e_range=(0, 256)):
    """Random canonical blocks (every code) and scales; the first scales run through every
    E8M0 byte 0..255 when the weight has that many blocks."""
    blocks = rng.integers(0, 256, size=(n, k // 32, 16), dtype=np.uint8)
    scales = rng.integers(*e_range, size=(n, k // 32), dtype=np.uint8)
    flat = scales.reshape(-1)
    if e_range == (0, 256):
        flat[: min(256, flat.size)] = np.arange(min(256, flat.size), dtype=np.uint8)
    return blocks, scales


@pytest.mark.parametrize("n,k", AWKWARD)
def test_blocks_plane_is_the_w4a16_plane_of_the_blocks_as_words(rng, n, k):
    blocks, scales = _canonical(rng, n, k)
    fb, _ = MF.repack(blocks, scales)
    qweight = blocks.reshape(n, k // 2).view("<u4").view(np.int32)   # [N, K/8] words
    dummy = np.ones((n, k // 32), np.float16)
    if n % 8 == 0:  # int4_frag.repack wants whole qzeros words; its plane needs none
        want, _, _ = FR.repack(qweight, dummy, None, 32)
    else:
        want = FR.pack_nibbles(MX.decode_codes(blocks).reshape(n, k))
    np.testing.assert_array_equal(MF.unplace_bits(fb), want)
    np.testing.assert_array_equal(MF.place_bits(want), fb)
    assert fb.shape == MF.plane_shapes(n, k)["blocks"]


def _rotl(w, r):
    return (w << np.uint32(r)) | (w >> np.uint32(32 - r)) if r else w


def test_bit_placement_is_what_the_gpu_decode_takes_apart(rng):
    """The extraction of hip/mma.h's e2m1_word (bf16 and fp16), in numpy, on placed words:
    pair p's two codes come out with the sign at bit 15 (31) and the three magnitude bits at
    6..8 (bf16) or 9..11 (fp16) of each half, for random words and every code."""
    codes = rng.integers(0, 2**32, size=4096, dtype=np.uint64).astype(np.uint32)
    codes[:16] = np.uint32(0x11111111) * np.arange(16, dtype=np.uint32)  # every code everywhere
    w = MF.place_bits(codes.view(np.int32)).view(np.uint32)
    assert sorted(MF.bit_position(j, c) for j in range(8) for c in range(4)) == list(range(32))
    u = np.uint32
    sign, mag = u(0x80008000), u(0x01c001c0)
    bf16 = [_rotl(w, 6) & (sign | mag), _rotl(w, 2) & (sign | mag), _rotl(w, 12) & (sign | mag),
            (w & u(0x81808180)) | (_rotl(w, 8) & u(0x00400040))]
    fp16 = [(_rotl(w, 6) & sign) | (_rotl(w, 9) & (mag << u(3))), (_rotl(w, 2) & sign) | (_rotl(w, 5) & (mag << u(3))),
            (_rotl(w, 12) & sign) | (_rotl(w, 15) & (mag << u(3))),
            (w & sign) | (_rotl(w, 3) & u(0x0c000c00)) | (_rotl(w, 11) & u(0x02000200))]
    for p in range(4):
        lo, hi = (codes >> u(4 * p)) & u(15), (codes >> u(4 * (p + 4))) & u(15)
        for got, at in ((bf16[p], 6), (fp16[p], 9)):
            want = ((lo >> u(3)) << u(15)) | ((lo & u(7)) << u(at))
            want |= (((hi >> u(3)) << u(15)) | ((hi & u(7)) << u(at))) << u(16)
            np.testing.assert_array_equal(got, want, err_msg=f"pair {p}, magnitude at bit {at}")


def test_every_e8m0_byte_becomes_its_bf16_value():
    e = np.arange(256, dtype=np.uint8)
    bits = MF.e8m0_to_bf16_bits(e)
    value = bits.view(BF16).astype(np.float64)
    finite = e != 255
    np.testing.assert_array_equal(value[finite], np.ldexp(1.0, e[finite].astype(np.int64) - 127))
    assert np.isnan(value[255]) and bits[255] == 0x7FC0
    assert bits[0] == 0x0040 and bits[1] == 0x0080 and bits[127] == 0x3F80
    np.testing.assert_array_equal(MF.bf16_bits_to_e8m0(bits), e)
    # the scales the CPU tier decodes from the bf16 plane equal the canonical ones
    one = np.full((1, 1, 16), 0x22, np.uint8)   # code 2 = 1.0 everywhere
    for ev in (0, 1, 126, 127, 200, 254, 255):
        s = np.full((1, 1), ev, np.uint8)
        np.testing.assert_array_equal(MX.dequantize(*MF.unpack(*MF.repack(one, s), 1, 32)),
                                      MX.dequantize(one, s))


@pytest.mark.parametrize("n,k", AWKWARD)
def test_round_trip_and_padding(rng, n, k):
    blocks, scales = _canonical(rng, n, k)
    fb, fs = MF.repack(blocks, scales)
    assert fs.dtype == BF16 and fs.shape == MF.plane_shapes(n, k)["scales"]
    b2, s2 = MF.unpack(fb, fs, n, k)
    np.testing.assert_array_equal(b2, blocks)
    np.testing.assert_array_equal(s2, scales)
    row, kk = FR.fragment_coords(n, k)
    words = MF.unplace_bits(fb).view(np.uint32)   # the codes back in the W4A16 nibble order
    nib = (words[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15
    assert not nib[(row >= n) | (kk >= k)].any(), "a padded code is not 0"
    srow, sgrp = FR._scale_coords(n, k, 32)
    assert not fs.view(np.uint16)[(srow >= n) | (sgrp >= k // 32)].any(), "a padded scale is not 0"


@pytest.mark.parametrize("n,k", AWKWARD)
def test_library_cpu_repack_matches_reference(rng, n, k, assert_bitwise_equal):
    blocks, scales = _canonical(rng, n, k)
    w = pyquant.from_mxfp4(blocks, scales)
    r = w.repack()
    fb, fs = MF.repack(blocks, scales)
    assert r.layout == "frag" and r.shape == (n, k)
    assert_bitwise_equal(np.asarray(r.blocks).reshape(fb.shape), fb, f"blocks plane {n}x{k}")
    assert_bitwise_equal(np.asarray(r.scales).reshape(fs.shape), fs, f"scales plane {n}x{k}")
    back = r.repack("canonical")
    assert back.layout == "canonical"
    assert_bitwise_equal(back.blocks, blocks, "round trip blocks")
    assert_bitwise_equal(back.scales, scales, "round trip scales")
    assert_bitwise_equal(r.dequantize(), w.dequantize(), "dequantize frag vs canonical")
    assert r.repack("frag") is r


X_DTYPES = [np.float32, np.float16, BF16]


@pytest.mark.parametrize("bias_dtype", [None, np.float32, BF16], ids=["no-bias", "bias-f32", "bias-bf16"])
@pytest.mark.parametrize("out_f32", [False, True], ids=["y=x", "y=f32"])
@pytest.mark.parametrize("x_dtype", X_DTYPES, ids=["x=f32", "x=f16", "x=bf16"])
@pytest.mark.parametrize("precision", [0, 1], ids=["auto", "fp32-exact"])
def test_frag_layout_on_the_cpu_tier_is_bitwise_the_canonical_result(rng, x_dtype, out_f32, bias_dtype, precision,
                                                                    assert_bitwise_equal):
    """N = 40 and K = 224 need padding; the CPU tier unpacks the planes exactly, so every
    output bit matches the canonical weight's, on both CPU paths (int8 and fp32-exact)."""
    n, k = 40, 224
    ctx = pyquant.Context("cpu")
    ctx.set_option("cpu_precision", precision)
    blocks, scales = _canonical(rng, n, k, e_range=(118, 130))   # finite products
    bias = None if bias_dtype is None else rng.standard_normal(n).astype(np.float32).astype(bias_dtype)
    w = pyquant.from_mxfp4(blocks, scales, bias)
    f = w.repack()
    x = rng.standard_normal((5, k)).astype(np.float32).astype(x_dtype)
    od = np.float32 if out_f32 else None
    assert_bitwise_equal(pyquant.gemm(x, f, out_dtype=od, ctx=ctx), pyquant.gemm(x, w, out_dtype=od, ctx=ctx),
                         "frag vs canonical")
    # the same through a CPU context's DeviceArrays (to_device keeps the layout there)
    fd = w.to_device(ctx, layout="frag")
    assert fd.layout == "frag" and fd.ctx is ctx
    xd = pyquant.DeviceArray.from_numpy(x, ctx)
    assert_bitwise_equal(pyquant.gemm(xd, fd, out_dtype=od).to_numpy(), pyquant.gemm(x, w, out_dtype=od, ctx=ctx),
                         "frag DeviceArrays vs canonical")


def test_to_device_layouts_on_a_cpu_context(rng):
    """auto keeps the layout on a CPU context; canonical of a frag weight unpacks it."""
    ctx = pyquant.Context("cpu")
    w = pyquant.from_mxfp4(*_canonical(rng, 24, 96))
    assert w.to_device(ctx).layout == "canonical"
    f = w.to_device(ctx, layout="frag")
    assert f.to_device(ctx).layout == "frag"
    c = f.to_device(ctx, layout="canonical")
    assert c.layout == "canonical"
    np.testing.assert_array_equal(c.to_host().blocks, w.blocks)
    np.testing.assert_array_equal(f.repack("canonical").scales, w.scales)  # a CPU context's memory is host memory
    with pytest.raises(pyquant.InvalidArgumentError, match="layout='tiled' is not one of auto, canonical, frag"):
        w.to_device(ctx, layout="tiled")


def test_frag_weight_checks_its_planes(rng):
    w = pyquant.from_mxfp4(*_canonical(rng, 24, 96))
    f = w.repack()
    with pytest.raises(pyquant.InvalidArgumentError, match=r"needs shape=\(N, K\), or \(E, N, K\) for experts"):
        pyquant.MXFP4Weight(f.blocks, f.scales, layout="frag")
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag blocks plane holds \d+ elements; \(24, 96\) needs"):
        pyquant.MXFP4Weight(f.blocks[:1], f.scales, layout="frag", shape=w.shape)
    with pytest.raises(pyquant.InvalidArgumentError, match="frag scales plane has dtype uint8; expected bfloat16"):
        pyquant.MXFP4Weight(f.blocks, w.scales, layout="frag", shape=w.shape)
    with pytest.raises(pyquant.InvalidArgumentError, match="K a multiple of 32"):
        pyquant.MXFP4Weight(f.blocks, f.scales, layout="frag", shape=(24, 100))
    with pytest.raises(pyquant.InvalidArgumentError, match="shape= is for the frag layout"):
        pyquant.MXFP4Weight(w.blocks, w.scales, shape=w.shape)
    with pytest.raises(pyquant.InvalidArgumentError, match="layout='tiled' is not one of canonical, frag"):
        pyquant.MXFP4Weight(w.blocks, w.scales, layout="tiled")
    assert pyquant.MXFP4Weight(f.blocks.view(np.uint32), f.scales, layout="frag", shape=w.shape).blocks.dtype == np.int32


def test_frag_shard_is_the_repack_of_the_canonical_shard(rng, assert_bitwise_equal):
    """As for int4 frag (tests/test_shard.py): cuts on 16-row blocks and 128-k chunks; N = 40
    and K = 352 are padded in the planes (to 48 and 384) and the last part keeps that padding,
    as the repack of its canonical shard pads it. Other cuts are refused, naming the rule."""
    n, k = 40, 352
    w = pyquant.from_mxfp4(*_canonical(rng, n, k), rng.standard_normal(n).astype(np.float32))
    f = w.repack()
    for axis, parts in (("n", [16, 24]), ("n", [32, 8]), ("k", [128, 224]), ("k", [256, 96]), ("k", 1)):
        for i in range(parts if isinstance(parts, int) else len(parts)):
            got, canon = f.shard(axis, parts, i), w.shard(axis, parts, i)
            assert got.layout == "frag" and got.shape == canon.shape
            ref = MF.repack(canon.blocks, canon.scales)
            for c, r in zip(("blocks", "scales"), ref):
                assert_bitwise_equal(np.asarray(getattr(got, c)).reshape(r.shape), r, f"{axis} {parts} part {i} {c}")
            assert (got.bias is None) == (canon.bias is None)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"frag-layout mxfp4 weight must cut K at multiples of 128"):
        f.shard("k", [96, 256], 0)


def test_stacked_experts_repack_only_through_moe_repack(rng):
    """Stacked experts stay canonical under repack() / to_device(): their frag layout splits
    gate from up rows, which only pyquant.moe_repack is told (tests/test_moe_frag_layout.py)."""
    blocks = rng.integers(0, 256, size=(2, 16, 3, 16), dtype=np.uint8)
    scales = rng.integers(118, 130, size=(2, 16, 3), dtype=np.uint8)
    w = pyquant.from_mxfp4(blocks, scales)
    with pytest.raises(pyquant.InvalidArgumentError, match=r"stacked experts \(2, 16, 96\) take the MoE frag "
                                                            r"layout.*pyquant.moe_repack"):
        w.repack()
    with pytest.raises(pyquant.InvalidArgumentError, match="stacked experts"):
        w.to_device(pyquant.Context("cpu"), layout="frag")
    assert w.to_device(pyquant.Context("cpu")).layout == "canonical"


def _repack_args(n=24, k=96, **over):
    src = aligned_bytes(n * k // 2 + n * k // 32)   # canonical blocks, then scales
    out = aligned_bytes(1 << 16)
    base = out.ctypes.data
    fields = dict(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, n=n, k=k, blocks=src.ctypes.data,
                  scales=src.ctypes.data + n * k // 2, out_blocks=base, out_scales=base + 32768)
    fields.update(over)
    return _lib.qg_mxfp4_repack_args(**fields), (src, out), base


def test_repack_size_is_the_plane_size():
    for n, k in AWKWARD:
        a, _, _ = _repack_args(n, k)
        nb, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_mxfp4_repack_size(ctypes.byref(a), ctypes.byref(nb), ctypes.byref(ns))
        shapes = MF.plane_shapes(n, k)
        assert (nb.value, ns.value) == (4 * np.prod(shapes["blocks"]), 2 * np.prod(shapes["scales"]))


@pytest.mark.parametrize("change,pattern", [
    (dict(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_CANONICAL),
     r"layout=QG_MXFP4_LAYOUT_CANONICAL: qg_mxfp4_repack produces QG_MXFP4_LAYOUT_FRAG \(1\) only"),
    (dict(layout=5), r"layout=5: qg_mxfp4_repack produces QG_MXFP4_LAYOUT_FRAG"),
    (dict(k=100), r"k=100 is not a multiple of 32 \(MXFP4 blocks\)"),
    (dict(n=0), r"n=0 must be positive"),
    (dict(k=-32), r"k=-32 must be positive"),
    (dict(blocks=None), r"blocks is NULL"),
    (dict(out_blocks="+4"), r"out_blocks=0x[0-9a-f]+ is not aligned to 16 bytes \(frag layout"),
    (dict(out_scales="+8"), r"out_scales=0x[0-9a-f]+ is not aligned to 16 bytes"),
    (dict(out_scales="+64"), r"out_scales overlaps out_blocks"),
    (dict(out_blocks="src"), r"out_blocks overlaps an input array"),
    (dict(out_scales="src"), r"out_scales overlaps an input array"),
])
def test_repack_refuses_bad_arguments_and_writes_nothing(change, pattern):
    a, (src, out), base = _repack_args()
    set_repack_fields(a, change, src, base)  # "+N": N bytes past out_blocks' start
    with pytest.raises(pyquant.InvalidArgumentError, match=pattern):
        _lib.qg_mxfp4_repack(pyquant.cpu_context().handle, ctypes.byref(a), None)
    assert not out.any(), "a refused repack wrote its output"
    assert not src.any(), "a refused repack wrote its input"
    if not any(f.startswith(("out_", "blocks")) for f in change):  # the size query reads no pointer
        with pytest.raises(pyquant.InvalidArgumentError, match=pattern):
            _lib.qg_mxfp4_repack_size(ctypes.byref(a), ctypes.byref(ctypes.c_size_t()),
                                      ctypes.byref(ctypes.c_size_t()))


def test_cpu_repack_reads_blocks_at_any_address(rng, assert_bitwise_equal):
    """Canonical blocks are bytes: the CPU repack reads them at an odd address (its word
    loads are memcpy), and writes the same planes. (On a GPU context the kernel reads words:
    4-byte alignment is required there, tests/test_gpu_mxfp4.py.)"""
    n, k = 24, 96
    blocks, scales = _canonical(rng, n, k)
    a, (src, out), base = _repack_args(n, k)
    odd = aligned_bytes(blocks.nbytes + 1)
    odd[1:] = blocks.reshape(-1)
    src[n * k // 2:] = scales.reshape(-1)
    a.blocks = odd.ctypes.data + 1
    _lib.qg_mxfp4_repack(pyquant.cpu_context().handle, ctypes.byref(a), None)
    fb, fs = MF.repack(blocks, scales)
    assert_bitwise_equal(out[:fb.nbytes].view(np.int32).reshape(fb.shape), fb, "blocks plane")
    assert_bitwise_equal(out[32768: 32768 + fs.nbytes].view(BF16).reshape(fs.shape), fs, "scales plane")
