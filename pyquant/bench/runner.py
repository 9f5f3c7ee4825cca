"""The library-backed runner: builds each case's weights, times pyquant.gemm / pyquant.moe.

A runner answers four questions for `main`: machine() (device, copy bandwidth, FLOP
ceiling), measure(case) (median seconds of one call), peers(case) (peer name -> median
seconds) and close(). timing.FakeRunner is the stand-in tests use.

Weights are random but valid (finite scales, no all-zero data): the kernels' speed does
not depend on the values. Each weight set is built once per (family, format, variant, N,
K) and rotated through `copies` copies so that no call finds its weights in the cache
(cases.rotation_copies: 3 x L2 on a GPU, 2 x the last-level cache on the CPU, bounded by
a memory budget).
"""
from __future__ import annotations

import os
import re
import sys

import ml_dtypes
import numpy as np

from . import cases as C
from . import golden
from . import peers as P
from . import roofline as R
from . import timing

NP_DTYPE = {"fp32": np.float32, "fp16": np.float16, "bf16": ml_dtypes.bfloat16}

# GPU: what must stream through L2 between two uses of one weight copy (3 x L2; the H200's
# L2 is 60 MB per DESIGN.md, MI300's Infinity Cache 256 MB) and the memory the copies may take.
GPU_L2_BYTES = {"cuda": 60 << 20, "hip": 256 << 20}
GPU_WEIGHT_BUDGET = 16 << 30
GPU_BUDGET_S = 0.25
GPU_BACKLOG_BYTES = 1 << 30   # ~0.5 ms of copy on an H200: covers enqueuing EventTimer.GROUP calls
# CPU: 2 x the last-level cache, and at most 2 GiB of copies (CI machines are small).
CPU_WEIGHT_BUDGET = 2 << 30
CPU_BUDGET_S = 0.5
CPU_LLC_FALLBACK = 32 << 20
# Scales of the random weights: small enough that sums of thousands of products of
# random codes and unit-normal activations stay far from fp16 overflow.
SCALE_RANGE = (1e-3, 1e-2)
GGUF_TILE_ROWS = 256  # random GGUF rows generated, then repeated to N rows (values don't matter)


def family_has_tier(build: str, family: str, backend: str) -> bool:
    """True when qg_build_info ("... tiers: w4a16=cpu,cuda:decode_frag gguf=cpu mxfp4=cpu ...")
    lists a tier of `backend` for `family` (older builds: "cuda", "cuda(sm_90a)"); True also
    when the build string names no tiers for the family (then the call decides)."""
    from .. import tiers
    return tiers.has_backend(build, family, backend)


def cpu_llc_bytes() -> int:
    """Size of the largest CPU cache (sysfs), or CPU_LLC_FALLBACK."""
    best = 0
    base = "/sys/devices/system/cpu/cpu0/cache"
    try:
        for idx in os.listdir(base):
            try:
                with open(os.path.join(base, idx, "size")) as f:
                    text = f.read().strip()
            except OSError:
                continue
            mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
            best = max(best, int(text.rstrip("KMG")) * mult)
    except (OSError, ValueError):
        pass
    return best or CPU_LLC_FALLBACK


