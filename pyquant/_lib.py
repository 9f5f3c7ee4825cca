"""ctypes mirror of include/quantgemm.h, one to one.

Every enum, struct and function of the header appears here in the header's order, with
the C declaration quoted above its binding; tests/test_lib_mirror.py parses the header
and fails when the two drift apart (names, order, field offsets and sizes).

Functions returning qg_status go through `_check`, attached as the ctypes `errcheck`
of each binding: a non-QG_OK status raises QuantGemmError (InvalidArgumentError, also
a ValueError, for QG_ERR_INVALID_ARGUMENT) whose message is qg_last_error().

Library lookup: $PYQUANT_LIB when set, else libquantgemm.so in a directory of the
pyquant package (where scikit-build-core installs it; an editable install lists both
the install tree and the source tree there). When the library cannot be loaded,
`import pyquant` still works (the numpy reference in pyquant.formats needs no
library) and every binding raises LibraryNotFoundError naming the paths tried. A
library whose version or format version does not match this package fails the import.
"""
from __future__ import annotations

import ctypes
import enum
import os
import sys
from pathlib import Path

from . import __version__ as _package_version

# QG_FORMAT_VERSION this package's packers and readers expect.
EXPECTED_FORMAT_VERSION = 11

if sys.platform == "win32":
    _LIB_NAME = "quantgemm.dll"
elif sys.platform == "darwin":
    _LIB_NAME = "libquantgemm.dylib"
else:
    _LIB_NAME = "libquantgemm.so"


# ---------------------------------------------------------------- errors

