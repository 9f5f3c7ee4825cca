"""The harness of the ABI fuzz: what every tests/test_fuzz_<family>.py shares.

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

The files, one per entry point family, each with its strategies, its model (`*_expect`)
and its case builders (`*_case`):
  test_fuzz_w4a16.py  qg_w4a16_gemm (+ its workspace query), CPU and GPU context
  test_fuzz_gguf.py   qg_gguf_gemm (+ its workspace query), both layouts of w, CPU and GPU context
  test_fuzz_mxfp4.py  qg_mxfp4_gemm (+ its workspace query), CPU and GPU context
  test_fuzz_moe.py    qg_moe_align, qg_moe_align_sizes, qg_moe_stage1, qg_moe_stage2
  test_fuzz_misc.py   the small entry points (status, build, context, memory, streams, events)
This module holds the rest: the forked worker, the host and device buffers with guard
bands, the outcome model (Expect, drive), the shared strategies and mutations, and the
case counter. A test file imports the module-scoped autouse fixture `fuzz_worker` (one
worker per file, stopped at its end) and, for its GPU cases, `gpu_env`.

Library bugs the fuzz found (an args struct read before its alignment was checked;
out-of-range enum values read through enum types, UB in C++) are fixed and pinned by
their own tests (test_misaligned_args_struct_is_refused in each family's file, the enum
cases of the fuzz under .ci/sanitize.sh); the fuzz does not generate misaligned args
structs or extents beyond int64 itself.

Budget: QG_FUZZ_SCALE (default 1) multiplies every max_examples; at 1 the files run in
well under a minute on 2 cores. The number of cases run is printed in the terminal
summary ("quantgemm ABI fuzz: ...", tests/conftest.py calls write_summary below).
"""
from __future__ import annotations

import collections
import ctypes
import faulthandler
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
from hypothesis import HealthCheck  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from conftest import FP32_EXACT, call, log_margin  # noqa: E402
from raw_gpu import RawGpu  # noqa: E402
from pyquant import _lib as L  # noqa: E402

# every test file of the fuzz: pytestmark = REQUIRES_LIBRARY
REQUIRES_LIBRARY = pytest.mark.skipif(not L.library_loaded(), reason="libquantgemm is not loaded")

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


def examples(n: int) -> int:
    return max(1, int(n * SCALE))


FUZZ_SETTINGS = dict(deadline=None, database=None, print_blob=True,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                            HealthCheck.filter_too_much,
                                            HealthCheck.function_scoped_fixture])
# ---------------------------------------------------------------- case counter + summary

# entry point -> outcome label ("valid-accepted", "invalid-refused", ...) -> cases
COUNTS: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)


def write_summary(terminalreporter):
    """The case counts of every fuzz file of this run (tests/conftest.py's
    pytest_terminal_summary calls it when this module was imported)."""
    if not COUNTS:
        return
    total = sum(sum(c.values()) for c in COUNTS.values())
    terminalreporter.write_sep("-", f"quantgemm ABI fuzz: {total} cases")
    for fn in sorted(COUNTS):
        c = COUNTS[fn]
        parts = ", ".join(f"{k} {v}" for k, v in sorted(c.items()))
        terminalreporter.write_line(f"  {fn}: {sum(c.values())} ({parts})")


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
                    builder, spec = msg
                    _write_msg(c2p_w, _child_result(lambda: builder(spec)))
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

    def run(self, builder, spec, timeout: float = 120.0):
        """builder(spec) in the child: a module-level function of a test file or of this
        module (pickle sends it by its module and name; the forked child has them all)."""
        if self.pid is None:
            self._start()
        _write_msg(self.send_fd, (builder, spec))
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
def fuzz_worker():
    """Imported by every fuzz test file: its cases share one worker, stopped at its end."""
    yield
    WORKER.stop()


# ---------------------------------------------------------------- calls

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


def gemm_sizes_expect(exp, m, n, k):
    """The GEMM sizes: negative ones are refused; n = 0 and k = 0 the header leaves open."""
    exp.bad(m < 0, "m")
    exp.bad(n < 0, "n")
    exp.bad(k < 0, "k")
    exp.open(n == 0, "n")
    exp.open(k == 0, "k")


