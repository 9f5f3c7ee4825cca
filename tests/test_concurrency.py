"""Concurrency: calls at the same time give the results of the same calls made one by one.

- CPU: many host threads call the CPU tier at once (ctypes releases the GIL for the
  call), each on its own data, through a shared context and through contexts of their
  own with different cpu_threads; every result is bit-identical to the serial result of
  the same call (the CPU tier fixes its summation order per output element, whatever
  the number of worker threads).
- qg_last_error is per thread: threads that fail with different conditions at the same
  time each read back their own sentence, also after the other threads made calls.
- GPU (marked `gpu`): problems launched on several streams at once, and from several
  host threads with a stream each, give the bits of the same problems run serially on
  the default stream (split-K reduces in a fixed order, so bit equality is the contract
  here, not a tolerance).
"""
from __future__ import annotations

import ctypes
import re
import threading

import ml_dtypes
import numpy as np
import pytest

from conftest import FP32_EXACT, log_margin, registry_formats
from raw_gpu import RawGpu
from pyquant import _lib as L
from pyquant.formats import FORMATS, int4, mxfp4, reference

pytestmark = pytest.mark.skipif(not L.library_loaded(), reason="libquantgemm is not loaded")

F32, F16, BF16 = 0, 1, 2
NP = {F32: np.dtype(np.float32), F16: np.dtype(np.float16), BF16: np.dtype(ml_dtypes.bfloat16)}
GGUF = registry_formats("gguf")  # the GGUF formats of the registry: problems cycle over them
HOST_THREADS = 8        # more host threads than the 2 CI cores: calls really overlap
REPEATS = 8             # calls per thread, interleaved with the other threads' calls


def assert_bits_equal(got, want, name):
    g, w = np.ascontiguousarray(got), np.ascontiguousarray(want)
    assert g.shape == w.shape and g.dtype == w.dtype, (name, g.shape, w.shape, g.dtype, w.dtype)
    u = np.dtype(f"u{g.dtype.itemsize}")
    bad = np.argwhere(g.view(u) != w.view(u))
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(f"{name}: first mismatch at {i}: concurrent {g[i]!r}, serial {w[i]!r} "
                             f"({len(bad)} of {g.size} differ)")


def cpu_ctx(threads=0):
    ctx = L.qg_context_p()
    L.qg_context_create(L.Backend.QG_BACKEND_CPU, 0, ctypes.byref(ctx))
    L.qg_context_set_option(ctx, b"cpu_threads", threads)
    # the reference bounds here are the fp32-exact path's (tests/test_cpu_int8*.py: int8)
    L.qg_context_set_option(ctx, b"cpu_precision", FP32_EXACT)
    return ctx


def run_threads(n, body):
    """body(i) on n threads started together; re-raises the first failure."""
    barrier = threading.Barrier(n)
    errors = []

    def run(i):
        try:
            barrier.wait()
            body(i)
        except BaseException as e:  # noqa: BLE001
            errors.append((i, e))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        i, e = errors[0]
        raise AssertionError(f"thread {i}: {type(e).__name__}: {e}") from e


# ---------------------------------------------------------------- problems (host memory)

