"""Contexts, streams, events and device arrays on top of the qg_* memory helpers.

A Context fixes where pointers live (DESIGN: host memory for the CPU backend, memory of
one device for CUDA / HIP). DeviceArray is memory allocated with qg_malloc in a context
and freed when the array is garbage collected; on a GPU context it exposes
`__cuda_array_interface__` (version 3) so CuPy, PyTorch and Numba can view it.

Foreign device arrays (anything with `__cuda_array_interface__`) are read through
`parse_cuda_array_interface`, which returns pointer, shape, strides, dtype and stream.
bfloat16 has no letter in the array-interface typestr grammar; producers describe it as
a 2-byte void, `'<V2'` (what `np.dtype(ml_dtypes.bfloat16).str` gives, and what
PyTorch's `Tensor.__cuda_array_interface__` reports for torch.bfloat16 in current
releases; older PyTorch releases refuse to export bfloat16 at all). A `'<V2'` typestr
is therefore read as bfloat16. Some producers label bfloat16 as `'<f2'`, which cannot be
told apart from float16: pass `dtype="bfloat16"` to `DeviceView.from_object` (or build a
`DeviceView.from_pointer`) to override the typestr in that case.

The other direction: PyTorch (2.11 checked on an H200) exports '<V2' but does not import
it, so `torch.as_tensor(bf16_device_array)` fails; hand torch an int16 view and
reinterpret it there: `torch.as_tensor(y.view(dtype=np.int16), device="cuda").view(torch.bfloat16)`.
"""
from __future__ import annotations

import ctypes
import math
import os
import weakref
from typing import Any

import numpy as np

from . import _lib
from ._lib import Backend, CopyKind, DType, InvalidArgumentError, Status

