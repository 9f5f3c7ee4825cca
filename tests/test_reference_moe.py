"""Reference GEMM / activations / MoE sanity: the float64 specification checked against
independent restatements (dense path, per-pair loop, GPT-OSS formula)."""

import ml_dtypes
import numpy as np
import pytest

from pyquant.formats import reference as ref

# Tolerance REORDER: both sides are float64 over the same terms; only the BLAS summation
# order may differ (a different row count M can pick a different blocking), which moves a
# result by a few ulps of the sum of |terms|. 1e-12 relative is ~5000 ulps of headroom at
# these sizes (H, I <= 128) and still 9 orders of magnitude below any real indexing bug.
REORDER = 1e-12


def _rng():
    seed = np.random.SeedSequence().entropy
    return np.random.default_rng(seed), seed


def _close(name, got, want, seed, rel=REORDER):
    err = np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300)
    assert err <= rel, f"{name}: normalised error {err:.3e} > {rel:.0e} (seed {seed})"


def _problem(rng, t, h, inter, e, top_k, bias=True):
    x = rng.standard_normal((t, h)).astype(np.float32)
    w13 = (rng.standard_normal((e, 2 * inter, h)) / np.sqrt(h)).astype(np.float32) * 3
    w2 = (rng.standard_normal((e, h, inter)) / np.sqrt(inter)).astype(np.float32)
    ids = np.stack([rng.choice(e, size=top_k, replace=False) for _ in range(t)]).astype(np.int32)
    wts = rng.dirichlet(np.ones(top_k), size=t).astype(np.float32)
    b13 = rng.standard_normal((e, 2 * inter)).astype(np.float32) if bias else None
    b2 = rng.standard_normal((e, h)).astype(np.float32) if bias else None
    return x, ids, wts, w13, w2, b13, b2


def _oai(gate, up, alpha=1.702, limit=7.0):
    """GPT-OSS swiglu restated from its published formula (one scalar at a time)."""
    out = np.empty_like(gate)
    for idx in np.ndindex(gate.shape):
        g = min(float(gate[idx]), limit)
        u = min(max(float(up[idx]), -limit), limit)
        out[idx] = g / (1.0 + np.exp(-alpha * g)) * (u + 1.0)
    return out


def test_gemm_and_bias():
    rng, seed = _rng()
    x = rng.standard_normal((5, 48)).astype(ml_dtypes.bfloat16)
    w = rng.standard_normal((24, 48)).astype(np.float32)
    b = rng.standard_normal(24).astype(np.float32)
    y = ref.gemm(x, w, b)
    assert y.dtype == np.float64 and y.shape == (5, 24)
    want = np.array([[sum(float(x[m, k]) * float(w[n, k]) for k in range(48)) + float(b[n])
                      for n in range(24)] for m in range(5)])
    _close("gemm", y, want, seed)
    with pytest.raises(ValueError, match="x has k=48 but the weight has k=40"):
        ref.gemm(x, w[:, :40])


def test_swiglu_oai_formula_and_clamp():
    rng, seed = _rng()
    gate = rng.uniform(-20, 20, size=(7, 33))
    up = rng.uniform(-20, 20, size=(7, 33))
    gate[0, :3] = (7.0, 7.5, 1e6)  # above the limit
    up[0, :3] = (-1e6, 7.0, 12.0)
    _close("swiglu_oai", ref.swiglu_oai(gate, up), _oai(gate, up), seed)
    # the clamp actually clamps: anything above the limit acts exactly as the limit
    lim = ref.swiglu_oai(np.array([7.0]), np.array([7.0]))
    assert ref.swiglu_oai(np.array([1e6]), np.array([1e6])) == lim
    assert ref.swiglu_oai(np.array([3.0]), np.array([-50.0])) == ref.swiglu_oai(
        np.array([3.0]), np.array([-7.0]))
    assert np.all(np.abs(ref.swiglu_oai(gate, up)) <= 7.0 * 8.0)  # |g| <= 7-ish, |u+1| <= 8
    # gate is clamped from above only: a very negative gate is not pulled up to -limit
    g_neg = ref.swiglu_oai(np.array([-12.0]), np.array([1.0]))
    assert g_neg != ref.swiglu_oai(np.array([-7.0]), np.array([1.0]))
    # alpha and limit are honoured
    _close("swiglu_oai alpha/limit", ref.swiglu_oai(gate, up, alpha=1.0, limit=3.0),
           _oai(gate, up, alpha=1.0, limit=3.0), seed)


