"""ABI fuzzing: every C entry point, driven through pyquant._lib with random arguments.

An engine embeds libquantgemm in a long-running server, so one malformed call must not
take the process down or write outside its output. Hypothesis draws a *valid* call
(shapes, strides, dtypes, enum values, group sizes, pointer alignment) and then applies
0-3 *mutations* (a negative or non-divisible size, an out-of-range enum, a NULL or
misaligned pointer, a short stride, a corrupt routing table, a wrong struct size, a huge
dimension next to another fault). A model written from include/quantgemm.h classifies
the resulting call:

  VALID   the call must return QG_OK, match the float64 reference within the bound of
          its output dtype, and leave every byte outside the elements it owns untouched
          (inputs byte-identical, guard bands and the ld-padding of outputs intact);
  INVALID the call must return QG_ERR_INVALID_ARGUMENT with a sentence naming one of the
          violated fields, and leave every buffer byte-identical;
  EITHER  the header does not decide (m = 0 next to another fault, n = 0, an odd GGUF
          row stride, a larger args->size, a byte pointer at +1, ...): accepted calls
          are checked like VALID ones, refused ones like INVALID ones.

Buffers are numpy arrays on the CPU context: inputs are allocated at exactly their size
(so that an over-read leaves the allocation, which AddressSanitizer sees, .ci/sanitize.sh),
outputs sit between random guard bands. Each case runs in a forked child (fork costs
~2 ms), so a crash, a sanitizer abort or a hang becomes a failing, shrinkable example
instead of a dead test run.

Library bugs this file found (an args struct read before its alignment was checked;
out-of-range enum values read through enum types, UB in C++) are fixed and pinned by
their own tests (test_misaligned_args_struct_is_refused, the enum cases of the fuzz under
.ci/sanitize.sh); the fuzz does not generate misaligned args structs or extents beyond
int64 itself.

Budget: QG_FUZZ_SCALE (default 1) multiplies every max_examples; at 1 the file runs in
well under a minute on 2 cores. The number of cases run is printed in the terminal
summary ("quantgemm ABI fuzz: ...").
"""
from __future__ import annotations

import collections
import ctypes
import faulthandler
import math
import os
import pickle
import re
import select
import signal
import time
import traceback

import ml_dtypes
import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, assume, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import FP32_EXACT, log_margin  # noqa: E402
from raw_gpu import RawGpu  # noqa: E402
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import FORMATS, int4, int8_act, mxfp4, reference  # noqa: E402

pytestmark = pytest.mark.skipif(not L.library_loaded(), reason="libquantgemm is not loaded")

# ---------------------------------------------------------------- constants

F32, F16, BF16, I32, U8, U4X8 = 0, 1, 2, 3, 4, 5
FLOAT_DTYPES = (F32, F16, BF16)
NP_DTYPE = {F32: np.dtype(np.float32), F16: np.dtype(np.float16),
            BF16: np.dtype(ml_dtypes.bfloat16)}
DTYPE_BYTES = {F32: 4, F16: 2, BF16: 2, I32: 4, U8: 1, U4X8: 4}
NOT_ENUM = (-1, 6, 7, 100, 2 ** 31 - 1, -2 ** 31)          # no qg_dtype / qg_format value
HUGE = (2 ** 31 + 8, 2 ** 40, 2 ** 62, 2 ** 63 - 64)         # only ever next to another fault
# a refusal caused by a huge size may name any size or stride that enters the extent
SIZE_FIELDS = ("m", "n", "k", "ldx", "ldy", "ldw", "num_tokens", "top_k", "num_experts", "hidden",
               "intermediate")
# num_tokens: T * top_k must stay inside int64 here (beyond it: tests/test_overflow.py)
HUGE_TOKENS = (2 ** 31 + 8, 2 ** 40)
GUARD = 64                                                  # guard band bytes on each side
SCALE = float(os.environ.get("QG_FUZZ_SCALE", "1"))

# Error bound of a valid call, ||y - y_ref|| <= 2 u_y ||y_ref|| + 2 K u32 || |x| @ |w|^T ||:
# one rounding to the output dtype (unit roundoff u_y: 2^-24 fp32, 2^-11 fp16, 2^-8 bf16)
# plus the worst case of a K-term fp32 dot product, K * 2^-24 times the sum of the
# magnitudes of its products (Higham, "Accuracy and Stability of Numerical Algorithms",
# section 3.1), each doubled. The second term matters when the products cancel: a tiny
# 1x1 output is then far less accurate than sqrt(K) * 2^-24 relative to itself.
UNIT_ROUNDOFF = {F32: 2.0 ** -24, F16: 2.0 ** -11, BF16: 2.0 ** -8}
U32 = 2.0 ** -24

GGUF_SPECS = {s.qg_format: s for s in FORMATS.values() if s.kind == "gguf"}


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


FUZZ_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much,
                                            HealthCheck.function_scoped_fixture])

# ---------------------------------------------------------------- case counter + summary

COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


class _FuzzSummary:
    def pytest_terminal_summary(self, terminalreporter):
        if not COUNTS:
            return
        total = sum(sum(c.values()) for c in COUNTS.values())
        terminalreporter.write_sep("-", f"quantgemm ABI fuzz: {total} cases")
        for fn in sorted(COUNTS):
            c = COUNTS[fn]
            parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
            terminalreporter.write_line(f"  {fn}: {sum(c.values())} ({parts})")


@pytest.fixture(scope="module", autouse=True)
def _fuzz_summary(request):
    pm = request.config.pluginmanager
    if not pm.has_plugin("quantgemm-fuzz-summary"):
        pm.register(_FuzzSummary(), "quantgemm-fuzz-summary")
    yield


# ---------------------------------------------------------------- isolation

CHILD_LOG: list = []   # (entry point, outcome) of every call a case made, in the child


def _child_result(fn):
    CHILD_LOG.clear()
    try:
        value = fn()
        return ("ok", (value, list(CHILD_LOG)))
    except AssertionError as e:
        return ("fail", f"{e}\n{traceback.format_exc(limit=4)}")
    except BaseException as e:  # noqa: BLE001 - everything is reported
        return ("fail", f"{type(e).__name__}: {e}\n{traceback.format_exc(limit=6)}")


def _write_msg(fd, obj):
    data = pickle.dumps(obj)
    view = memoryview(len(data).to_bytes(8, "little") + data)
    while view:
        view = view[os.write(fd, view):]


def _read_exact(fd, n, deadline):
    chunks, got = [], 0
    while got < n:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], min(left, 1e6))[0]:
            return None, "timeout"
        chunk = os.read(fd, n - got)
        if not chunk:
            return None, "eof"
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks), ""


def _read_msg(fd, deadline):
    head, why = _read_exact(fd, 8, deadline)
    if head is None:
        return None, why
    body, why = _read_exact(fd, int.from_bytes(head, "little"), deadline)
    return (None, why) if body is None else (pickle.loads(body), "")


def _reap(pid, why, timeout):
    """Kills (on a hang) and reaps a child; the failure sentence for its end."""
    if why == "timeout":
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        return f"the call did not return within {timeout:.0f} s (hang)"
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        return f"the call crashed the process with {signal.Signals(os.WTERMSIG(status)).name}"
    return (f"the process exited with status {os.WEXITSTATUS(status)} inside the call "
            "(a sanitizer report, if any, is in the captured stderr)")


