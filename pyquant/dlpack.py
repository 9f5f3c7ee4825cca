"""DLPack both ways, with ctypes only (no torch, CuPy or JAX needed to import pyquant).

DLPack (dmlc/dlpack `include/dlpack/dlpack.h`, and the array API's `__dlpack__` /
`__dlpack_device__` protocol) is how torch, JAX, CuPy and numpy exchange arrays. A
producer's `__dlpack__(stream=..., max_version=...)` returns a PyCapsule named "dltensor"
(DLManagedTensor, DLPack < 1.0) or "dltensor_versioned" (DLManagedTensorVersioned, 1.0+)
that owns one reference to the memory; the consumer renames it "used_dltensor[_versioned]"
and calls the struct's deleter when it is done with the memory.

  import_array(obj, name, stream) -> numpy array (host memory: CPU, CUDA-pinned) or
      DeviceView (device memory: CUDA, ROCm, CUDA-managed); either keeps the capsule's
      memory alive and calls the deleter when it is collected. bfloat16 comes in as
      ml_dtypes.bfloat16 (numpy's own from_dlpack refuses it).
  export_capsule(...) -> the capsule of a DeviceArray's __dlpack__; the array stays alive
      until the consumer calls the deleter (or the capsule dies unconsumed).

Streams (array API, `__dlpack__`): the consumer passes the stream it will use the memory
on; on CUDA None is not allowed through, 1 is the legacy default stream, 2 the
per-thread default, -1 "no synchronisation"; on ROCm 0 is the default stream. The
producer makes its work visible on that stream before returning the capsule.
"""
from __future__ import annotations

import ctypes
import threading
from typing import Any

import numpy as np

from .device import BFLOAT16, DeviceView, _c_strides, _err, dtype_name

# DLDeviceType (dlpack.h). Host memory is what the CPU tier can read through a pointer.
KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_ROCM, KDL_ROCM_HOST, KDL_CUDA_MANAGED = 1, 2, 3, 10, 11, 13
_HOST_DEVICES = {KDL_CPU: "cpu", KDL_CUDA_HOST: "cuda_host", KDL_ROCM_HOST: "rocm_host"}
_GPU_DEVICES = {KDL_CUDA: "cuda", KDL_CUDA_MANAGED: "cuda", KDL_ROCM: "hip"}
_DEVICE_NAMES = {1: "CPU", 2: "CUDA", 3: "CUDAHost", 4: "OpenCL", 7: "Vulkan", 8: "Metal",
                 9: "VPI", 10: "ROCm", 11: "ROCmHost", 12: "ExtDev", 13: "CUDAManaged",
                 14: "OneAPI", 15: "WebGPU", 16: "Hexagon", 17: "MAIA"}
_LEGACY_DEFAULT_STREAM = {KDL_CUDA: 1, KDL_CUDA_MANAGED: 1, KDL_ROCM: 0}

# DLDataTypeCode (dlpack.h) x bits -> numpy dtype, for what the kernels and weights read.
_INT, _UINT, _FLOAT, _BFLOAT, _BOOL = 0, 1, 2, 4, 6
_DTYPES = {(_FLOAT, 16): np.dtype(np.float16), (_FLOAT, 32): np.dtype(np.float32),
           (_FLOAT, 64): np.dtype(np.float64), (_INT, 8): np.dtype(np.int8),
           (_INT, 16): np.dtype(np.int16), (_INT, 32): np.dtype(np.int32),
           (_INT, 64): np.dtype(np.int64), (_UINT, 8): np.dtype(np.uint8),
           (_UINT, 16): np.dtype(np.uint16), (_UINT, 32): np.dtype(np.uint32),
           (_UINT, 64): np.dtype(np.uint64), (_BOOL, 8): np.dtype(np.bool_)}
if BFLOAT16 is not None:
    _DTYPES[(_BFLOAT, 16)] = BFLOAT16
_CODES = {dt: key for key, dt in _DTYPES.items()}

FLAG_READ_ONLY = 1  # DLPACK_FLAG_BITMASK_READ_ONLY
DLPACK_VERSION = (1, 0)


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p),
                ("device", DLDevice),
                ("ndim", ctypes.c_int32),
                ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)),   # in elements; NULL = C order
                ("byte_offset", ctypes.c_uint64)]


_DELETER = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", _DELETER)]


class DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("version", DLPackVersion), ("manager_ctx", ctypes.c_void_p),
                ("deleter", _DELETER), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


# The capsule API through the C API of the running interpreter. Capsules are passed as
# raw PyObject* (c_void_p) where a destructor sees one that is being deallocated.
_api = ctypes.pythonapi
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_New.restype = ctypes.py_object
_CAPSULE_DESTRUCTOR = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _CAPSULE_DESTRUCTOR]
_raw_is_valid = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_IsValid", _api))
_raw_get_pointer = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", _api))

