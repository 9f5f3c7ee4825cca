"""Reference GEMM, activations and mixture-of-experts in float64: the specification the
library's entry points are compared against (include/quantgemm.h).

Weights arrive already dequantized (float32 from the format modules); x arrives in any
float dtype (fp16, bf16, fp32) and is widened to float64 exactly.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

__all__ = [
    "TILE_M_VALUES",
    "gemm",
    "sigmoid",
    "silu_glu",
    "swiglu_oai",
    "moe_align_sizes",
    "moe_align",
    "moe",
]

TILE_M_VALUES = (16, 32, 64, 80, 96, 128, 256)
ACTIVATIONS = ("swiglu_oai", "silu_glu")
GATE_UP_LAYOUTS = ("interleaved", "concat")
_DTYPE_NAMES = {
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "bfloat16": np.dtype(ml_dtypes.bfloat16),
    "fp16": np.dtype(np.float16),
    "f16": np.dtype(np.float16),
    "float16": np.dtype(np.float16),
    "fp32": np.dtype(np.float32),
    "f32": np.dtype(np.float32),
    "float32": np.dtype(np.float32),
}


def _f64(name: str, a, ndim: int | None = None) -> np.ndarray:
    a = np.asarray(a)
    if ndim is not None and a.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimensions, got shape {a.shape}")
    return a.astype(np.float64)


def gemm(x, w_deq, bias=None) -> np.ndarray:
    """y[M, N] = x[M, K] @ w_deq[N, K]^T (+ bias[N]), in float64."""
    x = _f64("x", x, 2)
    w = _f64("w_deq", w_deq, 2)
    if x.shape[1] != w.shape[1]:
        raise ValueError(f"x has k={x.shape[1]} but the weight has k={w.shape[1]}")
    y = x @ w.T
    if bias is not None:
        b = _f64("bias", bias, 1)
        if b.shape != (w.shape[0],):
            raise ValueError(f"bias has shape {b.shape}, expected ({w.shape[0]},)")
        y = y + b
    return y


def sigmoid(x) -> np.ndarray:
    """1 / (1 + exp(-x)) in float64 without overflow for large |x|."""
    x = np.asarray(x, dtype=np.float64)
    e = np.exp(-np.abs(x))
    return np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e))


def silu_glu(gate, up) -> np.ndarray:
    """silu(gate) * up = gate * sigmoid(gate) * up (QG_ACT_SILU_GLU)."""
    g = np.asarray(gate, dtype=np.float64)
    u = np.asarray(up, dtype=np.float64)
    return g * sigmoid(g) * u


def swiglu_oai(gate, up, alpha: float = 1.702, limit: float = 7.0) -> np.ndarray:
    """GPT-OSS SwiGLU (QG_ACT_SWIGLU_OAI): g = min(gate, limit) (clamped from above only),
    u = clamp(up, -limit, limit), out = g * sigmoid(alpha * g) * (u + 1)."""
    g = np.minimum(np.asarray(gate, dtype=np.float64), limit)
    u = np.clip(np.asarray(up, dtype=np.float64), -limit, limit)
    return g * sigmoid(alpha * g) * (u + 1.0)


def _round_up(a: int, b: int) -> int:
    return (a + b - 1) // b * b


def _check_tile_m(tile_m) -> int:
    if int(tile_m) not in TILE_M_VALUES:
        raise ValueError(f"tile_m={tile_m} is not one of {TILE_M_VALUES}")
    return int(tile_m)


def moe_align_sizes(num_tokens: int, top_k: int, num_experts: int, tile_m: int):
    """(max_sorted, max_tiles) as qg_moe_align_sizes: max_sorted = round_up(T*top_k +
    E*(tile_m - 1), tile_m) bounds the padded length whatever the routing."""
    tile_m = _check_tile_m(tile_m)
    max_sorted = _round_up(num_tokens * top_k + num_experts * (tile_m - 1), tile_m)
    return max_sorted, max_sorted // tile_m


def moe_align(topk_ids, num_experts: int, tile_m: int):
    """Sort token-expert pairs into tiles of tile_m rows, each tile one expert (qg_moe_align).

    Pair p = t * top_k + j. Pairs are grouped by expert in expert order, in increasing p
    within an expert; each expert's run is padded with the value T*top_k up to a multiple of
    tile_m (an expert with no pair gets no tile).
    Returns (sorted_ids int32 [max_sorted], pad past num_sorted; tile_experts int32
    [max_tiles], -1 past the last tile; num_sorted int, a multiple of tile_m).
    """
    ids = np.asarray(topk_ids)
    if ids.ndim != 2:
        raise ValueError(f"topk_ids must be [T, top_k], got shape {ids.shape}")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"topk_ids must hold integers, got {ids.dtype}")
    num_experts = int(num_experts)
    if num_experts <= 0:
        raise ValueError(f"num_experts={num_experts} must be positive")
    tile_m = _check_tile_m(tile_m)
    t, top_k = ids.shape
    if ids.size and (ids.min() < 0 or ids.max() >= num_experts):
        raise ValueError(
            f"topk_ids holds experts outside [0, {num_experts}) (min {ids.min()}, max {ids.max()})"
        )
    max_sorted, max_tiles = moe_align_sizes(t, top_k, num_experts, tile_m)
    pad = t * top_k
    flat = ids.reshape(-1).astype(np.int64)
    order = np.argsort(flat, kind="stable")  # by expert, stable in p
    counts = np.bincount(flat, minlength=num_experts)
    sorted_ids = np.full(max_sorted, pad, dtype=np.int32)
    tile_experts = np.full(max_tiles, -1, dtype=np.int32)
    pos, tile, start = 0, 0, 0
    for e in range(num_experts):
        c = int(counts[e])
        if c == 0:
            continue
        sorted_ids[pos:pos + c] = order[start:start + c]
        padded = _round_up(c, tile_m)
        tile_experts[tile:tile + padded // tile_m] = e
        pos += padded
        tile += padded // tile_m
        start += c
    return sorted_ids, tile_experts, pos


def _resolve_dtype(dt) -> np.dtype:
    if isinstance(dt, str):
        if dt.lower() not in _DTYPE_NAMES:
            raise ValueError(f"act_dtype={dt!r} is not one of {sorted(_DTYPE_NAMES)}")
        return _DTYPE_NAMES[dt.lower()]
    return np.dtype(dt)


def moe(x, topk_ids, topk_weights, w13_deq, w2_deq, w13_bias=None, w2_bias=None,
        activation: str = "swiglu_oai", gate_up_layout: str = "interleaved",
        alpha: float = 1.702, limit: float = 7.0, act_dtype=None) -> np.ndarray:
    """Mixture of experts in float64, the semantics of qg_moe_align + stage1 + stage2.

    x [T, H]; topk_ids [T, top_k] int; topk_weights [T, top_k]; w13_deq [E, 2I, H];
    w2_deq [E, H, I]; w13_bias [E, 2I] and w2_bias [E, H] optional.
    For pair p = (t, j), e = topk_ids[t, j]:
        h = x[t] @ w13[e]^T + b13[e]                          [2I]
        gate, up = h[0::2], h[1::2] (interleaved) or h[:I], h[I:] (concat)
        act = activation(gate, up), rounded to act_dtype when given (the library writes
              the stage-1 activation in the activation dtype before stage 2)
        y[t] += topk_weights[t, j] * (act @ w2[e]^T + b2[e])
    Returns y float64 [T, H].
    """
    if activation not in ACTIVATIONS:
        raise ValueError(f"activation={activation!r} is not one of {ACTIVATIONS}")
    if gate_up_layout not in GATE_UP_LAYOUTS:
        raise ValueError(f"gate_up_layout={gate_up_layout!r} is not one of {GATE_UP_LAYOUTS}")
    x = _f64("x", x, 2)
    ids = np.asarray(topk_ids)
    wts = _f64("topk_weights", topk_weights, 2)
    w13 = _f64("w13_deq", w13_deq, 3)
    w2 = _f64("w2_deq", w2_deq, 3)
    t, h = x.shape
    e_count, two_i, h13 = w13.shape
    if ids.ndim != 2 or ids.shape[0] != t:
        raise ValueError(f"topk_ids has shape {ids.shape}, expected ({t}, top_k)")
    if ids.dtype.kind not in "iu":
        raise ValueError(f"topk_ids must hold integers, got {ids.dtype}")
    if wts.shape != ids.shape:
        raise ValueError(f"topk_weights has shape {wts.shape}, expected {ids.shape}")
    if h13 != h:
        raise ValueError(f"w13 has hidden={h13} but x has hidden={h}")
    if two_i % 2 != 0:
        raise ValueError(f"w13 has {two_i} rows, which is not 2 * intermediate")
    inter = two_i // 2
    if w2.shape != (e_count, h, inter):
        raise ValueError(f"w2 has shape {w2.shape}, expected ({e_count}, {h}, {inter})")
    if ids.size and (ids.min() < 0 or ids.max() >= e_count):
        raise ValueError(f"topk_ids holds experts outside [0, {e_count})")
    b13 = None if w13_bias is None else _f64("w13_bias", w13_bias, 2)
    b2 = None if w2_bias is None else _f64("w2_bias", w2_bias, 2)
    if b13 is not None and b13.shape != (e_count, two_i):
        raise ValueError(f"w13_bias has shape {b13.shape}, expected ({e_count}, {two_i})")
    if b2 is not None and b2.shape != (e_count, h):
        raise ValueError(f"w2_bias has shape {b2.shape}, expected ({e_count}, {h})")
    act_dt = None if act_dtype is None else _resolve_dtype(act_dtype)

    y = np.zeros((t, h), dtype=np.float64)
    for e in range(e_count):
        tok, slot = np.nonzero(ids == e)
        if tok.size == 0:
            continue
        hid = gemm(x[tok], w13[e], None if b13 is None else b13[e])  # [P, 2I]
        if gate_up_layout == "interleaved":
            gate, up = hid[:, 0::2], hid[:, 1::2]
        else:
            gate, up = hid[:, :inter], hid[:, inter:]
        if activation == "swiglu_oai":
            act = swiglu_oai(gate, up, alpha=alpha, limit=limit)
        else:
            act = silu_glu(gate, up)
        if act_dt is not None:
            act = act.astype(act_dt).astype(np.float64)
        out = gemm(act, w2[e], None if b2 is None else b2[e])  # [P, H]
        np.add.at(y, tok, wts[tok, slot][:, None] * out)
    return y