class QuantGemmError(Exception):
    """A qg_* call failed. `status` is the qg_status; str(err) is the library's
    qg_last_error() sentence (or the equally precise sentence of a Python-level check)."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        try:
            self.status = Status(status)
        except ValueError:
            self.status = int(status)
        self.message = message

    @property
    def status_name(self) -> str:
        return self.status.name if isinstance(self.status, Status) else f"status {self.status}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status_name}, {self.message!r})"


class InvalidArgumentError(QuantGemmError, ValueError):
    """QG_ERR_INVALID_ARGUMENT: a bad shape, pointer, enum, dtype or alignment."""


class LibraryNotFoundError(QuantGemmError, ImportError):
    """libquantgemm could not be loaded; the message names every path tried."""


# ---------------------------------------------------------------- library loading

def _installed_library() -> Path | None:
    """The library file of the installed pyquant distribution. Needed when this module is
    imported from a source checkout that shadows the installed package (`pip install .`
    then `python -m pyquant ...` in the checkout: the checkout's pyquant/ has no library)."""
    from importlib import metadata
    try:
        files = metadata.distribution("pyquant").files or []
    except metadata.PackageNotFoundError:
        return None
    for f in files:
        if f.name == _LIB_NAME:
            return Path(f.locate()).resolve()
    return None


def _candidate_paths() -> list[Path]:
    env = os.environ.get("PYQUANT_LIB")
    if env:
        return [Path(env)]
    dirs = []
    pkg = sys.modules.get(__package__)
    for d in list(getattr(pkg, "__path__", [])) + [str(Path(__file__).resolve().parent)]:
        p = Path(d)
        if p not in dirs:
            dirs.append(p)
    paths = [d / _LIB_NAME for d in dirs]
    installed = _installed_library()
    if installed is not None and installed not in paths:
        paths.append(installed)
    return paths


def _load():
    tried = []
    for path in _candidate_paths():
        if not path.exists():
            tried.append(f"{path} (no such file)")
            continue
        try:
            return ctypes.CDLL(str(path)), path, ""
        except OSError as e:
            tried.append(f"{path} ({e})")
    how = "PYQUANT_LIB" if os.environ.get("PYQUANT_LIB") else "the pyquant package directories"
    msg = (f"libquantgemm could not be loaded from {how}; tried: " + "; ".join(tried) +
           ". Build it (pip install . or cmake -S . -B build && cmake --build build) and/or "
           "set PYQUANT_LIB=/path/to/" + _LIB_NAME)
    return None, None, msg


_LIB, LIB_PATH, _LOAD_ERROR = _load()


def library_loaded() -> bool:
    return _LIB is not None


def _missing(name):
    def stub(*args, **kwargs):
        raise LibraryNotFoundError(Status.QG_ERR_INTERNAL, f"{name}: {_LOAD_ERROR}")
    stub.__name__ = name
    stub.argtypes = None
    stub.restype = None
    return stub


def _missing_symbol(name):
    def stub(*args, **kwargs):
        raise LibraryNotFoundError(Status.QG_ERR_INTERNAL,
                                   f"{name}: {LIB_PATH} has no such function: the library is older than "
                                   f"pyquant {_package_version}; rebuild it (pip install .) or point "
                                   "PYQUANT_LIB at a matching one")
    stub.__name__ = name
    stub.argtypes = None
    stub.restype = None
    return stub


def _check(status, func=None, args=None):
    """errcheck of every qg_status binding: QG_OK passes, anything else raises.

    ctypes hands an errcheck the qg_status instance itself (a c_int subclass is not
    converted to int), so the value is read here and the binding returns a plain int."""
    status = getattr(status, "value", status)
    if status == Status.QG_OK:
        return status
    message = qg_last_error().decode("utf-8", "replace") if _LIB is not None else ""
    name = getattr(func, "__name__", "qg call")
    if not message:
        message = f"{name} returned {Status(status).name if status in _STATUS_VALUES else status}"
    cls = InvalidArgumentError if status == Status.QG_ERR_INVALID_ARGUMENT else QuantGemmError
    raise cls(status, message)


def _fn(name: str, argtypes: list, restype):
    """Binds `name` with its argtypes and restype; qg_status results go through _check."""
    if _LIB is None:
        return _missing(name)
    try:
        f = getattr(_LIB, name)
    except AttributeError:
        # an older library than this package: the version check below names it; calls fail
        # with the path rather than an AttributeError
        return _missing_symbol(name)
    f.argtypes = argtypes
    f.restype = restype
    if restype is qg_status:
        f.errcheck = _check
    return f


# ---------------------------------------------------------------- macros

# #define QG_VERSION_MAJOR 0
QG_VERSION_MAJOR = 0
# #define QG_VERSION_MINOR 1
QG_VERSION_MINOR = 1
# #define QG_VERSION_PATCH 0
QG_VERSION_PATCH = 0
# #define QG_FORMAT_VERSION 11
QG_FORMAT_VERSION = 11

# ---------------------------------------------------------------- status

# typedef enum qg_status { QG_OK = 0, ... } qg_status;
class Status(enum.IntEnum):
    QG_OK = 0
    QG_ERR_INVALID_ARGUMENT = 1
    QG_ERR_UNSUPPORTED = 2
    QG_ERR_DEVICE = 3
    QG_ERR_OUT_OF_MEMORY = 4
    QG_ERR_INTERNAL = 5


_STATUS_VALUES = {int(s) for s in Status}
# A C enum is an int on every ABI the library supports. qg_status is a distinct c_int
# subclass so that _fn can recognise the functions whose result goes through _check.
class qg_status(ctypes.c_int):
    pass

# QG_API const char* qg_status_string(qg_status status);
qg_status_string = _fn("qg_status_string", [ctypes.c_int], ctypes.c_char_p)
# QG_API const char* qg_last_error(void);
qg_last_error = _fn("qg_last_error", [], ctypes.c_char_p)

# ---------------------------------------------------------------- build

# QG_API int qg_version(void);
qg_version = _fn("qg_version", [], ctypes.c_int)
# QG_API int qg_format_version(void);
qg_format_version = _fn("qg_format_version", [], ctypes.c_int)
# QG_API const char* qg_build_info(void);
qg_build_info = _fn("qg_build_info", [], ctypes.c_char_p)

# ---------------------------------------------------------------- enums

# typedef enum qg_backend { ... } qg_backend;
class Backend(enum.IntEnum):
    QG_BACKEND_CPU = 0
    QG_BACKEND_CUDA = 1
    QG_BACKEND_HIP = 2


# typedef enum qg_dtype { ... } qg_dtype;
class DType(enum.IntEnum):
    QG_DTYPE_F32 = 0
    QG_DTYPE_F16 = 1
    QG_DTYPE_BF16 = 2
    QG_DTYPE_I32 = 3
    QG_DTYPE_U8 = 4
    QG_DTYPE_U4X8 = 5  # int32 words each holding 8 unsigned 4-bit values, nibble i = bits 4i..4i+3


# typedef enum qg_format { ... } qg_format;
class Format(enum.IntEnum):
    QG_FORMAT_INT4 = 0
    QG_FORMAT_Q8_0 = 1
    QG_FORMAT_Q4_0 = 2
    QG_FORMAT_Q4_K = 3
    QG_FORMAT_Q6_K = 4
    QG_FORMAT_IQ4_XS = 5
    QG_FORMAT_IQ3_XXS = 6
    QG_FORMAT_MXFP4 = 7


qg_backend = ctypes.c_int
qg_dtype = ctypes.c_int
qg_format = ctypes.c_int

# QG_API qg_status qg_format_block(qg_format format, int32_t* block_elems, int32_t* block_bytes);
qg_format_block = _fn("qg_format_block",
                      [qg_format, ctypes.POINTER(ctypes.c_int32), ctypes.POINTER(ctypes.c_int32)],
                      qg_status)


# typedef enum qg_activation { ... } qg_activation;
class Activation(enum.IntEnum):
    QG_ACT_SILU_GLU = 0
    QG_ACT_SWIGLU_OAI = 1


# typedef enum qg_gate_up_layout { ... } qg_gate_up_layout;
class GateUpLayout(enum.IntEnum):
    QG_GATE_UP_CONCAT = 0
    QG_GATE_UP_INTERLEAVED = 1


# typedef enum qg_copy_kind { ... } qg_copy_kind;
class CopyKind(enum.IntEnum):
    QG_COPY_HOST_TO_HOST = 0
    QG_COPY_HOST_TO_DEVICE = 1
    QG_COPY_DEVICE_TO_HOST = 2
    QG_COPY_DEVICE_TO_DEVICE = 3


qg_activation = ctypes.c_int
qg_gate_up_layout = ctypes.c_int
qg_copy_kind = ctypes.c_int

# ---------------------------------------------------------------- context

# typedef struct qg_context qg_context;   (opaque: handled as void*)
qg_context_p = ctypes.c_void_p
# typedef void* qg_stream;
qg_stream = ctypes.c_void_p
# typedef struct qg_event qg_event;       (opaque: handled as void*)
qg_event_p = ctypes.c_void_p

# QG_API qg_status qg_device_count(qg_backend backend, int* count);
qg_device_count = _fn("qg_device_count", [qg_backend, ctypes.POINTER(ctypes.c_int)], qg_status)
# QG_API qg_status qg_context_create(qg_backend backend, int device, qg_context** ctx);
qg_context_create = _fn("qg_context_create",
                        [qg_backend, ctypes.c_int, ctypes.POINTER(qg_context_p)], qg_status)
# QG_API qg_status qg_context_destroy(qg_context* ctx);
qg_context_destroy = _fn("qg_context_destroy", [qg_context_p], qg_status)
# QG_API qg_status qg_context_backend(const qg_context* ctx, qg_backend* backend);
qg_context_backend = _fn("qg_context_backend", [qg_context_p, ctypes.POINTER(qg_backend)],
                         qg_status)
# QG_API qg_status qg_context_device_name(const qg_context* ctx, char* buf, size_t buf_size);
qg_context_device_name = _fn("qg_context_device_name",
                             [qg_context_p, ctypes.c_char_p, ctypes.c_size_t], qg_status)
# QG_API qg_status qg_context_set_option(qg_context* ctx, const char* name, int64_t value);
qg_context_set_option = _fn("qg_context_set_option",
                            [qg_context_p, ctypes.c_char_p, ctypes.c_int64], qg_status)
# QG_API qg_status qg_context_set_tier(qg_context* ctx, const char* family, const char* tier);
qg_context_set_tier = _fn("qg_context_set_tier",
                          [qg_context_p, ctypes.c_char_p, ctypes.c_char_p], qg_status)

# ---------------------------------------------------------------- memory, streams, events

# QG_API qg_status qg_malloc(qg_context* ctx, size_t bytes, void** ptr);
qg_malloc = _fn("qg_malloc", [qg_context_p, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p)],
                qg_status)
