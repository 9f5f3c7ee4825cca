"""ABI fuzz of the small entry points on a CPU context: status and build queries, contexts and
options, memory, streams and events.

tests/fuzz_harness.py says how the fuzz works (the VALID / INVALID / EITHER model, the
forked worker, the guard bands) and holds what the families share.
"""
from __future__ import annotations

import ctypes
import math
import re

import numpy as np
import pytest

pytest.importorskip("hypothesis")
from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from fuzz_harness import (  # noqa: E402
    CHILD_LOG, Expect, FUZZ_SETTINGS, Mem, REQUIRES_LIBRARY, call, drive, examples, make_ctx,
    names_field, rng_of, run_case, seeds,
)
from fuzz_harness import fuzz_worker  # noqa: E402,F401 (fixture: this file's worker)
from pyquant import _lib as L  # noqa: E402
from pyquant.formats import FORMATS  # noqa: E402

pytestmark = REQUIRES_LIBRARY


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
             name=draw(st.sampled_from([b"cpu_threads", b"w4a16_tier", b"gguf_tier", b"split_k", b"prefill_tile",
                                        b"", b"bogus", b"CPU_THREADS", None])),
             value=draw(st.sampled_from([0, 1, 2, 3, 4, 16, 32, 64, 128, 256, 257, 4096, 4097, -1, 2 ** 62, -2 ** 63])),
             big=draw(st.sampled_from([0, 1, 63, 4096, 2 ** 62, 2 ** 64 - 1, 2 ** 64 - 64])),
             record=draw(st.sampled_from([(True, True), (True, False), (False, True), (False, False)])))
    return s


OPTION_RANGE = {b"cpu_threads": (0, None), b"w4a16_tier": (0, 3), b"gguf_tier": (0, 5),
                b"split_k": (0, None), b"prefill_tile": (0, 256), b"cpu_precision": (0, 2)}


def misc_case(s):
    mem = Mem(rng_of(s))
    w = s["what"]
    exp = Expect()
    ctx = None if s["ctx_null"] else make_ctx(0)
    i32p = ctypes.POINTER(ctypes.c_int32)
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
                if name == b"prefill_tile":   # the header names the values: 0, 32, 64, 128, 256
                    exp.bad(lo <= value <= hi and value not in (0, 32, 64, 128, 256), "prefill_tile")
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