try:  # ml_dtypes is a dependency; bfloat16 numpy arrays are ml_dtypes.bfloat16
    import ml_dtypes as _ml_dtypes
    BFLOAT16 = np.dtype(_ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - declared dependency
    BFLOAT16 = None

_BACKENDS = {"cpu": Backend.QG_BACKEND_CPU, "cuda": Backend.QG_BACKEND_CUDA,
             "hip": Backend.QG_BACKEND_HIP}
_BACKEND_NAMES = {v: k for k, v in _BACKENDS.items()}

# numpy dtype <-> qg_dtype. int32 words carry packed int4 (U4X8 / I32 depending on role).
_DTYPE_ALIASES = {
    "f32": np.float32, "fp32": np.float32, "float32": np.float32,
    "f16": np.float16, "fp16": np.float16, "float16": np.float16, "half": np.float16,
    "bf16": "bfloat16", "bfloat16": "bfloat16",
    "i32": np.int32, "int32": np.int32, "u8": np.uint8, "uint8": np.uint8,
}


def _err(message: str) -> InvalidArgumentError:
    return InvalidArgumentError(Status.QG_ERR_INVALID_ARGUMENT, message)


def as_dtype(d: Any) -> np.dtype:
    """numpy dtype of `d`: a numpy dtype, a type, or a name ("bf16", "float16", ...)."""
    if isinstance(d, str) and d.lower() in _DTYPE_ALIASES:
        d = _DTYPE_ALIASES[d.lower()]
        if d == "bfloat16":
            return BFLOAT16
    try:
        return np.dtype(d)
    except TypeError:
        raise _err(f"unknown dtype {d!r}; expected float32, float16, bfloat16, int32 or uint8")


def qg_dtype_of(dtype: np.dtype) -> DType:
    """The qg_dtype of a numpy dtype, or InvalidArgumentError naming it."""
    dtype = np.dtype(dtype)
    if dtype == np.float32:
        return DType.QG_DTYPE_F32
    if dtype == np.float16:
        return DType.QG_DTYPE_F16
    if BFLOAT16 is not None and dtype == BFLOAT16:
        return DType.QG_DTYPE_BF16
    if dtype in (np.dtype(np.int32), np.dtype(np.uint32)):
        return DType.QG_DTYPE_I32
    if dtype == np.uint8:
        return DType.QG_DTYPE_U8
    raise _err(f"dtype {dtype} has no qg_dtype (float32, float16, bfloat16, int32, uint8)")


def dtype_name(dtype: np.dtype) -> str:
    """float16, bfloat16, ...; a non-native byte order is named: '>f2 (non-native byte order float16)'."""
    dt = np.dtype(dtype)
    if BFLOAT16 is not None and dt == BFLOAT16:
        return "bfloat16"
    if not dt.isnative:
        return f"{dt.str} (non-native byte order {dt.name})"
    return dt.name


# The largest allocation DeviceArray asks for (qg_malloc takes a size_t; Python ints do not wrap).
_MAX_BYTES = 2 ** 63 - 1


# ---------------------------------------------------------------- context

class Context:
    """A qg_context: backend "cpu", "cuda" or "hip" and a device index."""

    def __init__(self, backend: str | int = "cpu", device: int = 0):
        if isinstance(backend, str):
            if backend.lower() not in _BACKENDS:
                raise _err(f"unknown backend {backend!r}; expected one of {sorted(_BACKENDS)}")
            be = _BACKENDS[backend.lower()]
        else:
            try:
                be = Backend(backend)
            except ValueError:
                raise _err(f"unknown backend {backend!r}; expected one of {sorted(_BACKENDS)} or "
                           f"{[int(b) for b in Backend]}") from None
        if not -2 ** 31 <= int(device) < 2 ** 31:
            raise _err(f"device index {device} is outside a C int")
        _lib.require_library()
        handle = _lib.qg_context_p()
        _lib.qg_context_create(be, int(device), handle)
        self._handle = handle.value
        self._backend = be
        self.device = int(device)
        self._device_name = None
        self._workspaces: dict[Any, DeviceArray] = {}
        self._finalizer = weakref.finalize(self, _destroy_context, self._handle)

    # -- identity
    @property
    def handle(self) -> int:
        if self._handle is None:
            raise _err("the context has been closed")
        return self._handle

    @property
    def backend(self) -> str:
        return _BACKEND_NAMES[self._backend]

    @property
    def backend_enum(self) -> Backend:
        return self._backend

    @property
    def is_gpu(self) -> bool:
        return self._backend != Backend.QG_BACKEND_CPU

    @property
    def device_name(self) -> str:
        if self._device_name is None:
            buf = ctypes.create_string_buffer(256)
            _lib.qg_context_device_name(self.handle, buf, len(buf))
            self._device_name = buf.value.decode("utf-8", "replace")
        return self._device_name

    def __repr__(self) -> str:
        return f"Context(backend={self.backend!r}, device={self.device})"

    def close(self) -> None:
        """Destroys the context now (arrays allocated in it must be gone already)."""
        self._workspaces.clear()
        self._finalizer()
        self._handle = None

    # -- knobs and synchronisation
    def set_option(self, name: str, value: int) -> None:
        _lib.qg_context_set_option(self.handle, name.encode(), int(value))

    def set_tier(self, family: str, tier: str) -> None:
        """Forces `family`'s tier by name ("w4a16", "cuda:decode_frag"), or "auto"
        (qg_context_set_tier; pyquant.tiers() lists the names of this build)."""
        _lib.qg_context_set_tier(self.handle, str(family).encode(), str(tier).encode())

    def synchronize(self, stream=None) -> None:
        _lib.qg_stream_synchronize(self.handle, stream_handle(stream))

    def event(self) -> "Event":
        return Event(self)

    def stream(self) -> "Stream":
        return Stream(self)

    # -- memory
    def copy_kind(self, dst_on_device: bool, src_on_device: bool) -> CopyKind:
        if not self.is_gpu:  # a CPU context has host memory only
            return CopyKind.QG_COPY_HOST_TO_HOST
        return _COPY_KINDS[(bool(src_on_device), bool(dst_on_device))]

    def workspace(self, nbytes: int, stream=None, purpose: str = "workspace"):
        """Scratch memory for the kernels (the library never allocates behind the caller's
        back), cached per (purpose, stream) and grown on demand: launches on one stream
        are ordered, and another stream gets its own buffer, so no two launches that may
        overlap share one. Returns (pointer or None, bytes)."""
        ws = self.workspace_array(nbytes, stream, purpose)
        return (None, 0) if ws is None else (ws.ptr, ws.nbytes)

    def workspace_array(self, nbytes: int, stream=None, purpose: str = "workspace"):
        """The DeviceArray behind workspace() (None for 0 bytes): a holder (GemmPlan) keeps
        it alive even after the cache has moved on to a larger buffer."""
        if nbytes == 0:
            return None
        key = (purpose, stream_handle(stream))
        ws = self._workspaces.get(key)
        if ws is None or ws.nbytes < nbytes:
            ws = DeviceArray.empty((nbytes,), np.uint8, ctx=self)
            # quantgemm.h: workspace is zero-filled before its first use and then stays
            # reusable (split-K counters re-arm themselves)
            ws.fill_bytes(0, stream)
            self._workspaces[key] = ws
        return ws


_COPY_KINDS = {  # (source on device, destination on device) -> qg_copy_kind
    (False, False): CopyKind.QG_COPY_HOST_TO_HOST,
    (False, True): CopyKind.QG_COPY_HOST_TO_DEVICE,
    (True, False): CopyKind.QG_COPY_DEVICE_TO_HOST,
    (True, True): CopyKind.QG_COPY_DEVICE_TO_DEVICE,
}


def _destroy_context(handle) -> None:
    try:
        if handle and _lib is not None and _lib.library_loaded():
            _lib.qg_context_destroy(handle)
    except Exception:  # interpreter shutdown: nothing useful left to report to
        pass


class Stream:
    """A stream created in a context (qg_stream_create); destroyed when collected."""

    def __init__(self, ctx: Context):
        self.ctx = ctx
        h = ctypes.c_void_p()
        _lib.qg_stream_create(ctx.handle, ctypes.byref(h))
        self.handle = h.value
        self._finalizer = weakref.finalize(self, _destroy_stream, ctx, self.handle)

    def synchronize(self) -> None:
        _lib.qg_stream_synchronize(self.ctx.handle, self.handle)

    def close(self) -> None:
        self._finalizer()

    def __repr__(self) -> str:
        return f"Stream({self.ctx!r}, handle={self.handle:#x})" if self.handle else f"Stream({self.ctx!r}, default)"


def _destroy_stream(ctx, handle) -> None:
    try:
        if handle is not None:
            _lib.qg_stream_destroy(ctx.handle, handle)
    except Exception:
        pass


def stream_handle(stream) -> int | None:
    """The raw qg_stream of `stream`: None (default stream), a pyquant Stream, an int
    handle, a torch.cuda.Stream (.cuda_stream) or a cupy Stream (.ptr)."""
    if stream is None:
        return None
    if isinstance(stream, Stream):
        return stream.handle
    if isinstance(stream, (int, np.integer)):
        return int(stream) or None
    for attr in ("cuda_stream", "ptr", "handle"):
        v = getattr(stream, attr, None)
        if isinstance(v, (int, np.integer)):
            return int(v) or None
    raise _err(f"stream must be None, a pyquant Stream, an int handle, a torch.cuda.Stream or "
               f"a cupy Stream; got {type(stream).__name__}")


class Event:
    """A timing event (CUDA/HIP event; host clock on the CPU backend)."""

    def __init__(self, ctx: Context):
        h = _lib.qg_event_p()
        _lib.qg_event_create(ctx.handle, h)
        self.ctx = ctx
        self.handle = h.value
        self._finalizer = weakref.finalize(self, _destroy_event, ctx, self.handle)

    def record(self, stream=None) -> "Event":
        _lib.qg_event_record(self.ctx.handle, self.handle, stream_handle(stream))
        return self

    def synchronize(self) -> None:
        _lib.qg_event_synchronize(self.ctx.handle, self.handle)

    def elapsed_ms(self, other: "Event") -> float:
        """Milliseconds from this event (start) to `other` (stop); both recorded."""
        ms = ctypes.c_float()
        _lib.qg_event_elapsed_ms(self.ctx.handle, self.handle, other.handle, ctypes.byref(ms))
        return float(ms.value)


def _destroy_event(ctx, handle) -> None:
    try:
        _lib.qg_event_destroy(ctx.handle, handle)
    except Exception:
        pass


# ---------------------------------------------------------------- default contexts

_cpu_ctx: Context | None = None
_default_ctx: Context | None = None
_gpu_probe: tuple | None = None  # (Context or None, reason)


def device_count(backend: str) -> int:
    """qg_device_count for a backend name: 0 when this build lacks it or no device is there."""
    if not isinstance(backend, str) or backend.lower() not in _BACKENDS:
        raise _err(f"unknown backend {backend!r}; expected one of {sorted(_BACKENDS)}")
    n = ctypes.c_int()
    _lib.qg_device_count(_BACKENDS[backend.lower()], ctypes.byref(n))
    return int(n.value)


def cpu_context() -> Context:
    """The shared CPU context (numpy operands always run here)."""
    global _cpu_ctx
    if _cpu_ctx is None or _cpu_ctx._handle is None:  # none yet, or the user closed it
        _cpu_ctx = Context("cpu")
    return _cpu_ctx


def _forced_backend() -> str | None:
    v = os.environ.get("PYQUANT_BACKEND", "").strip().lower()
    if not v:
        return None
    if v not in _BACKENDS:
        raise _err(f"PYQUANT_BACKEND={v!r} is not one of {sorted(_BACKENDS)}")
    return v


def _probe_gpu() -> tuple:
    """First GPU context that can be created (CUDA, then HIP), or (None, why not)."""
    global _gpu_probe
    if _gpu_probe is None:
        forced = _forced_backend()
        if forced == "cpu":
            _gpu_probe = (None, "PYQUANT_BACKEND=cpu")
        else:
            reasons = []
            for be in ([forced] if forced else ["cuda", "hip"]):
                n = device_count(be)
                if n == 0:
                    reasons.append(f"{be}: 0 devices")
                    continue
                try:
                    _gpu_probe = (Context(be, 0), "")
                    break
                except _lib.QuantGemmError as e:
                    reasons.append(f"{be}: {e}")
            else:
                _gpu_probe = (None, "; ".join(reasons))
    return _gpu_probe


def gpu_available() -> bool:
    """True when a CUDA or HIP context can be created (and PYQUANT_BACKEND is not cpu)."""
    return _probe_gpu()[0] is not None


def gpu_context() -> Context:
    ctx, why = _probe_gpu()
    if ctx is None:
        raise _lib.QuantGemmError(Status.QG_ERR_UNSUPPORTED, f"no GPU context available ({why})")
    return ctx


def default_context() -> Context:
    """The GPU context when this build has a GPU backend and a device is present (CUDA
    first, then HIP), else the CPU context. PYQUANT_BACKEND=cpu|cuda|hip forces one."""
    global _default_ctx
    if _default_ctx is None:
        forced = _forced_backend()
        if forced in ("cuda", "hip"):
            _default_ctx = gpu_context()
        else:
            ctx, _ = _probe_gpu()
            _default_ctx = ctx if ctx is not None else cpu_context()
    return _default_ctx


# ---------------------------------------------------------------- arrays

def _c_strides(shape, itemsize) -> tuple:
    strides, acc = [], itemsize
    for extent in reversed(shape):
        strides.append(acc)
        acc *= max(int(extent), 1)
    return tuple(reversed(strides))


class _Shaped:
    """ndim and size from `shape`, shared by DeviceView and DeviceArray."""

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)