# QG_API qg_status qg_free(qg_context* ctx, void* ptr);
qg_free = _fn("qg_free", [qg_context_p, ctypes.c_void_p], qg_status)
# QG_API qg_status qg_memcpy(qg_context* ctx, void* dst, const void* src, size_t bytes,
#                            qg_copy_kind kind, qg_stream stream);
qg_memcpy = _fn("qg_memcpy",
                [qg_context_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, qg_copy_kind,
                 qg_stream], qg_status)
# QG_API qg_status qg_memset(qg_context* ctx, void* dst, int value, size_t bytes, qg_stream stream);
qg_memset = _fn("qg_memset",
                [qg_context_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_size_t, qg_stream],
                qg_status)
# QG_API qg_status qg_stream_create(qg_context* ctx, qg_stream* stream);
qg_stream_create = _fn("qg_stream_create", [qg_context_p, ctypes.POINTER(qg_stream)], qg_status)
# QG_API qg_status qg_stream_destroy(qg_context* ctx, qg_stream stream);
qg_stream_destroy = _fn("qg_stream_destroy", [qg_context_p, qg_stream], qg_status)
# QG_API qg_status qg_stream_synchronize(qg_context* ctx, qg_stream stream);
qg_stream_synchronize = _fn("qg_stream_synchronize", [qg_context_p, qg_stream], qg_status)
# QG_API qg_status qg_event_create(qg_context* ctx, qg_event** event);
qg_event_create = _fn("qg_event_create", [qg_context_p, ctypes.POINTER(qg_event_p)], qg_status)
# QG_API qg_status qg_event_destroy(qg_context* ctx, qg_event* event);
qg_event_destroy = _fn("qg_event_destroy", [qg_context_p, qg_event_p], qg_status)
# QG_API qg_status qg_event_record(qg_context* ctx, qg_event* event, qg_stream stream);
qg_event_record = _fn("qg_event_record", [qg_context_p, qg_event_p, qg_stream], qg_status)
# QG_API qg_status qg_event_synchronize(qg_context* ctx, qg_event* event);
qg_event_synchronize = _fn("qg_event_synchronize", [qg_context_p, qg_event_p], qg_status)
# QG_API qg_status qg_event_elapsed_ms(qg_context* ctx, qg_event* start, qg_event* stop, float* ms);
qg_event_elapsed_ms = _fn("qg_event_elapsed_ms",
                          [qg_context_p, qg_event_p, qg_event_p, ctypes.POINTER(ctypes.c_float)],
                          qg_status)


