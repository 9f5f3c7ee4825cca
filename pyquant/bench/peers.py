"""Peers: what a user would run instead, timed on the same shapes in the same run.

Never required: a peer whose package is missing is simply absent from the row.

GPU (torch with a GPU, else CuPy):
  cublas_bf16     torch.matmul bf16 on dense [N, K] weights (cuBLAS); every family but moe.
                  Through CuPy (no bf16 dtype there) it is cublas_fp16: same tensor-core rate.
  torch_int4pack  torch.ops.aten._weight_int4pack_mm (tinygemm) for the w4a16 family, bf16.
  torch_grouped_mm the same moe layer through torch._grouped_mm (two grouped bf16 GEMMs over the
                  pairs sorted by expert, gather / swiglu / weighted scatter-add around them).
  torch_moe_loop  a per-expert torch loop for moe: gather tokens, two bf16 matmuls, GPT-OSS
                  SwiGLU, weighted index_add; the per-expert token lists are built before timing.
CPU:
  numpy_f32       numpy float32 matmul on dense weights (the BLAS numpy links).
  numpy_moe_loop  the same per-expert loop in numpy float32.

Peer weights are random (speed does not depend on values) and rotated past the cache
like the library's.
"""
from __future__ import annotations

import statistics
import sys

import numpy as np

from . import cases as C
from . import timing

PEER_BUDGET_S = 0.3  # timing budget of one peer on one case


def _swiglu_oai_np(h):
    gate, up = h[:, 0::2], h[:, 1::2]
    gate = np.minimum(gate, 7.0)
    up = np.clip(up, -7.0, 7.0)
    with np.errstate(over="ignore"):  # exp of a very negative gate overflows to inf: sigmoid 0
        return gate / (1.0 + np.exp(-1.702 * gate)) * (up + 1.0)


class NumpyPeers:
    """CPU peers in numpy float32."""

    def __init__(self, flush_bytes: int, budget_bytes: int):
        self.flush_bytes = flush_bytes
        self.budget_bytes = budget_bytes
        self.timer = timing.HostTimer()
        self._key = None
        self._w = None

    def _weights(self, case: C.Case):
        if self._key == case.weight_key:
            return self._w
        self._w = None
        rng = np.random.default_rng()
        if case.family == "moe":
            mo = case.moe_model()
            one = mo.experts * 3 * mo.intermediate * mo.hidden * 4
            touched = C.moe_experts_hit(case) * 3 * mo.intermediate * mo.hidden * 4
            copies = C.rotation_copies(touched, one, self.flush_bytes, self.budget_bytes)
            self._w = [(rng.standard_normal((mo.experts, 2 * mo.intermediate, mo.hidden), np.float32),
                        rng.standard_normal((mo.experts, mo.hidden, mo.intermediate), np.float32))
                       for _ in range(copies)]
        else:
            one = case.n * case.k * 4
            copies = C.rotation_copies(one, one, self.flush_bytes, self.budget_bytes)
            self._w = [rng.standard_normal((case.n, case.k), np.float32) for _ in range(copies)]
        self._key = case.weight_key
        return self._w

    def __call__(self, case: C.Case) -> dict[str, float]:
        ws = self._weights(case)
        rng = np.random.default_rng()
        if case.family == "moe":
            ids, topw = C.moe_routing(case)
            x = rng.standard_normal((case.m, case.k), np.float32)
            plan = [(e, *np.nonzero(ids == e)) for e in np.unique(ids)]

            def run(i):
                w13, w2 = ws[i % len(ws)]
                y = np.zeros((case.m, case.k), np.float32)
                for e, tok, slot in plan:
                    act = _swiglu_oai_np(x[tok] @ w13[e].T)
                    np.add.at(y, tok, (act @ w2[e].T) * topw[tok, slot][:, None])
                return y
            return {"numpy_moe_loop": timing.measure(self.timer, run, PEER_BUDGET_S)}
        x = rng.standard_normal((case.m, case.k), np.float32)
        return {"numpy_f32": timing.measure(self.timer, lambda i: x @ ws[i % len(ws)].T, PEER_BUDGET_S)}

    def close(self):
        self._w = None


class _TorchTimer:
    """torch.cuda events around each call, behind a torch.cuda._sleep backlog (see EventTimer)."""

    GROUP = 8

    def __init__(self, torch):
        self.torch = torch
        self.sleep = getattr(torch.cuda, "_sleep", None)

    def time_calls(self, fn, reps, first=0):
        torch = self.torch
        out, i = [], first
        while i < first + reps:
            g = min(self.GROUP, first + reps - i)
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                  for _ in range(g)]
            if self.sleep is not None:
                self.sleep(2_000_000)  # ~1 ms of GPU clock cycles: time for the host to enqueue
            for a, b in ev:
                a.record()
                fn(i)
                b.record()
                i += 1
            ev[-1][1].synchronize()
            out += [a.elapsed_time(b) * 1e-3 for a, b in ev]
        return out

    def synchronize(self):
        self.torch.cuda.synchronize()


