"""The Python entry points: formats, build_info, quantize, from_gguf, from_mxfp4, gemm, moe.

Where an operation runs follows from where its operands live:
  - numpy operands -> the CPU context (CPU tier), numpy result;
  - pyquant DeviceArrays -> their context, DeviceArray result;
  - foreign device arrays (__cuda_array_interface__ first, else __dlpack__: CuPy, torch,
    JAX, Numba) -> the GPU context (`ctx` or pyquant.gpu_context()), DeviceArray result
    unless `out` is given;
  - foreign host arrays with __dlpack__ (a torch CPU tensor, a JAX CPU array) -> the CPU
    context, a host DeviceArray result (it exports __dlpack__: torch.from_dlpack(y)).
Host and device operands are never mixed silently: nothing is copied behind the
caller's back, a mix-up is an InvalidArgumentError naming the operands.

Activations are [..., K] like every framework's linear layer: the leading axes are the
rows M of the C call (they must collapse into evenly spaced rows in place, which numpy
arrays are copied to when they do not) and the result is [..., N].

When `stream` is None and x carries a CAI v3 stream, the launch goes on that stream, so
the kernels are ordered after the producer's work without a device-wide sync. DLPack
operands are handed the launch stream (None: the legacy default stream), on which their
producer orders its own work.
"""
from __future__ import annotations

import ctypes
import math
from typing import Any

import numpy as np

from . import _lib
from . import dlpack as _dlpack
from . import formats as _formats
from . import progress as _progress
from .formats import mxfp4 as _mxfp4
from ._lib import Activation, DType, GateUpLayout, QuantGemmError
from .device import (Context, DeviceArray, DeviceView, _err, as_dtype, cpu_context, default_context, dtype_name,
                     gpu_context, qg_dtype_of, stream_handle)
from .weights import GGUFWeight, Int4Weight, MXFP4Weight, SCALE_QG_DTYPE, _format_spec, _require_contiguous

_ACT_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), as_dtype("bfloat16"))
# What each entry point takes as activations (x), as the library checks it: the text of a
# refusal names the set of the entry point at hand, never a dtype it would then refuse.
_X_DTYPES_TEXT = {Int4Weight: "float16 or bfloat16 (W4A16)",
                  GGUFWeight: "float16, bfloat16 or float32 (GGUF)",
                  MXFP4Weight: "float16, bfloat16 or float32 (MXFP4)"}


def formats() -> list[str]:
    """Registered format names: "int4", "q8_0", "q4_0", "q4_K", "q6_K", "iq4_xs", "iq3_xxs", "mxfp4"."""
    return _formats.names()


def build_info() -> str:
    """Backends and tiers compiled into the loaded library (qg_build_info)."""
    _lib.require_library()
    return _lib.qg_build_info().decode()


# ---------------------------------------------------------------- constructors

def quantize(W: np.ndarray, fmt: str, progress: bool | None = None, **kw):
    """Reference quantizer (numpy) for every format.

    int4: kw group_size=128, symmetric=False, scale_dtype="bf16" -> Int4Weight;
    GGUF formats -> GGUFWeight; mxfp4 -> MXFP4Weight (W [N, K] or stacked [E, N, K]).
    progress: a line on stderr while a large W is quantized (in slices of rows, which
    gives the same bits: every format quantizes each row on its own); None shows it on a
    terminal for 256 MiB of W and more (pyquant.progress)."""
    spec = _format_spec(fmt)
    W = np.asarray(W)
    if spec.kind == "int4":
        group_size = kw.get("group_size", 128)
        try:
            parts = _by_rows(W, lambda part: spec.module.quantize(part, **kw), progress, spec.name,
                             row_multiple=8)  # qzeros pack 8 rows per word
        except (ValueError, TypeError) as e:
            raise _err(str(e)) from None
        qweight, scales = (np.concatenate([p[i] for p in parts]) for i in (0, 1))
        qzeros = None if parts[0][2] is None else np.concatenate([p[2] for p in parts])
        return Int4Weight(qweight, scales, qzeros, group_size)
    if kw:
        raise _err(f"quantize({spec.name!r}) takes no options, got {sorted(kw)}")
    if spec.kind == "mxfp4":
        if W.ndim not in (2, 3) or 0 in W.shape:
            raise _err(f"W must be [N, K] or stacked [E, N, K] with no empty axis for mxfp4, "
                       f"got shape {W.shape}")
        try:
            parts = _by_rows(W, spec.module.quantize, progress, spec.name)
        except (ValueError, TypeError) as e:
            raise _err(str(e)) from None
        return MXFP4Weight(*(np.concatenate([p[i] for p in parts]) for i in (0, 1)))
    if W.ndim != 2 or 0 in W.shape:
        raise _err(f"W must be 2-D [N, K] with N, K > 0 for {spec.name}, got shape {W.shape}")
    try:
        parts = _by_rows(W, lambda part: spec.module.quantize(part.astype(np.float32)), progress,
                         spec.name)
    except (ValueError, TypeError) as e:
        raise _err(str(e)) from None
    return GGUFWeight(spec.name, np.concatenate(parts), shape=W.shape)


# Rows per slice of a quantize() that shows progress: about 64 MiB of float32 W each.
_QUANTIZE_SLICE_BYTES = 64 << 20