class DeviceView(_Shaped):
    """A non-owning description of memory: pointer, shape, byte strides, dtype, where it
    lives, the context (None for foreign arrays) and the producer's stream (CAI v3)."""

    def __init__(self, ptr: int, shape, dtype, strides=None, ctx: Context | None = None,
                 on_device: bool = True, owner: Any = None, stream: int | None = None):
        self.ptr = int(ptr or 0)
        self.shape = tuple(int(s) for s in shape)
        self.dtype = as_dtype(dtype)
        self.strides = tuple(int(s) for s in strides) if strides is not None else _c_strides(
            self.shape, self.dtype.itemsize)
        self.ctx = ctx
        self.on_device = on_device
        self.owner = owner
        self.stream = stream
        self.device = None      # (backend, index) when the producer said (DLPack), else unknown
        self.read_only = False  # the producer marked the memory read-only (DLPack 1.0 flag)

    @classmethod
    def from_pointer(cls, ptr: int, shape, dtype, strides=None, ctx: Context | None = None,
                     owner: Any = None) -> "DeviceView":
        """A buffer given by raw pointer (strides in bytes, None = C-contiguous): device
        memory, or host memory when ctx is a CPU context."""
        on_device = ctx.is_gpu if ctx is not None else True
        return cls(ptr, shape, dtype, strides, ctx=ctx, on_device=on_device, owner=owner)

    @classmethod
    def from_object(cls, obj: Any, name: str = "array", dtype=None) -> "DeviceView":
        """View of an object exposing __cuda_array_interface__; `dtype` overrides its typestr."""
        try:
            cai = obj.__cuda_array_interface__
        except AttributeError as e:
            raise _err(f"{name} ({type(obj).__name__}) has no __cuda_array_interface__: {e}")
        ptr, shape, strides, dt, stream = parse_cuda_array_interface(cai, name)
        if dtype is not None:
            want = as_dtype(dtype)
            if want.itemsize != dt.itemsize:
                raise _err(f"{name}: dtype override {dtype_name(want)} has itemsize {want.itemsize} "
                           f"but the interface reports typestr {cai['typestr']!r}")
            dt = want
        return cls(ptr, shape, dt, strides, ctx=None, on_device=True, owner=obj, stream=stream)


    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def is_c_contiguous(self) -> bool:
        return all(st == c or ext == 1 for st, c, ext in
                   zip(self.strides, _c_strides(self.shape, self.dtype.itemsize), self.shape))

    @property
    def __cuda_array_interface__(self) -> dict:
        if not self.on_device:
            raise AttributeError("host memory has no __cuda_array_interface__")
        return _cai(self.ptr, self.shape, self.dtype,
                    None if self.is_c_contiguous() else self.strides, self.stream)

    def __repr__(self) -> str:
        where = self.ctx.backend if self.ctx is not None else ("device" if self.on_device else "host")
        return f"DeviceView(ptr={self.ptr:#x}, shape={self.shape}, dtype={dtype_name(self.dtype)}, {where})"


