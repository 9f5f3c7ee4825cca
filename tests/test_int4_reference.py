"""int4 reference: canonical packing, checkpoint importers/exporters, quantize error bound.

The checkpoint packers below are deliberately naive per-element loops written from each
project's published convention (see pyquant/formats/int4.py for the sources), so that the
vectorised importers are checked against an independent statement of the layout.
"""

import ml_dtypes
import numpy as np
import pytest

from pyquant.formats import int4

BF16 = np.dtype(ml_dtypes.bfloat16)
F16 = np.dtype(np.float16)
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # AutoAWQ order_map, restated here on purpose


def _rng():
    seed = np.random.SeedSequence().entropy
    return np.random.default_rng(seed), seed


def _assert_equal(name, got, want, seed):
    """Exact comparison that reports the first mismatching coordinate and both values."""
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape} (seed {seed})"
    bad = np.argwhere(got != want)
    assert bad.size == 0, (
        f"{name}: {len(bad)} mismatches, first at {tuple(bad[0])}: "
        f"got {got[tuple(bad[0])]!r}, want {want[tuple(bad[0])]!r} (seed {seed})"
    )


def _word(nibbles):
    """8 nibbles (slot 0 first) -> one int32, the way a checkpoint stores it."""
    v = 0
    for i, x in enumerate(nibbles):
        v |= (int(x) & 0xF) << (4 * i)
    return np.uint32(v).view(np.int32)