def _int4pack(torch, n, k, group, device):
    """Random weights in tinygemm's packed layout, or None if this torch lacks the op."""
    conv = getattr(torch.ops.aten, "_convert_weight_to_int4pack", None)
    if conv is None or not hasattr(torch.ops.aten, "_weight_int4pack_mm"):
        return None
    inner_k_tiles = 8
    try:  # torch >= 2.5: uint8 [N, K/2], two nibbles per byte
        raw = torch.randint(0, 256, (n, k // 2), dtype=torch.uint8, device=device)
        packed = conv(raw, inner_k_tiles)
    except (RuntimeError, TypeError):
        try:  # torch 2.1 .. 2.4: int32 [N, K] holding 0..15
            raw = torch.randint(0, 16, (n, k), dtype=torch.int32, device=device)
            packed = conv(raw, inner_k_tiles)
        except (RuntimeError, TypeError):
            return None
    sz = torch.empty(k // group, n, 2, dtype=torch.bfloat16, device=device)
    sz[..., 0].uniform_(0.001, 0.01)
    sz[..., 1].uniform_(-0.05, 0.05)
    return packed, sz


class TorchPeers:
    """GPU peers through torch (cuBLAS bf16, tinygemm int4, per-expert MoE loop)."""

    def __init__(self, flush_bytes: int, budget_bytes: int):
        import torch
        self.torch = torch
        self.flush_bytes = flush_bytes
        self.budget_bytes = budget_bytes
        self.timer = _TorchTimer(torch)
        self._key = None
        self._w = {}

    def _copies(self, touched, footprint):
        return C.rotation_copies(touched, footprint, self.flush_bytes, self.budget_bytes)

    def _weights(self, case):
        torch = self.torch
        if self._key == case.weight_key:
            return self._w
        self._w = {}
        torch.cuda.empty_cache()
        dev = "cuda"
        if case.family == "moe":
            mo = case.moe_model()
            per_expert = 3 * mo.intermediate * mo.hidden * 2
            copies = self._copies(C.moe_experts_hit(case) * per_expert, mo.experts * per_expert)
            self._w["moe"] = [
                (torch.randn(mo.experts, 2 * mo.intermediate, mo.hidden, dtype=torch.bfloat16, device=dev),
                 torch.randn(mo.experts, mo.hidden, mo.intermediate, dtype=torch.bfloat16, device=dev))
                for _ in range(copies)]
        else:
            dense = case.n * case.k * 2
            copies = self._copies(dense, dense)
            self._w["dense"] = [torch.randn(case.n, case.k, dtype=torch.bfloat16, device=dev)
                                for _ in range(copies)]
            if case.family == "w4a16":
                v = C.parse_w4a16_variant(case.variant)
                packed = _int4pack(torch, case.n, case.k, v.group_size, dev)
                if packed is not None:
                    copies = self._copies(case.n * case.k // 2, case.n * case.k // 2)
                    self._w["int4"] = [packed] + [_int4pack(torch, case.n, case.k, v.group_size, dev)
                                                  for _ in range(copies - 1)]
        self._key = case.weight_key
        return self._w

    def __call__(self, case: C.Case) -> dict[str, float]:
        torch = self.torch
        ws = self._weights(case)
        out = {}
        if case.family == "moe":
            ids, topw = C.moe_routing(case)
            x = torch.randn(case.m, case.k, dtype=torch.bfloat16, device="cuda")
            tw = torch.from_numpy(topw).to("cuda", torch.bfloat16)
            plan = []
            for e in np.unique(ids):
                tok, slot = np.nonzero(ids == e)
                plan.append((int(e), torch.from_numpy(tok).cuda(), torch.from_numpy(slot).cuda()))
            experts = ws["moe"]

            def run(i):
                w13, w2 = experts[i % len(experts)]
                y = torch.zeros(case.m, case.k, dtype=torch.bfloat16, device="cuda")
                for e, tok, slot in plan:
                    h = x[tok] @ w13[e].T
                    gate = h[:, 0::2].clamp(max=7.0)
                    up = h[:, 1::2].clamp(-7.0, 7.0)
                    act = gate * torch.sigmoid(1.702 * gate) * (up + 1)
                    y.index_add_(0, tok, (act @ w2[e].T) * tw[tok, slot][:, None])
                return y
            out["torch_moe_loop"] = timing.measure(self.timer, run, PEER_BUDGET_S)
            grouped = self._grouped_mm_moe(case, x, tw, ids, experts)
            if grouped is not None:
                out["torch_grouped_mm"] = timing.measure(self.timer, grouped, PEER_BUDGET_S)
            return out
        x = torch.randn(case.m, case.k, dtype=torch.bfloat16, device="cuda")
        dense = ws["dense"]
        out["cublas_bf16"] = timing.measure(self.timer, lambda i: x @ dense[i % len(dense)].T, PEER_BUDGET_S)
        if "int4" in ws:
            v = C.parse_w4a16_variant(case.variant)
            packs = ws["int4"]
            mm = torch.ops.aten._weight_int4pack_mm
            out["torch_int4pack"] = timing.measure(
                self.timer, lambda i: mm(x, packs[i % len(packs)][0], v.group_size, packs[i % len(packs)][1]),
                PEER_BUDGET_S)
        return out

    def _grouped_mm_moe(self, case: C.Case, x, tw, ids, experts):
        """The same layer as torch_moe_loop through torch._grouped_mm (one grouped GEMM per
        stage over the pairs sorted by expert): gather, grouped GEMM, GPT-OSS swiglu, grouped
        GEMM, weighted scatter-add. None where this torch has no _grouped_mm or refuses it."""
        torch = self.torch
        if not hasattr(torch, "_grouped_mm"):
            return None
        e_count = case.moe_model().experts
        flat = ids.reshape(-1)
        order = np.argsort(flat, kind="stable")
        offs = torch.from_numpy(np.cumsum(np.bincount(flat, minlength=e_count)).astype(np.int32)).cuda()
        tok = torch.from_numpy(order // ids.shape[1]).cuda()
        wsort = tw.reshape(-1)[torch.from_numpy(order).cuda()][:, None]

        def run(i):
            w13, w2 = experts[i % len(experts)]
            h = torch._grouped_mm(x[tok], w13.transpose(-2, -1), offs=offs)
            gate = h[:, 0::2].clamp(max=7.0)
            up = h[:, 1::2].clamp(-7.0, 7.0)
            act = (gate * torch.sigmoid(1.702 * gate) * (up + 1)).contiguous()
            out = torch._grouped_mm(act, w2.transpose(-2, -1), offs=offs)
            y = torch.zeros(case.m, case.k, dtype=torch.bfloat16, device="cuda")
            return y.index_add_(0, tok, out * wsort)
        try:
            run(0)
            torch.cuda.synchronize()
        except (RuntimeError, TypeError) as err:
            print(f"bench: torch._grouped_mm peer skipped: {err}", file=sys.stderr)
            return None
        return run

    def close(self):
        self._w = {}
        self._key = None
        self.torch.cuda.empty_cache()


class CupyPeers:
    """cuBLAS through CuPy when torch is missing; fp16 (CuPy has no bf16 dtype)."""

    def __init__(self, flush_bytes: int, budget_bytes: int):
        import cupy
        self.cp = cupy
        self.flush_bytes = flush_bytes
        self.budget_bytes = budget_bytes
        self._key = None
        self._w = None

    def __call__(self, case: C.Case) -> dict[str, float]:
        cp = self.cp
        if case.family == "moe":
            return {}
        if self._key != case.weight_key:
            self._w = None
            dense = case.n * case.k * 2
            copies = C.rotation_copies(dense, dense, self.flush_bytes, self.budget_bytes)
            self._w = [cp.random.standard_normal((case.n, case.k), dtype=cp.float32).astype(cp.float16)
                       for _ in range(copies)]
            self._key = case.weight_key
        x = cp.random.standard_normal((case.m, case.k), dtype=cp.float32).astype(cp.float16)
        ws = self._w
        for i in range(3):
            x @ ws[i % len(ws)].T
        times = []
        for i in range(30):
            a, b = cp.cuda.Event(), cp.cuda.Event()
            a.record()
            x @ ws[i % len(ws)].T
            b.record()
            b.synchronize()
            times.append(cp.cuda.get_elapsed_time(a, b) * 1e-3)
        return {"cublas_fp16": statistics.median(times)}

    def close(self):
        self._w = None


def make_peers(backend: str, flush_bytes: int, budget_bytes: int):
    """The peer set for a backend, or None when nothing suitable is importable."""
    if backend == "cpu":
        return NumpyPeers(flush_bytes, budget_bytes)
    try:
        import torch
        if torch.cuda.is_available():
            return TorchPeers(flush_bytes, budget_bytes)
    except ImportError:
        pass
    try:
        import cupy  # noqa: F401
        return CupyPeers(flush_bytes, budget_bytes)
    except ImportError:
        return None
