"""The W4A16 frag layout (pyquant.formats.int4_frag, qg_w4a16_repack) on the CPU.

1. The numpy reference against an independent statement of the tensor-core fragment
   layout: a simulated warp "loads" each lane's 16 bytes, splits every word into A
   registers with the kernels' `(w >> 4p) & 0x000F000F` extraction, and each 16-bit half
   must be the weight that the PTX ISA's mma.m16n8k16 A layout assigns to that lane,
   register and half. Then the simulated mma (A fragments x B fragments, summed over the
   lanes as the hardware does) must equal q @ x^T for the tile.
2. Round trips: unpack(repack(w)) == w for every G, sym/asym, N and K not multiples of
   the tile, and the padding is exactly q = 0, z = 0, s = 0.
3. The library's CPU repack (qg_w4a16_repack on a CPU context) gives the same bytes.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import pyquant
from pyquant.formats import int4 as I4
from pyquant.formats import int4_frag as FR

BF16 = np.dtype(ml_dtypes.bfloat16)


def _random_canonical(rng, n, k, g, symmetric, scale_dtype=BF16):
    qweight = rng.integers(0, 2 ** 32, size=(n, k // 8), dtype=np.uint32).view(np.int32)
    scales = rng.uniform(0.5, 2.0, size=(n, k // g)).astype(np.float32).astype(scale_dtype)
    qzeros = None if symmetric else rng.integers(0, 2 ** 32, size=(n // 8, k // g),
                                                 dtype=np.uint32).view(np.int32)
    return qweight, scales, qzeros


def _ptx_a_fragment(lane: int, reg: int, half: int) -> tuple[int, int]:
    """(row, k) inside a 16x16 A tile held by `lane` in register `reg` (0..3), 16-bit
    half `half`: PTX ISA "mma.m16n8k16 fragment layout for matrix A (.f16/.bf16)":
    groupID = lane >> 2, threadID_in_group = lane % 4;
    row = groupID for a0, a1, a4, a5 and groupID + 8 for a2, a3, a6, a7;
    col = threadID_in_group * 2 + (i & 1) for a0..a3, + 8 for a4..a7
    (elements a_i, i = 2 * reg + half)."""
    i = 2 * reg + half
    group_id, tig = lane >> 2, lane % 4
    row = group_id + (8 if i in (2, 3, 6, 7) else 0)
    col = tig * 2 + (i & 1) + (8 if i >= 4 else 0)
    return row, col


@pytest.mark.parametrize("n,k", [(16, 128), (48, 256), (8, 96), (24, 320)])
def test_fragment_extraction_matches_ptx_layout(rng, n, k):
    g = 32
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, False)
    fq, _, _ = FR.repack(qweight, scales, qzeros, g)
    np_, kp = FR.padded_shape(n, k)
    q = np.zeros((np_, kp), np.uint32)
    q[:n, :k] = I4.unpack_k(qweight)
    words = fq.view(np.uint32)                              # [RB, KT, 32, 4]
    for rb in range(np_ // 16):
        for kt in range(kp // 64):
            for lane in range(32):
                for s in range(4):
                    w = int(words[rb, kt, lane, s])
                    for reg in range(4):
                        pair = (w >> (4 * reg)) & 0x000F000F
                        for half in range(2):
                            row, col = _ptx_a_fragment(lane, reg, half)
                            got = (pair >> (16 * half)) & 0xF
                            want = q[16 * rb + row, 64 * kt + 16 * s + col]
                            assert got == want, (rb, kt, lane, s, reg, half)


def test_simulated_mma_reproduces_the_tile_product(rng):
    """A warp's m16n8k16 over the 4 k16 steps of one tile, simulated lane by lane with
    the PTX B layout (b0: k 2t..2t+1, b1: k 2t+8..2t+9, column = groupID) and C layout
    (c0, c1: row g, columns 2t, 2t+1; c2, c3: row g + 8), equals q[tile] @ x^T."""
    n, k, g = 16, 128, 128
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, True)
    fq, _, _ = FR.repack(qweight, scales, qzeros, g)
    q = I4.unpack_k(qweight).astype(np.int64)
    x = rng.integers(-8, 8, size=(8, k))                    # 8 tokens = the mma N
    for kt in range(k // 64):
        c = np.zeros((32, 4), np.int64)
        for s in range(4):
            # the warp-wide product D[row, col] = sum_k A[row, k] B[k, col], with A
            # assembled from what each lane holds in each register half
            A = np.zeros((16, 16), np.int64)
            for lane in range(32):
                w = int(fq.view(np.uint32)[0, kt, lane, s])
                for r in range(4):
                    for h in range(2):
                        row, col = _ptx_a_fragment(lane, r, h)
                        A[row, col] = (w >> (4 * r + 16 * h)) & 0xF
            B = x[:, 64 * kt + 16 * s: 64 * kt + 16 * s + 16].T   # [16 k, 8 tokens]
            D = A @ B
            for lane in range(32):
                gid, t = lane >> 2, lane % 4
                c[lane] += [D[gid, 2 * t], D[gid, 2 * t + 1], D[gid + 8, 2 * t], D[gid + 8, 2 * t + 1]]
        want = q[:, 64 * kt: 64 * kt + 64] @ x[:, 64 * kt: 64 * kt + 64].T   # [16 rows, 8 tokens]
        for lane in range(32):
            gid, t = lane >> 2, lane % 4
            assert list(c[lane]) == [want[gid, 2 * t], want[gid, 2 * t + 1],
                                     want[gid + 8, 2 * t], want[gid + 8, 2 * t + 1]]


@pytest.mark.parametrize("g", [32, 64, 128])
def test_scale_and_zero_records(rng, g):
    """Lane g of row block rb finds (s[row g], s[row g+8]) for the GC groups of a 128-k
    chunk contiguously, and the zero byte z[g] | z[g+8] << 4."""
    n, k = 32, 384
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, False)
    _, fs, fz = FR.repack(qweight, scales, qzeros, g)
    z = I4.unpack_zeros(qzeros)
    gc = 128 // g
    for rb in range(n // 16):
        for kc in range(k // 128):
            for lane_g in range(8):
                for c in range(gc):
                    grp = kc * gc + c
                    r0, r1 = 16 * rb + lane_g, 16 * rb + lane_g + 8
                    assert fs[rb, kc, lane_g, c, 0] == scales[r0, grp]
                    assert fs[rb, kc, lane_g, c, 1] == scales[r1, grp]
                    assert fz[rb, kc, lane_g, c] == z[r0, grp] | (z[r1, grp] << 4)


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("g", [32, 64, 128])
@pytest.mark.parametrize("n,k_groups", [(8, 1), (24, 3), (64, 12), (136, 5)])
def test_round_trip_and_padding(rng, g, symmetric, n, k_groups):
    k = g * k_groups
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, symmetric)
    fq, fs, fz = FR.repack(qweight, scales, qzeros, g)
    shapes = FR.plane_shapes(n, k, g)
    assert fq.shape == shapes["qweight"] and fs.shape == shapes["scales"]
    assert (fz is None) == symmetric
    back = FR.unpack(fq, fs, fz, n, k, g)
    np.testing.assert_array_equal(back[0], qweight)
    np.testing.assert_array_equal(back[1].view(np.uint16), scales.view(np.uint16))
    if symmetric:
        assert back[2] is None
    else:
        np.testing.assert_array_equal(back[2], qzeros)
    # padding: every nibble outside [N, K] is 0, every padded scale and zero is 0
    row, kk = FR.fragment_coords(n, k)
    nib = (fq.view(np.uint32)[..., None] >> (np.arange(8, dtype=np.uint32) * 4)) & 15
    outside = (row >= n) | (kk >= k)
    assert not nib[outside].any()
    srow, sgrp = FR._scale_coords(n, k, g)
    pad = (srow >= n) | (sgrp >= k // g)
    assert not fs.view(np.uint16)[pad].any()
    if fz is not None:
        zpad_lo, zpad_hi = pad[..., 0], pad[..., 1]
        assert not (fz[zpad_lo] & 15).any() and not (fz[zpad_hi] >> 4).any()


def test_dequantize_of_padding_is_exact_zero(rng):
    """(q - z) * s of a padded element is 0 * 0: the frag dequantization of the whole
    padded tile equals the canonical one inside [N, K] and 0 outside."""
    n, k, g = 24, 96, 32
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, False)
    fq, fs, fz = FR.repack(qweight, scales, qzeros, g)
    np_, kp = FR.padded_shape(n, k)
    w_pad = np.zeros((np_, kp), np.float32)
    back = FR.unpack(fq, fs, fz, n, k, g)
    w_pad[:n, :k] = I4.dequantize(*back, g)
    np.testing.assert_array_equal(w_pad[:n, :k], I4.dequantize(qweight, scales, qzeros, g))


@pytest.mark.parametrize("symmetric", [False, True], ids=["asym", "sym"])
@pytest.mark.parametrize("g", [32, 64, 128])
def test_library_cpu_repack_matches_reference(rng, g, symmetric):
    """qg_w4a16_repack on a CPU context writes the reference planes byte for byte."""
    n, k = 40, 3 * 128 + g
    qweight, scales, qzeros = _random_canonical(rng, n, k, g, symmetric, np.float16)
    w = pyquant.Int4Weight(qweight, scales, qzeros, g)
    r = w.repack()
    fq, fs, fz = FR.repack(qweight, scales, qzeros, g)
    assert r.layout == "frag"
    np.testing.assert_array_equal(np.asarray(r.qweight).reshape(fq.shape), fq)
    np.testing.assert_array_equal(np.asarray(r.scales).view(np.uint16).reshape(fs.shape), fs.view(np.uint16))
    if symmetric:
        assert r.qzeros is None
    else:
        np.testing.assert_array_equal(np.asarray(r.qzeros).reshape(fz.shape), fz)
    np.testing.assert_array_equal(r.dequantize(), w.dequantize())