def _cai(ptr, shape, dtype, strides, stream) -> dict:
    return {"shape": tuple(shape), "typestr": np.dtype(dtype).str, "data": (int(ptr), False),
            "strides": strides, "version": 3, "stream": stream}


# typestr -> numpy dtype for what the kernels consume. '<V2' is bfloat16 (module docstring).
_TYPESTR = {
    "f4": np.dtype(np.float32), "f2": np.dtype(np.float16), "i4": np.dtype(np.int32),
    "u4": np.dtype(np.uint32), "u1": np.dtype(np.uint8), "i1": np.dtype(np.int8),
    "i8": np.dtype(np.int64), "f8": np.dtype(np.float64),
}
if BFLOAT16 is not None:
    _TYPESTR["V2"] = BFLOAT16


def parse_cuda_array_interface(cai: Any, name: str = "array"):
    """(ptr, shape, byte strides, numpy dtype, stream) of a __cuda_array_interface__ dict.

    Checks what the kernels rely on: a supported typestr in little-endian or
    byte-order-free form, strides that are multiples of the item size, no mask.
    `strides` None (C-contiguous) is returned as the explicit C strides."""
    if not isinstance(cai, dict):
        raise _err(f"{name}: __cuda_array_interface__ is a {type(cai).__name__}, not a dict")
    for key in ("shape", "typestr", "data"):
        if key not in cai:
            raise _err(f"{name}: __cuda_array_interface__ lacks the required key {key!r}")
    version = cai.get("version", 0)
    if not isinstance(version, int) or version < 0 or version > 3:
        raise _err(f"{name}: __cuda_array_interface__ version {version!r} is not 0..3")
    typestr = cai["typestr"]
    if not isinstance(typestr, str) or len(typestr) < 3 or typestr[0] not in "<|=":
        raise _err(f"{name}: typestr {typestr!r} is not a little-endian ('<', '|', '=') typestr")
    dtype = _TYPESTR.get(typestr[1:])
    if dtype is None:
        raise _err(f"{name}: typestr {typestr!r} is not supported (float32 '<f4', float16 '<f2', "
                   f"bfloat16 '<V2', int32 '<i4', uint32 '<u4', uint8 '|u1')")
    shape = tuple(cai["shape"])
    if not all(isinstance(s, (int, np.integer)) and s >= 0 for s in shape):
        raise _err(f"{name}: shape {shape!r} must be non-negative integers")
    data = cai["data"]
    if not (isinstance(data, tuple) and len(data) == 2):
        raise _err(f"{name}: 'data' must be a (pointer, read_only) tuple, got {data!r}")
    ptr, _read_only = data
    ptr = int(ptr or 0)
    size = math.prod(int(s) for s in shape)
    if ptr == 0 and size > 0:
        raise _err(f"{name}: data pointer is NULL for a non-empty array of shape {shape}")
    if cai.get("mask") is not None:
        raise _err(f"{name}: masked arrays (a 'mask' entry) are not supported")
    strides = cai.get("strides")
    if strides is None:
        strides = _c_strides(shape, dtype.itemsize)
    else:
        strides = tuple(int(s) for s in strides)
        if len(strides) != len(shape):
            raise _err(f"{name}: {len(strides)} strides for a {len(shape)}-D shape {shape}")
        for ax, st in enumerate(strides):
            if st % dtype.itemsize:
                raise _err(f"{name}: stride {st} bytes of axis {ax} is not a multiple of "
                           f"the item size {dtype.itemsize}")
    stream = cai.get("stream") if version >= 3 else None
    if stream == 0:
        raise _err(f"{name}: stream 0 is disallowed by __cuda_array_interface__ v3 "
                   "(1 = legacy default, 2 = per-thread default)")
    return ptr, shape, strides, dtype, (int(stream) if stream is not None else None)