# ---------------------------------------------------------------- W4A16

# typedef enum qg_w4a16_layout { QG_W4A16_LAYOUT_CANONICAL = 0, ... } qg_w4a16_layout;
class W4A16Layout(enum.IntEnum):
    QG_W4A16_LAYOUT_CANONICAL = 0
    QG_W4A16_LAYOUT_FRAG = 1


qg_w4a16_layout = ctypes.c_int


class _Args(ctypes.Structure):
    """Argument structs start with `size_t size`; a fresh one has it set to sizeof."""

    def __init__(self, **fields):
        super().__init__(**fields)
        self.size = ctypes.sizeof(self)


# typedef struct qg_w4a16_gemm_args {
#     size_t size; int64_t m, n, k; int32_t group_size; qg_dtype x_dtype; qg_dtype y_dtype;
#     qg_dtype scale_dtype; qg_dtype zero_dtype; const void* x; int64_t ldx;
#     const int32_t* qweight; const void* scales; const int32_t* qzeros; void* y; int64_t ldy;
#     void* workspace; size_t workspace_bytes; qg_w4a16_layout layout; const void* bias;
#     qg_dtype bias_dtype;
# } qg_w4a16_gemm_args;
class qg_w4a16_gemm_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("group_size", ctypes.c_int32),
        ("x_dtype", qg_dtype),
        ("y_dtype", qg_dtype),
        ("scale_dtype", qg_dtype),
        ("zero_dtype", qg_dtype),
        ("x", ctypes.c_void_p),
        ("ldx", ctypes.c_int64),
        ("qweight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("qzeros", ctypes.c_void_p),
        ("y", ctypes.c_void_p),
        ("ldy", ctypes.c_int64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("layout", qg_w4a16_layout),
        ("bias", ctypes.c_void_p),
        ("bias_dtype", qg_dtype),
    ]


# QG_API qg_status qg_w4a16_gemm_workspace_size(qg_context* ctx, const qg_w4a16_gemm_args* args,
#                                               size_t* bytes);
qg_w4a16_gemm_workspace_size = _fn(
    "qg_w4a16_gemm_workspace_size",
    [qg_context_p, ctypes.POINTER(qg_w4a16_gemm_args), ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_w4a16_gemm(qg_context* ctx, const qg_w4a16_gemm_args* args, qg_stream stream);
qg_w4a16_gemm = _fn("qg_w4a16_gemm",
                    [qg_context_p, ctypes.POINTER(qg_w4a16_gemm_args), qg_stream], qg_status)


# typedef struct qg_w4a16_repack_args {
#     size_t size; qg_w4a16_layout layout; int64_t n, k; int32_t group_size; qg_dtype scale_dtype;
#     const int32_t* qweight; const void* scales; const int32_t* qzeros;
#     void* out_qweight; void* out_scales; void* out_qzeros;
# } qg_w4a16_repack_args;
class qg_w4a16_repack_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("layout", qg_w4a16_layout),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("group_size", ctypes.c_int32),
        ("scale_dtype", qg_dtype),
        ("qweight", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("qzeros", ctypes.c_void_p),
        ("out_qweight", ctypes.c_void_p),
        ("out_scales", ctypes.c_void_p),
        ("out_qzeros", ctypes.c_void_p),
    ]


# QG_API qg_status qg_w4a16_repack_size(const qg_w4a16_repack_args* args, size_t* qweight_bytes,
#                                       size_t* scales_bytes, size_t* qzeros_bytes);
qg_w4a16_repack_size = _fn(
    "qg_w4a16_repack_size",
    [ctypes.POINTER(qg_w4a16_repack_args), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
     ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_w4a16_repack(qg_context* ctx, const qg_w4a16_repack_args* args, qg_stream stream);
qg_w4a16_repack = _fn("qg_w4a16_repack",
                      [qg_context_p, ctypes.POINTER(qg_w4a16_repack_args), qg_stream], qg_status)


# ---------------------------------------------------------------- GGUF

# typedef enum qg_gguf_layout { QG_GGUF_LAYOUT_BLOCKS = 0, QG_GGUF_LAYOUT_FRAG = 1, QG_GGUF_LAYOUT_ROWS8 = 2 } qg_gguf_layout;
class GGUFLayout(enum.IntEnum):
    QG_GGUF_LAYOUT_BLOCKS = 0
    QG_GGUF_LAYOUT_FRAG = 1
    QG_GGUF_LAYOUT_ROWS8 = 2


qg_gguf_layout = ctypes.c_int


# typedef struct qg_gguf_gemm_args {
#     size_t size; qg_format format; int64_t m, n, k; qg_dtype x_dtype; qg_dtype y_dtype;
#     const void* x; int64_t ldx; const void* w; int64_t ldw; void* y; int64_t ldy;
#     void* workspace; size_t workspace_bytes; const void* bias; qg_dtype bias_dtype;
#     const void* w_scales; qg_gguf_layout layout;
# } qg_gguf_gemm_args;
class qg_gguf_gemm_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("format", qg_format),
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("x_dtype", qg_dtype),
        ("y_dtype", qg_dtype),
        ("x", ctypes.c_void_p),
        ("ldx", ctypes.c_int64),
        ("w", ctypes.c_void_p),
        ("ldw", ctypes.c_int64),
        ("y", ctypes.c_void_p),
        ("ldy", ctypes.c_int64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("bias", ctypes.c_void_p),
        ("bias_dtype", qg_dtype),
        ("w_scales", ctypes.c_void_p),
        ("layout", qg_gguf_layout),
    ]


# QG_API qg_status qg_gguf_gemm_workspace_size(qg_context* ctx, const qg_gguf_gemm_args* args,
#                                              size_t* bytes);
qg_gguf_gemm_workspace_size = _fn(
    "qg_gguf_gemm_workspace_size",
    [qg_context_p, ctypes.POINTER(qg_gguf_gemm_args), ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_gguf_gemm(qg_context* ctx, const qg_gguf_gemm_args* args, qg_stream stream);
qg_gguf_gemm = _fn("qg_gguf_gemm",
                   [qg_context_p, ctypes.POINTER(qg_gguf_gemm_args), qg_stream], qg_status)


# typedef struct qg_gguf_repack_args {
#     size_t size; qg_gguf_layout layout; qg_format format; int64_t n, k; const void* w;
#     int64_t ldw; void* out_w; void* out_scales;
# } qg_gguf_repack_args;
class qg_gguf_repack_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("layout", qg_gguf_layout),
        ("format", qg_format),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("w", ctypes.c_void_p),
        ("ldw", ctypes.c_int64),
        ("out_w", ctypes.c_void_p),
        ("out_scales", ctypes.c_void_p),
    ]


# QG_API qg_status qg_gguf_repack_size(const qg_gguf_repack_args* args, size_t* w_bytes, size_t* scales_bytes);
qg_gguf_repack_size = _fn(
    "qg_gguf_repack_size",
    [ctypes.POINTER(qg_gguf_repack_args), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    qg_status)
# QG_API qg_status qg_gguf_repack(qg_context* ctx, const qg_gguf_repack_args* args, qg_stream stream);
qg_gguf_repack = _fn("qg_gguf_repack",
                     [qg_context_p, ctypes.POINTER(qg_gguf_repack_args), qg_stream], qg_status)


# ---------------------------------------------------------------- MXFP4 dense

# typedef enum qg_mxfp4_layout { QG_MXFP4_LAYOUT_CANONICAL = 0, ... } qg_mxfp4_layout;
class MXFP4Layout(enum.IntEnum):
    QG_MXFP4_LAYOUT_CANONICAL = 0
    QG_MXFP4_LAYOUT_FRAG = 1


qg_mxfp4_layout = ctypes.c_int


# typedef struct qg_mxfp4_gemm_args {
#     size_t size; int64_t m, n, k; qg_dtype x_dtype; qg_dtype y_dtype; const void* x;
#     int64_t ldx; const uint8_t* blocks; const uint8_t* scales; const void* bias;
#     qg_dtype bias_dtype; void* y; int64_t ldy; void* workspace; size_t workspace_bytes;
#     qg_mxfp4_layout layout;
# } qg_mxfp4_gemm_args;
class qg_mxfp4_gemm_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("m", ctypes.c_int64),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("x_dtype", qg_dtype),
        ("y_dtype", qg_dtype),
        ("x", ctypes.c_void_p),
        ("ldx", ctypes.c_int64),
        ("blocks", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("bias_dtype", qg_dtype),
        ("y", ctypes.c_void_p),
        ("ldy", ctypes.c_int64),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("layout", qg_mxfp4_layout),
    ]


# QG_API qg_status qg_mxfp4_gemm_workspace_size(qg_context* ctx, const qg_mxfp4_gemm_args* args,
#                                               size_t* bytes);
qg_mxfp4_gemm_workspace_size = _fn(
    "qg_mxfp4_gemm_workspace_size",
    [qg_context_p, ctypes.POINTER(qg_mxfp4_gemm_args), ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_mxfp4_gemm(qg_context* ctx, const qg_mxfp4_gemm_args* args, qg_stream stream);
qg_mxfp4_gemm = _fn("qg_mxfp4_gemm",
                    [qg_context_p, ctypes.POINTER(qg_mxfp4_gemm_args), qg_stream], qg_status)


# typedef struct qg_mxfp4_repack_args {
#     size_t size; qg_mxfp4_layout layout; int64_t n, k; const uint8_t* blocks;
#     const uint8_t* scales; void* out_blocks; void* out_scales;
# } qg_mxfp4_repack_args;
class qg_mxfp4_repack_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("layout", qg_mxfp4_layout),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("blocks", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("out_blocks", ctypes.c_void_p),
        ("out_scales", ctypes.c_void_p),
    ]


# QG_API qg_status qg_mxfp4_repack_size(const qg_mxfp4_repack_args* args, size_t* blocks_bytes,
#                                       size_t* scales_bytes);
qg_mxfp4_repack_size = _fn(
    "qg_mxfp4_repack_size",
    [ctypes.POINTER(qg_mxfp4_repack_args), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    qg_status)
# QG_API qg_status qg_mxfp4_repack(qg_context* ctx, const qg_mxfp4_repack_args* args, qg_stream stream);
qg_mxfp4_repack = _fn("qg_mxfp4_repack",
                      [qg_context_p, ctypes.POINTER(qg_mxfp4_repack_args), qg_stream], qg_status)


# ---------------------------------------------------------------- MXFP4 MoE

# typedef struct qg_moe_align_args {
#     size_t size; int64_t num_tokens; int32_t top_k; int32_t num_experts; int32_t tile_m;
#     const int32_t* topk_ids; int32_t* sorted_ids; int32_t* tile_experts; int32_t* num_sorted;
# } qg_moe_align_args;
class qg_moe_align_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("num_tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int32),
        ("num_experts", ctypes.c_int32),
        ("tile_m", ctypes.c_int32),
        ("topk_ids", ctypes.c_void_p),
        ("sorted_ids", ctypes.c_void_p),
        ("tile_experts", ctypes.c_void_p),
        ("num_sorted", ctypes.c_void_p),
    ]


# QG_API qg_status qg_moe_align_sizes(int64_t num_tokens, int32_t top_k, int32_t num_experts,
#                                     int32_t tile_m, int64_t* max_sorted, int64_t* max_tiles);
qg_moe_align_sizes = _fn(
    "qg_moe_align_sizes",
    [ctypes.c_int64, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
     ctypes.POINTER(ctypes.c_int64), ctypes.POINTER(ctypes.c_int64)], qg_status)
# QG_API qg_status qg_moe_align(qg_context* ctx, const qg_moe_align_args* args, qg_stream stream);
qg_moe_align = _fn("qg_moe_align",
                   [qg_context_p, ctypes.POINTER(qg_moe_align_args), qg_stream], qg_status)


# typedef struct qg_moe_stage1_args {
#     size_t size; int64_t num_tokens; int32_t top_k; int32_t num_experts; int32_t tile_m;
#     int64_t hidden; int64_t intermediate; qg_dtype x_dtype; const void* x; int64_t ldx;
#     const int32_t* sorted_ids; const int32_t* tile_experts; const int32_t* num_sorted;
#     const uint8_t* w13_blocks; const uint8_t* w13_scales; const void* w13_bias;
#     qg_dtype bias_dtype; qg_activation activation; qg_gate_up_layout gate_up_layout;
#     float swiglu_alpha; float swiglu_limit; void* act; qg_mxfp4_layout layout;
#     void* workspace; size_t workspace_bytes;
# } qg_moe_stage1_args;
class qg_moe_stage1_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("num_tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int32),
        ("num_experts", ctypes.c_int32),
        ("tile_m", ctypes.c_int32),
        ("hidden", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("x_dtype", qg_dtype),
        ("x", ctypes.c_void_p),
        ("ldx", ctypes.c_int64),
        ("sorted_ids", ctypes.c_void_p),
        ("tile_experts", ctypes.c_void_p),
        ("num_sorted", ctypes.c_void_p),
        ("w13_blocks", ctypes.c_void_p),
        ("w13_scales", ctypes.c_void_p),
        ("w13_bias", ctypes.c_void_p),
        ("bias_dtype", qg_dtype),
        ("activation", qg_activation),
        ("gate_up_layout", qg_gate_up_layout),
        ("swiglu_alpha", ctypes.c_float),
        ("swiglu_limit", ctypes.c_float),
        ("act", ctypes.c_void_p),
        ("layout", qg_mxfp4_layout),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


# QG_API qg_status qg_moe_stage1_workspace_size(qg_context* ctx, const qg_moe_stage1_args* args, size_t* bytes);
qg_moe_stage1_workspace_size = _fn(
    "qg_moe_stage1_workspace_size",
    [qg_context_p, ctypes.POINTER(qg_moe_stage1_args), ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_moe_stage1(qg_context* ctx, const qg_moe_stage1_args* args, qg_stream stream);
qg_moe_stage1 = _fn("qg_moe_stage1",
                    [qg_context_p, ctypes.POINTER(qg_moe_stage1_args), qg_stream], qg_status)


# typedef struct qg_moe_stage2_args {
#     size_t size; int64_t num_tokens; int32_t top_k; int32_t num_experts; int32_t tile_m;
#     int64_t hidden; int64_t intermediate; qg_dtype act_dtype; const void* act;
#     const int32_t* sorted_ids; const int32_t* tile_experts; const int32_t* num_sorted;
#     const uint8_t* w2_blocks; const uint8_t* w2_scales; const void* w2_bias; qg_dtype bias_dtype;
#     const float* topk_weights; qg_dtype y_dtype; void* y; int64_t ldy; qg_mxfp4_layout layout;
#     void* workspace; size_t workspace_bytes;
# } qg_moe_stage2_args;
class qg_moe_stage2_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("num_tokens", ctypes.c_int64),
        ("top_k", ctypes.c_int32),
        ("num_experts", ctypes.c_int32),
        ("tile_m", ctypes.c_int32),
        ("hidden", ctypes.c_int64),
        ("intermediate", ctypes.c_int64),
        ("act_dtype", qg_dtype),
        ("act", ctypes.c_void_p),
        ("sorted_ids", ctypes.c_void_p),
        ("tile_experts", ctypes.c_void_p),
        ("num_sorted", ctypes.c_void_p),
        ("w2_blocks", ctypes.c_void_p),
        ("w2_scales", ctypes.c_void_p),
        ("w2_bias", ctypes.c_void_p),
        ("bias_dtype", qg_dtype),
        ("topk_weights", ctypes.c_void_p),
        ("y_dtype", qg_dtype),
        ("y", ctypes.c_void_p),
        ("ldy", ctypes.c_int64),
        ("layout", qg_mxfp4_layout),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
    ]


# QG_API qg_status qg_moe_stage2_workspace_size(qg_context* ctx, const qg_moe_stage2_args* args, size_t* bytes);
qg_moe_stage2_workspace_size = _fn(
    "qg_moe_stage2_workspace_size",
    [qg_context_p, ctypes.POINTER(qg_moe_stage2_args), ctypes.POINTER(ctypes.c_size_t)], qg_status)
# QG_API qg_status qg_moe_stage2(qg_context* ctx, const qg_moe_stage2_args* args, qg_stream stream);
qg_moe_stage2 = _fn("qg_moe_stage2",
                    [qg_context_p, ctypes.POINTER(qg_moe_stage2_args), qg_stream], qg_status)


# typedef struct qg_moe_repack_args {
#     size_t size; qg_mxfp4_layout layout; int32_t num_experts; int32_t parts;
#     qg_gate_up_layout gate_up_layout; int64_t n, k; const uint8_t* blocks; const uint8_t* scales;
#     void* out_blocks; void* out_scales;
# } qg_moe_repack_args;
class qg_moe_repack_args(_Args):
    _fields_ = [
        ("size", ctypes.c_size_t),
        ("layout", qg_mxfp4_layout),
        ("num_experts", ctypes.c_int32),
        ("parts", ctypes.c_int32),
        ("gate_up_layout", qg_gate_up_layout),
        ("n", ctypes.c_int64),
        ("k", ctypes.c_int64),
        ("blocks", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("out_blocks", ctypes.c_void_p),
        ("out_scales", ctypes.c_void_p),
    ]


# QG_API qg_status qg_moe_repack_size(const qg_moe_repack_args* args, size_t* blocks_bytes, size_t* scales_bytes);
qg_moe_repack_size = _fn(
    "qg_moe_repack_size",
    [ctypes.POINTER(qg_moe_repack_args), ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)],
    qg_status)
# QG_API qg_status qg_moe_repack(qg_context* ctx, const qg_moe_repack_args* args, qg_stream stream);
qg_moe_repack = _fn("qg_moe_repack",
                    [qg_context_p, ctypes.POINTER(qg_moe_repack_args), qg_stream], qg_status)


# ---------------------------------------------------------------- import-time checks

def _version_tuple(v: int) -> tuple[int, int, int]:
    return v // 10000, (v // 100) % 100, v % 100


def _check_versions() -> None:
    lib_version = _version_tuple(qg_version())
    want = tuple(int(p) for p in _package_version.split(".")[:2])
    if lib_version[:2] != want:
        raise ImportError(
            f"{LIB_PATH} is libquantgemm {'.'.join(map(str, lib_version))} but pyquant "
            f"{_package_version} needs {want[0]}.{want[1]}.x; rebuild the library or point "
            "PYQUANT_LIB at a matching one")
    fmt = qg_format_version()
    if fmt != EXPECTED_FORMAT_VERSION:
        raise ImportError(
            f"{LIB_PATH} has format version {fmt} but pyquant packs weights in format version "
            f"{EXPECTED_FORMAT_VERSION}; rebuild the library or point PYQUANT_LIB at a matching one")


if _LIB is not None:
    _check_versions()


def require_library() -> None:
    """Raises LibraryNotFoundError (naming the paths tried) when the library is missing."""
    if _LIB is None:
        raise LibraryNotFoundError(Status.QG_ERR_INTERNAL, _LOAD_ERROR)


def last_error() -> str:
    return qg_last_error().decode("utf-8", "replace")