def allow_empty(exp, empty, field):
    """An empty problem (m = 0, num_tokens = 0) may return QG_OK at once even next to other
    faults, unless the call itself is broken (NULL ctx or args, a wrong args->size)."""
    if empty and not (set(exp.hard) & {"ctx", "args", "size"}):
        exp.soft.extend(exp.hard)
        exp.hard.clear()
        exp.open(True, field)


def args_and_ctx(mem, s, struct, env=CPU_ENV):
    """The args buffer of a struct-taking entry point (args->size and NULL as the spec says)
    and its context (NULL as the spec says)."""
    pa = args_pointer(mem, struct, s["args_mode"], struct_size(type(struct), s["size_delta"]))
    ctx = None if s["ctx_null"] else env.ctx(s["threads"])
    return pa, ctx


def output_matrix(mem, struct, rows, cols, ld, dt, mode):
    """Puts the output y [rows, cols] with row stride ld (one row at least: buffers of
    empty problems exist too) in a guard-banded buffer and in struct.y; returns the
    number of elements of its extent."""
    elems = (max(rows, 1) - 1) * max(ld, 0) + max(cols, 0)
    struct.y = mem.output("y", elems * DTYPE_BYTES[dt], mode)
    return elems


def accepted_output(mem, rows, cols, ld, elems, dt):
    """After an accepted call: y [rows, cols] (None for an empty problem), once every byte
    but y's own elements and a workspace is checked to be as before the call."""
    if rows == 0 or cols <= 0:
        mem.check_untouched(WORKSPACE_FREE)
        return None
    idx = matrix_index(rows, cols, ld)
    mem.check_untouched({"y": elem_mask(elems * DTYPE_BYTES[dt], idx, DTYPE_BYTES[dt]), **WORKSPACE_FREE})
    return mem.payload("y", NP_DTYPE[dt])[idx].reshape(rows, cols)


def run_case(fn_name, builder, spec):
    """Runs one case in the worker child; counts every call it made here."""
    outcome, calls = WORKER.run(builder, spec)
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
FRAG_LD_PAD = st.sampled_from([0, 0, 8, 16])  # what the GPU frag tiers read x with: ldx % 8 == 0


def frag_gpu_x(draw, spec):
    """x as the GPU frag tiers take it (decode_frag's 16-byte copies, the prefill's tensor map):
    16-byte aligned, ldx a multiple of 8 elements. A valid call with another x is
    QG_ERR_UNSUPPORTED there (no GPU tier serves it), which the header allows."""
    spec["ptr"]["x"] = "ok"
    spec["ldx"] = spec["k"] + draw(FRAG_LD_PAD)
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
        spec["size_delta"] = draw(st.sampled_from(["zero", -8, -1, 8, "max", "v0", "v1"]))


def struct_size(struct_type, delta):
    """The args->size a case passes: sizeof + delta, 0, 2^64 - 1, or "vN" the size of the
    struct's N-th older version (sizeof itself where it has none)."""
    size = ctypes.sizeof(struct_type)
    if delta == "zero":
        return 0
    if delta == "max":
        return 2 ** 64 - 1
    if isinstance(delta, str):
        older = OLDER_SIZES.get(struct_type, ())
        i = int(delta[1:])
        return older[i] if i < len(older) else size
    return size + delta


def reads_field(struct_type, spec, field: str) -> bool:
    """Whether the library reads `field` of the args of this case: a struct of an older
    version (a smaller size) ends before the fields added after it, which read as zero."""
    f = getattr(struct_type, field)
    return struct_size(struct_type, spec["size_delta"]) >= f.offset + f.size


def layout_read(struct_type, spec) -> int:
    """The layout the library reads from the args of this case: the case's own, or 0 (the
    canonical / block layout) where its struct version predates the field, whatever the
    bytes past args->size hold."""
    return spec.get("layout", 0) if reads_field(struct_type, spec, "layout") else 0


# Sizes of the older versions of the structs that have grown, oldest first (include/quantgemm.h:
# argument structs only grow; a caller built against an older version passes its size).
# qg_w4a16_gemm_args: 128, then layout (136), then bias; qg_gguf_gemm_args: 112, then bias (128),
# then w_scales and layout; qg_mxfp4_gemm_args: 120, then layout.
OLDER_SIZES = {L.qg_w4a16_gemm_args: (128, 136), L.qg_gguf_gemm_args: (112, 128), L.qg_mxfp4_gemm_args: (120,)}