class DeviceArray(_Shaped):
    """Memory allocated with qg_malloc in a context, freed when collected.

    On a GPU context it is device memory with __cuda_array_interface__ v3; on the CPU
    context it is 64-byte-aligned host memory (handy for exercising the device path
    of the API on a machine without a GPU)."""

    def __init__(self, ctx: Context, shape, dtype):
        self.ctx = ctx
        self.shape = tuple(int(s) for s in shape)
        self.dtype = as_dtype(dtype)
        if any(s < 0 for s in self.shape):
            raise _err(f"DeviceArray: negative extent in shape {self.shape}")
        self.nbytes = math.prod(self.shape) * self.dtype.itemsize
        if self.nbytes > _MAX_BYTES:
            raise _err(f"DeviceArray: shape {self.shape} of {dtype_name(self.dtype)} is {self.nbytes} "
                       f"bytes, past the largest allocation (2^63 - 1)")
        self.stream = None           # qg_stream of the last launch that wrote it (None = default)
        self.written_async = False   # a launch wrote it; consumers must order after self.stream
        if self.nbytes == 0:
            self.ptr = 0
            self._finalizer = None
            return
        p = ctypes.c_void_p()
        _lib.qg_malloc(ctx.handle, self.nbytes, ctypes.byref(p))
        self.ptr = int(p.value)
        self._finalizer = weakref.finalize(self, _free, ctx, self.ptr)

    # -- construction
    @classmethod
    def empty(cls, shape, dtype, ctx: Context | None = None) -> "DeviceArray":
        return cls(ctx if ctx is not None else default_context(),
                   (shape,) if isinstance(shape, (int, np.integer)) else shape, dtype)

    @classmethod
    def from_numpy(cls, arr: np.ndarray, ctx: Context | None = None, stream=None) -> "DeviceArray":
        arr = np.asarray(arr)
        if not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr)  # (which would make a 0-d array 1-d)
        out = cls.empty(arr.shape, arr.dtype, ctx)
        if out.nbytes:
            out.ctx_memcpy(out.ptr, arr.ctypes.data, out.nbytes, to_device=True, stream=stream)
            out.ctx.synchronize(stream)
        return out

    def to_numpy(self, stream=None) -> np.ndarray:
        self._live("to_numpy")
        host = np.empty(self.shape, dtype=self.dtype)
        if self.nbytes:
            self.ctx_memcpy(host.ctypes.data, self.ptr, self.nbytes, to_device=False,
                            stream=stream if stream is not None else self.stream)
            self.ctx.synchronize(stream if stream is not None else self.stream)
        return host

    def copy_from_numpy(self, arr: np.ndarray, stream=None) -> None:
        self._live("copy_from_numpy")
        arr = np.ascontiguousarray(arr, dtype=self.dtype)
        if arr.shape != self.shape:
            raise _err(f"copy_from_numpy: shape {arr.shape} differs from the array's {self.shape}")
        if self.nbytes:
            self.ctx_memcpy(self.ptr, arr.ctypes.data, self.nbytes, to_device=True, stream=stream)
            self.ctx.synchronize(stream)

    def fill_bytes(self, value: int, stream=None) -> None:
        """Sets every byte to `value` (qg_memset)."""
        self._live("fill_bytes")
        if self.nbytes:
            _lib.qg_memset(self.ctx.handle, self.ptr, int(value), self.nbytes, stream_handle(stream))
            self.ctx.synchronize(stream)

    def ctx_memcpy(self, dst: int, src: int, nbytes: int, to_device: bool, stream=None) -> None:
        kind = self.ctx.copy_kind(dst_on_device=to_device, src_on_device=not to_device)
        _lib.qg_memcpy(self.ctx.handle, dst, src, nbytes, kind, stream_handle(stream))

    # -- description
    @property
    def strides(self) -> tuple:
        return _c_strides(self.shape, self.dtype.itemsize)

    @property
    def on_device(self) -> bool:
        return self.ctx.is_gpu

    def view(self, shape=None, dtype=None) -> DeviceView:
        """A C-contiguous view of the whole buffer with another shape and/or dtype."""
        self._live("view")
        dt = as_dtype(dtype) if dtype is not None else self.dtype
        shape = self.shape if shape is None else tuple(shape)
        if math.prod(int(s) for s in shape) * dt.itemsize != self.nbytes:
            raise _err(f"view: shape {shape} of {dtype_name(dt)} does not cover {self.nbytes} bytes")
        return DeviceView(self.ptr, shape, dt, None, ctx=self.ctx, on_device=self.on_device,
                          owner=self, stream=self._cai_stream())

    def window(self, row0: int, col0: int, rows: int, cols: int) -> DeviceView:
        """The [rows, cols] sub-matrix at (row0, col0) of a 2-D array, keeping the row
        stride: what an output with guard bands (ldy > n) looks like."""
        self._live("window")
        if self.ndim != 2:
            raise _err(f"window needs a 2-D array, this one has shape {self.shape}")
        R, C = self.shape
        if not (0 <= row0 and row0 + rows <= R and 0 <= col0 and col0 + cols <= C):
            raise _err(f"window rows {row0}..{row0 + rows} cols {col0}..{col0 + cols} "
                       f"exceed shape {self.shape}")
        it = self.dtype.itemsize
        return DeviceView(self.ptr + (row0 * C + col0) * it, (rows, cols), self.dtype,
                          (C * it, it), ctx=self.ctx, on_device=self.on_device, owner=self,
                          stream=self._cai_stream())

    @property
    def __cuda_array_interface__(self) -> dict:
        self._live("__cuda_array_interface__")
        if not self.ctx.is_gpu:
            raise AttributeError("a DeviceArray of a CPU context holds host memory and has no "
                                 "__cuda_array_interface__")
        return _cai(self.ptr, self.shape, self.dtype, None, self._cai_stream())

    # -- DLPack (torch.from_dlpack(y), jax.dlpack, cupy.from_dlpack, np.from_dlpack)
    def __dlpack_device__(self) -> tuple[int, int]:
        from . import dlpack
        if not self.ctx.is_gpu:
            return dlpack.KDL_CPU, 0
        return (dlpack.KDL_ROCM if self.ctx.backend == "hip" else dlpack.KDL_CUDA), self.ctx.device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        """A DLPack capsule of this memory (no copy); the array stays alive until the
        consumer releases it. `stream` is the consumer's (array API): the work that wrote
        the array is made visible there first; a host array takes stream None only."""
        from . import dlpack
        self._live("__dlpack__")
        device = self.__dlpack_device__()
        if dl_device is not None and tuple(int(v) for v in dl_device) != device:
            raise BufferError(f"dl_device={tuple(dl_device)}: this array lives on {device} "
                              "and is exported without a copy")
        if copy:
            raise BufferError("copy=True: a DeviceArray exports its own memory only (copy=None or False)")
        if not self.ctx.is_gpu:
            if stream not in (None, -1):
                raise BufferError(f"stream={stream!r}: host memory takes stream=None")
        else:
            self._order_before(stream, device[0] == dlpack.KDL_ROCM)
        return dlpack.export_capsule(self.ptr, self.shape, self.dtype, self.strides, device, self,
                                     dlpack.wants_versioned(max_version))

    def _order_before(self, stream, rocm: bool) -> None:
        """Makes the launch that wrote this array visible on the consumer's `stream`. There
        is no stream-wait-event in the ABI, so a different stream is ordered by waiting on
        the host for the writer's stream (only when a launch wrote the array since it was
        last synchronised)."""
        if stream == -1 or not self.written_async:
            return
        legacy = 0 if rocm else 1
        consumer = legacy if stream is None else int(stream)
        writer = legacy if self.stream is None else int(self.stream)
        if consumer != writer:
            self.ctx.synchronize(self.stream)

    def __array__(self, dtype=None, copy=None):
        """numpy view of a CPU context's (host) array, without a copy: np.asarray(y).
        Device memory has no host view: use to_numpy()."""
        self._live("__array__")
        if self.ctx.is_gpu:
            raise TypeError("a DeviceArray of a GPU context is device memory; copy it with "
                            ".to_numpy() (or hand it over with torch.from_dlpack / cupy.asarray)")
        from . import dlpack
        arr = dlpack._host_array(self.ptr, self.shape, self.dtype, self.strides, self, False) \
            if self.nbytes else np.empty(self.shape, self.dtype)
        if dtype is not None and np.dtype(dtype) != arr.dtype:
            if copy is False:
                raise ValueError(f"__array__: dtype {dtype} needs a copy of {dtype_name(self.dtype)}")
            return arr.astype(dtype)
        return arr.copy() if copy else arr

    def _cai_stream(self):
        if not self.written_async:
            return None  # from_numpy / copy_from_numpy synchronize: the data is ready
        return self.stream if self.stream is not None else 1

    def __repr__(self) -> str:
        return (f"DeviceArray(shape={self.shape}, dtype={dtype_name(self.dtype)}, "
                f"ctx={self.ctx!r}, ptr={self.ptr:#x})")

    def free(self) -> None:
        """Frees the memory now. The array is dead afterwards: using it raises."""
        if self._finalizer is not None:
            self._finalizer()
        self._finalizer = None
        self.ptr, self.nbytes, self._freed = 0, 0, True

    def _live(self, what: str) -> None:
        if getattr(self, "_freed", False):
            raise _err(f"{what}: this DeviceArray was freed (DeviceArray.free())")


def _free(ctx: Context, ptr: int) -> None:
    try:
        if ctx._handle is not None:
            _lib.qg_free(ctx.handle, ptr)
    except Exception:
        pass