def _host_weight_arrays(case: C.Case, rng) -> dict:
    """Random valid arrays of one weight set (numpy), keyed by constructor argument."""
    n, k = case.n, case.k
    if case.family == "w4a16":
        v = C.parse_w4a16_variant(case.variant)
        groups = k // v.group_size
        return {
            "qweight": rng.integers(0, 2**32, (n, k // 8), dtype=np.uint32).view(np.int32),
            "scales": rng.uniform(*SCALE_RANGE, (n, groups)).astype(NP_DTYPE[v.dtype]),
            "qzeros": None if v.symmetric else
            rng.integers(0, 2**32, (n // 8, groups), dtype=np.uint32).view(np.int32),
        }
    if case.family == "gguf":
        from pyquant import formats
        mod = formats.get(case.format).module
        tile = mod.random_blocks(rng, min(n, GGUF_TILE_ROWS), k, d_range=SCALE_RANGE)
        return {"raw": np.ascontiguousarray(np.resize(tile, (n, tile.shape[1])))}
    # E8M0 scales 2^-9 .. 2^0 (bytes 118..127): finite, and far from the NaN code 255.
    if case.family == "mxfp4":
        return {"blocks": rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8),
                "scales": rng.integers(118, 128, (n, k // 32), dtype=np.uint8)}
    model = case.moe_model()
    e, h, i = model.experts, model.hidden, model.intermediate
    bf16 = NP_DTYPE[C.MOE_ACT_DTYPE]
    return {
        "w13_blocks": rng.integers(0, 256, (e, 2 * i, h // 32, 16), dtype=np.uint8),
        "w13_scales": rng.integers(118, 128, (e, 2 * i, h // 32), dtype=np.uint8),
        "w13_bias": rng.uniform(-0.1, 0.1, (e, 2 * i)).astype(bf16),
        "w2_blocks": rng.integers(0, 256, (e, h, i // 32, 16), dtype=np.uint8),
        "w2_scales": rng.integers(118, 128, (e, h, i // 32), dtype=np.uint8),
        "w2_bias": rng.uniform(-0.1, 0.1, (e, h)).astype(bf16),
    }


def _make_weights(pq, case: C.Case, a: dict):
    """pyquant weight object(s) from the arrays of _host_weight_arrays."""
    if case.family == "w4a16":
        v = C.parse_w4a16_variant(case.variant)
        return pq.Int4Weight(a["qweight"], a["scales"], a["qzeros"], v.group_size)
    if case.family == "gguf":
        return pq.from_gguf(case.format, a["raw"], shape=(case.n, case.k))
    if case.family == "mxfp4":
        return pq.from_mxfp4(a["blocks"], a["scales"])
    return (pq.from_mxfp4(a["w13_blocks"], a["w13_scales"], a["w13_bias"]),
            pq.from_mxfp4(a["w2_blocks"], a["w2_scales"], a["w2_bias"]))


def _counted_nbytes(w) -> int:
    """w.nbytes as the bench counts a weight: its canonical arrays (bench/cases.py). A frag
    MXFP4 weight's planes hold each E8M0 scale as 2 bf16 bytes (4.5 instead of 4.25 bits per
    weight, docs/w4a16-layout.md "MXFP4"): the bench charges the format's 17 bytes per block,
    so the GB/s of the GPU tiers are of the format, not of the layout they chose. Likewise every
    frag GGUF weight is charged its blocks (q4_K's and iq4_xs's 6-bit fields are bytes there: 4.625
    bits per weight against the blocks' 4.5 and 4.25; q6_K's codes are bytes: 8.625 bits against
    6.5625; q4_0's and q8_0's planes hold the blocks' bits, plus the padding of N to 16 and K to
    128: pyquant/formats/gguf_frag.py), and a rows8 weight its blocks (the plane pads N to 8)."""
    bias = 0 if getattr(w, "bias", None) is None else int(w.bias.nbytes)
    if getattr(w, "format", None) == "mxfp4" and w.layout == "frag":
        n, k = w.shape
        return n * (k // 32) * 17 + bias
    if getattr(w, "spec", None) is not None and w.spec.kind == "gguf" and w.layout in ("frag", "rows8"):
        n, k = w.shape
        return n * (k // w.spec.block_elems) * w.spec.block_bytes + bias
    return w.nbytes


class LibraryRunner:
    def __init__(self, backend: str = "auto", device: int = 0, budget_s: float | None = None,
                 peers: bool = True, options: dict | None = None):
        import pyquant
        self.pq = pyquant
        if backend == "auto":
            backend = pyquant.default_context().backend
        self.ctx = pyquant.Context(backend, device)
        for name, value in (options or {}).items():  # --option: a bad name or value fails here
            self.ctx.set_option(name, value)
        self.backend = self.ctx.backend
        self.device = self.ctx.device_name
        self.build = pyquant.build_info()
        self.gpu = self.backend != "cpu"
        self.rng = np.random.default_rng()
        if self.gpu:
            self.flush_bytes = 3 * GPU_L2_BYTES.get(self.backend, 60 << 20)
            self.mem_budget = GPU_WEIGHT_BUDGET
            self.budget_s = budget_s or GPU_BUDGET_S
            self._backlog_src = pyquant.DeviceArray.empty((GPU_BACKLOG_BYTES,), np.uint8, ctx=self.ctx)
            self._backlog_dst = pyquant.DeviceArray.empty((GPU_BACKLOG_BYTES,), np.uint8, ctx=self.ctx)
            self.timer = timing.EventTimer(self.ctx, None, self._backlog)
            self.reps = dict(min_reps=timing.MIN_REPS, max_reps=timing.MAX_REPS, warmup=timing.WARMUP)
        else:
            self.flush_bytes = 2 * cpu_llc_bytes()
            self.mem_budget = CPU_WEIGHT_BUDGET
            self.budget_s = budget_s or CPU_BUDGET_S
            self.timer = timing.HostTimer()
            # The CPU tier's large cases take a good fraction of a second: fewer calls.
            self.reps = dict(min_reps=5, max_reps=timing.MAX_REPS, warmup=2)
        self.timer_kind = (f"{self.timer.kind}, median of {self.reps['min_reps']}..{self.reps['max_reps']} "
                           f"calls within {self.budget_s:g} s after {self.reps['warmup']} warm-up calls; "
                           f"weights rotated past {self.flush_bytes >> 20} MiB of cache")
        self._peers = P.make_peers(self.backend, self.flush_bytes, self.mem_budget) if peers else None
        self._peer_warned = False
        self._wkey = None
        self._weights = None
        self._ckey = None
        self._call = None
        self.repack_ms = {}   # "w4a16 repack NxK g128 asym", "mxfp4 repack NxK" -> (ms, canonical bytes)

    # ------------------------------------------------------------ machine

    def machine(self) -> R.Machine:
        if not self.gpu:
            return R.cpu_machine(self.device)
        copy = R.gpu_copy_bandwidth(self.ctx, self._d2d)
        peak, source = R.torch_bf16_peak()
        return R.Machine(self.device, self.backend, copy,
                         f"qg_memcpy device-to-device {R.GPU_COPY_BYTES >> 30} GiB, read+write", peak, source)

    def _d2d(self, dst, src, nbytes, stream=None):
        from pyquant import _lib
        _lib.qg_memcpy(self.ctx.handle, dst.ptr, src.ptr, nbytes,
                       _lib.CopyKind.QG_COPY_DEVICE_TO_DEVICE, stream)

    def _backlog(self, stream):
        self._d2d(self._backlog_dst, self._backlog_src, GPU_BACKLOG_BYTES, stream)

    # ------------------------------------------------------------ cases

    def _weight_set(self, case: C.Case):
        if self._wkey == case.weight_key:
            return self._weights
        self._weights = None  # free the previous set before building the next
        self._ckey = self._call = None
        arrays = _host_weight_arrays(case, self.rng)
        copies = C.rotation_copies(C.touched_weight_bytes(case), C.weight_footprint(case),
                                   self.flush_bytes, self.mem_budget)
        ws = []
        for c in range(copies):
            # Each copy in its own memory: distinct device copies, or host arrays copied.
            w = _make_weights(self.pq, case, arrays if (self.gpu or c == 0) else
                              {n: None if a is None else a.copy() for n, a in arrays.items()})
            if self.gpu:
                # the frag layouts the GPU tiers read: to_device for a dense weight (int4,
                # mxfp4, gguf q4_0), moe_repack for experts (the cases route with interleaved
                # gate / up); fp32 x and the -blocks variants keep the GGUF blocks
                layout = "canonical" if C.gguf_keeps_blocks(case) else "auto"
                w = (self.pq.moe_repack(*w, "interleaved", ctx=self.ctx) if isinstance(w, tuple)
                     else w.to_device(self.ctx, layout=layout))
            elif C.gguf_rows8(case):  # the CPU tier's rows8 layout (host memory, as the blocks)
                w = w.repack("rows8")
            ws.append(w)
        if self.gpu and (case.family in ("w4a16", "mxfp4") or getattr(ws[0], "layout", None) == "frag"):
            self._time_repack(case, ws[0])
        first = ws[0][0] if isinstance(ws[0], tuple) else ws[0]
        if case.family != "moe" and _counted_nbytes(first) != C.dense_weight_bytes(case):
            print(f"bench: warning: {case.label}: weight.nbytes = {first.nbytes} but the bench "
                  f"counts {C.dense_weight_bytes(case)} bytes", file=sys.stderr)
        self._wkey, self._weights = case.weight_key, ws
        return ws

    def _time_repack(self, case: C.Case, w) -> None:
        """Device time of qg_w4a16_repack / qg_mxfp4_repack / qg_gguf_repack (canonical ->
        frag) for this weight, once per shape (and int4 group size, GGUF format): the one-time
        cost a frag weight pays (reported in the notes)."""
        key = f"{case.family} repack {case.n}x{case.k}"
        if case.family == "gguf":
            key = f"gguf {case.format} repack {case.n}x{case.k}"
        if case.family == "w4a16":
            key += f" g{C.parse_w4a16_variant(case.variant).group_size} {'sym' if w.qzeros is None else 'asym'}"
        if key in self.repack_ms:
            return
        canon = w.to_device(self.ctx, layout="canonical") if w.layout == "frag" else w
        times = []
        for _ in range(3):  # the first includes the kernels' load
            start, stop = self.ctx.event(), self.ctx.event()
            start.record()
            canon.repack("frag")
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_ms(stop))
        self.repack_ms[key] = (min(times[1:]), canon.nbytes)

    def _callable(self, case: C.Case):
        """fn(i): one call of the case on weight copy i % copies."""
        if self._ckey == case.key:
            return self._call
        ws = self._weight_set(case)
        pq, ctx = self.pq, self.ctx
        dt = NP_DTYPE[C.act_dtype(case)]
        x = self.rng.standard_normal((case.m, case.k), dtype=np.float32).astype(dt)
        if case.family == "moe":
            ids, topw = C.moe_routing(case)
            y = np.empty((case.m, case.k), dt)
            if self.gpu:
                x, ids, topw, y = (pq.DeviceArray.from_numpy(a, ctx) for a in (x, ids, topw, y))

            def call(i):
                w13, w2 = ws[i % len(ws)]
                pq.moe(x, ids, topw, w13, w2, activation="swiglu_oai", gate_up_layout="interleaved",
                       ctx=ctx, out=y)
        else:
            y = np.empty((case.m, case.n), dt)
            if self.gpu:
                x, y = pq.DeviceArray.from_numpy(x, ctx), pq.DeviceArray.from_numpy(y, ctx)
            # one prepared call per weight copy: the timed loop pays one C call from Python
            plans = [pq.gemm_plan(x, w, out=y, ctx=ctx) for w in ws]

            def call(i):
                plans[i % len(plans)]()
        self._ckey, self._call = case.key, call
        return call

    def measure(self, case: C.Case) -> float:
        """Median seconds of one call; golden.Unsupported when the library cannot run the case
        (a family without a tier on this backend is known from the build before any weight
        is made: gpt-oss-120b's MoE weights alone are gigabytes)."""
        from pyquant._lib import Status
        if not family_has_tier(self.build, case.family, self.backend):
            raise golden.Unsupported(f"this build has no {self.backend} tier for {case.family}: {self.build}")
        try:
            return timing.measure(self.timer, self._callable(case), self.budget_s, **self.reps)
        except self.pq.QuantGemmError as e:
            if e.status == Status.QG_ERR_UNSUPPORTED:
                raise golden.Unsupported(str(e)) from None
            raise

    def peers(self, case: C.Case) -> dict[str, float]:
        if self._peers is None:
            return {}
        try:
            out = self._peers(case)
            if not self.gpu:
                R.settle_blas()  # numpy's matmul threads off the cores before our next case
            return out
        except Exception as e:  # a peer is never required: report once and go on
            if not self._peer_warned:
                print(f"bench: warning: peer failed on {case.label}: {type(e).__name__}: {e}",
                      file=sys.stderr)
                self._peer_warned = True
            return {}

    def notes(self) -> list[str]:
        """Warnings about the measurements, printed after the table."""
        out = []
        starved = getattr(self.timer, "starved", 0)
        if starved:
            out.append(f"{starved} groups of timed calls were enqueued slower than the device ran "
                       f"them even behind {self.timer.MAX_BACKLOG} backlog copies: their times "
                       "may include host launch gaps")
        for what, (ms, nbytes) in sorted(self.repack_ms.items()):
            out.append(f"{what} to the frag layout on the GPU: "
                       f"{ms * 1e3:.0f} us ({nbytes / (ms * 1e-3) / 1e9:.0f} GB/s of canonical weight read)")
        return out

    def close(self) -> None:
        self._weights = self._call = None
        if self._peers is not None:
            self._peers.close()