def _by_rows(W: np.ndarray, quantize_rows, progress, name: str, row_multiple: int = 1) -> list:
    """quantize_rows over slices of W's first axis (one slice when no progress is shown,
    or when the rows do not split into multiples of row_multiple: the quantizer then
    names the condition itself)."""
    bar = _progress_for(W.size * 4, f"quantize {name} {list(W.shape)}", progress)
    row_bytes = max(1, W[0].size * 4) if W.shape[0] else 1
    rows = max(row_multiple, _QUANTIZE_SLICE_BYTES // row_bytes // row_multiple * row_multiple)
    if bar is None or W.shape[0] % row_multiple:
        return [quantize_rows(W)]
    parts = []
    for r0 in range(0, W.shape[0], rows):
        parts.append(quantize_rows(W[r0:r0 + rows]))
        bar.step(f"rows {r0}..{min(r0 + rows, W.shape[0])}", W[r0:r0 + rows].size * 4)
    bar.close()
    return parts


def _progress_for(nbytes: int, title: str, progress):
    bar = _progress.for_work(nbytes, title, progress)
    return None if isinstance(bar, _progress._Silent) else bar


def from_gguf(fmt: str, raw, shape=None):
    """Weight from raw GGUF block bytes [N, row_bytes] (or flat with shape=(N, K)).

    GGUF's own "mxfp4" block (17 bytes: E8M0 byte, then 16 bytes with elements 0..15 in
    the low nibbles and 16..31 in the high ones) is repacked once, on the host, into the
    OCP layout the kernels read (formats.mxfp4.from_gguf_blocks): an MXFP4Weight."""
    spec = _format_spec(fmt)
    if spec.kind == "gguf":
        return GGUFWeight(spec.name, raw, shape)
    if spec.kind == "mxfp4":
        if not isinstance(raw, (np.ndarray, bytes, bytearray, memoryview)):
            raise _err("from_gguf('mxfp4', ...) repacks on the host: pass raw as a numpy array "
                       "and move the result with .to_device()")
        raw = np.asarray(np.frombuffer(raw, np.uint8) if not isinstance(raw, np.ndarray) else raw)
        if raw.dtype != np.uint8:
            raise _err(f"raw has dtype {raw.dtype}; expected uint8 GGUF block bytes")
        if shape is not None:
            n, k = (int(s) for s in shape)
            if k % 32:
                raise _err(f"k={k} is not a multiple of the MXFP4 block size 32")
            if raw.size != n * (k // 32) * spec.block_bytes:
                raise _err(f"raw holds {raw.size} bytes; mxfp4 shape ({n}, {k}) needs "
                           f"N * (K/32) * 17 = {n * (k // 32) * spec.block_bytes}")
            raw = raw.reshape(n, (k // 32) * spec.block_bytes)
        try:
            blocks, scales = _mxfp4.from_gguf_blocks(raw)
        except ValueError as e:
            raise _err(str(e)) from None
        return MXFP4Weight(blocks, scales)
    raise _err(f"{spec.name!r} is not a GGUF format; use pyquant.Int4Weight or pyquant.quantize")


def from_mxfp4(blocks, scales, bias=None) -> MXFP4Weight:
    """OCP MXFP4 (GPT-OSS checkpoints): blocks [N, K/32, 16] and scales [N, K/32] uint8
    (stacked experts [E, N, K/32, 16] / [E, N, K/32]), optional bias."""
    return MXFP4Weight(blocks, scales, bias)


# ---------------------------------------------------------------- operands

def _needs_copy(a: np.ndarray) -> bool:
    """A 2-D numpy array the C ABI cannot take as it is: columns not unit-strided, rows
    not at a positive stride of whole elements that clears the row before (broadcast,
    overlapping or reversed rows), or data not aligned to its element size."""
    if a.ndim != 2 or a.size == 0:
        return False
    rows, cols = a.shape
    rs, cs = a.strides
    if cols > 1 and cs != a.itemsize:
        return True
    if rows > 1 and (rs < cols * a.itemsize or rs % a.itemsize):
        return True
    return rs < 0 or not a.flags.aligned


def _foreign(obj: Any, name: str, stream=None):
    """An object with __dlpack__ and no __cuda_array_interface__ (torch CPU tensors, JAX,
    a CuPy array seen through DLPack) as a numpy array (host memory) or DeviceView
    (device memory); anything else unchanged."""
    if isinstance(obj, (np.ndarray, DeviceArray, DeviceView)) or \
            hasattr(obj, "__cuda_array_interface__") or not hasattr(obj, "__dlpack__"):
        return obj
    return _dlpack.import_array(obj, name, stream)


def _operand(obj: Any, name: str, allow_copy: bool = True, stream=None) -> DeviceView:
    """DeviceView of an operand. numpy arrays the C ABI cannot take as they are
    (_needs_copy) are copied (host, harmless) when allow_copy; outputs never are (the
    result would land in the copy). `stream`: the launch's, for DLPack producers."""
    obj = _foreign(obj, name, stream)
    if isinstance(obj, DeviceView):
        return obj
    if isinstance(obj, DeviceArray):
        obj._live(name)
        return obj.view()
    if isinstance(obj, np.ndarray):
        if _needs_copy(obj):
            if not allow_copy:
                raise _err(f"{name} must have unit stride along its columns, rows that do not "
                           f"overlap at a positive stride of whole elements, and aligned data "
                           f"(shape {obj.shape}, strides {obj.strides} bytes, "
                           f"aligned={obj.flags.aligned}): it is written in place, not copied")
            obj = np.require(obj, requirements=["C", "A"])  # copies a misaligned C-contiguous one too
        return DeviceView(obj.ctypes.data, obj.shape, obj.dtype, obj.strides, ctx=None,
                          on_device=False, owner=obj)
    if hasattr(obj, "__cuda_array_interface__"):
        return DeviceView.from_object(obj, name)
    raise _err(f"{name} must be a numpy array, a pyquant.DeviceArray or an object with "
               f"__cuda_array_interface__ or __dlpack__; got {type(obj).__name__}")


def _rows(obj: Any, name: str, axis: str, allow_copy: bool = True, stream=None):
    """(2-D DeviceView [M, last], leading shape) of an operand [..., last]: M is the
    product of the leading axes (1 for a vector). numpy arrays are reshaped (a copy where
    the axes do not collapse, inputs only); other memory must collapse in place."""
    obj = _foreign(obj, name, stream)
    v = None if isinstance(obj, np.ndarray) else _operand(obj, name, allow_copy, stream)
    shape = tuple(obj.shape if v is None else v.shape)
    if len(shape) == 0:
        raise _err(f"{name} must have at least one axis [..., {axis}], got a 0-d array")
    lead, last = shape[:-1], int(shape[-1])
    rows = math.prod(lead)
    if v is None:
        if allow_copy:
            flat = obj.reshape(rows, last)
        else:
            flat = obj.view()
            try:
                flat.shape = (rows, last)  # raises where reshape would have to copy
            except AttributeError:
                raise _err(f"{name} has shape {shape} and strides {obj.strides} bytes: its leading "
                           f"axes do not collapse into rows [{rows}, {last}] in place, and it is "
                           "written in place, not copied") from None
        if not allow_copy and not obj.flags.writeable:
            raise _err(f"{name} is a read-only array")
        return _operand(flat, name, allow_copy), lead
    if not allow_copy and v.read_only:
        raise _err(f"{name} is read-only memory (its producer flagged it so)")
    return _collapse_rows(v, name, rows, last), lead


def _collapse_rows(v: DeviceView, name: str, rows: int, last: int) -> DeviceView:
    """The [rows, last] view of a [..., last] DeviceView: its leading axes must step by
    one row stride (each axis's stride = the next axis's extent x its stride; extent-1
    axes do not count), since the C ABI takes one row stride and device memory is never
    copied behind the caller's back."""
    if len(v.shape) == 2:
        return v
    it = v.dtype.itemsize
    lead = [(n, st) for n, st in zip(v.shape[:-1], v.strides[:-1]) if n != 1]
    col_stride = v.strides[-1]
    row_stride = lead[-1][1] if lead else last * it
    for (_, outer), (n_in, inner) in zip(lead, lead[1:]):
        if outer != n_in * inner:
            raise _err(f"{name} has shape {v.shape} and strides {v.strides} bytes: its leading "
                       f"axes do not collapse into evenly spaced rows [{rows}, {last}], which the "
                       "C ABI needs (one row stride) and device memory is not copied for: pass "
                       "a contiguous array (x.contiguous(), cupy.ascontiguousarray)")
    out = DeviceView(v.ptr, (rows, last), v.dtype, (row_stride, col_stride), ctx=v.ctx,
                     on_device=v.on_device, owner=v, stream=v.stream)
    out.device, out.read_only = v.device, v.read_only
    return out


def _weight_operands(w) -> dict:
    return {f"w.{n}": _operand(a, f"w.{n}") for n, a in w._components().items()}


def _pick_context(operands: dict, ctx: Context | None) -> Context:
    """The context that runs a call, from where its operands live (module docstring)."""
    host = [n for n, v in operands.items() if not v.on_device]
    dev = [n for n, v in operands.items() if v.on_device]
    if host and dev:
        raise _err(f"{', '.join(host)} in host memory but {', '.join(dev)} in device memory; "
                   "move them together (pyquant.DeviceArray.from_numpy, weight.to_device(ctx))")
    ctxs = {}
    for n, v in operands.items():
        if v.ctx is not None:
            ctxs.setdefault(id(v.ctx), (v.ctx, n))
    if len(ctxs) > 1:
        desc = ", ".join(f"{n} in {c!r}" for c, n in ctxs.values())
        raise _err(f"operands belong to different contexts: {desc}")
    own = next(iter(ctxs.values()))[0] if ctxs else None
    if ctx is not None and own is not None and ctx is not own:
        raise _err(f"ctx={ctx!r} is not the context the operands belong to ({own!r}, "
                   f"another Context object): pass that one, or none")
    chosen = ctx or own
    if dev:
        chosen = chosen or gpu_context()
        if not chosen.is_gpu:
            raise _err(f"{', '.join(dev)} in device memory but ctx is a {chosen.backend} context")
        for n in dev:  # DLPack says which device; __cuda_array_interface__ does not
            where = operands[n].device
            if where is not None and where != (chosen.backend, chosen.device):
                raise _err(f"{n} lives on {where[0]}:{where[1]} but the call runs on "
                           f"{chosen.backend}:{chosen.device} ({chosen!r}); pass ctx=pyquant."
                           f"Context({where[0]!r}, {where[1]}) or move it")
        return chosen
    chosen = chosen or cpu_context()
    if chosen.is_gpu:
        raise _err(f"{', '.join(host)} in host memory (numpy) but ctx is a {chosen.backend} "
                   "context; pass device arrays (DeviceArray.from_numpy(x, ctx), "
                   "w.to_device(ctx)) or a CPU context")
    return chosen


def _ld(v: DeviceView, name: str) -> int:
    """Row stride in elements of a 2-D operand with unit column stride."""
    it = v.dtype.itemsize
    rows, cols = v.shape
    if rows and cols > 1 and v.strides[1] != it:
        raise _err(f"{name} must have unit stride along its columns (strides {v.strides} bytes)")
    if rows <= 1 or cols == 0:
        return cols  # the row stride of a single (or empty) row is never used
    if v.strides[0] % it or v.strides[0] < cols * it:
        raise _err(f"{name} row stride {v.strides[0]} bytes is not a multiple of the item size "
                   f"{it} or overlaps its {cols} columns")
    return v.strides[0] // it


def _act_dtype(v: DeviceView, name: str, valid: str = "float32, float16 or bfloat16") -> DType:
    """qg_dtype of an activation or output; `valid` says what the entry point at hand
    takes (dtypes of the float set it refuses, such as fp32 for W4A16, are left to the
    library, whose sentence names them)."""
    if v.dtype not in _ACT_DTYPES:
        raise _err(f"{name} has dtype {dtype_name(v.dtype)}; expected {valid}")
    return qg_dtype_of(v.dtype)


def _launch_stream(stream, x: DeviceView):
    """The qg_stream of a launch: `stream` when given, else the producer's CAI v3 stream of
    x, so the launch is ordered after it. CAI 1 is the legacy default stream, which is
    what NULL means to the runtime; 2 (per-thread default) is a valid handle as it is."""
    if stream is not None:
        return stream_handle(stream)
    return None if x.stream in (None, 1) else x.stream


def _result_array(like_numpy: bool, shape, dtype, ctx: Context):
    """numpy for numpy x; else a DeviceArray in ctx (host memory on a CPU context), which
    exports __dlpack__ (and __cuda_array_interface__ on a GPU)."""
    if like_numpy:
        return np.empty(shape, dtype=dtype)
    return DeviceArray.empty(shape, dtype, ctx=ctx)


def _out_dtype(out_dtype, valid: str) -> np.dtype:
    try:
        dt = as_dtype(out_dtype)
    except QuantGemmError:
        dt = None
    if dt is None or dt not in _ACT_DTYPES:
        shown = dtype_name(dt) if dt is not None else repr(out_dtype)
        raise _err(f"out_dtype {shown} is not {valid}")
    return dt


def _output(out, lead, n, out_dtype, default_dtype, valid: str, stream=None):
    """(2-D view [M, n] of `out`, dtype) when out is given (shape lead + (n,)), else
    (None, dtype of the result). `valid` names the output dtypes of the entry point."""
    want = tuple(lead) + (n,)
    if out is None:
        dt = _out_dtype(out_dtype, valid) if out_dtype is not None else default_dtype
        return None, dt
    v, out_lead = _rows(out, "out", "N", allow_copy=False, stream=stream)
    if tuple(out_lead) + (v.shape[1],) != want:
        raise _err(f"out has shape {tuple(out_lead) + (v.shape[1],)}, expected {want}")
    if out_dtype is not None and _out_dtype(out_dtype, valid) != v.dtype:
        raise _err(f"out has dtype {dtype_name(v.dtype)} but out_dtype={dtype_name(as_dtype(out_dtype))}")
    return v, v.dtype


def _ptr(v: DeviceView | None):
    return None if v is None or v.ptr == 0 else v.ptr


# ---------------------------------------------------------------- gemm

def gemm(x, w, out=None, out_dtype=None, ctx: Context | None = None, stream=None):
    """y[..., N] = x[..., K] @ dequant(w)[N, K]^T (+ w.bias where the weight has one).

    x: numpy (CPU tier), a host or device array with __dlpack__ (torch, JAX, CuPy), a
    __cuda_array_interface__ object or a DeviceArray; fp16 / bf16 (fp32 too for GGUF and
    MXFP4). y has the dtype of x, or float32 (out_dtype=np.float32); `out` may be any
    array of shape [..., N] in the same place as x whose rows are evenly spaced (their
    stride becomes ldy). numpy x gives a numpy y, anything else a DeviceArray (which
    torch.from_dlpack(y) takes without a copy)."""
    call = _GemmCall(x, w, out, out_dtype, ctx, stream)
    _run(call.ctx, call.args, call.query, call.launch, call.stream)
    _mark_stream(call.result, call.stream)
    return call.result


class GemmPlan:
    """gemm() with its checks and argument struct done once: each call() launches on the
    same x, weight and output buffers (refill x in place between calls), costing one
    C call from Python instead of the argument checks and struct building of gemm()
    (gemm() costs about 25 us of Python per call, a plan call about 3 us more than the
    work itself on a CPU context, measured: bench/NOTES.md). The plan holds its
    operands and its workspace alive; the library still checks every argument on every
    launch. Build one with pyquant.gemm_plan()."""

    def __init__(self, x, w, out=None, out_dtype=None, ctx: Context | None = None, stream=None):
        self._call = _GemmCall(x, w, out, out_dtype, ctx, stream)
        c = self._call
        if isinstance(x, np.ndarray) and c.args.x != (x.ctypes.data or None):
            raise _err("gemm_plan: x must have unit stride along its columns, rows that do not "
                       "overlap at a positive stride of whole elements, and aligned data "
                       f"(strides {x.strides} bytes): a copy would not see x refilled")
        nbytes = ctypes.c_size_t(0)
        c.query(c.ctx.handle, ctypes.byref(c.args), ctypes.byref(nbytes))
        self._workspace = c.ctx.workspace_array(nbytes.value, c.stream)
        if self._workspace is not None:
            c.args.workspace, c.args.workspace_bytes = self._workspace.ptr, self._workspace.nbytes
        self._args_ref = ctypes.byref(c.args)

    @property
    def out(self):
        """The output the plan writes (the `out` it was built with, or its own array)."""
        return self._call.result

    def __call__(self):
        """Launches once; returns the output."""
        c = self._call
        c.launch(c.ctx.handle, self._args_ref, c.stream)
        _mark_stream(c.result, c.stream)
        return c.result


def gemm_plan(x, w, out=None, out_dtype=None, ctx: Context | None = None, stream=None) -> GemmPlan:
    """A GemmPlan: gemm(x, w, out, ...) prepared once, launched by calling it."""
    return GemmPlan(x, w, out, out_dtype, ctx, stream)


class _GemmCall:
    """The checked operands and the argument struct of one gemm(): ctx, args, query and
    launch (the C workspace query and entry point), stream, result."""

    def __init__(self, x, w, out, out_dtype, ctx, stream):
        if not isinstance(w, (Int4Weight, GGUFWeight, MXFP4Weight)):
            raise _err(f"w must be an Int4Weight, GGUFWeight or MXFP4Weight, got {type(w).__name__}")
        if isinstance(w, MXFP4Weight) and len(w.shape) != 2:
            raise _err(f"w holds stacked experts {w.shape}; dense gemm needs an [N, K] weight "
                       "(use pyquant.moe for experts)")
        xv, lead = _rows(x, "x", "K", stream=stream_handle(stream))
        m, k = xv.shape
        n, wk = w.shape
        if k != wk:
            raise _err(f"x has K={k} columns but the weight has K={wk} (w.shape = {w.shape})")
        what = f"pyquant.gemm with a {w.format} weight"
        x_dt = _act_dtype(xv, "x", f"{_X_DTYPES_TEXT[type(w)]} for {what}")
        s = _launch_stream(stream, xv)
        y_valid = f"x's dtype ({dtype_name(xv.dtype)}) or float32, what {what} writes"
        ops = {"x": xv, **_weight_operands(w)}
        yv, y_np_dtype = _output(out, lead, n, out_dtype, xv.dtype, y_valid, stream=s)
        if yv is not None:
            ops["out"] = yv
        c = _pick_context(ops, ctx)
        result = out
        if yv is None:
            result = _result_array(isinstance(x, np.ndarray), tuple(lead) + (n,), y_np_dtype, c)
            yv, _ = _rows(result, "out", "N", allow_copy=False)
        y_dt = _act_dtype(yv, "out", y_valid)
        ldx, ldy = _ld(xv, "x"), _ld(yv, "out")
        bias = ops.get("w.bias")
        bias_dt = qg_dtype_of(bias.dtype) if bias is not None else DType.QG_DTYPE_F32

        if isinstance(w, Int4Weight):
            args = _lib.qg_w4a16_gemm_args(
                m=m, n=n, k=k, group_size=w.group_size, x_dtype=x_dt, y_dtype=y_dt,
                scale_dtype=SCALE_QG_DTYPE[np.dtype(w.scales.dtype)], zero_dtype=DType.QG_DTYPE_U4X8,
                x=_ptr(xv), ldx=ldx, qweight=_ptr(ops["w.qweight"]), scales=_ptr(ops["w.scales"]),
                qzeros=_ptr(ops.get("w.qzeros")), y=_ptr(yv), ldy=ldy,
                layout=_lib.W4A16Layout.QG_W4A16_LAYOUT_FRAG if w.layout == "frag"
                else _lib.W4A16Layout.QG_W4A16_LAYOUT_CANONICAL, bias=_ptr(bias), bias_dtype=bias_dt)
            query, launch = _lib.qg_w4a16_gemm_workspace_size, _lib.qg_w4a16_gemm
        elif isinstance(w, GGUFWeight):
            args = _lib.qg_gguf_gemm_args(
                format=w.spec.qg_format, m=m, n=n, k=k, x_dtype=x_dt, y_dtype=y_dt,
                x=_ptr(xv), ldx=ldx, w=_ptr(ops["w.raw"]), ldw=w.ldw, y=_ptr(yv), ldy=ldy,
                bias=_ptr(bias), bias_dtype=bias_dt, w_scales=_ptr(ops.get("w.scales")),
                layout=_GGUF_LAYOUT_IDS[w.layout])
            query, launch = _lib.qg_gguf_gemm_workspace_size, _lib.qg_gguf_gemm
        else:
            args = _lib.qg_mxfp4_gemm_args(
                m=m, n=n, k=k, x_dtype=x_dt, y_dtype=y_dt, x=_ptr(xv), ldx=ldx,
                blocks=_ptr(ops["w.blocks"]), scales=_ptr(ops["w.scales"]), bias=_ptr(bias),
                bias_dtype=bias_dt, y=_ptr(yv), ldy=ldy,
                layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG if w.layout == "frag"
                else _lib.MXFP4Layout.QG_MXFP4_LAYOUT_CANONICAL)
            query, launch = _lib.qg_mxfp4_gemm_workspace_size, _lib.qg_mxfp4_gemm
        self.ctx, self.args, self.query, self.launch, self.stream, self.result = c, args, query, launch, s, result
        self._keep = (xv, yv, ops)   # the operands' owners stay alive as long as the call


_GGUF_LAYOUT_IDS = {"canonical": _lib.GGUFLayout.QG_GGUF_LAYOUT_BLOCKS, "frag": _lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG,
                    "rows8": _lib.GGUFLayout.QG_GGUF_LAYOUT_ROWS8}


def _run(c: Context, args, query, launch, s) -> None:
    nbytes = ctypes.c_size_t(0)
    query(c.handle, ctypes.byref(args), ctypes.byref(nbytes))
    args.workspace, args.workspace_bytes = c.workspace(nbytes.value, s)
    launch(c.handle, ctypes.byref(args), s)


def _mark_stream(result, s) -> None:
    """A DeviceArray written by a launch remembers its stream: to_numpy() waits on it and
    __cuda_array_interface__ reports it (the default stream as 1, CAI v3's legacy default)."""
    if isinstance(result, DeviceArray) and result.on_device:
        result.stream = s
        result.written_async = True


# ---------------------------------------------------------------- moe

_ACTIVATIONS = {"swiglu_oai": Activation.QG_ACT_SWIGLU_OAI, "silu_glu": Activation.QG_ACT_SILU_GLU}
_LAYOUTS = {"interleaved": GateUpLayout.QG_GATE_UP_INTERLEAVED,
            "concat": GateUpLayout.QG_GATE_UP_CONCAT}


def default_tile_m(num_tokens: int, top_k: int, num_experts: int, widest: int = 64) -> int:
    """tile_m for qg_moe_align when the caller gives none, at most `widest`."""
    rows_per_expert = num_tokens * top_k / max(num_experts, 1)
    # Every expert's rows are padded up to a multiple of tile_m: with a few rows per
    # expert (decode) the smallest tile wastes least; with many, a taller tile reuses
    # each dequantized weight tile across more rows. widest >= 128: a GPU whose stages take
    # the grouped wgmma tier (tile_m 64 and up there, choose_stage); 256 where x is bf16 (the
    # 256-token kernel folds the scales into bf16 weights). Measured (bench/NOTES.md, sessions
    # 48 and 49: H100, profile_moe.py, GPT-OSS-20b and 120b, the layer in a graph): 16 up to 16
    # rows an expert (the mma.sync tiles; the grouped 64 is 1.3-1.7x slower there), 32 up to 24
    # (about even at 24), the grouped 64 up to 136 rows (12-20 % faster than 32 at 32 rows and
    # than 128 at 64-128 rows; 5-8 % faster than 256 at 128 rows, even at 136), then 256 (3-4 %
    # faster than 64 at 144 rows, 7-21 % from 152 to 384; the 128 tile is never the fastest
    # where 256 is built). widest 128 (fp16 x): the grouped 64 up to 256 rows, then 128 (even
    # at 384, 3 % faster at 512). widest 64 (the CPU tier, GPUs without the grouped tier): 16
    # up to 16 rows, 32 up to 32, then 64. widest 256 (bf16 x) also has the 80- and 96-token
    # tiles, for experts of about 64-88 rows (GPT-OSS-120b T = 2048, 20b T = 512), where the
    # 64-token tile spills about half of them into a second, mostly padded tile (bench/NOTES.md,
    # session 55, H100): 80 from 57 to 72 rows an expert (0.81-0.85x the 64's layer at 64-72
    # rows, 1.06x at 48), 96 from 73 to 88 (0.82-0.93x at 80-88 rows; even with 64 and 128 at
    # 96); the grouped 32 (bf16 x) 0.89-0.93x the 64 at 17-24 rows, the mma.sync 16 below.
    if widest < 128:
        for tile, most_rows in ((16, 16), (32, 32)):
            if rows_per_expert <= most_rows or tile >= widest:
                return tile
        return 64
    if widest >= 256:
        bands, wide = ((16, 16), (32, 24), (64, 56), (80, 72), (96, 88), (64, 136)), 256
    else:
        bands, wide = ((16, 16), (32, 24), (64, 256)), 128
    for tile, most_rows in bands:
        if rows_per_expert <= most_rows:
            return tile
    return wide


def _index_operand(a, name: str, dtype, kind: str, stream=None) -> DeviceView:
    """View [T, top_k] of topk_ids / topk_weights [..., top_k]; numpy of another int/float
    width is converted (host, cheap), device arrays must already have the kernel's dtype."""
    a = _foreign(a, name, stream)
    if isinstance(a, np.ndarray):
        if a.ndim == 0:
            raise _err(f"{name} must be [..., top_k], got a 0-d array")
        a = a.reshape(-1, a.shape[-1])
        if a.dtype.kind not in kind:
            raise _err(f"{name} has dtype {a.dtype}; expected {np.dtype(dtype).name}")
        if a.dtype.kind in "iu" and a.size:
            info = np.iinfo(dtype)
            lo, hi = int(a.min()), int(a.max())
            if lo < info.min or hi > info.max:
                bad = lo if lo < info.min else hi
                raise _err(f"{name} holds {bad}, outside {np.dtype(dtype).name} (the kernels' index type)")
        return _operand(np.ascontiguousarray(a, dtype=dtype), name)
    v = _operand(a, name, stream=stream)
    if v.dtype != np.dtype(dtype):
        raise _err(f"{name} has dtype {dtype_name(v.dtype)}; the kernels read "
                   f"{np.dtype(dtype).name} (convert it before the call)")
    if not v.is_c_contiguous():
        raise _err(f"{name} must be C-contiguous [..., top_k]")
    if len(v.shape) != 2 and len(v.shape) > 0:
        rows = math.prod(v.shape[:-1])
        flat = DeviceView(v.ptr, (rows, v.shape[-1]), v.dtype, None, ctx=v.ctx,
                          on_device=v.on_device, owner=v, stream=v.stream)
        flat.device = v.device
        return flat
    return v


def _bias_operand(b, name: str, stream):
    """A bias view (the C ABI takes biases without a row stride: numpy ones are made
    contiguous, others must be)."""
    if b is None:
        return None
    return _operand(_require_contiguous(_foreign(b, name, stream), name), name, stream=stream)


def moe_repack(w13: MXFP4Weight, w2: MXFP4Weight, gate_up_layout: str = "interleaved",
               ctx: Context | None = None, stream=None) -> tuple[MXFP4Weight, MXFP4Weight]:
    """Canonical experts w13 [E, 2I, H/32, 16] and w2 [E, H, I/32, 16] in the MoE frag layout
    that the GPU MoE tiers read (qg_moe_repack), in ctx (default_context()): copied there
    first if they are elsewhere, repacked once. w13's gate and up rows are taken apart as
    gate_up_layout says; pass the same value to moe(). Biases travel with the weights."""
    if gate_up_layout not in _LAYOUTS:
        raise _err(f"gate_up_layout={gate_up_layout!r} is not one of {sorted(_LAYOUTS)}")
    for w, name in ((w13, "w13"), (w2, "w2")):
        if not isinstance(w, MXFP4Weight) or len(w.shape) != 3 or w.layout != "canonical":
            raise _err(f"{name} must be canonical MXFP4Weight experts [E, N, K/32, 16], got "
                       f"{type(w).__name__} {getattr(w, 'layout', '')} {getattr(w, 'shape', '')}")
    c = ctx if ctx is not None else default_context()
    return w13.moe_repack(2, gate_up_layout, c, stream), w2.moe_repack(1, None, c, stream)


def moe(x, topk_ids, topk_weights, w13: MXFP4Weight, w2: MXFP4Weight,
        activation: str = "swiglu_oai", gate_up_layout: str = "interleaved",
        w13_bias=None, w2_bias=None, tile_m: int | None = None, ctx: Context | None = None,
        stream=None, alpha: float = 1.702, limit: float = 7.0, out=None, out_dtype=None):
    """MXFP4 mixture of experts: qg_moe_align, stage 1 (gate_up GEMM + activation),
    stage 2 (down GEMM + top-k weighted sum). The stage-1 activation buffer
    act [T*top_k, I] (dtype of x) and the align buffers are allocated here, next to x.

    x [..., H] (T = the product of the leading axes); topk_ids [..., top_k] int32 and
    topk_weights [..., top_k] float32 with T rows; w13 experts [E, 2I, H/32, 16]; w2
    experts [E, H, I/32, 16]; biases [E, 2I] / [E, H] (default: the weights' own .bias).
    Operands may be numpy, DeviceArrays, or __dlpack__ / __cuda_array_interface__ objects
    (gemm's rules). The CPU tier reads canonical experts, the GPU tiers the MoE frag layout
    (moe_repack). Returns y [..., H] in the dtype of x (or out_dtype)."""
    for w, name in ((w13, "w13"), (w2, "w2")):
        if not isinstance(w, MXFP4Weight) or len(w.shape) != 3:
            raise _err(f"{name} must be an MXFP4Weight of stacked experts [E, N, K/32, 16], got "
                       f"{type(w).__name__} {getattr(w, 'shape', '')}")
    if activation not in _ACTIVATIONS:
        raise _err(f"activation={activation!r} is not one of {sorted(_ACTIVATIONS)}")
    if gate_up_layout not in _LAYOUTS:
        raise _err(f"gate_up_layout={gate_up_layout!r} is not one of {sorted(_LAYOUTS)}")
    if w13.layout != w2.layout:
        raise _err(f"w13 is {w13.layout} and w2 {w2.layout}: both experts in one layout (moe_repack)")
    frag = w13.layout == "frag"
    if frag and (w13.parts != 2 or w2.parts != 1):
        raise _err(f"frag experts: w13 must have parts=2 (gate, up) and w2 parts=1, got {w13.parts}, "
                   f"{w2.parts} (moe_repack makes both)")
    if frag and w13.gate_up != gate_up_layout:
        raise _err(f"w13 was repacked with gate_up={w13.gate_up!r} but gate_up_layout={gate_up_layout!r} "
                   "(the bias is read in that row order)")
    xv, lead = _rows(x, "x", "H", stream=stream_handle(stream))
    t, h = xv.shape
    e, two_i, h13 = w13.shape
    if h13 != h:
        raise _err(f"x has H={h} columns but w13 has H={h13} (w13.shape = {w13.shape})")
    inter = two_i // 2
    if w2.shape != (e, h, inter):
        raise _err(f"w2 has shape {w2.shape}, expected (E, H, I) = ({e}, {h}, {inter}) "
                   f"from w13 {w13.shape}")
    float_text = "float32, float16 or bfloat16 (pyquant.moe)"
    x_dt = _act_dtype(xv, "x", float_text)
    s = _launch_stream(stream, xv)
    idv = _index_operand(topk_ids, "topk_ids", np.int32, "iu", s)
    wtv = _index_operand(topk_weights, "topk_weights", np.float32, "f", s)
    if len(idv.shape) != 2 or idv.shape[0] != t:
        raise _err(f"topk_ids has {idv.shape[0] if len(idv.shape) == 2 else 'no'} rows of top_k "
                   f"(shape {tuple(getattr(topk_ids, 'shape', ()))}), expected [..., top_k] with "
                   f"T={t} rows, one per token of x {tuple(lead) + (h,)}")
    top_k = idv.shape[1]
    if tuple(wtv.shape) != tuple(idv.shape):
        raise _err(f"topk_weights has shape {tuple(wtv.shape)}, expected {tuple(idv.shape)}")
    b13 = w13_bias if w13_bias is not None else w13.bias
    b2 = w2_bias if w2_bias is not None else w2.bias
    # the C ABI takes biases without a row stride: numpy ones are made contiguous
    b13v = _bias_operand(b13, "w13_bias", s)
    b2v = _bias_operand(b2, "w2_bias", s)
    for bv, name, shape in ((b13v, "w13_bias", (e, two_i)), (b2v, "w2_bias", (e, h))):
        if bv is not None and tuple(bv.shape) != shape:
            raise _err(f"{name} has shape {tuple(bv.shape)}, expected {shape}")

    ops = {"x": xv, "topk_ids": idv, "topk_weights": wtv,
           **{f"w13.{k}": v for k, v in _weight_operands(w13).items()},
           **{f"w2.{k}": v for k, v in _weight_operands(w2).items()}}
    if b13v is not None:
        ops["w13_bias"] = b13v
    if b2v is not None:
        ops["w2_bias"] = b2v
    yv, y_np_dtype = _output(out, lead, h, out_dtype, xv.dtype, "float32, float16 or bfloat16",
                             stream=s)
    if yv is not None:
        ops["out"] = yv
    c = _pick_context(ops, ctx)
    numpy_result = isinstance(x, np.ndarray)
    result = out
    if yv is None:
        result = _result_array(numpy_result, tuple(lead) + (h,), y_np_dtype, c)
        yv, _ = _rows(result, "out", "H", allow_copy=False)
    # GPU: the grouped wgmma tier's expert tiles (64, 128 and, for bf16 x, 256 tokens, sm_90a)
    # past 24 rows an expert; where the stages refuse a tile above 64 (no such tier on this
    # device), the context remembers 64 and the call reruns
    widest = getattr(c, "_moe_widest", (256 if x_dt == DType.QG_DTYPE_BF16 else 128) if c.is_gpu else 64)
    tm = int(tile_m) if tile_m is not None else default_tile_m(t, top_k, e, widest)

    max_sorted, max_tiles = ctypes.c_int64(), ctypes.c_int64()
    _lib.qg_moe_align_sizes(t, top_k, e, tm, ctypes.byref(max_sorted), ctypes.byref(max_tiles))
    # Temporaries: numpy on the CPU backend; on a GPU, buffers cached in the context per
    # stream (launches on one stream are ordered, so reuse is safe; no cudaMalloc per call).
    def scratch(name, shape, dt):
        if not c.is_gpu:
            return _operand(np.empty(shape, dt), name)
        nbytes = int(np.prod(shape)) * np.dtype(dt).itemsize
        ptr, _ = c.workspace(nbytes, s, purpose=f"moe.{name}")
        return DeviceView(ptr, shape, dt, None, ctx=c, on_device=True)

    sv = scratch("sorted_ids", (max_sorted.value,), np.int32)
    tv = scratch("tile_experts", (max_tiles.value,), np.int32)
    nv = scratch("num_sorted", (1,), np.int32)
    av = scratch("act", (t * top_k, inter), xv.dtype)

    w13o = _weight_operands(w13)
    w2o = _weight_operands(w2)
    layout = _lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG if frag else _lib.MXFP4Layout.QG_MXFP4_LAYOUT_CANONICAL
    _lib.qg_moe_align(c.handle, ctypes.byref(_lib.qg_moe_align_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=tm, topk_ids=_ptr(idv),
        sorted_ids=_ptr(sv), tile_experts=_ptr(tv), num_sorted=_ptr(nv))), s)
    args1 = _lib.qg_moe_stage1_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=tm, hidden=h, intermediate=inter,
        x_dtype=x_dt, x=_ptr(xv), ldx=_ld(xv, "x"), sorted_ids=_ptr(sv),
        tile_experts=_ptr(tv), num_sorted=_ptr(nv), w13_blocks=_ptr(w13o["w.blocks"]),
        w13_scales=_ptr(w13o["w.scales"]), w13_bias=_ptr(b13v),
        bias_dtype=qg_dtype_of(b13v.dtype) if b13v is not None else DType.QG_DTYPE_F32,
        activation=_ACTIVATIONS[activation], gate_up_layout=_LAYOUTS[gate_up_layout],
        swiglu_alpha=alpha, swiglu_limit=limit, act=_ptr(av), layout=layout)
    ws_bytes = ctypes.c_size_t(0)
    _lib.qg_moe_stage1_workspace_size(c.handle, ctypes.byref(args1), ctypes.byref(ws_bytes))
    args1.workspace, args1.workspace_bytes = c.workspace(ws_bytes.value, s, purpose="moe.stage1")
    try:
        _lib.qg_moe_stage1(c.handle, ctypes.byref(args1), s)
    except QuantGemmError as err:
        if tile_m is not None or tm <= 64 or err.status != _lib.Status.QG_ERR_UNSUPPORTED:
            raise
        c._moe_widest = 64  # nothing was written: the stage refused the tile before any launch
        return moe(x, topk_ids, topk_weights, w13, w2, activation, gate_up_layout, w13_bias, w2_bias,
                   default_tile_m(t, top_k, e, 64), ctx, stream, alpha, limit, out, out_dtype)
    args2 = _lib.qg_moe_stage2_args(
        num_tokens=t, top_k=top_k, num_experts=e, tile_m=tm, hidden=h, intermediate=inter,
        act_dtype=x_dt, act=_ptr(av), sorted_ids=_ptr(sv), tile_experts=_ptr(tv),
        num_sorted=_ptr(nv), w2_blocks=_ptr(w2o["w.blocks"]), w2_scales=_ptr(w2o["w.scales"]),
        w2_bias=_ptr(b2v),
        bias_dtype=qg_dtype_of(b2v.dtype) if b2v is not None else DType.QG_DTYPE_F32,
        topk_weights=_ptr(wtv), y_dtype=_act_dtype(yv, "out", float_text), y=_ptr(yv),
        ldy=_ld(yv, "out"), layout=layout)
    ws_bytes = ctypes.c_size_t(0)
    _lib.qg_moe_stage2_workspace_size(c.handle, ctypes.byref(args2), ctypes.byref(ws_bytes))
    args2.workspace, args2.workspace_bytes = c.workspace(ws_bytes.value, s, purpose="moe.stage2")
    _lib.qg_moe_stage2(c.handle, ctypes.byref(args2), s)
    _mark_stream(result, s)
    return result