# Capsule names: PyCapsule_SetName keeps the pointer, so they must outlive every capsule.
_NAMES = {False: ctypes.create_string_buffer(b"dltensor"),
          True: ctypes.create_string_buffer(b"dltensor_versioned")}
_USED = {False: ctypes.create_string_buffer(b"used_dltensor"),
         True: ctypes.create_string_buffer(b"used_dltensor_versioned")}


# ---------------------------------------------------------------- import (consumer)

class _Imported:
    """One consumed capsule: calls the producer's deleter when collected."""

    def __init__(self, managed: int, deleter):
        self._managed, self._deleter = managed, deleter

    def __del__(self):
        if self._deleter and self._managed:
            try:
                self._deleter(self._managed)
            except Exception:  # interpreter shutdown: nothing left to report to
                pass
            self._managed = None


class _HostBuffer:
    """__array_interface__ over the bytes of an imported host tensor: the numpy arrays
    built on it keep it (and so the producer's memory) alive."""

    def __init__(self, address: int, nbytes: int, owner: _Imported):
        self.__array_interface__ = {"data": (address, False), "shape": (nbytes,),
                                    "typestr": "|u1", "version": 3}
        self.owner = owner


def device_of(obj: Any, name: str) -> tuple[int, int]:
    """(DLDeviceType, device id) of an object with __dlpack__."""
    get = getattr(obj, "__dlpack_device__", None)
    if get is None:
        return KDL_CPU, 0  # producers before the device query were host-only (numpy < 1.22)
    try:
        dev_type, dev_id = get()
    except Exception as e:
        raise _err(f"{name}: __dlpack_device__() failed: {type(e).__name__}: {e}") from None
    return int(dev_type), int(dev_id)


def _describe_device(dev_type: int) -> str:
    return f"{_DEVICE_NAMES.get(dev_type, 'unknown')} ({dev_type})"


def import_array(obj: Any, name: str, stream: int | None = None):
    """A numpy array (host memory) or DeviceView (device memory) of an object with
    __dlpack__. `stream`: the qg_stream the caller will use the memory on (None: the
    legacy default stream); the producer is asked to order its work before it."""
    dev_type, dev_id = device_of(obj, name)
    if dev_type in _HOST_DEVICES:
        kwargs = {"stream": None}
    elif dev_type in _GPU_DEVICES:
        kwargs = {"stream": _LEGACY_DEFAULT_STREAM[dev_type] if stream is None else int(stream)}
    else:
        raise _err(f"{name} lives on DLPack device {_describe_device(dev_type)}; pyquant reads "
                   "host memory (CPU, CUDAHost, ROCmHost) and CUDA / ROCm device memory")
    try:
        try:
            capsule = obj.__dlpack__(max_version=DLPACK_VERSION, **kwargs)
        except TypeError:  # a producer older than DLPack 1.0 takes no max_version
            capsule = obj.__dlpack__(**kwargs)
    except (BufferError, RuntimeError, TypeError, ValueError) as e:
        raise _err(f"{name}: {type(obj).__name__}.__dlpack__() refused to export it: "
                   f"{type(e).__name__}: {e}") from None
    return _consume(capsule, name, dev_type)


def _consume(capsule, name: str, dev_type: int):
    versioned = bool(_api.PyCapsule_IsValid(capsule, _NAMES[True]))
    if not versioned and not _api.PyCapsule_IsValid(capsule, _NAMES[False]):
        raise _err(f"{name}: __dlpack__() returned {type(capsule).__name__}, not an unused "
                   "'dltensor' or 'dltensor_versioned' capsule")
    ptr = _api.PyCapsule_GetPointer(capsule, _NAMES[versioned])
    if versioned:
        managed = DLManagedTensorVersioned.from_address(ptr)
        if managed.version.major != DLPACK_VERSION[0]:
            raise _err(f"{name}: DLPack version {managed.version.major}.{managed.version.minor} "
                       f"is not {DLPACK_VERSION[0]}.x (its capsule is left to its producer)")
        read_only = bool(managed.flags & FLAG_READ_ONLY)
    else:
        managed = DLManagedTensor.from_address(ptr)
        read_only = False
    # From here the memory is ours to release: the capsule no longer frees it.
    _api.PyCapsule_SetName(capsule, _USED[versioned])
    owner = _Imported(ptr, managed.deleter if ctypes.cast(managed.deleter, ctypes.c_void_p).value else None)
    t = managed.dl_tensor
    if t.dtype.lanes != 1 or (t.dtype.code, t.dtype.bits) not in _DTYPES:
        raise _err(f"{name} has DLPack dtype code {t.dtype.code} bits {t.dtype.bits} lanes "
                   f"{t.dtype.lanes}; pyquant reads float16, bfloat16, float32 and integer arrays")
    dtype = _DTYPES[(t.dtype.code, t.dtype.bits)]
    shape = tuple(int(t.shape[i]) for i in range(t.ndim))
    if any(s < 0 for s in shape):
        raise _err(f"{name}: DLPack shape {shape} has a negative extent")
    if t.strides:
        strides = tuple(int(t.strides[i]) * dtype.itemsize for i in range(t.ndim))
    else:
        strides = _c_strides(shape, dtype.itemsize)
    address = (t.data or 0) + int(t.byte_offset)
    if dev_type in _GPU_DEVICES:
        v = DeviceView(address, shape, dtype, strides, ctx=None, on_device=True, owner=owner)
        v.device = (_GPU_DEVICES[dev_type], int(t.device.device_id))
        v.read_only = read_only
        return v
    return _host_array(address, shape, dtype, strides, owner, read_only)