class Problem:
    """One call with its own inputs; run() writes a fresh output and returns it."""

    def __init__(self, kind, rng, i, fmt=None):
        self.kind, self.keep = kind, []
        m = [1, 3, 17, 40][i % 4]
        if kind == "w4a16":
            n, k, g = 64 + 8 * (i % 3), 256 + 128 * (i % 2), [32, 64, 128][i % 3]
            qw, sc, qz = int4.quantize(rng.standard_normal((n, k)).astype(np.float32), group_size=g,
                                       scale_dtype="bf16" if i % 2 else "fp16")
            x = rng.standard_normal((m, k)).astype(NP[BF16 if i % 2 else F16])
            self.keep += [qw, sc, qz, x]
            self.out = ((m, n), NP[F32] if i % 3 == 0 else x.dtype)
            self.args = L.qg_w4a16_gemm_args(
                m=m, n=n, k=k, group_size=g, x_dtype=BF16 if i % 2 else F16,
                y_dtype=F32 if i % 3 == 0 else (BF16 if i % 2 else F16), scale_dtype=BF16 if i % 2 else F16,
                zero_dtype=5, x=x.ctypes.data, ldx=k, qweight=qw.ctypes.data, scales=sc.ctypes.data,
                qzeros=qz.ctypes.data, ldy=n)
            self.fn = L.qg_w4a16_gemm
        elif kind == "gguf":
            spec = FORMATS[GGUF[i % len(GGUF)] if fmt is None else fmt]
            n, k = 33 + i, spec.block_elems * (2 if spec.block_elems == 256 else 8)
            raw = spec.module.random_blocks(rng, n, k, d_range=(1e-3, 1e-2))
            xdt = [F32, F16, BF16][i % 3]
            x = rng.standard_normal((m, k)).astype(NP[xdt])
            self.keep += [raw, x]
            self.out = ((m, n), NP[xdt])
            self.args = L.qg_gguf_gemm_args(format=spec.qg_format, m=m, n=n, k=k, x_dtype=xdt, y_dtype=xdt,
                                            x=x.ctypes.data, ldx=k, w=raw.ctypes.data, ldw=raw.shape[1], ldy=n)
            self.fn = L.qg_gguf_gemm
        else:  # mxfp4 dense with bias
            n, k = 48 + i, 256
            blocks = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
            scales = rng.integers(120, 129, (n, k // 32), dtype=np.uint8)
            bias = rng.standard_normal(n).astype(np.float32)
            x = rng.standard_normal((m, k)).astype(np.float32)
            self.keep += [blocks, scales, bias, x]
            self.out = ((m, n), NP[F32])
            self.args = L.qg_mxfp4_gemm_args(m=m, n=n, k=k, x_dtype=F32, y_dtype=F32, x=x.ctypes.data, ldx=k,
                                             blocks=blocks.ctypes.data, scales=scales.ctypes.data,
                                             bias=bias.ctypes.data, bias_dtype=F32, ldy=n)
            self.fn = L.qg_mxfp4_gemm

    def run(self, ctx):
        shape, dtype = self.out
        y = np.full(shape, np.nan, dtype)
        args = type(self.args).from_buffer_copy(self.args)  # each call its own struct
        args.y = y.ctypes.data
        self.fn(ctx, ctypes.byref(args), None)
        return y


class MoeProblem:
    """align + stage 1 + stage 2 of one small mixture of experts, on its own data."""

    def __init__(self, rng, i):
        T, E, top_k, H, I = 5 + i, 4 + i % 3, 2, 64, 32 * (1 + i % 2)
        self.tile_m = [16, 32, 64][i % 3]
        self.T, self.E, self.top_k, self.H, self.I = T, E, top_k, H, I
        self.ids = np.stack([rng.permutation(E)[:top_k] for _ in range(T)]).astype(np.int32)
        self.wts = rng.uniform(0, 1, (T, top_k)).astype(np.float32)
        self.x = rng.standard_normal((T, H)).astype(np.float32)
        self.b13 = rng.integers(0, 256, (E, 2 * I, H // 32, 16), dtype=np.uint8)
        self.s13 = rng.integers(120, 129, (E, 2 * I, H // 32), dtype=np.uint8)
        self.b2 = rng.integers(0, 256, (E, H, I // 32, 16), dtype=np.uint8)
        self.s2 = rng.integers(120, 129, (E, H, I // 32), dtype=np.uint8)

    def run(self, ctx):
        ms, mt = ctypes.c_int64(), ctypes.c_int64()
        L.qg_moe_align_sizes(self.T, self.top_k, self.E, self.tile_m, ctypes.byref(ms), ctypes.byref(mt))
        sorted_ids = np.empty(ms.value, np.int32)
        tiles = np.empty(mt.value, np.int32)
        num = np.empty(1, np.int32)
        route = dict(num_tokens=self.T, top_k=self.top_k, num_experts=self.E, tile_m=self.tile_m)
        a = L.qg_moe_align_args(topk_ids=self.ids.ctypes.data, sorted_ids=sorted_ids.ctypes.data,
                                tile_experts=tiles.ctypes.data, num_sorted=num.ctypes.data, **route)
        L.qg_moe_align(ctx, ctypes.byref(a), None)
        tables = dict(sorted_ids=sorted_ids.ctypes.data, tile_experts=tiles.ctypes.data,
                      num_sorted=num.ctypes.data, hidden=self.H, intermediate=self.I, **route)
        act = np.full((self.T * self.top_k, self.I), np.nan, np.float32)
        a1 = L.qg_moe_stage1_args(x_dtype=F32, x=self.x.ctypes.data, ldx=self.H,
                                  w13_blocks=self.b13.ctypes.data, w13_scales=self.s13.ctypes.data,
                                  activation=1, gate_up_layout=1, swiglu_alpha=1.702, swiglu_limit=7.0,
                                  act=act.ctypes.data, **tables)
        L.qg_moe_stage1(ctx, ctypes.byref(a1), None)
        y = np.full((self.T, self.H), np.nan, np.float32)
        a2 = L.qg_moe_stage2_args(act_dtype=F32, act=act.ctypes.data, w2_blocks=self.b2.ctypes.data,
                                  w2_scales=self.s2.ctypes.data, topk_weights=self.wts.ctypes.data,
                                  y_dtype=F32, y=y.ctypes.data, ldy=self.H, **tables)
        L.qg_moe_stage2(ctx, ctypes.byref(a2), None)
        # the routing order inside an expert is free; y and num_sorted are not
        return np.concatenate([y.reshape(-1), num.astype(np.float32)])


def problems(rng, count):
    kinds = ["w4a16", "gguf", "mxfp4", "moe"]
    out = []
    for i in range(count):
        kind = kinds[i % len(kinds)]
        out.append(MoeProblem(rng, i) if kind == "moe" else Problem(kind, rng, i))
    return out


def assert_threads_match_serial(probs, thread_ctx):
    """HOST_THREADS host threads, thread t alternating problems t and t + HOST_THREADS on the
    context thread_ctx(t) (called in the thread), REPEATS times: every result has the bits of
    the same problem run serially on one worker thread."""
    serial_ctx = cpu_ctx(1)
    serial = [p.run(serial_ctx) for p in probs]
    results = {}

    def body(t):
        ctx = thread_ctx(t)
        for r in range(REPEATS):
            for j in (t, t + HOST_THREADS):
                results[(j, r)] = probs[j].run(ctx)

    run_threads(HOST_THREADS, body)
    for (j, r), y in sorted(results.items()):
        assert_bits_equal(y, serial[j], f"problem {j} ({getattr(probs[j], 'kind', 'moe')}), repeat {r}")
    assert len(results) == HOST_THREADS * 2 * REPEATS


@pytest.mark.parametrize("shared_context", [True, False], ids=["shared-context", "context-per-thread"])
def test_cpu_threads_match_serial(rng, shared_context):
    probs = problems(rng, HOST_THREADS * 2)
    shared = cpu_ctx(0)
    assert_threads_match_serial(probs, lambda t: shared if shared_context else cpu_ctx([0, 1, 2, 3][t % 4]))


@pytest.mark.parametrize("fmt", GGUF)
def test_cpu_threads_match_serial_every_gguf_format(rng, fmt):
    """Every GGUF format of the registry under concurrent calls on a shared context (the
    mixed problems of test_cpu_threads_match_serial reach only the formats their indices
    draw)."""
    probs = [Problem("gguf", rng, i, fmt=fmt) for i in range(HOST_THREADS * 2)]
    shared = cpu_ctx(0)
    assert_threads_match_serial(probs, lambda t: shared)


def test_cpu_results_also_match_the_reference(rng):
    """The serial results that the threaded runs are compared with are themselves right
    (a shared bug would make the bitwise comparison vacuous). Bounds per output dtype:
    fp32 accumulation over K <= 512 (about sqrt(K) * 2^-24 < 2e-6) plus one rounding to
    the output dtype (2^-11 fp16, 2^-8 bf16), each about twice the worst case."""
    bound = {np.dtype(np.float32): 2e-5, np.dtype(np.float16): 1e-3, NP[BF16]: 8e-3}
    ctx = cpu_ctx(0)
    for p in problems(rng, 8):
        if isinstance(p, MoeProblem):
            got = p.run(ctx)[:-1].reshape(p.T, p.H)
            ref = reference.moe(p.x, p.ids, p.wts, mxfp4.dequantize(p.b13, p.s13), mxfp4.dequantize(p.b2, p.s2),
                                act_dtype=np.float32)
        else:
            got = p.run(ctx)
            if p.kind == "w4a16":
                qw, sc, qz, x = p.keep
                ref = reference.gemm(x, int4.dequantize(qw, sc, qz, p.args.group_size))
            elif p.kind == "gguf":
                raw, x = p.keep
                spec = next(f for f in FORMATS.values() if f.qg_format == p.args.format)
                ref = reference.gemm(x, spec.module.dequantize(raw))
            else:
                blocks, scales, bias, x = p.keep
                ref = reference.gemm(x, mxfp4.dequantize(blocks, scales), bias)
        err = np.linalg.norm(got.astype(np.float64) - ref) / np.linalg.norm(ref)
        assert err <= bound[got.dtype], f"{getattr(p, 'kind', 'moe')} ({got.dtype}): normalised error {err:.3e}"
        log_margin(f"{getattr(p, 'kind', 'moe')} ({got.dtype})", err, bound[got.dtype])


def test_cpu_pool_serves_a_forked_child():
    """The CPU tier keeps a pool of worker threads (src/cpu/parallel.cpp). A child forked
    after the parent used it has none of those threads (and maybe a lock held at the
    fork): its calls must still finish, with the parent's bits. Runs in a fresh
    interpreter so that pytest's own threads are not forked; a hang fails on timeout."""
    import os
    import subprocess
    import sys
    script = """
import os, sys, numpy as np, pyquant
ctx = pyquant.Context("cpu"); ctx.set_option("cpu_threads", 4)
rng = np.random.default_rng(5)
w = pyquant.quantize(rng.standard_normal((256, 512)).astype(np.float32), "q4_K")
x = rng.standard_normal((3, 512)).astype(np.float32)
want = pyquant.gemm(x, w, ctx=ctx)          # the parent starts the pool
pid = os.fork()
if pid == 0:
    got = pyquant.gemm(x, w, ctx=ctx)
    os._exit(0 if got.tobytes() == want.tobytes() else 3)
_, status = os.waitpid(pid, 0)
sys.exit(os.waitstatus_to_exitcode(status))
"""
    env = dict(os.environ)
    r = subprocess.run([sys.executable, "-c", script], env=env, timeout=120, capture_output=True, text=True)
    assert r.returncode == 0, f"forked child: exit {r.returncode} (3 = different bits)\n{r.stderr[-2000:]}"


# ---------------------------------------------------------------- qg_last_error per thread

def test_last_error_is_per_thread():
    """Thread i fails with k = 128 * i + 8 (not a multiple of group_size=128). After all
    threads failed, and after every thread made further calls (successful ones, and
    failures of other threads with other numbers), each thread's qg_last_error still
    names its own k."""
    ctx = cpu_ctx(1)
    x = np.zeros(8 * 1024, np.float16)
    qw = np.zeros(4096, np.int32)
    sc = np.ones(1024, np.float16)
    y = np.zeros(4096, np.float16)
    after_fail = threading.Barrier(HOST_THREADS)
    after_more = threading.Barrier(HOST_THREADS)

    def failing(k):
        a = L.qg_w4a16_gemm_args(m=1, n=8, k=k, group_size=128, x_dtype=F16, y_dtype=F16, scale_dtype=F16,
                                 zero_dtype=5, x=x.ctypes.data, ldx=k, qweight=qw.ctypes.data,
                                 scales=sc.ctypes.data, y=y.ctypes.data, ldy=8)
        with pytest.raises(L.QuantGemmError):
            L.qg_w4a16_gemm(ctx, ctypes.byref(a), None)

    def body(i):
        k = 128 * (i + 1) + 8
        for _ in range(50):  # the sentence is set and read many times while others do the same
            failing(k)
            mine = L.last_error()
            assert re.search(rf"\bk={k}\b", mine), f"thread {i}: {mine!r} does not name k={k}"
        after_fail.wait()
        # calls that do not fail on this thread must not change its sentence
        n = ctypes.c_int()
        L.qg_device_count(L.Backend.QG_BACKEND_CPU, ctypes.byref(n))
        L.qg_version()
        after_more.wait()
        mine = L.last_error()
        assert re.search(rf"\bk={k}\b", mine), (
            f"thread {i}: qg_last_error is {mine!r} after the other threads failed; want k={k}")

    run_threads(HOST_THREADS, body)


def test_last_error_of_a_new_thread_is_empty():
    """A thread that never failed reads "" even while another thread holds an error."""
    ctx = cpu_ctx(1)
    with pytest.raises(L.QuantGemmError):
        L.qg_context_set_option(ctx, b"no_such_option", 1)
    assert "no_such_option" in L.last_error()
    seen = []
    t = threading.Thread(target=lambda: seen.append(L.last_error()))
    t.start()
    t.join()
    assert seen == [""], f"a fresh thread sees {seen[0]!r}"


# ---------------------------------------------------------------- GPU streams

@pytest.fixture
def gpu():
    g = RawGpu()
    yield g
    g.close()


class GpuProblem:
    """A GEMM with device inputs, a device output and its own zeroed workspace."""

    def __init__(self, gpu, kind, rng, i, m=None, fmt=None):
        self.gpu, self.kind = gpu, kind
        m = [1, 2, 7, 16, 33, 64][i % 6] if m is None else m
        if kind == "w4a16":
            n, k, g = [4096, 1024, 2048][i % 3], [4096, 1024, 2048, 8192][i % 4], [32, 64, 128][i % 3]
            qw, sc, qz = int4.quantize(rng.standard_normal((n, k)).astype(np.float32), group_size=g,
                                       scale_dtype="bf16" if i % 2 else "fp16")
            xdt = BF16 if i % 2 else F16
            x = rng.standard_normal((m, k)).astype(NP[xdt])
            self.args = L.qg_w4a16_gemm_args(
                m=m, n=n, k=k, group_size=g, x_dtype=xdt, y_dtype=xdt, scale_dtype=xdt, zero_dtype=5,
                x=gpu.upload(x), ldx=k, qweight=gpu.upload(qw), scales=gpu.upload(sc),
                qzeros=gpu.upload(qz) if i % 4 else None, ldy=n)
            self.fn = "qg_w4a16_gemm"
            self.out = ((m, n), NP[xdt])
            self.ref = lambda: reference.gemm(x, int4.dequantize(qw, sc, qz if i % 4 else None, g))
        elif kind == "gguf":
            spec = FORMATS[GGUF[i % len(GGUF)] if fmt is None else fmt]
            n, k = 1536 + 8 * i, 2048
            raw = spec.module.random_blocks(rng, n, k, d_range=(1e-3, 1e-2))
            x = rng.standard_normal((m, k)).astype(np.float16)
            self.args = L.qg_gguf_gemm_args(format=spec.qg_format, m=m, n=n, k=k, x_dtype=F16, y_dtype=F16,
                                            x=gpu.upload(x), ldx=k, w=gpu.upload(raw), ldw=raw.shape[1], ldy=n)
            self.fn = "qg_gguf_gemm"
            self.out = ((m, n), NP[F16])
            self.ref = lambda: reference.gemm(x, spec.module.dequantize(raw))
        else:
            n, k = 2048 + 32 * i, 2048
            blocks = rng.integers(0, 256, (n, k // 32, 16), dtype=np.uint8)
            scales = rng.integers(120, 129, (n, k // 32), dtype=np.uint8)
            x = rng.standard_normal((m, k)).astype(np.float16)
            self.args = L.qg_mxfp4_gemm_args(m=m, n=n, k=k, x_dtype=F16, y_dtype=F16, x=gpu.upload(x), ldx=k,
                                             blocks=gpu.upload(blocks), scales=gpu.upload(scales), ldy=n)
            self.fn = "qg_mxfp4_gemm"
            self.out = ((m, n), NP[F16])
            self.ref = lambda: reference.gemm(x, mxfp4.dequantize(blocks, scales))
        (rows, cols), dt = self.out
        self.nbytes = rows * cols * dt.itemsize
        self.args.y = gpu.alloc(self.nbytes, fill=0xFF)
        size = ctypes.c_size_t(0)
        getattr(L, self.fn + "_workspace_size")(gpu.ctx, ctypes.byref(self.args), ctypes.byref(size))
        if size.value:
            self.args.workspace = gpu.alloc(size.value, fill=0)  # zeroed once, re-armed by the library
            self.args.workspace_bytes = size.value

    def launch(self, stream):
        getattr(L, self.fn)(self.gpu.ctx, ctypes.byref(self.args), stream)

    def poison(self, stream):
        L.qg_memset(self.gpu.ctx, self.args.y, 0xFF, self.nbytes, stream)

    def result(self):
        return self.gpu.download(self.args.y, *self.out)


def gpu_problems(gpu, rng, count):
    out = []
    for i in range(count):
        for kind in ["w4a16", "gguf", "mxfp4"][i % 3:] + ["w4a16", "gguf", "mxfp4"][:i % 3]:
            p = GpuProblem(gpu, kind, rng, i)
            try:
                p.launch(None)  # one call to see whether this build has the family on the GPU
            except L.QuantGemmError as e:
                if e.status == L.Status.QG_ERR_UNSUPPORTED:
                    continue
                raise
            out.append(p)
            break
    L.qg_stream_synchronize(gpu.ctx, None)
    if not out:
        pytest.skip("no GEMM family has a GPU tier in this build")
    return out


def serial_results(gpu, probs):
    res = []
    for p in probs:
        p.poison(None)
        p.launch(None)
        L.qg_stream_synchronize(gpu.ctx, None)
        res.append(p.result())
    return res


@pytest.mark.gpu
def test_gpu_streams_match_serial(gpu, rng):
    probs = gpu_problems(gpu, rng, 8)
    serial = serial_results(gpu, probs)
    streams = []
    for _ in range(4):
        s = L.qg_stream()
        L.qg_stream_create(gpu.ctx, ctypes.byref(s))
        streams.append(s.value)
    try:
        for rep in range(3):
            for i, p in enumerate(probs):
                p.poison(streams[i % len(streams)])
            for _ in range(3):  # several launches per stream, all queued before any sync
                for i, p in enumerate(probs):
                    p.launch(streams[i % len(streams)])
            for s in streams:
                L.qg_stream_synchronize(gpu.ctx, s)
            for i, p in enumerate(probs):
                assert_bits_equal(p.result(), serial[i], f"{p.fn} problem {i} on stream {i % len(streams)}, "
                                  f"round {rep}")
    finally:
        for s in streams:
            L.qg_stream_destroy(gpu.ctx, s)


@pytest.mark.gpu
def test_gpu_host_threads_with_own_streams_match_serial(gpu, rng):
    probs = gpu_problems(gpu, rng, 8)
    serial = serial_results(gpu, probs)
    nthreads = len(probs)

    def body(t):
        s = L.qg_stream()
        L.qg_stream_create(gpu.ctx, ctypes.byref(s))
        try:
            for r in range(REPEATS):
                probs[t].poison(s.value)
                probs[t].launch(s.value)
                L.qg_stream_synchronize(gpu.ctx, s.value)
                assert_bits_equal(probs[t].result(), serial[t], f"{probs[t].fn} problem {t}, repeat {r}")
        finally:
            L.qg_stream_destroy(gpu.ctx, s.value)

    run_threads(nthreads, body)


@pytest.mark.gpu
def test_gpu_serial_results_match_the_reference(gpu, rng):
    """Guards the bitwise comparisons above against a shared wrong answer: every problem
    against the float64 reference. Bound 8e-3: one rounding to bf16 (2^-8) or fp16
    (2^-11) of an fp32 accumulation, about twice the bf16 unit roundoff; GGUF adds 2^-6
    (GGUF_INT8), the default GPU tier's int8 activations (docs/gguf-layout.md section 6)."""
    for p in gpu_problems(gpu, rng, 6):
        p.poison(None)
        p.launch(None)
        L.qg_stream_synchronize(gpu.ctx, None)
        got = p.result().astype(np.float64)
        ref = p.ref()
        assert np.isfinite(got).all(), f"{p.fn}: output not fully written"
        err = np.linalg.norm(got - ref) / np.linalg.norm(ref)
        bound = 8e-3 + (GGUF_INT8 if p.fn == "qg_gguf_gemm" else 0.0)
        assert err <= bound, f"{p.fn} {p.out}: normalised error {err:.3e}"


# The GPU's default GGUF tier quantizes x to int8 per 32 elements: 2^-6 normwise is about
# three times that error's RMS (tests/test_gpu_gemm.py holds it to a rigorous bound).
GGUF_INT8 = 2.0 ** -6
GPU_KINDS = ["w4a16", "mxfp4"] + GGUF


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 16, 17, 33, 64])
@pytest.mark.parametrize("kind", GPU_KINDS)
def test_gpu_workspace_serves_repeated_calls(gpu, rng, kind, m):
    """quantgemm.h: a workspace zeroed once serves any number of calls on one stream (the
    split-K arrival counters re-arm themselves). Three calls in a row on one workspace,
    the output poisoned before each: every call writes the whole output, with the bits
    of the first (which is checked against the reference, bound as in
    test_gpu_serial_results_match_the_reference)."""
    family = "gguf" if kind in FORMATS and FORMATS[kind].kind == "gguf" else kind
    p = GpuProblem(gpu, family, rng, 1, m=m, fmt=kind if family == "gguf" else None)
    first = None
    for call_no in range(3):
        p.poison(None)
        try:
            p.launch(None)
        except L.QuantGemmError as e:
            if e.status == L.Status.QG_ERR_UNSUPPORTED:
                pytest.skip(str(e))
            raise
        L.qg_stream_synchronize(gpu.ctx, None)
        y = p.result()
        bad = np.argwhere(~np.isfinite(y.astype(np.float64)))
        assert not bad.size, (f"{kind} m={m}: call {call_no + 1} on the same workspace left "
                              f"{len(bad)} of {y.size} outputs unwritten (first at {tuple(bad[0])})")
        if first is None:
            ref = p.ref()
            err = np.linalg.norm(y.astype(np.float64) - ref) / np.linalg.norm(ref)
            assert err <= 8e-3 + (GGUF_INT8 if family == "gguf" else 0.0), f"{kind} m={m}: normalised error {err:.3e}"
            first = y
        else:
            assert_bits_equal(y, first, f"{kind} m={m}: call {call_no + 1} vs call 1")
    # quantgemm.h: every call leaves its workspace zero-filled again
    if p.args.workspace:
        ws = gpu.download(p.args.workspace, (p.args.workspace_bytes,), np.uint8)
        nz = np.flatnonzero(ws)
        assert not nz.size, (f"{kind} m={m}: {nz.size} of {ws.size} workspace bytes left non-zero "
                             f"(first at byte {nz[0] if nz.size else 0})")