def run_isolated(fn, timeout: float = 120.0):
    """Runs fn() in a forked child and returns its (picklable) result. A crash, a
    sanitizer abort (non-zero exit) or a hang becomes an AssertionError here."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into pytest
        os.close(r)
        faulthandler.disable()  # a crash is reported by the parent; no traceback dump
        try:
            _write_msg(w, _child_result(fn))
        finally:
            os._exit(0)
    os.close(w)
    try:
        msg, why = _read_msg(r, time.monotonic() + timeout)
    finally:
        os.close(r)
    if msg is None:
        raise AssertionError(_reap(pid, why, timeout))
    os.waitpid(pid, 0)
    kind, value = msg
    if kind == "fail":
        raise AssertionError(value)
    return value[0]


class Worker:
    """One forked child that runs case after case (forking per case costs ~15 ms once
    numpy's thread pools exist; a pipe round trip costs ~0.1 ms). When a case kills it,
    the case fails with the reason and the next case starts a fresh child."""

    def __init__(self):
        self.pid = None

    def _start(self):
        p2c_r, p2c_w = os.pipe()
        c2p_r, c2p_w = os.pipe()
        pid = os.fork()
        if pid == 0:
            faulthandler.disable()
            os.close(p2c_w)
            os.close(c2p_r)
            try:
                while True:
                    msg, _ = _read_msg(p2c_r, float("inf"))
                    if msg is None:
                        break
                    name, spec = msg
                    _write_msg(c2p_w, _child_result(lambda: globals()[name](spec)))
            finally:
                os._exit(0)
        os.close(p2c_r)
        os.close(c2p_w)
        self.pid, self.send_fd, self.recv_fd = pid, p2c_w, c2p_r

    def stop(self):
        if self.pid is not None:
            os.close(self.send_fd)
            os.close(self.recv_fd)
            os.waitpid(self.pid, 0)
            self.pid = None

    def run(self, name, spec, timeout: float = 120.0):
        if self.pid is None:
            self._start()
        _write_msg(self.send_fd, (name, spec))
        msg, why = _read_msg(self.recv_fd, time.monotonic() + timeout)
        if msg is None:
            pid = self.pid
            os.close(self.send_fd)
            os.close(self.recv_fd)
            self.pid = None
            raise AssertionError(_reap(pid, why, timeout))
        kind, value = msg
        if kind == "fail":
            raise AssertionError(value)
        return value  # (the case's return value, [(entry point, outcome), ...])


WORKER = Worker()


@pytest.fixture(scope="module", autouse=True)
def _stop_worker():
    yield
    WORKER.stop()


# ---------------------------------------------------------------- calls

def call(fn, *args):
    """(status, message) of a qg_* call; pyquant._lib raises on a non-QG_OK status."""
    try:
        fn(*args)
        return 0, ""
    except L.QuantGemmError as e:
        return int(e.status), e.message


def names_field(msg: str, fields) -> bool:
    return any(re.search(rf"(?<![A-Za-z0-9_]){re.escape(f)}(?![A-Za-z0-9_])", msg) for f in fields)


# ---------------------------------------------------------------- host memory

# pointer modes: "ok" (64-byte aligned), "shift" (+4 bytes: aligned for every element
# type, but not to 16 bytes: vector-load paths must fall back), "mis" (+1 byte: misaligned
# for every type wider than a byte), "null"
OFFSET = {"mis": 1, "shift": 4}


def assert_bytes_kept(kind, name, now, before, off, nbytes, allowed=None):
    """Every byte of a buffer (payload at [off, off + nbytes) between guard bands) is as in
    the snapshot, except where `allowed` says: True for the whole payload (a workspace),
    or a boolean mask over the payload."""
    diff = now != before
    if allowed is True:
        diff[off:off + nbytes] = False
    elif allowed is not None:
        diff[off:off + nbytes] &= ~allowed
    if diff.any():
        i = int(np.argmax(diff))
        where = ("guard band before" if i < off else
                 "guard band after" if i >= off + nbytes else f"payload byte {i - off}")
        raise AssertionError(f"{kind} {name!r} changed at {where} ({int(diff.sum())} bytes changed)")


class Mem:
    """The buffers of one case. Inputs: exactly their size (+1 byte when misaligned).
    Outputs: random guard bands on both sides, payload 64-byte aligned (+1 when
    misaligned), payload filled with random poison."""

    def __init__(self, rng):
        self.rng = rng
        self.bufs = {}   # name -> (store, offset, nbytes, kind)
        self.keep = []

    def _bytes(self, n):
        return self.rng.integers(0, 256, size=n, dtype=np.uint8)

    def input(self, name, arr, mode="ok", host=False):
        raw = np.ascontiguousarray(arr).reshape(-1).view(np.uint8)
        mis = OFFSET.get(mode, 0)
        store = np.empty(raw.size + mis, np.uint8)
        if store.ctypes.data % 64:  # rare: keep the aligned case aligned
            big = np.empty(raw.size + mis + 64, np.uint8)
            off0 = (-big.ctypes.data) % 64
            store = big[off0:off0 + raw.size + mis]
        store[:mis] = self._bytes(mis)
        store[mis:] = raw
        self.bufs[name] = (store, mis, raw.size, "in")
        return None if mode == "null" else store.ctypes.data + mis

    def output(self, name, nbytes, mode="ok", host=False, zero=False):
        nbytes = int(max(nbytes, 0))
        store = np.empty(GUARD + 64 + 4 + nbytes + GUARD, np.uint8)
        start = GUARD + (-(store.ctypes.data + GUARD)) % 64 + OFFSET.get(mode, 0)
        store[:] = self._bytes(store.size)
        if zero:
            store[start:start + nbytes] = 0
        self.bufs[name] = (store, start, nbytes, "out")
        return None if mode == "null" else store.ctypes.data + start

    def raw_ptr(self, name):
        store, off, _, _ = self.bufs[name]
        return store.ctypes.data + off

    def host_store_changed(self, name):
        pass  # the next drive() takes a fresh snapshot

    def snapshot(self):
        self.before = {k: v[0].copy() for k, v in self.bufs.items()}

    def payload(self, name, dtype):
        store, off, nbytes, _ = self.bufs[name]
        return store[off:off + nbytes].view(dtype)

    def check_untouched(self, allowed=None):
        """Every byte is as in the snapshot, except the byte ranges in allowed[name]
        (a boolean mask over that buffer's payload)."""
        allowed = allowed or {}
        for name, (store, off, nbytes, _) in self.bufs.items():
            assert_bytes_kept("buffer", name, store, self.before[name], off, nbytes, allowed.get(name))


class DevMem:
    """Mem with the data buffers in device memory of a GPU context (qg_malloc, every
    buffer between random guard bands, inputs included); args structs and the size_t of
    a workspace query stay in host memory (host=True)."""

    def __init__(self, rng, gpu):
        self.rng, self.gpu = rng, gpu
        self.host = Mem(rng)
        self.bufs = {}   # name -> (base pointer, total bytes, payload offset, payload bytes)

    def _put(self, name, payload, mode, zero=False):
        off = GUARD + OFFSET.get(mode, 0)
        total = off + payload.size + GUARD
        init = self.rng.integers(0, 256, total, dtype=np.uint8)
        init[off:off + payload.size] = 0 if zero else payload
        base = self.gpu.alloc(total)
        self.gpu.upload_to(base, init)
        self.bufs[name] = (base, total, off, payload.size)
        return None if mode == "null" else base + off

    def input(self, name, arr, mode="ok", host=False):
        if host:
            return self.host.input(name, arr, mode)
        return self._put(name, np.ascontiguousarray(arr).reshape(-1).view(np.uint8), mode)

    def output(self, name, nbytes, mode="ok", host=False, zero=False):
        if host:
            return self.host.output(name, nbytes, mode, zero=zero)
        return self._put(name, np.zeros(int(max(nbytes, 0)), np.uint8), mode, zero=zero)

    def host_store_changed(self, name):
        pass

    def _all(self, name):
        base, total, _, _ = self.bufs[name]
        return self.gpu.download_from(base, total)

    def snapshot(self):
        self.host.snapshot()
        self.before = {k: self._all(k) for k in self.bufs}

    def payload(self, name, dtype):
        if name in self.host.bufs:
            return self.host.payload(name, dtype)
        _, _, off, nbytes = self.bufs[name]
        return self._all(name)[off:off + nbytes].view(dtype)

    def check_untouched(self, allowed=None):
        allowed = allowed or {}
        self.host.check_untouched({k: v for k, v in allowed.items() if k in self.host.bufs})
        for name, (_, _, off, nbytes) in self.bufs.items():
            assert_bytes_kept("device buffer", name, self._all(name), self.before[name], off, nbytes,
                              allowed.get(name))


class CpuEnv:
    gpu = False

    def mem(self, rng):
        return Mem(rng)

    def ctx(self, threads):
        return make_ctx(threads)


CPU_ENV = CpuEnv()


class GpuEnv:
    """The GEMM cases on a GPU context, in-process (a GPU context does not survive fork);
    the context and the buffers are a RawGpu's (tests/raw_gpu.py)."""
    gpu = True

    def __init__(self):
        self.raw = RawGpu()  # skips the test without a GPU device

    def mem(self, rng):
        return DevMem(rng, self)

    def ctx(self, threads):
        return self.raw.ctx

    def alloc(self, nbytes):
        return self.raw.alloc(nbytes)

    def upload_to(self, ptr, arr):
        self.raw.upload(arr, at=ptr)

    def download_from(self, ptr, nbytes):
        return self.raw.download(ptr, nbytes, np.uint8)

    def free_all(self):
        self.raw.free_all()

    def close(self):
        self.raw.close()


WORKSPACE_FREE = {"workspace": True}  # scratch of a GPU call: its bytes may change, not its guards


def workspace_step(env, mem, fn_name, query, ctx, pa, struct, wexp):
    """The *_workspace_size query (same checks minus the data pointers, plus `bytes`);
    on a GPU context a zeroed workspace of that size is then put in the args."""
    wbytes = mem.output("workspace_bytes", 8, host=True)
    need = []

    def verify_ws():
        got = int(mem.payload("workspace_bytes", np.uint64)[0])
        mem.check_untouched({"workspace_bytes": np.ones(8, bool)})
        if not env.gpu:
            assert got == 0, f"the CPU tier asks for a workspace of {got} bytes"
        assert got < 2 ** 40, f"{fn_name}: absurd workspace size {got}"
        need.append(got)
    drive(fn_name, lambda: call(query, ctx, pa, ctypes.cast(wbytes, ctypes.POINTER(ctypes.c_size_t))),
          wexp, mem, verify_ws)
    if env.gpu and need and need[0] > 0:
        ws = mem.output("workspace", need[0], zero=True)
        rewrite_args(mem, pa, struct, ws, need[0])


def elem_mask(nbytes, index, esize):
    """Boolean byte mask of the elements `index` (element indices) of a payload."""
    mask = np.zeros(nbytes, bool)
    idx = np.asarray(index, dtype=np.int64).reshape(-1)
    for b in range(esize):
        mask[idx * esize + b] = True
    return mask


def matrix_index(rows, cols, ld):
    return (np.arange(rows, dtype=np.int64)[:, None] * ld + np.arange(cols)[None, :]).reshape(-1)


def args_pointer(mem, struct, mode, size):
    """Copies the args struct into an exact-size numpy buffer (an over-read of the struct
    is then visible to ASan) and returns a typed pointer (or None)."""
    struct.size = size
    raw = np.frombuffer(bytes(struct), np.uint8)
    ptr = mem.input("args", raw, "null" if mode == "null" else "ok", host=True)
    return None if ptr is None else ctypes.cast(ptr, ctypes.POINTER(type(struct)))


def rewrite_args(mem, pa, struct, workspace, nbytes):
    """Sets the workspace fields of the struct already copied to the args buffer."""
    if pa is None:
        return
    struct.workspace, struct.workspace_bytes = workspace, nbytes
    size = pa.contents.size
    pa.contents = struct
    pa.contents.size = size
    mem.host_store_changed("args")


def assert_close(name, got, ref, ydt, abs_ref, k, roundings=2):
    """got vs the float64 reference within the bound above; abs_ref is the same product
    computed on magnitudes (|x| @ |w|^T + |bias|), k the length of the fp32 sums,
    roundings the number of output-dtype unit roundoffs allowed per element."""
    got = np.asarray(got).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    bad = np.argwhere(~np.isfinite(got))
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{name}: non-finite output at {i}: {got[i]!r} (reference {ref[i]!r})")
    norm = np.linalg.norm(ref)
    err = np.linalg.norm(got - ref)
    bound = roundings * UNIT_ROUNDOFF[ydt] * norm + 2 * k * U32 * np.linalg.norm(abs_ref)
    if not err <= bound:
        i = np.unravel_index(np.argmax(np.abs(got - ref)), got.shape)
        raise AssertionError(f"{name}: ||y - ref|| = {err:.3e} > bound {bound:.3e} (normalised error "
                             f"{err / max(norm, 1e-300):.3e}); worst at {tuple(int(v) for v in i)}: "
                             f"got {got[i]!r}, reference {ref[i]!r}")
    log_margin(name, err, bound)


def float_input(rng, rows, cols, ld, dt):
    """A [rows, cols] matrix with row stride ld stored in the minimal extent
    (rows - 1) * ld + cols, random N(0, 1) values (padding too). Returns (flat, dense)."""
    rows, cols, ld = max(rows, 0), max(cols, 0), max(ld, 0)
    extent = max((rows - 1) * ld + cols, 0) if rows else 0
    npdt = NP_DTYPE.get(dt, np.dtype(np.float16))
    flat = rng.standard_normal(extent).astype(npdt)
    dense = None
    if rows and ld >= cols:
        full = np.zeros(rows * ld, npdt)
        full[:extent] = flat
        dense = full.reshape(rows, ld)[:, :cols]
    return flat, dense


def is_sane(exp, s, fields):
    """Buffers are sized exactly from the arguments only for calls the library may
    accept with non-negative, non-huge sizes; otherwise they are small stand-ins."""
    return not s["huge"] and exp.kind != "invalid" and all(s[f] >= 0 for f in fields)


def small(v, cap=64):
    """A dimension clamped to something allocatable (invalid cases only)."""
    return int(min(max(v, 0), cap))


# ---------------------------------------------------------------- the case driver

class Expect:
    def __init__(self):
        self.hard = []   # fields of violated conditions: the call must be refused
        self.soft = []   # fields of conditions the header leaves open

    def bad(self, cond, *fields):
        if cond:
            self.hard.extend(fields)

    def open(self, cond, *fields):
        if cond:
            self.soft.extend(fields)

    @property
    def kind(self):
        return "invalid" if self.hard else "either" if self.soft else "valid"


def drive(fn_name, invoke, exp: Expect, mem: Mem, verify):
    """Calls invoke() -> (status, message) once and checks the outcome against exp.
    verify() checks an accepted call (outputs vs reference, untouched bytes) and returns
    nothing. Returns the outcome label for the case counter."""
    mem.snapshot()
    status, msg = invoke()
    kind = exp.kind
    if status == 0:
        assert kind != "invalid", (
            f"{fn_name} accepted a call that violates {exp.hard} (must be QG_ERR_INVALID_ARGUMENT)")
        verify()
        CHILD_LOG.append((fn_name, f"{kind}-accepted"))
        return f"{kind}-accepted"
    name = L.Status(status).name if status in L._STATUS_VALUES else str(status)
    assert kind != "valid", f"{fn_name} refused a valid call with {name}: {msg!r}"
    assert status == L.Status.QG_ERR_INVALID_ARGUMENT, (
        f"{fn_name} refused {exp.hard + exp.soft} with {name}, not QG_ERR_INVALID_ARGUMENT: {msg!r}")
    assert msg, f"{fn_name} refused the call without a qg_last_error sentence"
    fields = exp.hard + exp.soft
    assert names_field(msg, fields), (
        f"{fn_name}: the error {msg!r} names none of the violated fields {fields}")
    mem.check_untouched()
    CHILD_LOG.append((fn_name, f"{kind}-refused"))
    return f"{kind}-refused"


def make_ctx(threads):
    ctx = L.qg_context_p()
    L.qg_context_create(L.Backend.QG_BACKEND_CPU, 0, ctypes.byref(ctx))
    L.qg_context_set_option(ctx, b"cpu_threads", threads)
    # the result bounds here are the fp32-exact path's (tests/test_cpu_int8*.py: int8)
    L.qg_context_set_option(ctx, b"cpu_precision", FP32_EXACT)
    return ctx


def run_case(fn_name, builder, spec):
    """Runs one case in the worker child; counts every call it made here."""
    outcome, calls = WORKER.run(builder.__name__, spec)
    for name, label in calls:
        COUNTS[name][label] += 1
    if not calls:  # a case checked without drive()
        COUNTS[fn_name][outcome] += 1


def rng_of(spec):
    return np.random.default_rng(spec["seed"])


seeds = st.integers(0, 2 ** 63 - 1)
THREADS = st.sampled_from([0, 1, 2, 3, 5])
N_MUTATIONS = st.sampled_from([0, 0, 0, 1, 1, 2, 3])
LD_PAD = st.sampled_from([0, 0, 1, 8, 13])
ALIGNED = st.sampled_from(["ok", "ok", "ok", "shift"])  # valid pointer placements
M_VALUES = st.sampled_from([1, 2, 3, 5, 8, 16, 17, 33, 257])


def ptr_mutation(draw, spec, names):
    name = draw(st.sampled_from(names))
    spec["ptr"][name] = draw(st.sampled_from(["null", "mis"]))


def args_mutation(draw, spec):
    what = draw(st.sampled_from(["null", "size", "ctx"]))
    if what == "null":
        spec["args_mode"] = "null"
    elif what == "ctx":
        spec["ctx_null"] = True
    else:
        spec["size_delta"] = draw(st.sampled_from(["zero", -8, -1, 8, "max"]))


def struct_size(struct_type, delta):
    size = ctypes.sizeof(struct_type)
    if delta == "zero":
        return 0
    if delta == "max":
        return 2 ** 64 - 1
    return size + delta


# Sizes of the first version of the structs that have grown (include/quantgemm.h: argument
# structs only grow; a caller built against the first version passes its size).
FIRST_SIZE = {L.qg_w4a16_gemm_args: 128}


def common_expect(exp, spec, struct_type):
    exp.bad(spec["ctx_null"], "ctx")
    exp.bad(spec["args_mode"] == "null", "args")
    size = struct_size(struct_type, spec["size_delta"])
    first = FIRST_SIZE.get(struct_type, ctypes.sizeof(struct_type))
    exp.bad(size < ctypes.sizeof(struct_type) and size != first, "size")
    exp.open(size > ctypes.sizeof(struct_type), "size")
    return size


def base_spec(draw):
    return dict(seed=draw(seeds), threads=draw(THREADS), ptr={}, args_mode="ok",
                size_delta=0, ctx_null=False)


def force_fault_next_to_huge(spec, exp, huge_fields, fault):
    """A huge dimension is only safe next to a fault the library must refuse anyway
    (otherwise it would, correctly, read the huge extent from our tiny buffers)."""
    if huge_fields and not (set(exp.hard) - set(huge_fields)):
        fault(spec)
        return True
    return False


# ================================================================ W4A16

@st.composite
def w4a16_specs(draw):
    s = base_spec(draw)
    G = draw(st.sampled_from([32, 64, 128]))
    x_dtype = draw(st.sampled_from([F16, BF16]))
    s.update(m=draw(M_VALUES), n=8 * draw(st.integers(1, 6)), k=G * draw(st.integers(1, 4)), G=G,
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])),
             scale_dtype=draw(st.sampled_from([F16, BF16])), zero_dtype=U4X8,
             ldx_pad=draw(LD_PAD), ldy_pad=draw(LD_PAD), huge=[])
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "qweight", "scales", "y")}
    s["ptr"]["qzeros"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))  # NULL = symmetric
    s["ldx"], s["ldy"] = s["k"] + s["ldx_pad"], s["n"] + s["ldy_pad"]
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "G", "x_dtype", "y_dtype", "scale_dtype",
                                     "zero_dtype", "ldx", "ldy", "ptr", "args", "huge", "layout"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "layout":
            # not a qg_w4a16_layout value (1 = frag is valid, but these buffers are canonical)
            s["layout"] = draw(st.sampled_from([2, -1, 7, 2 ** 31 - 1]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -8, 1, 4, 12, 7]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -G, G // 2, G + 8, 8]))
        elif what == "G":
            s["G"] = draw(st.sampled_from([0, -32, 8, 16, 48, 96, 256, 2 ** 31 - 1]))
        elif what in ("x_dtype", "scale_dtype"):
            s[what] = draw(st.sampled_from([F32, I32, U8, U4X8, *NOT_ENUM]))
        elif what == "y_dtype":
            other = BF16 if s["x_dtype"] == F16 else F16
            s[what] = draw(st.sampled_from([other, I32, U8, U4X8, *NOT_ENUM]))
        elif what == "zero_dtype":
            s[what] = draw(st.sampled_from([F16, BF16, F32, I32, U8, *NOT_ENUM]))
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["k"] - 1, 0, -1, s["k"] // 2, -2 ** 63]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["n"] - 1, 0, -1, s["n"] // 2, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "qweight", "scales", "qzeros", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 128
            s["huge"].append(f)
    exp = w4a16_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def w4a16_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_w4a16_gemm_args)
    m, n, k, G = s["m"], s["n"], s["k"], s["G"]
    exp.bad(m < 0, "m")
    exp.bad(n < 0, "n")
    exp.bad(k < 0, "k")
    exp.open(n == 0, "n")
    exp.open(k == 0, "k")
    exp.bad(G not in (32, 64, 128), "group_size")
    exp.bad(G in (32, 64, 128) and k % G != 0, "k", "group_size")
    exp.bad(n % 8 != 0, "n")
    exp.bad(s["x_dtype"] not in (F16, BF16), "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    exp.bad(s["scale_dtype"] not in (F16, BF16), "scale_dtype")
    exp.bad(s["ptr"]["qzeros"] != "null" and s["zero_dtype"] != U4X8, "zero_dtype")
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    # a first-version struct (size 128) has no layout field: canonical whatever it holds
    first_version = struct_size(L.qg_w4a16_gemm_args, s["size_delta"]) == FIRST_SIZE[L.qg_w4a16_gemm_args]
    exp.bad(s.get("layout", 0) != 0 and not first_version, "layout")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "qweight", "scales", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        exp.bad(s["ptr"]["qzeros"] == "mis", "qzeros")
    if m == 0 and not (exp.hard and ("ctx" in exp.hard or "args" in exp.hard or "size" in exp.hard)):
        # empty problem: QG_OK at once is allowed even next to other faults
        exp.soft.extend(exp.hard)
        exp.hard.clear()
        exp.open(True, "m")
    return exp


def w4a16_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = w4a16_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy"))
    m, n, k, G = s["m"], s["n"], s["k"], s["G"]
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k))
    aG = G if G in (32, 64, 128) else 32
    ldx, ldy = (s["ldx"], s["ldy"]) if sane else (small(s["ldx"]), small(s["ldy"]))
    groups = -(-ak // aG)
    xdt = s["x_dtype"] if s["x_dtype"] in (F16, BF16) else F16
    sdt = s["scale_dtype"] if s["scale_dtype"] in (F16, BF16) else F16
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    qweight = rng.integers(0, 2 ** 32, size=(an, -(-ak // 8)), dtype=np.uint32).view(np.int32)
    sign = rng.choice([-1.0, 1.0], size=(an, groups))
    scales = (sign * rng.uniform(0.005, 0.02, size=(an, groups))).astype(NP_DTYPE[sdt])
    qzeros = rng.integers(0, 2 ** 32, size=(-(-an // 8), groups), dtype=np.uint32).view(np.int32)
    ptr = s["ptr"]
    a = L.qg_w4a16_gemm_args(
        m=m, n=n, k=k, group_size=G, x_dtype=s["x_dtype"], y_dtype=s["y_dtype"],
        scale_dtype=s["scale_dtype"], zero_dtype=s["zero_dtype"],
        x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
        qweight=mem.input("qweight", qweight, ptr["qweight"]),
        scales=mem.input("scales", scales, ptr["scales"]),
        qzeros=mem.input("qzeros", qzeros, ptr["qzeros"]), ldy=s["ldy"], layout=s.get("layout", 0))
    y_rows = max(am, 1)
    y_elems = (y_rows - 1) * max(ldy, 0) + max(an, 0)
    a.y = mem.output("y", y_elems * DTYPE_BYTES[ydt], ptr["y"])
    size = struct_size(L.qg_w4a16_gemm_args, s["size_delta"])
    pa = args_pointer(mem, a, s["args_mode"], size)
    ctx = None if s["ctx_null"] else env.ctx(s["threads"])
    workspace_step(env, mem, "qg_w4a16_gemm_workspace_size", L.qg_w4a16_gemm_workspace_size, ctx, pa, a,
                   w4a16_expect(s, pointers=False))

    def verify():
        if m == 0 or n <= 0:
            mem.check_untouched(WORKSPACE_FREE)
            return
        idx = matrix_index(m, n, ldy)
        mem.check_untouched({"y": elem_mask(y_elems * DTYPE_BYTES[ydt], idx, DTYPE_BYTES[ydt]),
                             **WORKSPACE_FREE})
        y = mem.payload("y", NP_DTYPE[ydt])[idx].reshape(m, n)
        w = int4.dequantize(qweight, scales, None if ptr["qzeros"] == "null" else qzeros, G)
        assert_close("y", y, reference.gemm(x_dense, w), ydt, reference.gemm(np.abs(x_dense), np.abs(w)), k)
    return drive("qg_w4a16_gemm", lambda: call(L.qg_w4a16_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(900), **FUZZ_SETTINGS)
@given(w4a16_specs())
def test_fuzz_w4a16_gemm(spec):
    run_case("qg_w4a16_gemm", w4a16_case, spec)


# ================================================================ GGUF

@st.composite
def gguf_specs(draw):
    s = base_spec(draw)
    fmt = draw(st.sampled_from(sorted(GGUF_SPECS)))
    fs = GGUF_SPECS[fmt]
    x_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    k = fs.block_elems * draw(st.integers(1, 2 if fs.block_elems == 256 else 4))
    row = k // fs.block_elems * fs.block_bytes
    s.update(format=fmt, m=draw(M_VALUES), n=draw(st.integers(1, 40)), k=k,
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])), huge=[])
    s["ldx"] = k + draw(LD_PAD)
    s["ldy"] = s["n"] + draw(LD_PAD)
    s["ldw"] = row + draw(st.sampled_from([0, 0, 2, 6, 64]))
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "w", "y")}
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "format", "x_dtype", "y_dtype", "ldx", "ldy",
                                     "ldw", "ptr", "args", "huge"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -32, 16, k + 32, k + 8]))
        elif what == "format":
            s["format"] = draw(st.sampled_from([0, 7, *NOT_ENUM]))
        elif what == "x_dtype":
            s["x_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "y_dtype":
            s["y_dtype"] = draw(st.sampled_from([d for d in FLOAT_DTYPES if d not in (x_dtype, F32)]
                                                + [I32, U8, *NOT_ENUM]))
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["k"] - 1, 0, -1, -2 ** 63]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["n"] - 1, 0, -1, -2 ** 63]))
        elif what == "ldw":
            s["ldw"] = draw(st.sampled_from([row - 2, row + 1, row + 3, 0, -2, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "w", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy", "ldw"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 256
            if f == "ldw":
                s["ldw"] -= s["ldw"] % 2
            s["huge"].append(f)
    exp = gguf_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def gguf_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_gguf_gemm_args)
    m, n, k = s["m"], s["n"], s["k"]
    fs = GGUF_SPECS.get(s["format"])
    exp.bad(fs is None, "format")
    exp.bad(m < 0, "m")
    exp.bad(n < 0, "n")
    exp.bad(k < 0, "k")
    exp.open(n == 0, "n")
    exp.open(k == 0, "k")
    if fs is not None:
        exp.bad(k % fs.block_elems != 0, "k")
        exp.bad(s["ldw"] < max(k, 0) // fs.block_elems * fs.block_bytes, "ldw")
    exp.open(s["ldw"] % 2 != 0, "ldw")  # the header does not ask for even row strides
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        exp.bad(s["ptr"]["w"] == "null", "w")
        exp.open(s["ptr"]["w"] == "mis", "w")  # byte rows: the header asks no alignment
    if m == 0 and not (set(exp.hard) & {"ctx", "args", "size"}):
        exp.soft.extend(exp.hard)
        exp.hard.clear()
        exp.open(True, "m")
    return exp


def gguf_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = gguf_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy", "ldw"))
    m, n, k = s["m"], s["n"], s["k"]
    fs = GGUF_SPECS.get(s["format"], GGUF_SPECS[1])
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k, 256))
    ldx, ldy, ldw = (s["ldx"], s["ldy"], s["ldw"]) if sane else (
        small(s["ldx"]), small(s["ldy"]), small(s["ldw"], 1024))
    nb = -(-ak // fs.block_elems)
    row = nb * fs.block_bytes
    raw = (fs.module.random_blocks(rng, max(an, 1), nb * fs.block_elems, d_range=(1e-3, 1e-2))[:an]
           if nb else np.zeros((an, 0), np.uint8))
    w_extent = max((an - 1) * ldw + row, 0) if an else 0
    w_flat = rng.integers(0, 256, size=w_extent, dtype=np.uint8)
    if ldw >= row:
        for i in range(an):
            w_flat[i * ldw:i * ldw + row] = raw[i]
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    ptr = s["ptr"]
    a = L.qg_gguf_gemm_args(format=s["format"], m=m, n=n, k=k, x_dtype=s["x_dtype"],
                            y_dtype=s["y_dtype"], x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
                            w=mem.input("w", w_flat, ptr["w"]), ldw=s["ldw"], ldy=s["ldy"])
    y_elems = (max(am, 1) - 1) * max(ldy, 0) + max(an, 0)
    a.y = mem.output("y", y_elems * DTYPE_BYTES[ydt], ptr["y"])
    pa = args_pointer(mem, a, s["args_mode"], struct_size(L.qg_gguf_gemm_args, s["size_delta"]))
    ctx = None if s["ctx_null"] else env.ctx(s["threads"])
    workspace_step(env, mem, "qg_gguf_gemm_workspace_size", L.qg_gguf_gemm_workspace_size, ctx, pa, a,
                   gguf_expect(s, pointers=False))

    def verify():
        if m == 0 or n <= 0:
            mem.check_untouched(WORKSPACE_FREE)
            return
        idx = matrix_index(m, n, ldy)
        mem.check_untouched({"y": elem_mask(y_elems * DTYPE_BYTES[ydt], idx, DTYPE_BYTES[ydt]),
                             **WORKSPACE_FREE})
        y = mem.payload("y", NP_DTYPE[ydt])[idx].reshape(m, n)
        w = fs.module.dequantize(np.ascontiguousarray(raw))
        ref = reference.gemm(x_dense, w)
        if isinstance(env, GpuEnv):
            # the GPU's default (int8) tier quantizes x per 32 elements: held to the exact
            # product within that quantization's rigorous bound (pyquant.formats.int8_act)
            # plus the fp32 terms of assert_close
            xq = np.ascontiguousarray(x_dense)
            bound = (int8_act.exact_error_bound(xq, fs.name, np.ascontiguousarray(raw))
                     + 2 * UNIT_ROUNDOFF[ydt] * np.abs(ref)
                     + 4 * k * U32 * reference.gemm(np.abs(x_dense), np.abs(w)))
            err = np.abs(y.astype(np.float64) - ref)
            i = np.unravel_index(np.argmax(err - bound), err.shape)
            assert np.all(err <= bound), (f"y ({fs.name}, GPU): at {tuple(int(v) for v in i)} got {y[i]!r}, "
                                          f"reference {ref[i]!r}, bound {bound[i]:.3g}")
            return
        assert_close(f"y ({fs.name})", y, ref, ydt, reference.gemm(np.abs(x_dense), np.abs(w)), k)
    return drive("qg_gguf_gemm", lambda: call(L.qg_gguf_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(900), **FUZZ_SETTINGS)
@given(gguf_specs())
def test_fuzz_gguf_gemm(spec):
    run_case("qg_gguf_gemm", gguf_case, spec)


# ================================================================ MXFP4 dense

def mxfp4_weight(rng, rows, k):
    """Random OCP blocks [rows, k/32, 16] and E8M0 scales around 2^0 (finite)."""
    nb = max(k, 0) // 32
    blocks = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    scales = rng.integers(120, 129, size=(rows, nb), dtype=np.uint8)
    return blocks, scales


@st.composite
def mxfp4_specs(draw):
    s = base_spec(draw)
    x_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    s.update(m=draw(M_VALUES), n=draw(st.integers(1, 40)), k=32 * draw(st.integers(1, 8)),
             x_dtype=x_dtype, y_dtype=draw(st.sampled_from([x_dtype, F32])),
             bias_dtype=draw(st.sampled_from(FLOAT_DTYPES)), huge=[])
    s["ldx"] = s["k"] + draw(LD_PAD)
    s["ldy"] = s["n"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "blocks", "scales", "y")}
    s["ptr"]["bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))  # NULL = no bias
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["m", "n", "k", "x_dtype", "y_dtype", "bias_dtype", "ldx",
                                     "ldy", "ptr", "args", "huge"]))
        if what == "m":
            s["m"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "n":
            s["n"] = draw(st.sampled_from([0, -1, -2 ** 63]))
        elif what == "k":
            s["k"] = draw(st.sampled_from([0, -32, 16, s["k"] + 8, 33]))
        elif what == "x_dtype":
            s["x_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "y_dtype":
            s["y_dtype"] = draw(st.sampled_from([d for d in FLOAT_DTYPES if d not in (x_dtype, F32)]
                                                + [I32, U8, *NOT_ENUM]))
        elif what == "bias_dtype":
            s["bias_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["k"] - 1, 0, -1, -2 ** 63]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["n"] - 1, 0, -1, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, ["x", "blocks", "scales", "bias", "y"])
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["m", "n", "k", "ldx", "ldy"]))
            s[f] = draw(st.sampled_from(HUGE))
            if f == "k":
                s["k"] -= s["k"] % 32
            s["huge"].append(f)
    exp = mxfp4_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def mxfp4_expect(s, pointers=True):
    exp = Expect()
    common_expect(exp, s, L.qg_mxfp4_gemm_args)
    m, n, k = s["m"], s["n"], s["k"]
    exp.bad(m < 0, "m")
    exp.bad(n < 0, "n")
    exp.bad(k < 0, "k")
    exp.open(n == 0, "n")
    exp.open(k == 0, "k")
    exp.bad(k % 32 != 0, "k")
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["y_dtype"] not in (s["x_dtype"], F32), "y_dtype")
    has_bias = s["ptr"]["bias"] != "null"
    exp.bad(has_bias and s["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    exp.bad(s["ldx"] < k, "ldx")
    exp.bad(s["ldy"] < n, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    if pointers:
        for p in ("x", "y"):
            exp.bad(s["ptr"][p] in ("null", "mis"), p)
        exp.bad(s["ptr"]["bias"] == "mis", "bias")
        for p in ("blocks", "scales"):
            exp.bad(s["ptr"][p] == "null", p)
            exp.open(s["ptr"][p] == "mis", p)  # byte arrays
    if m == 0 and not (set(exp.hard) & {"ctx", "args", "size"}):
        exp.soft.extend(exp.hard)
        exp.hard.clear()
        exp.open(True, "m")
    return exp


def mxfp4_case(s, env=CPU_ENV):
    rng, mem = rng_of(s), env.mem(rng_of(s))
    exp = mxfp4_expect(s)
    sane = is_sane(exp, s, ("m", "n", "k", "ldx", "ldy"))
    m, n, k = s["m"], s["n"], s["k"]
    am, an, ak = (m, n, k) if sane else (small(m), small(n), small(k, 256))
    ldx, ldy = (s["ldx"], s["ldy"]) if sane else (small(s["ldx"]), small(s["ldy"]))
    blocks, scales = mxfp4_weight(rng, an, ak)
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    bdt = s["bias_dtype"] if s["bias_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, am, ak, ldx, xdt)
    bias = rng.standard_normal(an).astype(NP_DTYPE[bdt])
    ptr = s["ptr"]
    a = L.qg_mxfp4_gemm_args(m=m, n=n, k=k, x_dtype=s["x_dtype"], y_dtype=s["y_dtype"],
                             x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
                             blocks=mem.input("blocks", blocks, ptr["blocks"]),
                             scales=mem.input("scales", scales, ptr["scales"]),
                             bias=mem.input("bias", bias, ptr["bias"]), bias_dtype=s["bias_dtype"],
                             ldy=s["ldy"])
    y_elems = (max(am, 1) - 1) * max(ldy, 0) + max(an, 0)
    a.y = mem.output("y", y_elems * DTYPE_BYTES[ydt], ptr["y"])
    pa = args_pointer(mem, a, s["args_mode"], struct_size(L.qg_mxfp4_gemm_args, s["size_delta"]))
    ctx = None if s["ctx_null"] else env.ctx(s["threads"])
    workspace_step(env, mem, "qg_mxfp4_gemm_workspace_size", L.qg_mxfp4_gemm_workspace_size, ctx, pa, a,
                   mxfp4_expect(s, pointers=False))

    def verify():
        if m == 0 or n <= 0:
            mem.check_untouched(WORKSPACE_FREE)
            return
        idx = matrix_index(m, n, ldy)
        mem.check_untouched({"y": elem_mask(y_elems * DTYPE_BYTES[ydt], idx, DTYPE_BYTES[ydt]),
                             **WORKSPACE_FREE})
        y = mem.payload("y", NP_DTYPE[ydt])[idx].reshape(m, n)
        # a pointer at +1 still points at our payload (the byte before it is slack)
        w = mxfp4.dequantize(blocks, scales)
        b = None if ptr["bias"] == "null" else bias
        ref = reference.gemm(x_dense, w, b)
        abs_ref = reference.gemm(np.abs(x_dense), np.abs(w), None if b is None else np.abs(b.astype(np.float64)))
        assert_close("y", y, ref, ydt, abs_ref, k)
    return drive("qg_mxfp4_gemm", lambda: call(L.qg_mxfp4_gemm, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(700), **FUZZ_SETTINGS)
@given(mxfp4_specs())
def test_fuzz_mxfp4_gemm(spec):
    run_case("qg_mxfp4_gemm", mxfp4_case, spec)


# ================================================================ MoE

def routing_expect(exp, s):
    T, top_k, E, tile_m = s["T"], s["top_k"], s["E"], s["tile_m"]
    exp.bad(T < 0, "num_tokens")
    exp.bad(E < 1, "num_experts")
    exp.bad(top_k < 1, "top_k")
    exp.open(top_k > E, "top_k", "num_experts")  # distinct experts per token: not in the header
    exp.bad(tile_m not in (16, 32, 64), "tile_m")


def topk_ids_for(rng, T, top_k, E):
    ids = np.zeros((T, top_k), np.int32)
    for t in range(T):
        ids[t] = rng.permutation(max(E, top_k))[:top_k] % max(E, 1)
    return ids


@st.composite
def moe_base(draw):
    s = base_spec(draw)
    E = draw(st.integers(1, 6))
    s.update(T=draw(st.sampled_from([1, 2, 3, 5, 8, 12])), E=E,
             top_k=draw(st.integers(1, min(E, 4))), tile_m=draw(st.sampled_from([16, 32, 64])),
             huge=[], corrupt=None)
    return s


def routing_mutation(draw, s):
    what = draw(st.sampled_from(["T", "E", "top_k", "tile_m"]))
    if what == "T":
        s["T"] = draw(st.sampled_from([0, -1, -2 ** 63]))
    elif what == "E":
        s["E"] = draw(st.sampled_from([0, -1, -2 ** 31]))
    elif what == "top_k":
        s["top_k"] = draw(st.sampled_from([0, -1, s["E"] + 1]))
    else:
        s["tile_m"] = draw(st.sampled_from([0, 8, 48, 128, -16, 2 ** 31 - 1]))


def empty_tokens(exp, s):
    if s["T"] == 0 and not (set(exp.hard) & {"ctx", "args", "size"}):
        exp.soft.extend(exp.hard)
        exp.hard.clear()
        exp.open(True, "num_tokens")


@st.composite
def align_specs(draw):
    s = draw(moe_base())
    s["ptr"] = {p: draw(ALIGNED) for p in ("topk_ids", "sorted_ids", "tile_experts", "num_sorted")}
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "ids", "ptr", "args", "huge"]))
        if what == "routing":
            routing_mutation(draw, s)
        elif what == "ids":
            s["corrupt"] = draw(st.sampled_from([-1, "E", 2 ** 31 - 1, -2 ** 31]))
        elif what == "ptr":
            ptr_mutation(draw, s, list(s["ptr"]))
        elif what == "args":
            args_mutation(draw, s)
        else:
            s["T"] = draw(st.sampled_from(HUGE_TOKENS))
            s["huge"].append("num_tokens")
    exp = align_expect(s)
    force_fault_next_to_huge(s, exp, ["num_tokens"] if s["huge"] else [],
                             lambda s: s.update(tile_m=7))
    return s


def align_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_align_args)
    routing_expect(exp, s)
    exp.bad(s["corrupt"] is not None, "topk_ids")
    exp.open(bool(s["huge"]), "num_tokens", "top_k", *SIZE_FIELDS)
    for p, mode in s["ptr"].items():
        exp.bad(mode in ("null", "mis"), p)
    empty_tokens(exp, s)
    return exp


def align_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = align_expect(s)
    sane = is_sane(exp, s, ("T", "top_k", "E"))
    T, top_k, E, tile_m = s["T"], s["top_k"], s["E"], s["tile_m"]
    aT, ak, aE = (T, max(top_k, 1), max(E, 1)) if sane else (small(T, 12), small(top_k, 6), max(small(E, 6), 1))
    ids = topk_ids_for(rng, aT, ak, aE)
    if s["corrupt"] is not None and ids.size:
        bad = E if s["corrupt"] == "E" else s["corrupt"]
        ids.reshape(-1)[rng.integers(ids.size)] = np.array(bad).astype(np.int32)
    at = tile_m if tile_m in (16, 32, 64) else 16
    max_sorted, max_tiles = reference.moe_align_sizes(aT, ak, aE, at)
    ptr = s["ptr"]
    a = L.qg_moe_align_args(num_tokens=T, top_k=top_k, num_experts=E, tile_m=tile_m,
                            topk_ids=mem.input("topk_ids", ids, ptr["topk_ids"]),
                            sorted_ids=mem.output("sorted_ids", 4 * max_sorted, ptr["sorted_ids"]),
                            tile_experts=mem.output("tile_experts", 4 * max_tiles, ptr["tile_experts"]),
                            num_sorted=mem.output("num_sorted", 4, ptr["num_sorted"]))
    pa = args_pointer(mem, a, s["args_mode"], struct_size(L.qg_moe_align_args, s["size_delta"]))
    ctx = None if s["ctx_null"] else make_ctx(s["threads"])

    def verify():
        if T == 0:
            mem.check_untouched()
            return
        mem.check_untouched({"sorted_ids": np.ones(4 * max_sorted, bool),
                             "tile_experts": np.ones(4 * max_tiles, bool),
                             "num_sorted": np.ones(4, bool)})
        ref_sorted, ref_tiles, ref_num = reference.moe_align(ids, E, tile_m)
        num = int(mem.payload("num_sorted", np.int32)[0])
        assert num == ref_num, f"num_sorted={num}, reference {ref_num}"
        tiles = mem.payload("tile_experts", np.int32)
        assert np.array_equal(tiles, ref_tiles), f"tile_experts {tiles} != reference {ref_tiles}"
        got = mem.payload("sorted_ids", np.int32)[:num]
        # within one expert the order of pairs is not part of the contract: compare sets
        for e in range(E):
            sl = np.repeat(ref_tiles[:num // tile_m] == e, tile_m)
            assert sorted(got[sl]) == sorted(ref_sorted[:num][sl]), (
                f"expert {e}: sorted_ids {sorted(got[sl])} != reference {sorted(ref_sorted[:num][sl])}")
    return drive("qg_moe_align", lambda: call(L.qg_moe_align, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(500), **FUZZ_SETTINGS)
@given(align_specs())
def test_fuzz_moe_align(spec):
    run_case("qg_moe_align", align_case, spec)


@st.composite
def align_sizes_specs(draw):
    s = draw(moe_base())
    s.update(ms="ok", mt="ok")
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "ms", "mt"]))
        if what == "routing":
            routing_mutation(draw, s)
        else:
            s[what] = "null"
    return s


def align_sizes_case(s):
    mem = Mem(rng_of(s))
    exp = Expect()
    routing_expect(exp, s)
    exp.bad(s["ms"] == "null", "max_sorted")
    exp.bad(s["mt"] == "null", "max_tiles")
    ms = mem.output("max_sorted", 8, s["ms"])
    mt = mem.output("max_tiles", 8, s["mt"])
    i64p = ctypes.POINTER(ctypes.c_int64)

    def verify():
        mem.check_untouched({"max_sorted": np.ones(8, bool), "max_tiles": np.ones(8, bool)})
        want = reference.moe_align_sizes(s["T"], s["top_k"], s["E"], s["tile_m"])
        got = (int(mem.payload("max_sorted", np.int64)[0]), int(mem.payload("max_tiles", np.int64)[0]))
        assert got == want, f"qg_moe_align_sizes gave {got}, reference {want}"
    return drive("qg_moe_align_sizes",
                 lambda: call(L.qg_moe_align_sizes, s["T"], s["top_k"], s["E"], s["tile_m"],
                              ctypes.cast(ms, i64p), ctypes.cast(mt, i64p)), exp, mem, verify)


@settings(max_examples=examples(250), **FUZZ_SETTINGS)
@given(align_sizes_specs())
def test_fuzz_moe_align_sizes(spec):
    run_case("qg_moe_align_sizes", align_sizes_case, spec)


def routing_tables(rng, s, aT, ak, aE, at):
    """Routing of random distinct experts per token by the reference align, padded to
    the qg_moe_align_sizes extents, with the corruption of s["corrupt"] applied."""
    ids = topk_ids_for(rng, aT, ak, aE)
    sorted_ids, tile_experts, num = reference.moe_align(ids, aE, at)
    sorted_ids, tile_experts = sorted_ids.copy(), tile_experts.copy()
    c = s["corrupt"]
    if c is not None:
        kind, value = c
        if kind == "num_sorted":
            num = {"neg": -at, "odd": num + 1 if num % at == 0 else num, "big": len(sorted_ids) + at,
                   "max": 2 ** 31 - 1}[value]
        elif kind == "sorted_ids" and num > 0:
            sorted_ids[rng.integers(num)] = {"neg": -1, "big": aT * ak + 1, "max": 2 ** 31 - 1}[value]
        elif kind == "tile_experts" and num > 0:
            tile_experts[rng.integers(num // at)] = {"neg": -2, "big": aE, "max": 2 ** 31 - 1}[value]
    return ids, sorted_ids, tile_experts, np.array([num], np.int32)


def routing_corrupt(draw, s):
    kind = draw(st.sampled_from(["num_sorted", "sorted_ids", "tile_experts"]))
    values = ["neg", "odd", "big", "max"] if kind == "num_sorted" else ["neg", "big", "max"]
    s["corrupt"] = (kind, draw(st.sampled_from(values)))


def routing_corrupt_expect(exp, s):
    if s["corrupt"] is not None:
        exp.bad(True, s["corrupt"][0])


def activation_ref(act, gate, up, alpha, limit):
    if act == 1:
        return reference.swiglu_oai(gate, up, alpha=alpha, limit=limit)
    return reference.silu_glu(gate, up)


@st.composite
def stage1_specs(draw):
    s = draw(moe_base())
    x_dtype = draw(st.sampled_from(FLOAT_DTYPES))
    s.update(H=32 * draw(st.integers(1, 3)), I=32 * draw(st.integers(1, 2)), x_dtype=x_dtype,
             bias_dtype=draw(st.sampled_from(FLOAT_DTYPES)), activation=draw(st.sampled_from([0, 1])),
             layout=draw(st.sampled_from([0, 1])),
             alpha=draw(st.sampled_from([1.702, 1.0, 0.25])), limit=draw(st.sampled_from([7.0, 1.5, 100.0])))
    s["ldx"] = s["H"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("x", "sorted_ids", "tile_experts", "num_sorted", "w13_blocks",
                                  "w13_scales", "act")}
    s["ptr"]["w13_bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "corrupt", "H", "I", "x_dtype", "bias_dtype", "ldx",
                                     "activation", "layout", "swiglu", "ptr", "args", "huge"]))
        if what == "routing":
            routing_mutation(draw, s)
        elif what == "corrupt":
            routing_corrupt(draw, s)
        elif what == "H":
            s["H"] = draw(st.sampled_from([0, -32, 16, 40]))
        elif what == "I":
            s["I"] = draw(st.sampled_from([0, -32, 16, 40]))
        elif what == "x_dtype":
            s["x_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "bias_dtype":
            s["bias_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "ldx":
            s["ldx"] = draw(st.sampled_from([s["H"] - 1, 0, -1, -2 ** 63]))
        elif what == "activation":
            s["activation"] = draw(st.sampled_from([2, -1, 2 ** 31 - 1]))
        elif what == "layout":
            s["layout"] = draw(st.sampled_from([2, -1, 2 ** 31 - 1]))
        elif what == "swiglu":
            s["activation"] = 1
            s[draw(st.sampled_from(["alpha", "limit"]))] = draw(
                st.sampled_from([math.nan, math.inf, -math.inf, 0.0, -7.0]))
        elif what == "ptr":
            ptr_mutation(draw, s, list(s["ptr"]))
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["T", "H", "I", "ldx"]))
            s[f] = draw(st.sampled_from(HUGE_TOKENS if f == "T" else HUGE))
            if f in ("H", "I"):
                s[f] -= s[f] % 32
            s["huge"].append({"T": "num_tokens", "H": "hidden", "I": "intermediate"}.get(f, f))
    exp = stage1_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(x_dtype=100))
    return s


def stage1_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_stage1_args)
    routing_expect(exp, s)
    routing_corrupt_expect(exp, s)
    H, I = s["H"], s["I"]
    exp.bad(H <= 0, "hidden")
    exp.bad(I < 0, "intermediate")
    exp.open(I == 0, "intermediate")
    exp.bad(H % 32 != 0, "hidden")
    exp.open(I % 32 != 0, "intermediate")  # the header asks it of stage 2 only
    exp.bad(s["x_dtype"] not in FLOAT_DTYPES, "x_dtype")
    exp.bad(s["ldx"] < H, "ldx")
    exp.bad(s["activation"] not in (0, 1), "activation")
    exp.bad(s["layout"] not in (0, 1), "gate_up_layout")
    if s["activation"] == 1:
        exp.open(not math.isfinite(s["alpha"]), "swiglu_alpha")
        exp.open(not (math.isfinite(s["limit"]) and s["limit"] > 0), "swiglu_limit")
    has_bias = s["ptr"]["w13_bias"] != "null"
    exp.bad(has_bias and s["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    for p in ("x", "sorted_ids", "tile_experts", "num_sorted", "act"):
        exp.bad(s["ptr"][p] in ("null", "mis"), p)
    exp.bad(s["ptr"]["w13_bias"] == "mis", "w13_bias")
    for p in ("w13_blocks", "w13_scales"):
        exp.bad(s["ptr"][p] == "null", p)
        exp.open(s["ptr"][p] == "mis", p)
    empty_tokens(exp, s)
    return exp


def moe_dims(s, exp):
    """Sizes to build buffers with: the arguments themselves for calls the library may
    accept (an empty problem may come with E = 0 or a bad tile_m: those are clamped, as
    nothing is read then), small stand-ins otherwise."""
    sane = is_sane(exp, s, ("T", "top_k", "E", "H", "I"))
    T, top_k, E, tile_m, H, I = s["T"], s["top_k"], s["E"], s["tile_m"], s["H"], s["I"]
    tile_m = tile_m if tile_m in (16, 32, 64) else 16
    if sane:
        return T, max(top_k, 1), max(E, 1), tile_m, H, I
    return (small(T, 12), max(small(top_k, 6), 1), max(small(E, 6), 1), tile_m,
            max(small(H, 96), 32), max(small(I, 64), 1))


def stage1_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = stage1_expect(s)
    aT, ak, aE, at, aH, aI = moe_dims(s, exp)
    ldx = s["ldx"] if is_sane(exp, s, ("ldx",)) else small(s["ldx"], 128)
    ids, sorted_ids, tile_experts, num = routing_tables(rng, s, aT, ak, aE, at)
    xdt = s["x_dtype"] if s["x_dtype"] in FLOAT_DTYPES else F32
    bdt = s["bias_dtype"] if s["bias_dtype"] in FLOAT_DTYPES else F32
    x_flat, x_dense = float_input(rng, aT, aH, ldx, xdt)
    hb = -(-aH // 32)
    blocks, scales = mxfp4_weight(rng, aE * 2 * aI, hb * 32)
    bias = rng.standard_normal((aE, 2 * aI)).astype(NP_DTYPE[bdt])
    P = aT * ak
    ptr = s["ptr"]
    a = L.qg_moe_stage1_args(
        num_tokens=s["T"], top_k=s["top_k"], num_experts=s["E"], tile_m=s["tile_m"],
        hidden=s["H"], intermediate=s["I"], x_dtype=s["x_dtype"],
        x=mem.input("x", x_flat, ptr["x"]), ldx=s["ldx"],
        sorted_ids=mem.input("sorted_ids", sorted_ids, ptr["sorted_ids"]),
        tile_experts=mem.input("tile_experts", tile_experts, ptr["tile_experts"]),
        num_sorted=mem.input("num_sorted", num, ptr["num_sorted"]),
        w13_blocks=mem.input("w13_blocks", blocks, ptr["w13_blocks"]),
        w13_scales=mem.input("w13_scales", scales, ptr["w13_scales"]),
        w13_bias=mem.input("w13_bias", bias, ptr["w13_bias"]), bias_dtype=s["bias_dtype"],
        activation=s["activation"], gate_up_layout=s["layout"],
        swiglu_alpha=s["alpha"], swiglu_limit=s["limit"])
    esize = DTYPE_BYTES[xdt]
    a.act = mem.output("act", P * aI * esize, ptr["act"])
    pa = args_pointer(mem, a, s["args_mode"], struct_size(L.qg_moe_stage1_args, s["size_delta"]))
    ctx = None if s["ctx_null"] else make_ctx(s["threads"])

    def verify():
        if s["T"] == 0:
            mem.check_untouched()
            return
        mem.check_untouched({"act": np.ones(P * aI * esize, bool)})
        w13 = mxfp4.dequantize(blocks, scales).reshape(aE, 2 * aI, aH)
        act = mem.payload("act", NP_DTYPE[xdt]).reshape(P, aI)
        ref, sens = np.zeros((P, aI)), np.zeros((P, aI))
        split = (lambda h: (h[:, 0::2], h[:, 1::2])) if s["layout"] == 1 else (lambda h: (h[:, :aI], h[:, aI:]))
        for e in range(aE):
            tok, slot = np.nonzero(ids == e)
            if tok.size == 0:
                continue
            b = None if ptr["w13_bias"] == "null" else bias[e]
            gate, up = split(reference.gemm(x_dense[tok], w13[e], b))
            gabs, uabs = split(reference.gemm(np.abs(x_dense[tok]), np.abs(w13[e]),
                                              None if b is None else np.abs(b.astype(np.float64))))
            ref[tok * ak + slot] = activation_ref(s["activation"], gate, up, s["alpha"], s["limit"])
            # how far an error in gate/up moves the activation: |d act / d up| <= |g| and
            # |d act / d gate| <= 1.1 (|u| + 1) for both SiLU-GLU and SwiGLU-OAI (|alpha| <= 1.702)
            sens[tok * ak + slot] = 1.1 * (np.abs(up) + 1) * gabs + np.abs(gate) * uabs
        # 4 roundings: expf and the division of the activation (a few fp32 ulps) + the store
        assert_close("act", act, ref, xdt, sens, aH, roundings=4)
    return drive("qg_moe_stage1", lambda: call(L.qg_moe_stage1, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(600), **FUZZ_SETTINGS)
@given(stage1_specs())
def test_fuzz_moe_stage1(spec):
    run_case("qg_moe_stage1", stage1_case, spec)


@st.composite
def stage2_specs(draw):
    s = draw(moe_base())
    s.update(H=32 * draw(st.integers(1, 3)), I=32 * draw(st.integers(1, 2)),
             act_dtype=draw(st.sampled_from(FLOAT_DTYPES)), y_dtype=draw(st.sampled_from(FLOAT_DTYPES)),
             bias_dtype=draw(st.sampled_from(FLOAT_DTYPES)))
    s["ldy"] = s["H"] + draw(LD_PAD)
    s["ptr"] = {p: draw(ALIGNED) for p in ("act", "sorted_ids", "tile_experts", "num_sorted", "w2_blocks",
                                  "w2_scales", "topk_weights", "y")}
    s["ptr"]["w2_bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))
    for _ in range(draw(N_MUTATIONS)):
        what = draw(st.sampled_from(["routing", "corrupt", "H", "I", "act_dtype", "y_dtype",
                                     "bias_dtype", "ldy", "ptr", "args", "huge"]))
        if what == "routing":
            routing_mutation(draw, s)
        elif what == "corrupt":
            routing_corrupt(draw, s)
        elif what == "H":
            s["H"] = draw(st.sampled_from([0, -32, 16, 40]))
        elif what == "I":
            s["I"] = draw(st.sampled_from([0, -32, 16, 40]))
        elif what in ("act_dtype", "y_dtype", "bias_dtype"):
            s[what] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))
        elif what == "ldy":
            s["ldy"] = draw(st.sampled_from([s["H"] - 1, 0, -1, -2 ** 63]))
        elif what == "ptr":
            ptr_mutation(draw, s, list(s["ptr"]))
        elif what == "args":
            args_mutation(draw, s)
        else:
            f = draw(st.sampled_from(["T", "H", "I", "ldy"]))
            s[f] = draw(st.sampled_from(HUGE_TOKENS if f == "T" else HUGE))
            if f in ("H", "I"):
                s[f] -= s[f] % 32
            s["huge"].append({"T": "num_tokens", "H": "hidden", "I": "intermediate"}.get(f, f))
    exp = stage2_expect(s)
    force_fault_next_to_huge(s, exp, s["huge"], lambda s: s.update(act_dtype=100))
    return s


def stage2_expect(s):
    exp = Expect()
    common_expect(exp, s, L.qg_moe_stage2_args)
    routing_expect(exp, s)
    routing_corrupt_expect(exp, s)
    H, I = s["H"], s["I"]
    exp.bad(H < 0, "hidden")
    exp.open(H == 0, "hidden")
    exp.bad(I <= 0, "intermediate")
    exp.open(H % 32 != 0, "hidden")  # the header asks it of stage 1 only
    exp.bad(I % 32 != 0, "intermediate")
    for f in ("act_dtype", "y_dtype"):
        exp.bad(s[f] not in FLOAT_DTYPES, f)
    has_bias = s["ptr"]["w2_bias"] != "null"
    exp.bad(has_bias and s["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    exp.bad(s["ldy"] < H, "ldy")
    exp.open(bool(s["huge"]), *s["huge"], *SIZE_FIELDS)
    for p in ("act", "sorted_ids", "tile_experts", "num_sorted", "topk_weights", "y"):
        exp.bad(s["ptr"][p] in ("null", "mis"), p)
    exp.bad(s["ptr"]["w2_bias"] == "mis", "w2_bias")
    for p in ("w2_blocks", "w2_scales"):
        exp.bad(s["ptr"][p] == "null", p)
        exp.open(s["ptr"][p] == "mis", p)
    empty_tokens(exp, s)
    return exp


def stage2_case(s):
    rng, mem = rng_of(s), Mem(rng_of(s))
    exp = stage2_expect(s)
    aT, ak, aE, at, aH, aI = moe_dims(s, exp)
    aI = -(-aI // 32) * 32
    ldy = s["ldy"] if is_sane(exp, s, ("ldy",)) else small(s["ldy"], 128)
    ids, sorted_ids, tile_experts, num = routing_tables(rng, s, aT, ak, aE, at)
    adt = s["act_dtype"] if s["act_dtype"] in FLOAT_DTYPES else F32
    ydt = s["y_dtype"] if s["y_dtype"] in FLOAT_DTYPES else F32
    bdt = s["bias_dtype"] if s["bias_dtype"] in FLOAT_DTYPES else F32
    P = aT * ak
    act = rng.standard_normal((P, aI)).astype(NP_DTYPE[adt])
    blocks, scales = mxfp4_weight(rng, aE * aH, aI)
    bias = rng.standard_normal((aE, aH)).astype(NP_DTYPE[bdt])
    weights = rng.uniform(0.0, 1.0, size=(aT, ak)).astype(np.float32)
    ptr = s["ptr"]
    a = L.qg_moe_stage2_args(
        num_tokens=s["T"], top_k=s["top_k"], num_experts=s["E"], tile_m=s["tile_m"],
        hidden=s["H"], intermediate=s["I"], act_dtype=s["act_dtype"],
        act=mem.input("act", act, ptr["act"]),
        sorted_ids=mem.input("sorted_ids", sorted_ids, ptr["sorted_ids"]),
        tile_experts=mem.input("tile_experts", tile_experts, ptr["tile_experts"]),
        num_sorted=mem.input("num_sorted", num, ptr["num_sorted"]),
        w2_blocks=mem.input("w2_blocks", blocks, ptr["w2_blocks"]),
        w2_scales=mem.input("w2_scales", scales, ptr["w2_scales"]),
        w2_bias=mem.input("w2_bias", bias, ptr["w2_bias"]), bias_dtype=s["bias_dtype"],
        topk_weights=mem.input("topk_weights", weights, ptr["topk_weights"]),
        y_dtype=s["y_dtype"], ldy=s["ldy"])
    y_elems = (max(aT, 1) - 1) * max(ldy, 0) + aH
    a.y = mem.output("y", y_elems * DTYPE_BYTES[ydt], ptr["y"])
    pa = args_pointer(mem, a, s["args_mode"], struct_size(L.qg_moe_stage2_args, s["size_delta"]))
    ctx = None if s["ctx_null"] else make_ctx(s["threads"])

    def verify():
        T, H = s["T"], s["H"]
        if T == 0 or H <= 0:
            mem.check_untouched()
            return
        idx = matrix_index(T, H, ldy)
        mem.check_untouched({"y": elem_mask(y_elems * DTYPE_BYTES[ydt], idx, DTYPE_BYTES[ydt])})
        y = mem.payload("y", NP_DTYPE[ydt])[idx].reshape(T, H)
        w2 = mxfp4.dequantize(blocks, scales).reshape(aE, aH, aI)
        ref, abs_ref = np.zeros((T, H)), np.zeros((T, H))
        a64 = act.astype(np.float64)
        for t in range(T):
            for j in range(ak):
                e = ids[t, j]
                w_e = w2[e].astype(np.float64)
                out = a64[t * ak + j] @ w_e.T
                mag = np.abs(a64[t * ak + j]) @ np.abs(w_e).T
                if ptr["w2_bias"] != "null":
                    out = out + bias[e].astype(np.float64)
                    mag = mag + np.abs(bias[e].astype(np.float64))
                ref[t] += float(weights[t, j]) * out
                abs_ref[t] += abs(float(weights[t, j])) * mag
        assert_close("y", y, ref, ydt, abs_ref, aI + ak)
    return drive("qg_moe_stage2", lambda: call(L.qg_moe_stage2, ctx, pa, None), exp, mem, verify)


@settings(max_examples=examples(600), **FUZZ_SETTINGS)
@given(stage2_specs())
def test_fuzz_moe_stage2(spec):
    run_case("qg_moe_stage2", stage2_case, spec)


# ================================================================ the small entry points

MISC = ["status_string", "format_block", "device_count", "context_create", "device_name",
        "set_option", "malloc", "memcpy", "memset", "stream", "event", "context_backend",
        "context_destroy", "free", "stream_ops", "event_ops", "event_create", "build", "last_error"]


@st.composite
def misc_specs(draw):
    what = draw(st.sampled_from(MISC))
    s = dict(what=what, seed=draw(seeds), ctx_null=draw(st.sampled_from([False] * 6 + [True])),
             p1=draw(st.sampled_from(["ok"] * 5 + ["null"])),
             p2=draw(st.sampled_from(["ok"] * 5 + ["null"])),
             int_value=draw(st.sampled_from(list(range(-2, 9)) + [100, 2 ** 31 - 1, -2 ** 31])),
             size=draw(st.sampled_from([0, 1, 2, 5, 16, 63, 255, 256, 1000])),
             name=draw(st.sampled_from([b"cpu_threads", b"w4a16_tier", b"gguf_tier", b"split_k",
                                        b"", b"bogus", b"CPU_THREADS", None])),
             value=draw(st.sampled_from([0, 1, 2, 3, 4, 16, 256, 257, 4096, 4097, -1, 2 ** 62, -2 ** 63])),
             big=draw(st.sampled_from([0, 1, 63, 4096, 2 ** 62, 2 ** 64 - 1, 2 ** 64 - 64])),
             record=draw(st.sampled_from([(True, True), (True, False), (False, True), (False, False)])))
    return s


OPTION_RANGE = {b"cpu_threads": (0, None), b"w4a16_tier": (0, 3), b"gguf_tier": (0, 3),
                b"split_k": (0, None)}


def misc_case(s):
    mem = Mem(rng_of(s))
    w = s["what"]
    exp = Expect()
    ctx = None if s["ctx_null"] else make_ctx(0)
    i32p, i64p = ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int64)
    v = s["int_value"]

    if w == "build":
        v_ = L.qg_version()
        assert v_ == L.QG_VERSION_MAJOR * 10000 + L.QG_VERSION_MINOR * 100 + L.QG_VERSION_PATCH, v_
        assert L.qg_format_version() == L.QG_FORMAT_VERSION
        info = L.qg_build_info()
        assert info and b"cpu" in info, info
        CHILD_LOG.extend([("qg_version", "valid-accepted"), ("qg_format_version", "valid-accepted"),
                          ("qg_build_info", "valid-accepted")])
        return "valid-accepted"

    if w == "event_create":
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null", "event")
        out = mem.output("event", 8, s["p1"])

        def verify():
            mem.check_untouched({"event": np.ones(8, bool)})
            event = int(mem.payload("event", np.uint64)[0])
            assert event, "qg_event_create returned a NULL event"
            L.qg_event_destroy(ctx, event)
        return drive("qg_event_create",
                     lambda: call(L.qg_event_create, ctx, ctypes.cast(out, ctypes.POINTER(L.qg_event_p))),
                     exp, mem, verify)

    if w == "last_error":
        # the sentence of this thread's last failed call, stable until the next call
        status, msg = call(L.qg_context_set_option, ctx if ctx else make_ctx(0), b"no_such_option", v)
        assert status == L.Status.QG_ERR_INVALID_ARGUMENT
        again = L.qg_last_error()
        assert again is not None and again.decode() == msg and "no_such_option" in msg, (again, msg)
        CHILD_LOG.append(("qg_last_error", "valid-accepted"))
        return "valid-accepted"

    if w == "context_backend":
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null", "backend")
        out = mem.output("backend", 4, s["p1"])

        def verify():
            mem.check_untouched({"backend": np.ones(4, bool)})
            assert int(mem.payload("backend", np.int32)[0]) == 0
        return drive("qg_context_backend",
                     lambda: call(L.qg_context_backend, ctx, ctypes.cast(out, ctypes.POINTER(ctypes.c_int))),
                     exp, mem, verify)

    if w == "context_destroy":
        # NULL is a no-op (like free(NULL)); a live context is destroyed once
        target = None if s["ctx_null"] else make_ctx(0)
        return drive("qg_context_destroy", lambda: call(L.qg_context_destroy, target), exp, mem,
                     lambda: mem.check_untouched())

    if w == "free":
        exp.bad(s["ctx_null"], "ctx")
        block = None
        if s["p1"] == "ok":
            p = ctypes.c_void_p()
            L.qg_malloc(make_ctx(0), 256, ctypes.byref(p))
            block = p.value
        return drive("qg_free", lambda: call(L.qg_free, ctx, block), exp, mem, lambda: mem.check_untouched())

    if w == "stream_ops":
        exp.bad(s["ctx_null"], "ctx")
        stream = None
        if s["p1"] == "ok":
            st_ = L.qg_stream()
            L.qg_stream_create(make_ctx(0), ctypes.byref(st_))
            stream = st_.value
        fn = (L.qg_stream_synchronize, L.qg_stream_destroy)[v % 2]
        return drive(fn.__name__, lambda: call(fn, ctx, stream), exp, mem, lambda: mem.check_untouched())

    if w == "event_ops":
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null" and v % 3 != 2, "event")  # destroy(NULL) is a no-op
        event = None
        if s["p1"] == "ok":
            e = L.qg_event_p()
            L.qg_event_create(make_ctx(0), ctypes.byref(e))
            event = e.value
        fn = (L.qg_event_record, L.qg_event_synchronize, L.qg_event_destroy)[v % 3]
        args_ = (ctx, event, None) if fn is L.qg_event_record else (ctx, event)
        if fn is L.qg_event_destroy and s["p1"] == "null":
            exp.hard = [f for f in exp.hard if f != "event"]
        return drive(fn.__name__, lambda: call(fn, *args_), exp, mem, lambda: mem.check_untouched())

    if w == "status_string":
        text = L.qg_status_string(v)
        assert text, "qg_status_string returned NULL"
        names = {int(x): x.name for x in L.Status}
        assert text.decode() == names.get(v, "unknown status"), (v, text)
        return "valid-accepted"

    if w == "format_block":
        exp.bad(v not in range(8), "format")
        exp.bad(s["p1"] == "null", "block_elems")
        exp.bad(s["p2"] == "null", "block_bytes")
        e_ptr, b_ptr = mem.output("elems", 4, s["p1"]), mem.output("bytes", 4, s["p2"])

        def verify():
            mem.check_untouched({"elems": np.ones(4, bool), "bytes": np.ones(4, bool)})
            spec = next(f for f in FORMATS.values() if f.qg_format == v)
            got = (int(mem.payload("elems", np.int32)[0]), int(mem.payload("bytes", np.int32)[0]))
            assert got == (spec.block_elems, spec.block_bytes), (spec.name, got)
        return drive("qg_format_block", lambda: call(L.qg_format_block, v, ctypes.cast(e_ptr, i32p),
                                                     ctypes.cast(b_ptr, i32p)), exp, mem, verify)

    if w == "device_count":
        # GPU backends are asked in-process by the gpu tests; a forked child must not
        # initialise a GPU runtime the parent may hold
        b = v if v not in (1, 2) else 0
        exp.bad(b not in (0, 1, 2), "backend")
        exp.bad(s["p1"] == "null", "count")
        c_ptr = mem.output("count", 4, s["p1"])

        def verify():
            mem.check_untouched({"count": np.ones(4, bool)})
            assert int(mem.payload("count", np.int32)[0]) == 1, "the CPU backend has one device"
        return drive("qg_device_count", lambda: call(L.qg_device_count, b, ctypes.cast(c_ptr, ctypes.POINTER(ctypes.c_int))),
                     exp, mem, verify)

    if w == "context_create":
        b = v if v not in (1, 2) else 0
        dev = 0 if s["p2"] == "ok" or abs(s["value"]) >= 2 ** 31 else s["value"]
        exp.bad(b not in (0, 1, 2), "backend")
        exp.bad(b == 0 and dev != 0, "device")
        exp.bad(s["p1"] == "null", "ctx")
        out = mem.output("ctx", 8, s["p1"])

        def verify():
            mem.check_untouched({"ctx": np.ones(8, bool)})
            made = L.qg_context_p(int(mem.payload("ctx", np.uint64)[0]))
            backend = ctypes.c_int(-1)
            L.qg_context_backend(made, ctypes.byref(backend))
            assert backend.value == 0
            L.qg_context_destroy(made)
        return drive("qg_context_create", lambda: call(L.qg_context_create, b, dev,
                                                       ctypes.cast(out, ctypes.POINTER(L.qg_context_p))),
                     exp, mem, verify)

    if w == "device_name":
        size = s["size"]
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null", "buf")
        exp.bad(size == 0, "buf_size")
        buf = mem.output("buf", size, s["p1"])

        def verify():
            got = mem.payload("buf", np.uint8)
            nul = np.flatnonzero(got == 0)
            assert nul.size, "the device name is not NUL-terminated inside buf_size"
            end = int(nul[0])
            mask = np.zeros(size, bool)
            mask[:end + 1] = True
            mem.check_untouched({"buf": mask})
            assert end > 0 or size == 1, "empty device name"
        return drive("qg_context_device_name",
                     lambda: call(L.qg_context_device_name, ctx, ctypes.cast(buf, ctypes.c_char_p), size), exp, mem, verify)

    if w == "set_option":
        name, value = s["name"], s["value"]
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(name is None, "name")
        if name is not None:
            rng_ = OPTION_RANGE.get(name)
            exp.bad(rng_ is None, "option", name.decode() or "option")
            if rng_ is not None:
                lo, hi = rng_
                exp.bad(value < lo, name.decode())
                if hi is not None:
                    exp.bad(value > hi, name.decode())
                if name == b"cpu_threads":
                    exp.open(value > 4096, "cpu_threads")   # the header gives no upper bound
                if name == b"split_k":
                    exp.open(value > 256, "split_k")
        return drive("qg_context_set_option",
                     lambda: call(L.qg_context_set_option, ctx, name, value), exp, mem,
                     lambda: mem.check_untouched())

    if w == "malloc":
        nbytes = s["big"]
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null", "ptr")
        out = mem.output("ptr", 8, s["p1"])
        huge = nbytes >= 2 ** 62
        mem.snapshot()
        status, msg = call(L.qg_malloc, ctx, nbytes, ctypes.cast(out, ctypes.POINTER(ctypes.c_void_p)))
        if exp.hard:
            assert status == L.Status.QG_ERR_INVALID_ARGUMENT and names_field(msg, exp.hard), (status, msg)
            mem.check_untouched()
            return "invalid-refused"
        if huge:
            assert status in (L.Status.QG_ERR_OUT_OF_MEMORY, L.Status.QG_ERR_INVALID_ARGUMENT), (status, msg)
            assert msg and re.search(r"bytes|memory", msg), msg
            mem.check_untouched()
            return "huge-refused"
        assert status == 0, msg
        mem.check_untouched({"ptr": np.ones(8, bool)})
        p = int(mem.payload("ptr", np.uint64)[0])
        assert p and p % 64 == 0, f"qg_malloc returned {p:#x}, not 64-byte aligned"
        ctypes.memset(p, 0xA5, max(nbytes, 1))  # the block is writable over its whole size
        L.qg_free(ctx, p)
        return "valid-accepted"

    if w in ("memcpy", "memset"):
        nbytes = s["size"]
        kind = (v if s["size"] % 2 else v % 4) if w == "memcpy" else 0  # mostly valid kinds
        exp.bad(s["ctx_null"], "ctx")
        if w == "memcpy":
            exp.bad(kind not in (0, 1, 2, 3), "kind")
        zero = nbytes == 0
        exp.bad(s["p1"] == "null" and not zero, "dst")
        exp.open(s["p1"] == "null" and zero, "dst")
        if w == "memcpy":
            exp.bad(s["p2"] == "null" and not zero, "src")
            exp.open(s["p2"] == "null" and zero, "src")
        src = mem.input("src", np.random.default_rng(s["seed"]).integers(0, 256, nbytes, dtype=np.uint8),
                        s["p2"])
        dst = mem.output("dst", nbytes, s["p1"])

        def verify():
            mem.check_untouched({"dst": np.ones(nbytes, bool)})
            got = mem.payload("dst", np.uint8)
            want = (mem.payload("src", np.uint8) if w == "memcpy"
                    else np.full(nbytes, s["value"] & 0xFF, np.uint8))
            assert np.array_equal(got, want), f"{w} wrote the wrong bytes"
        fn = ((lambda: call(L.qg_memcpy, ctx, dst, src, nbytes, kind, None)) if w == "memcpy" else
              (lambda: call(L.qg_memset, ctx, dst, s["value"] & 0x7FFFFFFF, nbytes, None)))
        return drive(f"qg_{w}", fn, exp, mem, verify)

    if w == "stream":
        exp.bad(s["ctx_null"], "ctx")
        exp.bad(s["p1"] == "null", "stream")
        out = mem.output("stream", 8, s["p1"])

        def verify():
            mem.check_untouched({"stream": np.ones(8, bool)})
            stream = int(mem.payload("stream", np.uint64)[0])
            assert stream != 0, "qg_stream_create gave the NULL (default) stream"
            L.qg_stream_synchronize(ctx, stream)
            L.qg_stream_destroy(ctx, stream)
        return drive("qg_stream_create", lambda: call(L.qg_stream_create, ctx,
                                                      ctypes.cast(out, ctypes.POINTER(L.qg_stream))),
                     exp, mem, verify)

    # events: create two, record some, ask for the elapsed time
    exp.bad(s["ctx_null"], "ctx")
    rec_start, rec_stop = s["record"]
    exp.bad(not rec_start, "start")
    exp.bad(not rec_stop, "stop")
    exp.bad(s["p1"] == "null", "ms")
    real = make_ctx(0)
    ev = [L.qg_event_p(), L.qg_event_p()]
    for e in ev:
        L.qg_event_create(real, ctypes.byref(e))
    if rec_start:
        L.qg_event_record(real, ev[0], None)
    if rec_stop:
        L.qg_event_record(real, ev[1], None)
    out = mem.output("ms", 4, s["p1"])

    def verify():
        mem.check_untouched({"ms": np.ones(4, bool)})
        ms = float(mem.payload("ms", np.float32)[0])
        assert math.isfinite(ms) and ms >= 0, ms
    return drive("qg_event_elapsed_ms",
                 lambda: call(L.qg_event_elapsed_ms, ctx, ev[0], ev[1],
                              ctypes.cast(out, ctypes.POINTER(ctypes.c_float))), exp, mem, verify)


@settings(max_examples=examples(800), **FUZZ_SETTINGS)
@given(misc_specs())
def test_fuzz_small_entry_points(spec):
    run_case(f"qg_{spec['what']}", misc_case, spec)


# ================================================================ GPU context (marked gpu)

@pytest.fixture(scope="module")
def gpu_env():
    env = GpuEnv()  # skips without a GPU
    yield env
    env.close()


def run_gpu_case(env, fn_name, case, spec):
    """One case on the GPU context, in this process; a family without a GPU tier in this
    build skips the test."""
    CHILD_LOG.clear()
    try:
        case(spec, env)
    except AssertionError as e:
        if "QG_ERR_UNSUPPORTED" in str(e) and "no GPU tier" in str(e):
            pytest.skip(f"{fn_name}: no GPU tier in this build")
        raise
    finally:
        env.free_all()
    for name, label in CHILD_LOG:
        COUNTS[f"{name} (gpu)"][label] += 1


@pytest.mark.gpu
@settings(max_examples=examples(300), **FUZZ_SETTINGS)
@given(spec=w4a16_specs())
def test_fuzz_w4a16_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_w4a16_gemm", w4a16_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(300), **FUZZ_SETTINGS)
@given(spec=gguf_specs())
def test_fuzz_gguf_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_gguf_gemm", gguf_case, spec)


@pytest.mark.gpu
@settings(max_examples=examples(200), **FUZZ_SETTINGS)
@given(spec=mxfp4_specs())
def test_fuzz_mxfp4_gemm_gpu(gpu_env, spec):
    run_gpu_case(gpu_env, "qg_mxfp4_gemm", mxfp4_case, spec)


# ================================================================ known bugs, pinned

ARGS_STRUCTS = {
    "qg_w4a16_gemm": L.qg_w4a16_gemm_args,
    "qg_gguf_gemm": L.qg_gguf_gemm_args,
    "qg_mxfp4_gemm": L.qg_mxfp4_gemm_args,
    "qg_moe_align": L.qg_moe_align_args,
    "qg_moe_stage1": L.qg_moe_stage1_args,
    "qg_moe_stage2": L.qg_moe_stage2_args,
}


@pytest.mark.parametrize("fn_name", sorted(ARGS_STRUCTS))
def test_misaligned_args_struct_is_refused(fn_name):
    """An args pointer one byte off its alignment (an FFI caller packing the struct
    into a byte buffer) must be refused, not read through a misaligned pointer, which is
    undefined behaviour in C and a sanitizer abort."""
    def child():
        mem = Mem(np.random.default_rng())
        struct = ARGS_STRUCTS[fn_name](num_tokens=0) if "moe" in fn_name else ARGS_STRUCTS[fn_name](m=0)
        raw = np.frombuffer(bytes(struct), np.uint8)
        ptr = mem.input("args", raw, "mis")
        ctx = make_ctx(0)
        mem.snapshot()
        status, msg = call(getattr(L, fn_name), ctx, ctypes.cast(ptr, ctypes.POINTER(type(struct))), None)
        mem.check_untouched()
        assert status == L.Status.QG_ERR_INVALID_ARGUMENT and names_field(msg, ["args"]), (
            f"{fn_name} with args at an address % 8 == 1 returned status {status}: {msg!r}")
        return "ok"
    run_isolated(child)