def common_expect(exp, spec, struct_type):
    exp.bad(spec["ctx_null"], "ctx")
    exp.bad(spec["args_mode"] == "null", "args")
    size = struct_size(struct_type, spec["size_delta"])
    exp.bad(size < ctypes.sizeof(struct_type) and size not in OLDER_SIZES.get(struct_type, ()), "size")
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


# ---------------------------------------------------------------- the optional bias of the dense GEMMs

def bias_spec(draw, spec):
    """bias_dtype and the bias pointer of a dense GEMM case (NULL = no bias)."""
    spec["bias_dtype"] = draw(st.sampled_from(FLOAT_DTYPES))
    spec["ptr"]["bias"] = draw(st.sampled_from(["ok", "ok", "shift", "null"]))


def bias_dtype_mutation(draw, spec):
    spec["bias_dtype"] = draw(st.sampled_from([I32, U8, U4X8, *NOT_ENUM]))


def has_bias(spec, struct_type) -> bool:
    """A bias pointer is given and this case's struct version holds the field."""
    return spec["ptr"]["bias"] != "null" and reads_field(struct_type, spec, "bias")


def bias_expect(exp, spec, struct_type, pointers):
    given = has_bias(spec, struct_type)
    exp.bad(given and spec["bias_dtype"] not in FLOAT_DTYPES, "bias_dtype")
    if pointers:
        exp.bad(given and spec["ptr"]["bias"] == "mis", "bias")


def bias_input(rng, mem, spec, rows):
    """(pointer, float64 bias or None for the reference) of a case's bias [rows]."""
    dt = spec["bias_dtype"] if spec["bias_dtype"] in FLOAT_DTYPES else F32
    bias = rng.standard_normal(rows).astype(NP_DTYPE[dt])
    ptr = mem.input("bias", bias, spec["ptr"]["bias"])
    return ptr, (None if spec["ptr"]["bias"] == "null" else bias.astype(np.float64))


def with_bias(ref, abs_ref, bias):
    """The reference and its magnitude with a bias added (None: unchanged)."""
    if bias is None:
        return ref, abs_ref
    return ref + bias[None, :], abs_ref + np.abs(bias)[None, :]


# ---------------------------------------------------------------- shared by MXFP4 dense and MoE

def mxfp4_weight(rng, rows, k):
    """Random OCP blocks [rows, k/32, 16] and E8M0 scales around 2^0 (finite)."""
    nb = max(k, 0) // 32
    blocks = rng.integers(0, 256, size=(rows, nb, 16), dtype=np.uint8)
    scales = rng.integers(120, 129, size=(rows, nb), dtype=np.uint8)
    return blocks, scales


# ---------------------------------------------------------------- GPU context (marked gpu)

@pytest.fixture(scope="module")
def gpu_env():
    env = GpuEnv()  # skips without a GPU
    yield env
    env.close()


def _gpu_tier_built(fn_name: str) -> bool:
    """True when qg_build_info lists a GPU tier for the entry point's family."""
    from pyquant import tiers
    family = fn_name.split("_")[1]  # qg_gguf_gemm -> gguf
    return any(tiers.backend_of(t) in ("cuda", "hip") for t in tiers.tiers().get(family, []))


def run_gpu_case(env, fn_name, case, spec):
    """One case on the GPU context, in this process; a family without a GPU tier in this
    build skips the test (a build with one must serve every valid call the specs draw)."""
    CHILD_LOG.clear()
    try:
        case(spec, env)
    except AssertionError as e:
        if "QG_ERR_UNSUPPORTED" in str(e) and "no GPU tier" in str(e) and not _gpu_tier_built(fn_name):
            pytest.skip(f"{fn_name}: no GPU tier in this build")
        raise
    finally:
        env.free_all()
    for name, label in CHILD_LOG:
        COUNTS[f"{name} (gpu)"][label] += 1



# ---------------------------------------------------------------- known bugs, pinned

def check_misaligned_args_refused(fn_name, struct_type):
    """An args pointer one byte off its alignment (an FFI caller packing the struct
    into a byte buffer) must be refused, not read through a misaligned pointer, which is
    undefined behaviour in C and a sanitizer abort (each family's
    test_misaligned_args_struct_is_refused)."""
    def child():
        mem = Mem(np.random.default_rng())
        struct = struct_type(num_tokens=0) if "moe" in fn_name else struct_type(m=0)
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