def _host_array(address: int, shape, dtype: np.dtype, strides, owner, read_only: bool) -> np.ndarray:
    """numpy view of host memory at `address` (byte strides, possibly negative or zero)."""
    if 0 in shape:
        return np.empty(shape, dtype)
    lo = sum(min(0, (n - 1) * s) for n, s in zip(shape, strides))
    hi = sum(max(0, (n - 1) * s) for n, s in zip(shape, strides)) + dtype.itemsize
    raw = np.asarray(_HostBuffer(address + lo, hi - lo, owner))
    arr = np.ndarray(shape, dtype, buffer=raw, offset=-lo, strides=strides)
    if read_only:
        arr.flags.writeable = False
    return arr


# ---------------------------------------------------------------- export (producer)

# manager_ctx -> what one exported capsule keeps alive (the array and the ctypes structs),
# until the consumer calls the deleter or the unconsumed capsule is destroyed.
_exported: dict[int, tuple] = {}
_exported_lock = threading.Lock()


def _release(managed: int | None) -> None:
    if managed:
        with _exported_lock:
            _exported.pop(managed, None)


_deleter = _DELETER(_release)


def _destroy_capsule(capsule: int | None) -> None:
    """Capsule destructor: a capsule that was never consumed still owns its memory."""
    try:
        for versioned in (False, True):
            if _raw_is_valid(capsule, _NAMES[versioned]):
                _release(_raw_get_pointer(capsule, _NAMES[versioned]))
                return
    except Exception:
        pass


_capsule_destructor = _CAPSULE_DESTRUCTOR(_destroy_capsule)


def exported_count() -> int:
    """Capsules exported and not yet released by their consumer (tests check leaks)."""
    with _exported_lock:
        return len(_exported)


def export_capsule(ptr: int, shape, dtype, strides, device: tuple[int, int], keep: Any,
                   versioned: bool, read_only: bool = False):
    """A DLPack capsule over memory that `keep` owns (it stays alive until released)."""
    dtype = np.dtype(dtype)
    if dtype not in _CODES:
        raise BufferError(f"dtype {dtype_name(dtype)} has no DLPack code here")
    code, bits = _CODES[dtype]
    ndim = len(shape)
    c_shape = (ctypes.c_int64 * max(ndim, 1))(*shape)
    c_strides = (ctypes.c_int64 * max(ndim, 1))(*(s // dtype.itemsize for s in strides))
    managed = DLManagedTensorVersioned() if versioned else DLManagedTensor()
    t = managed.dl_tensor
    t.data = ptr or None
    t.device = DLDevice(*device)
    t.ndim = ndim
    t.dtype = DLDataType(code, bits, 1)
    t.shape = ctypes.cast(c_shape, ctypes.POINTER(ctypes.c_int64))
    t.strides = ctypes.cast(c_strides, ctypes.POINTER(ctypes.c_int64))
    t.byte_offset = 0
    address = ctypes.addressof(managed)
    managed.manager_ctx = address
    managed.deleter = _deleter
    if versioned:
        managed.version = DLPackVersion(*DLPACK_VERSION)
        managed.flags = FLAG_READ_ONLY if read_only else 0
    with _exported_lock:
        _exported[address] = (keep, managed, c_shape, c_strides)
    return _api.PyCapsule_New(address, _NAMES[versioned], _capsule_destructor)


def wants_versioned(max_version) -> bool:
    """True when the consumer's max_version admits DLPack 1.0 (the versioned capsule)."""
    if max_version is None:
        return False
    try:
        return tuple(int(v) for v in max_version)[:1] >= (DLPACK_VERSION[0],)
    except (TypeError, ValueError):
        raise BufferError(f"max_version={max_version!r} is not a (major, minor) tuple") from None
