"""A GPU context of the library and raw device buffers through qg_malloc / qg_memcpy (no other
GPU package needed), for the tests that drive the C ABI directly on the GPU (overflow,
non-finite, concurrency). Creating one skips the test when there is no GPU device."""
from __future__ import annotations

import ctypes

import numpy as np
import pytest

from pyquant import _lib as L


class RawGpu:
    def __init__(self):
        for backend in (L.Backend.QG_BACKEND_CUDA, L.Backend.QG_BACKEND_HIP):
            n = ctypes.c_int(0)
            L.qg_device_count(backend, ctypes.byref(n))
            if n.value:
                self.ctx = L.qg_context_p()
                L.qg_context_create(backend, 0, ctypes.byref(self.ctx))
                break
        else:
            pytest.skip("no GPU device")
        self.ptrs = []

    def alloc(self, nbytes, fill=None):
        """Device pointer to `nbytes` bytes, each set to `fill` when given."""
        p = ctypes.c_void_p()
        L.qg_malloc(self.ctx, max(nbytes, 1), ctypes.byref(p))
        self.ptrs.append(p.value)
        if fill is not None:
            L.qg_memset(self.ctx, p.value, fill, nbytes, None)
            L.qg_stream_synchronize(self.ctx, None)
        return p.value

    def upload(self, arr, at=None, offset=0):
        """Copies `arr` to `at + offset` (a new buffer when `at` is None); returns `at`."""
        arr = np.ascontiguousarray(arr)
        if at is None:
            at = self.alloc(arr.nbytes)
        L.qg_memcpy(self.ctx, at + offset, arr.ctypes.data, arr.nbytes, L.CopyKind.QG_COPY_HOST_TO_DEVICE, None)
        L.qg_stream_synchronize(self.ctx, None)
        return at

    def download(self, ptr, shape, dtype, offset=0):
        out = np.empty(shape, dtype)
        L.qg_stream_synchronize(self.ctx, None)
        L.qg_memcpy(self.ctx, out.ctypes.data, ptr + offset, out.nbytes, L.CopyKind.QG_COPY_DEVICE_TO_HOST, None)
        return out

    def workspace(self, fn, args):
        """Sizes, allocates (zeroed) and attaches the workspace `fn` needs for `args`."""
        size = ctypes.c_size_t(0)
        getattr(L, fn + "_workspace_size")(self.ctx, ctypes.byref(args), ctypes.byref(size))
        if size.value:
            args.workspace = self.alloc(size.value, fill=0)
            args.workspace_bytes = size.value

    def free_all(self):
        """Frees every buffer allocated so far; the context stays."""
        L.qg_stream_synchronize(self.ctx, None)
        for p in self.ptrs:
            L.qg_free(self.ctx, p)
        self.ptrs = []

    def close(self):
        self.free_all()
        L.qg_context_destroy(self.ctx)