def _random_case(rng, n, k, g, scale_dtype, zmin=0):
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    z = rng.integers(zmin, 16, size=(n, k // g), dtype=np.uint8)
    s = (rng.uniform(0.5, 2.0, size=(n, k // g)) * 2.0 ** rng.integers(-8, 2, size=(n, k // g)))
    return q, z, s.astype(np.float32).astype(scale_dtype)


def _expected_dequant(q, z, s, g):
    """(q - z) * s written independently: float64 product, then float32 (exact either way)."""
    zf = np.repeat(z.astype(np.float64), g, axis=1)
    sf = np.repeat(s.astype(np.float64), g, axis=1)
    return ((q.astype(np.float64) - zf) * sf).astype(np.float32)


# ------------------------------------------------------------ naive checkpoint packers


def awq_pack(q, z, s):
    """AutoAWQ: qweight [K, N/8], qzeros [K/G, N/8], slot i of word j = column 8j+AWQ_ORDER[i]."""
    n, k = q.shape
    groups = z.shape[1]
    qw = np.zeros((k, n // 8), dtype=np.int32)
    qz = np.zeros((groups, n // 8), dtype=np.int32)
    for kk in range(k):
        for j in range(n // 8):
            qw[kk, j] = _word([q[8 * j + AWQ_ORDER[i], kk] for i in range(8)])
    for gg in range(groups):
        for j in range(n // 8):
            qz[gg, j] = _word([z[8 * j + AWQ_ORDER[i], gg] for i in range(8)])
    return qw, qz, np.ascontiguousarray(s.T)


def gptq_pack(q, z, s):
    """GPTQ v1: qweight [K/8, N] sequential along K; qzeros [K/G, N/8] holding z - 1."""
    n, k = q.shape
    groups = z.shape[1]
    qw = np.zeros((k // 8, n), dtype=np.int32)
    qz = np.zeros((groups, n // 8), dtype=np.int32)
    for r in range(k // 8):
        for nn in range(n):
            qw[r, nn] = _word([q[nn, 8 * r + i] for i in range(8)])
    for gg in range(groups):
        for j in range(n // 8):
            qz[gg, j] = _word([int(z[8 * j + i, gg]) - 1 for i in range(8)])
    return qw, qz, np.ascontiguousarray(s.T)


def ct_pack(q_signed, z_signed, s):
    """compressed-tensors pack-quantized: signed values stored + 8; weight_packed [N, K/8]
    along K; weight_zero_point [N/8, K/G] along N (packed_dim=0)."""
    n, k = q_signed.shape
    groups = s.shape[1]
    wp = np.zeros((n, k // 8), dtype=np.int32)
    for nn in range(n):
        for j in range(k // 8):
            wp[nn, j] = _word([int(q_signed[nn, 8 * j + i]) + 8 for i in range(8)])
    if z_signed is None:
        return wp, s.copy(), None
    zp = np.zeros((n // 8, groups), dtype=np.int32)
    for r in range(n // 8):
        for gg in range(groups):
            zp[r, gg] = _word([int(z_signed[8 * r + i, gg]) + 8 for i in range(8)])
    return wp, s.copy(), zp


# ------------------------------------------------------------ canonical packing


@pytest.mark.parametrize("n,k", [(8, 8), (16, 64), (24, 40)])
def test_pack_k_matches_naive_and_round_trips(n, k):
    rng, seed = _rng()
    q = rng.integers(0, 16, size=(n, k), dtype=np.uint8)
    q[0, :8] = 15  # nibble 7 = 15 sets bit 31: the word is negative as int32
    naive = np.array([[_word(q[r, 8 * j:8 * j + 8]) for j in range(k // 8)] for r in range(n)])
    packed = int4.pack_k(q)
    assert packed.dtype == np.int32
    _assert_equal("pack_k", packed, naive, seed)
    assert packed[0, 0] < 0
    _assert_equal("unpack_k", int4.unpack_k(packed), q, seed)


@pytest.mark.parametrize("n,groups", [(8, 1), (16, 3), (40, 2)])
def test_pack_zeros_matches_naive_and_round_trips(n, groups):
    rng, seed = _rng()
    z = rng.integers(0, 16, size=(n, groups), dtype=np.uint8)
    naive = np.array([[_word(z[8 * r:8 * r + 8, gg]) for gg in range(groups)]
                      for r in range(n // 8)])
    packed = int4.pack_zeros(z)
    _assert_equal("pack_zeros", packed, naive, seed)
    _assert_equal("unpack_zeros", int4.unpack_zeros(packed), z, seed)


def test_dequantize_formula_asym_and_sym():
    rng, seed = _rng()
    n, k, g = 16, 256, 64
    for dt in (F16, BF16):
        q, z, s = _random_case(rng, n, k, g, dt)
        got = int4.dequantize(int4.pack_k(q), s, int4.pack_zeros(z), g)
        assert got.dtype == np.float32
        _assert_equal(f"dequant asym {dt}", got, _expected_dequant(q, z, s, g), seed)
        got = int4.dequantize(int4.pack_k(q), s, None, g)
        eight = np.full_like(z, 8)
        _assert_equal(f"dequant sym {dt}", got, _expected_dequant(q, eight, s, g), seed)


def _round_to_bf16_bits(w32):
    """float32 -> bf16 bits, round to nearest even, by integer arithmetic on the float32 bits
    (the device's float_to_bf16_bits in hip/elem.h; finite inputs): an independent statement
    of the rounding that int4.dequantize_folded asks of ml_dtypes."""
    u = np.asarray(w32, np.float32).view(np.uint32).astype(np.uint64)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("g", [32, 64, 128])
def test_dequantize_folded_is_the_exact_weight_rounded_once_to_bf16(g, symmetric):
    """The folded GPU prefill's weights (bf16 x, bf16 scales): bf16(float32((q - z) * s)),
    round to nearest even, within half a bf16 ulp of the exact weight and equal to it where
    the product fits bf16's 8 significant bits. Scales over 2^-8 .. 4 with every mantissa,
    every q and z."""
    rng, seed = _rng()
    n, k = 32, 4 * g  # 128 groups
    q, z, s = _random_case(rng, n, k, g, BF16)
    s.reshape(-1)[:128] = (0x3F80 + np.arange(128, dtype=np.uint16)).view(BF16)  # 1 + m 2^-7, every m
    qz = None if symmetric else int4.pack_zeros(z)
    zz = np.full_like(z, 8) if symmetric else z
    exact = _expected_dequant(q, zz, s, g)
    got = int4.dequantize_folded(int4.pack_k(q), s, qz, g)
    assert got.dtype == np.float32 and got.shape == (n, k)
    want = (_round_to_bf16_bits(exact).astype(np.uint32) << 16).view(np.float32)
    _assert_equal("dequantize_folded vs bf16 RNE of the exact weight", got.view(np.uint32),
                  want.view(np.uint32), seed)
    # Bound HALF_ULP: |got - exact| <= half an ulp of bf16 at |exact| (an ulp is 2^(e - 7) for
    # |exact| in [2^e, 2^(e + 1))); exact where |q - z| is 0 or a power of two (the product
    # keeps the scale's 8 significant bits).
    e = np.floor(np.log2(np.where(exact != 0, np.abs(exact), 1.0)))
    err = np.abs(got.astype(np.float64) - exact.astype(np.float64))
    assert np.all(err <= 2.0 ** (e - 8)), f"more than half a bf16 ulp off (seed {seed})"
    d = np.abs(q.astype(np.int32) - np.repeat(zz.astype(np.int32), g, axis=1))
    pow2 = (d & (d - 1)) == 0
    _assert_equal("exact where |q - z| is 0 or 2^i", got[pow2], exact[pow2], seed)
    assert np.any(got[~pow2] != exact[~pow2]), f"no weight was rounded: the test is vacuous (seed {seed})"


def test_dequantize_folded_ties_go_to_even():
    """(q - z) * s halfway between two bf16 values goes to the even one. bf16's ulp in [2, 4)
    is 2^-6: s = 1 + 2^-7 and q - z = 3 give 3 + 1.5 ulp -> 3 + 2 ulp = 3.03125 (up; -3 mirrors
    it); s = 1 + 3 * 2^-7 and q - z = 3 give 3 + 4.5 ulp -> 3 + 4 ulp = 3.0625 (down). Not a
    tie: s = 1 + 2^-7, q - z = 5 is 5 + 1.25 ulp (2^-5 in [4, 8)) -> 5 + 1 ulp = 5.03125."""
    g = 32
    q = np.full((8, g), 8, np.uint8)
    q[0, :3] = (11, 5, 13)  # z = 8: q - z = 3, -3, 5
    q[1, 0] = 11
    s = np.full((8, 1), 1 + 2.0 ** -7, np.float32)
    s[1, 0] = 1 + 3 * 2.0 ** -7
    got = int4.dequantize_folded(int4.pack_k(q), s.astype(BF16), None, g)
    assert got[0, :3].tolist() == [3.03125, -3.03125, 5.03125]
    assert got[1, 0] == 3.0625
    assert int4.prefill_folds(BF16, BF16) and int4.prefill_folds(BF16, F16)
    assert not int4.prefill_folds(F16, BF16) and not int4.prefill_folds(F16, F16)
    # an fp16 scale folds with one rounding of the exact product: 1 + 2^-10 (11 significand
    # bits) times 3 is 3 + 3 * 2^-10, whose bf16 is 3 (one rounding), not bf16(3 * bf16(s)) = 3
    s16 = np.full((8, 1), 1 + 2.0 ** -10, np.float16)
    q16 = np.full((8, g), 8, np.uint8)
    q16[0, 0] = 11
    assert int4.dequantize_folded(int4.pack_k(q16), s16, None, g)[0, 0] == 3.0


# ------------------------------------------------------------ importers and exporters


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("dt", [F16, BF16])
def test_awq_import_known_integers(g, dt):
    rng, seed = _rng()
    n, k = 24, 2 * g
    q, z, s = _random_case(rng, n, k, g, dt)
    awq = awq_pack(q, z, s)
    qweight, scales, qzeros = int4.from_awq(*awq, group_size=g)
    _assert_equal("awq q", int4.unpack_k(qweight), q, seed)
    _assert_equal("awq z", int4.unpack_zeros(qzeros), z, seed)
    assert scales.dtype == dt
    _assert_equal("awq scales", scales.view(np.uint16), s.view(np.uint16), seed)
    _assert_equal("awq dequant", int4.dequantize(qweight, scales, qzeros, g),
                  _expected_dequant(q, z, s, g), seed)
    # group_size inferred from the scales
    _assert_equal("awq inferred", int4.from_awq(*awq)[0], qweight, seed)
    # exporter reproduces the checkpoint words exactly
    for name, got, want in zip(("qweight", "qzeros", "scales"),
                               int4.to_awq(qweight, scales, qzeros, g), awq):
        _assert_equal(f"to_awq {name}", got.view(np.uint16) if got.dtype == dt else got,
                      want.view(np.uint16) if want.dtype == dt else want, seed)


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("dt", [F16, BF16])
def test_gptq_import_known_integers(g, dt):
    rng, seed = _rng()
    n, k = 16, 3 * g
    q, z, s = _random_case(rng, n, k, g, dt, zmin=1)  # GPTQ v1 cannot store z = 0
    gptq = gptq_pack(q, z, s)
    g_idx = np.arange(k, dtype=np.int32) // g
    qweight, scales, qzeros = int4.from_gptq(*gptq, group_size=g, g_idx=g_idx)
    _assert_equal("gptq q", int4.unpack_k(qweight), q, seed)
    _assert_equal("gptq z", int4.unpack_zeros(qzeros), z, seed)
    _assert_equal("gptq dequant", int4.dequantize(qweight, scales, qzeros, g),
                  _expected_dequant(q, z, s, g), seed)
    exported = int4.to_gptq(qweight, scales, qzeros, g)
    _assert_equal("to_gptq qweight", exported[0], gptq[0], seed)
    _assert_equal("to_gptq qzeros", exported[1], gptq[1], seed)
    _assert_equal("to_gptq scales", exported[2].view(np.uint16), gptq[2].view(np.uint16), seed)


def test_gptq_symmetric_checkpoint_zero_is_eight():
    # Symmetric GPTQ checkpoints store 7 (= 8 - 1) in every zero nibble.
    rng, seed = _rng()
    n, k, g = 16, 256, 128
    q, _, s = _random_case(rng, n, k, g, F16)
    eight = np.full((n, k // g), 8, dtype=np.uint8)
    qw, qz, sc = gptq_pack(q, eight, s)
    assert np.all(qz == 0x77777777)
    qweight, scales, qzeros = int4.from_gptq(qw, qz, sc, g)
    _assert_equal("gptq sym dequant", int4.dequantize(qweight, scales, qzeros, g),
                  int4.dequantize(qweight, scales, None, g), seed)


def test_gptq_act_order_rejected():
    rng, _ = _rng()
    n, k, g = 8, 256, 64
    q, z, s = _random_case(rng, n, k, g, F16, zmin=1)
    gptq = gptq_pack(q, z, s)
    g_idx = np.arange(k, dtype=np.int32) // g
    perm = g_idx[rng.permutation(k)]
    if np.array_equal(perm, g_idx):  # astronomically unlikely; keep the test meaningful
        perm = g_idx[::-1].copy()
    with pytest.raises(ValueError, match="act-order"):
        int4.from_gptq(*gptq, group_size=g, g_idx=perm)
    with pytest.raises(ValueError, match=r"g_idx has shape \(255,\), expected \(256,\)"):
        int4.from_gptq(*gptq, group_size=g, g_idx=g_idx[:-1])


def test_gptq_zero_point_zero_not_representable():
    rng, _ = _rng()
    n, k, g = 8, 128, 32
    q, z, s = _random_case(rng, n, k, g, F16, zmin=1)
    z[3, 1] = 0
    with pytest.raises(ValueError, match="zero point 0 at row 3, group 1"):
        int4.to_gptq(int4.pack_k(q), s, int4.pack_zeros(z), g)
    # a v1 checkpoint with an underflowed zero (stored nibble 15 -> GPTQ reads 16)
    qw, qz, sc = gptq_pack(q, np.maximum(z, 1), s)
    qz[1, 0] = np.int32(-1)  # 0xFFFFFFFF: what packing 0 - 1 as uint32 leaves behind
    with pytest.raises(ValueError, match="zero point 16"):
        int4.from_gptq(qw, qz, sc, g)


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
def test_compressed_tensors_import_known_integers(g, symmetric):
    rng, seed = _rng()
    n, k = 16, 2 * g
    q_signed = rng.integers(-8, 8, size=(n, k), dtype=np.int8)
    z_signed = None if symmetric else rng.integers(-8, 8, size=(n, k // g), dtype=np.int8)
    s = rng.uniform(0.01, 0.1, size=(n, k // g)).astype(np.float32).astype(BF16)
    ct = ct_pack(q_signed, z_signed, s)
    qweight, scales, qzeros = int4.from_compressed_tensors(*ct, group_size=g)
    _assert_equal("ct q", int4.unpack_k(qweight), (q_signed + 8).astype(np.uint8), seed)
    if symmetric:
        assert qzeros is None
        z_eff = np.zeros((n, k // g))
    else:
        _assert_equal("ct z", int4.unpack_zeros(qzeros), (z_signed + 8).astype(np.uint8), seed)
        z_eff = z_signed
    # compressed-tensors' own dequantization: (q_signed - zp_signed) * s
    want = ((q_signed.astype(np.float64) - np.repeat(z_eff, g, axis=1))
            * np.repeat(s.astype(np.float64), g, axis=1)).astype(np.float32)
    _assert_equal("ct dequant", int4.dequantize(qweight, scales, qzeros, g), want, seed)
    out = int4.to_compressed_tensors(qweight, scales, qzeros, g)
    _assert_equal("to_ct weight_packed", out[0], ct[0], seed)
    if symmetric:
        assert out[2] is None
    else:
        _assert_equal("to_ct zero_point", out[2], ct[2], seed)
        # older checkpoints: unpacked signed int8 zero points
        old = int4.from_compressed_tensors(ct[0], ct[1], z_signed, group_size=g)
        _assert_equal("ct int8 zero_point", old[2], qzeros, seed)


def test_cross_format_round_trip():
    """quantize -> AWQ -> canonical -> GPTQ -> canonical -> compressed-tensors -> canonical."""
    rng, seed = _rng()
    n, k, g = 32, 512, 128
    W = rng.standard_normal((n, k)).astype(np.float32)
    qweight, scales, qzeros = int4.quantize(W, g, symmetric=False, scale_dtype="fp16")
    z = int4.unpack_zeros(qzeros)
    if np.any(z == 0):  # all-positive group: GPTQ v1 cannot carry it; nudge that zero point
        z = np.maximum(z, 1)
        qzeros = int4.pack_zeros(z)
    a = int4.from_awq(*int4.to_awq(qweight, scales, qzeros, g), group_size=g)
    b = int4.from_gptq(*int4.to_gptq(*a, g), group_size=g)
    c = int4.from_compressed_tensors(*int4.to_compressed_tensors(*b, g), group_size=g)
    for name, got, want in zip(("qweight", "scales", "qzeros"), c, (qweight, scales, qzeros)):
        if got.dtype == F16:
            got, want = got.view(np.uint16), want.view(np.uint16)
        _assert_equal(f"round trip {name}", got, want, seed)


# ------------------------------------------------------------ bad inputs


def test_bad_inputs_name_the_condition():
    rng, _ = _rng()
    with pytest.raises(ValueError, match="k=4100 is not a multiple of group_size=128"):
        int4.quantize(rng.standard_normal((8, 4100)).astype(np.float32), 128)
    with pytest.raises(ValueError, match=r"group_size=96 is not one of \(32, 64, 128\)"):
        int4.quantize(rng.standard_normal((8, 192)).astype(np.float32), 96)
    with pytest.raises(ValueError, match="n=12 is not a multiple of 8"):
        int4.quantize(rng.standard_normal((12, 128)).astype(np.float32), 128)
    bad = rng.standard_normal((8, 128)).astype(np.float32)
    bad[2, 5] = np.nan
    with pytest.raises(ValueError, match="non-finite"):
        int4.quantize(bad, 32)
    with pytest.raises(ValueError, match="overflows"):
        int4.quantize(np.full((8, 32), 6e6, np.float32), 32, scale_dtype="fp16")
    with pytest.raises(ValueError, match="scale_dtype='fp8'"):
        int4.quantize(bad, 32, scale_dtype="fp8")
    with pytest.raises(ValueError, match="values outside 0..15"):
        int4.pack_k(np.full((8, 8), 16, dtype=np.uint8))
    qweight = np.zeros((8, 16), np.int32)
    with pytest.raises(ValueError, match="qweight must be int32"):
        int4.dequantize(qweight.astype(np.int64), np.ones((8, 1), F16), None, 128)
    with pytest.raises(ValueError, match=r"scales has shape \(8, 2\), expected \(8, 1\)"):
        int4.dequantize(qweight, np.ones((8, 2), F16), None, 128)
    with pytest.raises(ValueError, match="scales must be float16 or bfloat16, got float32"):
        int4.dequantize(qweight, np.ones((8, 1), np.float32), None, 128)
    with pytest.raises(ValueError, match=r"qzeros has shape \(2, 1\), expected \(1, 1\)"):
        int4.dequantize(qweight, np.ones((8, 1), F16), np.zeros((2, 1), np.int32), 128)
    # importer shape checks: scales claim group 64 while group_size=128 is passed
    qw, qz, sc = awq_pack(*_random_case(rng, 8, 128, 64, F16))
    with pytest.raises(ValueError, match="group_size=128 does not match the scales"):
        int4.from_awq(qw, qz, sc, group_size=128)
    with pytest.raises(ValueError, match=r"awq qzeros has shape \(2, 2\), expected \(2, 1\)"):
        int4.from_awq(qw, np.zeros((2, 2), np.int32), sc, group_size=64)
    with pytest.raises(ValueError, match=r"weight_zero_point has shape \(1, 3\), expected \(1, 2\)"):
        int4.from_compressed_tensors(np.zeros((8, 16), np.int32), np.ones((8, 2), BF16),
                                     np.zeros((1, 3), np.int32))


# ------------------------------------------------------------ quantize error bound


@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("symmetric", [False, True])
@pytest.mark.parametrize("scale_dtype", ["bf16", "fp16"])
def test_quantize_error_bound(g, symmetric, scale_dtype):
    rng, seed = _rng()
    n, k = 24, 4 * g
    W = (rng.standard_normal((n, k)) * rng.uniform(0.01, 3.0, size=(n, 1))).astype(np.float32)
    W[0, :g] = np.abs(W[0, :g])  # an all-positive group (asymmetric zero point 0)
    W[1, :g] = 0.0  # an all-zero group
    qweight, scales, qzeros = int4.quantize(W, g, symmetric=symmetric, scale_dtype=scale_dtype)
    dt = BF16 if scale_dtype == "bf16" else F16
    assert scales.dtype == dt and scales.shape == (n, k // g)
    assert (qzeros is None) == symmetric
    deq = int4.dequantize(qweight, scales, qzeros, g)
    # Bound: HALF_STEP. The scale is rounded up to its dtype and the quantization range
    # contains 0, so w / s + z never leaves [-0.5, 15.5]: round-to-nearest is never clipped
    # and |w - (q - z) s| <= s / 2 holds exactly (the 1e-12 only absorbs float64 rounding
    # of the subtraction).
    s_full = np.repeat(scales.astype(np.float64), g, axis=1)
    err = np.abs(W.astype(np.float64) - deq.astype(np.float64))
    worst = np.unravel_index(np.argmax(err / s_full), err.shape)
    assert np.all(err <= 0.5 * s_full * (1 + 1e-12)), (
        f"error {err[worst]} > s/2 = {0.5 * s_full[worst]} at {worst} (seed {seed})")
    assert np.all(deq[1, :g] == 0)
    # Tightness: the scale is the ideal one rounded up by at most one ulp of its dtype
    # (relative 2^-7 for bf16's 8-bit significand, 2^-10 for fp16), so the bound is not
    # met trivially by an oversized scale.
    wg = W.astype(np.float64).reshape(n, k // g, g)
    hi, lo = np.maximum(wg.max(-1), 0), np.minimum(wg.min(-1), 0)
    ideal = np.maximum(hi / 7, -lo / 8) if symmetric else (hi - lo) / 15
    ideal = np.where(ideal > 0, ideal, 1.0)
    ulp = 2.0 ** -7 if dt == BF16 else 2.0 ** -10
    s64 = scales.astype(np.float64)
    assert np.all(s64 >= ideal) and np.all(s64 <= ideal * (1 + ulp)), f"seed {seed}"