def test_silu_glu_and_sigmoid_extremes():
    rng, seed = _rng()
    gate = rng.uniform(-30, 30, size=(4, 17))
    up = rng.standard_normal((4, 17))
    _close("silu_glu", ref.silu_glu(gate, up), gate / (1 + np.exp(-gate)) * up, seed)
    with np.errstate(over="raise", invalid="raise"):  # no overflow or nan at the extremes
        s = ref.sigmoid(np.array([-1000.0, 0.0, 1000.0]))
    assert s[0] >= 0 and s[1] == 0.5 and s[2] == 1.0


@pytest.mark.parametrize("tile_m", [16, 32, 64, 80, 96, 128, 256])
def test_moe_align_covers_every_pair_once(tile_m):
    rng, seed = _rng()
    t, top_k, e = int(rng.integers(tile_m, 3 * tile_m)), 4, 8
    ids = rng.integers(0, e, size=(t, top_k)).astype(np.int32)
    ids[:, 0] = 0  # expert 0 is busy...
    ids[ids == e - 1] = e - 2  # ...and the last expert idle: it must get no tile
    ids[ids == 1] = 2
    ids[:tile_m, 1] = 1  # expert 1 fills exactly one tile: no padding may follow it
    sorted_ids, tile_experts, num_sorted = ref.moe_align(ids, e, tile_m)
    max_sorted, max_tiles = ref.moe_align_sizes(t, top_k, e, tile_m)
    pad = t * top_k
    assert sorted_ids.shape == (max_sorted,) and tile_experts.shape == (max_tiles,)
    assert sorted_ids.dtype == np.int32 and tile_experts.dtype == np.int32
    assert num_sorted % tile_m == 0 and 0 < num_sorted <= max_sorted
    # minimal padding: each expert's run is rounded up to a tile, nothing more
    counts = np.bincount(ids.reshape(-1), minlength=e)
    assert num_sorted == sum(-(-int(c) // tile_m) * tile_m for c in counts), f"seed {seed}"
    used = sorted_ids[:num_sorted]
    real = used[used != pad]
    assert np.array_equal(np.sort(real), np.arange(pad)), f"pairs lost or repeated (seed {seed})"
    assert np.all(sorted_ids[num_sorted:] == pad)
    n_tiles = num_sorted // tile_m
    assert np.all(tile_experts[n_tiles:] == -1) and np.all(tile_experts[:n_tiles] >= 0)
    assert np.all(np.diff(tile_experts[:n_tiles]) >= 0), "tiles not in expert order"
    assert e - 1 not in tile_experts
    flat = ids.reshape(-1)
    for i in range(n_tiles):
        tile = used[i * tile_m:(i + 1) * tile_m]
        members = tile[tile != pad]
        assert members.size > 0, f"tile {i} is only padding (seed {seed})"
        assert np.all(flat[members] == tile_experts[i]), f"tile {i} mixes experts (seed {seed})"
        assert np.all(np.diff(members) > 0), f"tile {i} not stable in p (seed {seed})"
        # padding only at the end of an expert's last tile
        k = members.size
        assert np.all(tile[:k] != pad) and np.all(tile[k:] == pad)
    with pytest.raises(ValueError, match=r"tile_m=48 is not one of \(16, 32, 64, 80, 96, 128, 256\)"):
        ref.moe_align(ids, e, 48)
    with pytest.raises(ValueError, match=r"outside \[0, 8\)"):
        ref.moe_align(ids + 8, e, tile_m)


@pytest.mark.parametrize("activation", ["swiglu_oai", "silu_glu"])
def test_moe_single_expert_top1_equals_dense(activation):
    rng, seed = _rng()
    t, h, inter = 19, 64, 96
    x, ids, wts, w13, w2, b13, b2 = _problem(rng, t, h, inter, 1, 1)
    y = ref.moe(x, ids, wts, w13, w2, b13, b2, activation=activation)
    hid = ref.gemm(x, w13[0], b13[0])
    gate, up = hid[:, 0::2], hid[:, 1::2]  # interleaved: row 2i gate, row 2i + 1 up
    act = ref.swiglu_oai(gate, up) if activation == "swiglu_oai" else ref.silu_glu(gate, up)
    dense = wts.astype(np.float64) * ref.gemm(act, w2[0], b2[0])
    _close("moe vs dense", y, dense, seed)


@pytest.mark.parametrize("activation", ["swiglu_oai", "silu_glu"])
def test_moe_matches_per_pair_loop(activation):
    rng, seed = _rng()
    t, h, inter, e, top_k = 13, 32, 64, 6, 3
    x, ids, wts, w13, w2, b13, b2 = _problem(rng, t, h, inter, e, top_k)
    ids[0, :] = ids[0, 0]  # a token routed twice to one expert: both pairs contribute
    y = ref.moe(x, ids, wts, w13, w2, b13, b2, activation=activation)
    want = np.zeros((t, h))
    for tt in range(t):
        for j in range(top_k):
            ex = ids[tt, j]
            hv = w13[ex].astype(np.float64) @ x[tt].astype(np.float64) + b13[ex]
            gate, up = hv[0::2], hv[1::2]
            if activation == "swiglu_oai":
                a = _oai(gate, up)
            else:
                a = gate / (1 + np.exp(-gate)) * up
            want[tt] += float(wts[tt, j]) * (w2[ex].astype(np.float64) @ a + b2[ex])
    _close("moe vs loop", y, want, seed)


def test_moe_interleaved_equals_concat_with_permuted_rows():
    rng, seed = _rng()
    t, h, inter, e, top_k = 9, 64, 32, 4, 2
    x, ids, wts, w13, w2, b13, b2 = _problem(rng, t, h, inter, e, top_k)
    y_int = ref.moe(x, ids, wts, w13, w2, b13, b2, gate_up_layout="interleaved")
    w13_cat = np.concatenate([w13[:, 0::2], w13[:, 1::2]], axis=1)
    b13_cat = np.concatenate([b13[:, 0::2], b13[:, 1::2]], axis=1)
    y_cat = ref.moe(x, ids, wts, w13_cat, w2, b13_cat, b2, gate_up_layout="concat")
    _close("interleaved vs concat", y_cat, y_int, seed)
    # and the layouts really differ: the same weights under the other layout disagree
    y_wrong = ref.moe(x, ids, wts, w13, w2, b13, b2, gate_up_layout="concat")
    assert np.linalg.norm(y_wrong - y_int) > 1e-3 * np.linalg.norm(y_int)


def test_moe_act_dtype_rounds_the_activation():
    rng, seed = _rng()
    t, h, inter, e, top_k = 7, 32, 32, 3, 2
    x, ids, wts, w13, w2, _, _ = _problem(rng, t, h, inter, e, top_k, bias=False)
    y64 = ref.moe(x, ids, wts, w13, w2)
    y16 = ref.moe(x, ids, wts, w13, w2, act_dtype="bf16")
    assert not np.array_equal(y64, y16)  # rounding happened
    # Bound BF16_ACT: each activation moves by <= 2^-9 relative (bf16 round to nearest),
    # so the output moves by <= 2^-9 * sum |w2| |act| |topk_w|; normalised, 2^-8 is ample.
    _close("bf16 activation", y16, y64, seed, rel=2.0 ** -8)
    with pytest.raises(ValueError, match="act_dtype='int3'"):
        ref.moe(x, ids, wts, w13, w2, act_dtype="int3")


def test_moe_rejects_bad_arguments():
    rng, _ = _rng()
    x, ids, wts, w13, w2, b13, b2 = _problem(rng, 4, 32, 32, 3, 2)
    with pytest.raises(ValueError, match="activation='gelu'"):
        ref.moe(x, ids, wts, w13, w2, activation="gelu")
    with pytest.raises(ValueError, match="gate_up_layout='split'"):
        ref.moe(x, ids, wts, w13, w2, gate_up_layout="split")
    with pytest.raises(ValueError, match=r"w2 has shape \(3, 32, 16\), expected \(3, 32, 32\)"):
        ref.moe(x, ids, wts, w13, w2[..., :16])
    with pytest.raises(ValueError, match=r"w13_bias has shape \(3, 63\)"):
        ref.moe(x, ids, wts, w13, w2, w13_bias=b13[:, :63])
    with pytest.raises(ValueError, match=r"outside \[0, 3\)"):
        ref.moe(x, ids + 3, wts, w13, w2)
