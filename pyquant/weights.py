"""Quantized weights: Int4Weight (W4A16), GGUFWeight (GGUF block formats), MXFP4Weight.

A weight holds its packed arrays exactly in the canonical layout of include/quantgemm.h
or, for Int4Weight and a dense MXFP4Weight, in the frag layout that .repack() and
.to_device() make (what the GPU tiers read: docs/w4a16-layout.md), either as host numpy
arrays or in device memory (pyquant DeviceArray, or any object with
__cuda_array_interface__ such as a CuPy array or a CUDA torch tensor). Nothing is
repacked behind the caller's back: the arrays handed in are the arrays the kernels read.

Common attributes: .format (registry name), .shape ((N, K); (E, N, K) for stacked MXFP4
experts), .nbytes (every byte a kernel reads: packed data + scales + zeros + bias),
.bits_per_weight (packed data + scales + zeros, per weight), .dequantize() (float32, via
the numpy reference of pyquant.formats, bit-exact), .to_device(ctx=None), .to_host(),
.is_device, .ctx (the context holding the arrays, None for numpy / foreign arrays).

Python checks here are the ones only Python can do: array ranks, dtypes and extents that
must agree with each other. Conditions the library states itself (k % group_size,
n % 8, block divisibility, ...) are left to it, so their message is its sentence.
"""
from __future__ import annotations

import ctypes
from typing import Any

import numpy as np

from . import _lib
from . import formats as _formats
from .formats import gguf_frag as _ggfrag, gguf_rows8 as _ggrows8, int4 as _int4, int4_frag as _frag, mxfp4 as _mxfp4, mxfp4_frag as _mxfrag
from .device import (BFLOAT16, Context, DeviceArray, DeviceView, _err, cpu_context, default_context,
                     dtype_name, gpu_context, stream_handle)
from ._lib import DType, QuantGemmError

_SCALE_DTYPES = (np.dtype(np.float16), BFLOAT16)
_BIAS_DTYPES = (np.dtype(np.float32), np.dtype(np.float16), BFLOAT16)
_PACKED_INT_DTYPES = (np.dtype(np.int32), np.dtype(np.uint32))


def _component(obj: Any, name: str):
    """numpy array (kept as given when C-contiguous), DeviceArray / DeviceView, or a foreign
    device array wrapped as a DeviceView. Weight arrays have no stride in the ABI, so they
    must be C-contiguous (GGUF rows excepted: see GGUFWeight)."""
    if obj is None:
        return None
    if isinstance(obj, (DeviceArray, DeviceView)):
        return obj
    if isinstance(obj, np.ndarray):
        return obj
    if hasattr(obj, "__cuda_array_interface__"):
        return DeviceView.from_object(obj, name)
    if hasattr(obj, "__dlpack__"):  # torch / JAX / CuPy: numpy view (host) or DeviceView
        from . import dlpack
        return dlpack.import_array(obj, name)
    if isinstance(obj, (bytes, bytearray, memoryview)):
        return np.frombuffer(obj, dtype=np.uint8)
    raise _err(f"{name} must be a numpy array, a pyquant.DeviceArray or an object with "
               f"__cuda_array_interface__ or __dlpack__; got {type(obj).__name__}")


def _require_contiguous(a, name: str):
    if isinstance(a, np.ndarray):
        return np.ascontiguousarray(a)
    view = a.view() if isinstance(a, DeviceArray) else a
    if not view.is_c_contiguous():
        raise _err(f"{name} must be C-contiguous (shape {view.shape}, strides {view.strides} "
                   "bytes): the kernels read weight arrays without a stride")
    return a


def _checked_bias(bias, lead: tuple):
    """An optional bias of shape `lead` ([N], or [E, N] for stacked experts), as a component:
    float32, float16 or bfloat16, C-contiguous (the ABI takes it without a stride)."""
    bias = _component(bias, "bias")
    if bias is None:
        return None
    bias = _require_contiguous(bias, "bias")
    if np.dtype(bias.dtype) not in _BIAS_DTYPES:
        raise _err(f"bias has dtype {dtype_name(bias.dtype)}; expected float32, float16 or bfloat16")
    if tuple(bias.shape) != tuple(lead):
        raise _err(f"bias has shape {tuple(bias.shape)}, expected {tuple(lead)}")
    return bias


def _where(a) -> tuple:
    """(on_device, context) of a component: numpy -> (False, None)."""
    if isinstance(a, np.ndarray):
        return False, None
    if isinstance(a, DeviceArray):
        return a.on_device, a.ctx
    return a.on_device, a.ctx


def _to_host(a, ctx: Context | None) -> np.ndarray:
    if a is None or isinstance(a, np.ndarray):
        return a
    if isinstance(a, DeviceArray):
        return a.to_numpy()
    # a DeviceView, C-contiguous or with padded rows (non-negative byte strides): copy the
    # bytes it spans through a context, then keep the elements the strides select
    c = a.ctx if a.ctx is not None else (ctx or gpu_context())
    if not a.nbytes:
        return np.empty(a.shape, dtype=a.dtype)
    span = a.dtype.itemsize + sum((n - 1) * st for n, st in zip(a.shape, a.strides))
    raw = np.empty(span, np.uint8)
    kind = c.copy_kind(dst_on_device=False, src_on_device=a.on_device)
    _lib.qg_memcpy(c.handle, raw.ctypes.data, a.ptr, span, kind, None)
    c.synchronize()
    return np.ndarray(a.shape, a.dtype, buffer=raw, strides=a.strides).copy()


class _Weight:
    format: str = ""
    _component_names: tuple = ()

    # -- location
    def _components(self) -> dict:
        return {n: getattr(self, n) for n in self._component_names if getattr(self, n) is not None}

    def _check_location(self) -> None:
        where = {n: _where(a) for n, a in self._components().items()}
        devs = {w[0] for w in where.values()}
        if len(devs) > 1:
            host = [n for n, w in where.items() if not w[0]]
            dev = [n for n, w in where.items() if w[0]]
            raise _err(f"{type(self).__name__}: {', '.join(host)} in host memory but "
                       f"{', '.join(dev)} in device memory; all arrays of a weight must live "
                       "in one place")
        ctxs = {id(w[1]): w[1] for w in where.values() if w[1] is not None}
        if len(ctxs) > 1:
            raise _err(f"{type(self).__name__}: its arrays belong to different contexts "
                       f"({', '.join(repr(c) for c in ctxs.values())})")

    @property
    def is_device(self) -> bool:
        """True when the arrays are in GPU memory."""
        return any(_where(a)[0] for a in self._components().values())

    @property
    def ctx(self) -> Context | None:
        for a in self._components().values():
            c = _where(a)[1]
            if c is not None:
                return c
        return None

    # -- sizes
    @property
    def nbytes(self) -> int:
        """Every byte a kernel must read: packed data + scales + zeros + bias."""
        return int(sum(a.nbytes for a in self._components().values()))

    @property
    def numel(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64))

    @property
    def bits_per_weight(self) -> float:
        """Storage per weight of packed data + scales + zeros (bias excluded)."""
        comps = self._components()
        nb = sum(a.nbytes for n, a in comps.items() if n != "bias")
        return 8.0 * nb / max(self.numel, 1)

    # -- moves
    def _replace(self, **arrays):
        raise NotImplementedError

    def to_device(self, ctx: Context | None = None):
        """The same weight with every array copied into `ctx` (default_context()).
        Arrays already in that context are shared, not copied."""
        ctx = ctx if ctx is not None else default_context()
        return self._replace(**{n: self._moved(a, ctx) for n, a in self._components().items()})

    def _moved(self, a, ctx: Context):
        """Component a in ctx: itself when it is there already, else a copy."""
        if a is None:
            return None
        on_dev, c = _where(a)
        if c is ctx or (on_dev and c is None and ctx.is_gpu):
            return a
        return DeviceArray.from_numpy(_to_host(a, ctx), ctx)

    def to_host(self):
        """The same weight with numpy arrays."""
        ctx = self.ctx
        return self._replace(**{n: _to_host(a, ctx) for n, a in self._components().items()})

    def _host(self, name: str):
        return _to_host(getattr(self, name), self.ctx)

    def with_bias(self, bias):
        """The same weight (its arrays shared, not copied) with `bias` ([N], or [E, N] for
        stacked experts; float32, float16 or bfloat16, where the weight's arrays are), which
        pyquant.gemm adds; None drops it. The loaders never attach one: a checkpoint's
        X.bias stays its own tensor, ckpt["X.weight"].with_bias(ckpt["X.bias"]) joins them."""
        return self._replace(**{**self._components(), "bias": bias})

    # -- tensor / expert parallelism
    def shard(self, axis, parts, index: int):
        """Part `index` of `parts` along `axis`: "n" (column-parallel: whole output
        features), "k" (row-parallel: a slice of the inputs; partial outputs are summed) or
        "expert" (stacked MXFP4 experts), or an index into .shape. `parts` is a number of
        equal parts or a list of sizes. The result is a weight of the same class, format
        and layout holding that slice (copies), where this one lives. A cut that would
        split a packed word, a group or a block is refused naming the rule: int4 N at
        multiples of 8 and K of group_size; frag (int4, mxfp4, q4_0) N of 16 and K of 128 (the frag shard is
        then byte for byte the repack of the canonical shard); GGUF K of its block; MXFP4
        K of 32 (row-parallel parts after part 0 drop the bias). pyquant.shard.plan() lists
        the byte copies; docs/tensor-parallel.md."""
        from . import shard as _shard
        return _shard.shard(self, axis, parts, index)

    def __repr__(self) -> str:
        where = "device" if self.is_device else ("host" if self.ctx is None else self.ctx.backend)
        return (f"{type(self).__name__}(format={self.format!r}, shape={self.shape}, "
                f"{self.bits_per_weight:.3f} bits/weight, {where})")


def _check_ndim(a, ndim: int, name: str, layout: str) -> None:
    if len(a.shape) != ndim:
        raise _err(f"{name} must be {ndim}-D {layout}, got shape {tuple(a.shape)}")


_LAYOUTS = ("canonical", "frag")


def _check_layout(layout: str) -> None:
    if layout not in _LAYOUTS:
        raise _err(f"layout={layout!r} is not one of {', '.join(_LAYOUTS)}")


_GGUF_LAYOUTS = _LAYOUTS + ("rows8",)  # rows8: the CPU tier's (GGUFWeight)


def _check_gguf_layout(layout: str) -> None:
    if layout not in _GGUF_LAYOUTS:
        raise _err(f"layout={layout!r} is not one of {', '.join(_GGUF_LAYOUTS)}")


def _aligned_host(nbytes: int, align: int = 64) -> np.ndarray:
    """uint8 host buffer of `nbytes` starting at an `align`-byte boundary (the frag planes
    are read with 16-byte loads)."""
    raw = np.empty(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + nbytes]


def _out_plane(shape: tuple, dtype, nbytes: int, ctx: Context, in_ctx: bool):
    """An output plane of a repack, where the weight is: a DeviceArray of ctx (device memory,
    or a CPU context's host memory), or a numpy array of `nbytes` (the library's size
    query) at a 64-byte boundary."""
    if in_ctx:
        return DeviceArray.empty(shape, dtype, ctx)
    return _aligned_host(nbytes).view(dtype).reshape(shape)


def _address(a):
    """The address the C ABI gets for a component (None for an absent one)."""
    if a is None:
        return None
    return a.ctypes.data if isinstance(a, np.ndarray) else a.ptr


def _frag_planes(given: dict, planes: dict, what: str) -> dict:
    """The planes of a frag-layout weight, checked: given = {name: (array or None, accepted
    dtypes, optional)}, planes = {name: shape} (its element count is what counts: a plane
    may come flat), what = the shape's description for a message. uint32 words are viewed
    as int32."""
    arrays = {}
    for name, (a, dtypes, optional) in given.items():
        a = _component(a, name)
        if a is None:
            if not optional:
                raise _err(f"{name} is None; a frag-layout weight needs its {name} plane")
            arrays[name] = None
            continue
        a = _require_contiguous(a, name)
        if np.dtype(a.dtype) not in dtypes:
            raise _err(f"frag {name} plane has dtype {dtype_name(a.dtype)}; expected "
                       f"{' or '.join(dtype_name(d) for d in dtypes)}")
        want = int(np.prod(planes[name]))
        if int(np.prod(a.shape)) != want:
            raise _err(f"frag {name} plane holds {int(np.prod(a.shape))} elements; {what} needs {want} "
                       f"(shape {planes[name]})")
        if isinstance(a, np.ndarray) and a.dtype == np.uint32:
            a = a.view(np.int32)
        arrays[name] = a
    return arrays


class _TwoLayouts(_Weight):
    """A weight with a canonical and a frag layout (Int4Weight, MXFP4Weight): .repack() and
    .to_device(layout=...) for both. A subclass says how to make each: _canonical_weight()
    (host, canonical), _repack_frag(ctx, in_ctx, stream) (the library's repack into new
    planes where the weight is: DeviceArrays of ctx when in_ctx, else numpy), and
    _frag_refusal() (why this weight has no frag layout, or None)."""

    layout = "canonical"

    def _frag_refusal(self) -> str | None:
        return None

    def repack(self, layout: str = "frag", stream=None):
        """The same weight in `layout` ("frag"), in the same memory as this one: host numpy
        arrays through the library's CPU repack, device arrays through its GPU repack
        kernel on `stream` (qg_w4a16_repack, qg_mxfp4_repack). A weight already in `layout`
        is returned; "canonical" unpacks a host frag weight with the numpy reference."""
        _check_layout(layout)
        if layout == self.layout:
            return self
        if layout == "canonical":
            if self.is_device:
                raise _err("repack to canonical runs on host weights; call .to_host() first")
            return self._canonical_weight()
        why = self._frag_refusal()
        if why is not None:
            raise _err(why)
        on_dev = self.is_device
        ctx = self.ctx if self.ctx is not None else (gpu_context() if on_dev else cpu_context())
        out = self._repack_frag(ctx, on_dev or self.ctx is not None, stream)
        if on_dev:
            ctx.synchronize(stream)
        return out

    def to_device(self, ctx: Context | None = None, layout: str = "auto", stream=None):
        """The same weight in `ctx` (default_context()). layout="auto" gives a GPU context
        the frag layout (repacked there, on `stream`: what the GPU tiers read) where the
        weight has one, and keeps the layout otherwise; "canonical" or "frag" asks for one."""
        ctx = ctx if ctx is not None else default_context()
        if layout == "auto":
            layout = "frag" if ctx.is_gpu and self._frag_refusal() is None else self.layout
        if layout not in _LAYOUTS:
            raise _err(f"layout={layout!r} is not one of auto, {', '.join(_LAYOUTS)}")
        if layout == "canonical" and self.layout == "frag":
            return self._canonical_weight().to_device(ctx, "canonical")
        moved = super().to_device(ctx)
        return moved.repack(layout, stream) if layout != moved.layout else moved


class Int4Weight(_TwoLayouts):
    """int4 group-quantized weight (W4A16), in one of two layouts.

    layout="canonical" (what checkpoints become on import): qweight [N, K/8] int32,
    nibble i of word j of row n = q[n, 8j + i] (0..15); scales [N, K/G] float16 or
    bfloat16; qzeros [N/8, K/G] int32 packed along N (row n -> word n/8, bits 4*(n%8)) or
    None for symmetric weights (zero = 8). Zero-points stay 4-bit: a float zero-point
    array is refused.

    layout="frag" (made by .repack() or .to_device(); pyquant.formats.int4_frag and
    docs/w4a16-layout.md): the three planes qg_w4a16_repack writes, which the GPU decode
    and prefill tiers read without any permutation; shape=(N, K) must be given.

    Optional bias [N] (float32, float16 or bfloat16; a GPTQ / AWQ layer's .bias), added by
    pyquant.gemm in either layout."""

    format = "int4"
    _component_names = ("qweight", "scales", "qzeros", "bias")

    def __init__(self, qweight, scales, qzeros=None, group_size: int = 128, layout: str = "canonical",
                 shape=None, bias=None):
        _check_layout(layout)
        self.layout = layout
        if layout == "frag":
            self._init_frag(qweight, scales, qzeros, group_size, shape)
            self.bias = _checked_bias(bias, self.shape[:1])
            self._check_location()
            return
        if shape is not None:
            raise _err("shape= is for the frag layout; a canonical weight's shape follows from qweight")
        qweight = _require_contiguous(_component(qweight, "qweight"), "qweight")
        scales = _require_contiguous(_component(scales, "scales"), "scales")
        qzeros = _component(qzeros, "qzeros")
        _check_ndim(qweight, 2, "qweight", "[N, K/8] int32")
        if np.dtype(qweight.dtype) not in _PACKED_INT_DTYPES:
            raise _err(f"qweight has dtype {dtype_name(qweight.dtype)}; expected int32 words "
                       "[N, K/8] holding 8 nibbles along K")
        _check_ndim(scales, 2, "scales", "[N, K/G] float16 or bfloat16")
        if np.dtype(scales.dtype) not in _SCALE_DTYPES:
            raise _err(f"scales has dtype {dtype_name(scales.dtype)}; expected float16 or bfloat16")
        if qzeros is not None:
            if np.dtype(qzeros.dtype) not in _PACKED_INT_DTYPES:
                raise _err(
                    f"qzeros has dtype {dtype_name(qzeros.dtype)}: zero-points must stay 4-bit, "
                    "packed along N into int32 words [N/8, K/G] (QG_DTYPE_U4X8), never expanded "
                    "to the activation or scale dtype")
            qzeros = _require_contiguous(qzeros, "qzeros")
            _check_ndim(qzeros, 2, "qzeros", "[N/8, K/G] int32")
        if isinstance(qweight, np.ndarray) and qweight.dtype == np.uint32:
            qweight = qweight.view(np.int32)
        if isinstance(qzeros, np.ndarray) and qzeros.dtype == np.uint32:
            qzeros = qzeros.view(np.int32)
        self.qweight, self.scales, self.qzeros = qweight, scales, qzeros
        self.group_size = int(group_size)
        n, k = int(qweight.shape[0]), 8 * int(qweight.shape[1])
        self.shape = (n, k)
        # Extents that follow from (N, K, G); when K % G or N % 8 is off, the library
        # names that condition at the first gemm, so the extents are not checked here.
        if scales.shape[0] != n:
            raise _err(f"scales has {scales.shape[0]} rows but qweight has N={n}")
        g = self.group_size
        if g > 0 and k % g == 0 and scales.shape[1] != k // g:
            raise _err(f"scales has shape {tuple(scales.shape)}, expected [N, K/G] = ({n}, {k // g}) "
                       f"for K={k}, group_size={g}")
        if qzeros is not None and g > 0 and k % g == 0 and n % 8 == 0 and \
                tuple(qzeros.shape) != (n // 8, k // g):
            raise _err(f"qzeros has shape {tuple(qzeros.shape)}, expected [N/8, K/G] = "
                       f"({n // 8}, {k // g})")
        self.bias = _checked_bias(bias, (n,))
        self._check_location()

    @property
    def symmetric(self) -> bool:
        return self.qzeros is None

    @property
    def scale_dtype(self) -> np.dtype:
        return np.dtype(self.scales.dtype)

    def _replace(self, **arrays):
        return Int4Weight(arrays["qweight"], arrays["scales"], arrays.get("qzeros"), self.group_size,
                          layout=self.layout, shape=self.shape if self.layout == "frag" else None,
                          bias=arrays.get("bias"))

    def canonical_arrays(self) -> tuple:
        """(qweight, scales, qzeros) in the canonical layout, as numpy arrays (a frag weight
        is unpacked with the numpy reference)."""
        q, s, z = self._host("qweight"), self._host("scales"), self._host("qzeros")
        if self.layout == "frag":
            return _frag.unpack(q, s, z, self.shape[0], self.shape[1], self.group_size)
        return q, s, z

    def dequantize(self) -> np.ndarray:
        """float32 [N, K]: (q - z) * s, the numpy reference (pyquant.formats.int4)."""
        return _int4.dequantize(*self.canonical_arrays(), self.group_size)

    def _canonical_weight(self) -> "Int4Weight":
        return Int4Weight(*self.canonical_arrays(), self.group_size, bias=self._host("bias"))

    def _repack_frag(self, ctx: Context, in_ctx: bool, stream) -> "Int4Weight":
        n, k = self.shape
        args = _lib.qg_w4a16_repack_args(
            layout=_lib.W4A16Layout.QG_W4A16_LAYOUT_FRAG, n=n, k=k, group_size=self.group_size,
            scale_dtype=SCALE_QG_DTYPE.get(np.dtype(self.scales.dtype), DType.QG_DTYPE_F16))
        sizes = [ctypes.c_size_t(0) for _ in range(3)]
        _lib.qg_w4a16_repack_size(ctypes.byref(args), *(ctypes.byref(v) for v in sizes))
        nq, ns, nz = (v.value for v in sizes)
        planes = _frag.plane_shapes(n, k, self.group_size)
        out_q = _out_plane(planes["qweight"], np.int32, nq, ctx, in_ctx)
        out_s = _out_plane(planes["scales"], self.scales.dtype, ns, ctx, in_ctx)
        out_z = None if self.qzeros is None else _out_plane(planes["qzeros"], np.uint8, nz, ctx, in_ctx)
        args.qweight, args.scales, args.qzeros = (_address(a) for a in (self.qweight, self.scales, self.qzeros))
        args.out_qweight, args.out_scales, args.out_qzeros = (_address(a) for a in (out_q, out_s, out_z))
        _lib.qg_w4a16_repack(ctx.handle, ctypes.byref(args), stream_handle(stream))
        return Int4Weight(out_q, out_s, out_z, self.group_size, layout="frag", shape=self.shape, bias=self.bias)

    def _init_frag(self, qweight, scales, qzeros, group_size, shape):
        if shape is None or len(shape) != 2:
            raise _err("a frag-layout Int4Weight needs shape=(N, K)")
        n, k = (int(v) for v in shape)
        self.shape = (n, k)
        self.group_size = int(group_size)
        try:
            planes = _frag.plane_shapes(n, k, self.group_size)
        except ValueError as e:
            raise _err(str(e)) from None
        arrays = _frag_planes({"qweight": (qweight, _PACKED_INT_DTYPES, False),
                               "scales": (scales, _SCALE_DTYPES, False),
                               "qzeros": (qzeros, (np.dtype(np.uint8),), True)},
                              planes, f"({n}, {k}) with group_size={self.group_size}")
        self.qweight, self.scales, self.qzeros = arrays["qweight"], arrays["scales"], arrays["qzeros"]

    @staticmethod
    def _group_size(k: int, groups: int, group_size) -> int:
        if group_size is not None:
            return int(group_size)
        if groups <= 0 or k % groups:
            raise _err(f"cannot infer group_size: K={k} is not a multiple of {groups} scale groups")
        return k // groups

    @classmethod
    def _from_canonical(cls, importer, group_size, bias=None):
        """importer() -> canonical (qweight, scales, qzeros); its ValueErrors become
        InvalidArgumentError like every other refusal of the API."""
        try:
            qweight, scales, qzeros = importer()
        except (ValueError, TypeError) as e:
            if isinstance(e, QuantGemmError):
                raise
            raise _err(str(e)) from None
        k = 8 * qweight.shape[1]
        return cls(qweight, scales, qzeros, cls._group_size(k, scales.shape[1], group_size), bias=bias)

    @classmethod
    def from_awq(cls, qweight, qzeros, scales, group_size=None, bias=None) -> "Int4Weight":
        """AutoAWQ GEMM tensors (qweight [K, N/8], qzeros [K/G, N/8], scales [K/G, N]; bias [N])."""
        return cls._from_canonical(lambda: _int4.from_awq(qweight, qzeros, scales, group_size),
                                   group_size, bias)

    @classmethod
    def from_gptq(cls, qweight, qzeros, scales, group_size=None, g_idx=None, bias=None) -> "Int4Weight":
        """GPTQ tensors (qweight [K/8, N], qzeros [K/G, N/8] stored minus one, scales [K/G, N];
        bias [N])."""
        return cls._from_canonical(
            lambda: _int4.from_gptq(qweight, qzeros, scales, group_size, g_idx=g_idx), group_size, bias)

    @classmethod
    def from_compressed_tensors(cls, weight_packed, weight_scale, weight_zero_point=None,
                                group_size=None, g_idx=None, bias=None) -> "Int4Weight":
        """compressed-tensors pack-quantized tensors (weight_packed [N, K/8], weight_scale
        [N, K/G], weight_zero_point packed [N/8, K/G] or None; bias [N])."""
        return cls._from_canonical(
            lambda: _int4.from_compressed_tensors(weight_packed, weight_scale, weight_zero_point,
                                                  group_size=group_size, g_idx=g_idx), group_size, bias)


class GGUFWeight(_TwoLayouts):
    """GGUF block-quantized weight, in one of three layouts.

    layout="canonical": raw [N, row_bytes] uint8, each row K / block_elems blocks exactly as
    a .gguf file stores them. A numpy `raw` whose rows are padded (row stride > row bytes) is
    passed with that stride as ldw.

    layout="frag" (every GGUF format; made by .repack() or .to_device() on a GPU
    context; pyquant.formats.gguf_frag, docs/gguf-layout.md): raw is the int32 weights plane (q8_0's
    and q6_K's hold bytes, twice the others' size) and scales the scales plane that qg_gguf_repack
    writes (float16 for q4_0 and q8_0, uint16 for q4_K, iq4_xs, q6_K and iq3_xxs: gguf_frag.scales_dtype),
    the W4A16 frag planes of G = 32 that the GPU decode and prefill
    kernels read (fp16 or bf16 x there; fp32 x takes the block layout). Requires shape=(N, K).

    layout="rows8" (every GGUF format; made by .repack("rows8") or .to_device(ctx, "rows8")
    on the host or a CPU context; pyquant.formats.gguf_rows8): raw is the uint8 plane that
    qg_gguf_repack writes for the CPU tier, the blocks of each 8 rows side by side (the same
    results as the blocks, bit for bit). The CPU tier only. Requires shape=(N, K).

    Optional bias [N] (float32, float16 or bfloat16; the file's <name>.bias beside
    <name>.weight), added by pyquant.gemm, in either layout."""

    _component_names = ("raw", "scales", "bias")

    def __init__(self, format: str, raw, shape=None, bias=None, layout: str = "canonical", scales=None):
        spec = _format_spec(format)
        if spec.kind != "gguf":
            raise _err(f"format {spec.name!r} is not a GGUF block format "
                       f"({', '.join(n for n, s in _formats.FORMATS.items() if s.kind == 'gguf')}); "
                       "use pyquant.from_gguf for GGUF mxfp4 blocks")
        self.format = spec.name
        self.spec = spec
        _check_gguf_layout(layout)
        self.layout = layout
        if layout == "rows8":
            self._init_rows8(raw, scales, shape)
            self.bias = _checked_bias(bias, self.shape[:1])
            self._check_location()
            return
        if layout == "frag":
            self._init_frag(raw, scales, shape)
            self.bias = _checked_bias(bias, self.shape[:1])
            self._check_location()
            return
        if scales is not None:
            raise _err("scales= is the frag layout's scales plane; canonical GGUF blocks hold their scales")
        raw = _component(raw, "raw")
        if np.dtype(raw.dtype) not in (np.dtype(np.uint8), np.dtype(np.int8)):
            raise _err(f"raw has dtype {dtype_name(raw.dtype)}; expected uint8 GGUF block bytes")
        if isinstance(raw, np.ndarray) and raw.dtype == np.int8:
            raw = raw.view(np.uint8)
        if shape is None:
            _check_ndim(raw, 2, "raw", "[N, (K/block_elems)*block_bytes] (or pass shape=(N, K))")
            n, row_bytes = int(raw.shape[0]), int(raw.shape[1])
            if row_bytes % spec.block_bytes:
                raise _err(f"raw rows hold {row_bytes} bytes, not a multiple of the "
                           f"{spec.block_bytes}-byte {spec.name} block")
            shape = (n, row_bytes // spec.block_bytes * spec.block_elems)
        n, k = (int(s) for s in shape)
        self.shape = (n, k)
        row_bytes = (k // spec.block_elems) * spec.block_bytes  # K % block_elems: the library's check
        if len(raw.shape) == 1:
            if raw.shape[0] != n * row_bytes:
                raise _err(f"raw holds {raw.shape[0]} bytes; {spec.name} shape ({n}, {k}) needs "
                           f"N * (K/{spec.block_elems}) * {spec.block_bytes} = {n * row_bytes}")
            raw = raw.reshape(n, row_bytes) if isinstance(raw, np.ndarray) else \
                DeviceView(raw.ptr, (n, row_bytes), np.uint8, None, ctx=raw.ctx,
                           on_device=raw.on_device, owner=raw, stream=getattr(raw, "stream", None))
        _check_ndim(raw, 2, "raw", "[N, row_bytes] uint8")
        if raw.shape[0] != n:
            raise _err(f"raw has {raw.shape[0]} rows but shape says N={n}")
        if k % spec.block_elems == 0 and raw.shape[1] != row_bytes:
            raise _err(f"raw rows hold {raw.shape[1]} bytes; {spec.name} with K={k} needs "
                       f"(K/{spec.block_elems}) * {spec.block_bytes} = {row_bytes}")
        if isinstance(raw, np.ndarray) and raw.strides[1] != 1:
            raw = np.ascontiguousarray(raw)
        self.raw = raw
        self.scales = None
        self.bias = _checked_bias(bias, (n,))
        self._check_location()

    def _plane_shape_of(self, shape, layout: str) -> tuple:
        """(N, K) of a repacked layout's weight, whose planes do not say it: shape, checked."""
        if shape is None or len(shape) != 2:
            raise _err(f"a {layout}-layout GGUFWeight needs shape=(N, K)")
        n, k = (int(v) for v in shape)
        if n <= 0 or k <= 0 or k % self.spec.block_elems:
            raise _err(f"shape={(n, k)}: N and K must be positive and K a multiple of the "
                       f"{self.spec.block_elems}-element {self.spec.name} block")
        return n, k

    def _init_frag(self, raw, scales, shape):
        why = self._frag_refusal()
        if why is not None:
            raise _err(why)
        n, k = self.shape = self._plane_shape_of(shape, "frag")
        planes = _ggfrag.plane_shapes(self.format, n, k)
        arrays = _frag_planes({"raw": (raw, _PACKED_INT_DTYPES, False),
                               "scales": (scales, (_ggfrag.scales_dtype(self.format),), False)},
                              {"raw": planes["w"], "scales": planes["scales"]}, f"{self.spec.name} ({n}, {k})")
        self.raw, self.scales = arrays["raw"], arrays["scales"]

    def _init_rows8(self, raw, scales, shape):
        if scales is not None:
            raise _err("scales= is the frag layout's scales plane; the rows8 plane holds the blocks whole")
        n, k = self.shape = self._plane_shape_of(shape, "rows8")
        plane = _ggrows8.plane_shape(n, k, self.spec.block_elems, self.spec.block_bytes)
        a = _component(raw, "raw")
        if a is None:
            raise _err("raw is None; a rows8-layout weight needs its plane")
        a = _require_contiguous(a, "raw")
        if np.dtype(a.dtype) != np.dtype(np.uint8):
            raise _err(f"rows8 plane has dtype {dtype_name(a.dtype)}; expected uint8")
        if int(np.prod(a.shape)) != int(np.prod(plane)):
            raise _err(f"rows8 plane holds {int(np.prod(a.shape))} bytes; {self.spec.name} ({n}, {k}) needs "
                       f"{int(np.prod(plane))} (shape {plane}: N padded to 8)")
        self.raw, self.scales = a, None

    @property
    def ldw(self) -> int:
        """Row stride of raw in bytes (0 for the frag and rows8 layouts, whose planes have no rows)."""
        if self.layout in ("frag", "rows8"):
            return 0
        return int(self.raw.strides[0]) if self.shape[0] > 1 else int(self.raw.shape[1])

    @property
    def nbytes(self) -> int:
        """The rows' block bytes (row padding excluded) + the bias; the planes + the bias for
        the frag and rows8 layouts."""
        if self.layout in ("frag", "rows8"):
            return super().nbytes
        bias = 0 if self.bias is None else int(self.bias.nbytes)
        return int(self.raw.shape[0]) * int(self.raw.shape[1]) + bias

    def _replace(self, **arrays):
        return GGUFWeight(self.format, arrays["raw"], self.shape, bias=arrays.get("bias"), layout=self.layout,
                          scales=arrays.get("scales"))

    def _frag_refusal(self) -> str | None:
        if self.format in _ggfrag.FORMATS:
            return None
        return (f"format {self.format!r} has no frag layout yet "
                f"({', '.join(_ggfrag.FORMATS)} only); it runs on the block layout's tiers")

    def canonical_raw(self) -> np.ndarray:
        """The .gguf blocks uint8 [N, row_bytes] as a numpy array (a frag weight is unpacked
        with the numpy reference)."""
        raw = self._host("raw")
        if self.layout == "rows8":
            return _ggrows8.unpack(raw, *self.shape, self.spec.block_elems, self.spec.block_bytes)
        if self.layout == "frag":
            return _ggfrag.unpack(self.format, raw, self._host("scales"), *self.shape)
        return np.ascontiguousarray(raw)

    def _canonical_weight(self) -> "GGUFWeight":
        return GGUFWeight(self.format, self.canonical_raw(), self.shape, bias=self._host("bias"))

    def _repack_frag(self, ctx: Context, in_ctx: bool, stream) -> "GGUFWeight":
        n, k = self.shape
        args = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_FRAG, format=self.spec.qg_format,
                                        n=n, k=k, ldw=self.ldw)
        nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_gguf_repack_size(ctypes.byref(args), ctypes.byref(nw), ctypes.byref(ns))
        planes = _ggfrag.plane_shapes(self.format, n, k)
        out_w = _out_plane(planes["w"], np.int32, nw.value, ctx, in_ctx)
        out_s = _out_plane(planes["scales"], _ggfrag.scales_dtype(self.format), ns.value, ctx, in_ctx)
        args.w = _address(self.raw)
        args.out_w, args.out_scales = _address(out_w), _address(out_s)
        _lib.qg_gguf_repack(ctx.handle, ctypes.byref(args), stream_handle(stream))
        return GGUFWeight(self.format, out_w, self.shape, bias=self.bias, layout="frag", scales=out_s)

    def repack(self, layout: str = "frag", stream=None):
        """The same weight in `layout`: "frag" and "canonical" as for every weight (below);
        "rows8", the CPU tier's layout, on the host or a CPU context (qg_gguf_repack there)."""
        _check_gguf_layout(layout)
        if layout == self.layout:
            return self
        if self.layout == "rows8" and layout == "frag":
            return self._canonical_weight().repack("frag", stream)
        if layout != "rows8":
            return super().repack(layout, stream)
        if self.is_device and (self.ctx is None or self.ctx.is_gpu):
            raise _err("the rows8 layout is the CPU tier's: repack a host weight or one in a CPU context")
        src = self._canonical_weight() if self.layout == "frag" else self
        ctx = self.ctx if self.ctx is not None else cpu_context()
        n, k = self.shape
        args = _lib.qg_gguf_repack_args(layout=_lib.GGUFLayout.QG_GGUF_LAYOUT_ROWS8, format=self.spec.qg_format,
                                        n=n, k=k, ldw=src.ldw)
        nw, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_gguf_repack_size(ctypes.byref(args), ctypes.byref(nw), ctypes.byref(ns))
        out_w = _out_plane((nw.value,), np.uint8, nw.value, ctx, self.ctx is not None)
        args.w, args.out_w = _address(src.raw), _address(out_w)
        _lib.qg_gguf_repack(ctx.handle, ctypes.byref(args), stream_handle(stream))
        return GGUFWeight(self.format, out_w, self.shape, bias=self.bias, layout="rows8")

    def to_device(self, ctx: Context | None = None, layout: str = "auto", stream=None,
                  row_align: int | None = 16):
        """The same weight in `ctx` (default_context()). layout="auto" gives a GPU context the
        frag layout for every GGUF format (gguf_frag.AUTO_FRAG: repacked there, on
        `stream`: what the GPU decode and prefill kernels read) and keeps the layout otherwise;
        "canonical" or "frag" asks for one. The frag planes of q6_K and iq3_xxs take 1.31x and
        1.51x their blocks' device memory (the others 1.00-1.09x); where memory is what binds,
        layout="canonical" keeps the blocks, on the slower block-layout tiers. A canonical weight's rows start `row_align` bytes after the previous one
        (blocks unchanged; the zero padding is never read), so that the GPU decode tier copies
        rows with 16-byte loads: raw Q6_K and IQ3_XXS rows are otherwise only 2-byte aligned
        (docs/gguf-layout.md). The cost is one host-side copy and at most row_align - 1 bytes
        per row. row_align=None keeps the rows as they are."""
        ctx = ctx if ctx is not None else default_context()
        if layout == "auto":
            layout = "frag" if ctx.is_gpu and self.format in _ggfrag.AUTO_FRAG else self.layout
            layout = "frag" if ctx.is_gpu and layout == "rows8" else layout  # rows8 is the CPU tier's
        if layout == "rows8" or self.layout == "rows8":
            _check_gguf_layout(layout)
            if layout == "rows8" and ctx.is_gpu:
                raise _err("the rows8 layout is the CPU tier's; a GPU context reads canonical or frag weights")
            if self.layout == "rows8":
                return (_Weight.to_device(self, ctx) if layout == "rows8" else
                        self._canonical_weight().to_device(ctx, layout, stream, row_align))
            return self.to_device(ctx, "canonical", stream, None).repack("rows8", stream)
        if layout == "frag" or self.layout == "frag":
            return super().to_device(ctx, layout, stream)
        _check_layout(layout)
        n, row_bytes = int(self.raw.shape[0]), int(self.raw.shape[1])
        if row_align is None or self.ldw % row_align == 0:
            return _Weight.to_device(self, ctx)
        ldw = -(-row_bytes // row_align) * row_align
        padded = np.zeros((n, ldw), np.uint8)
        padded[:, :row_bytes] = self._host("raw")
        rows = DeviceArray.from_numpy(padded, ctx).window(0, 0, n, row_bytes)
        return GGUFWeight(self.format, rows, self.shape, bias=self._moved(self.bias, ctx))

    def dequantize(self) -> np.ndarray:
        """float32 [N, K] through the numpy reference (bit-exact with gguf.quants)."""
        return self.spec.module.dequantize(self.canonical_raw())


class MXFP4Weight(_TwoLayouts):
    """OCP MXFP4 weight, in one of two layouts.

    layout="canonical" (as GPT-OSS ships it): blocks [N, K/32, 16] uint8 (byte j = element
    2j low nibble, 2j+1 high nibble, E2M1 codes), scales [N, K/32] uint8 E8M0. Stacked
    experts for moe(): blocks [E, N, K/32, 16], scales [E, N, K/32].

    layout="frag" (made by .repack() or .to_device() for a dense weight, by
    pyquant.moe_repack for experts; pyquant.formats.mxfp4_frag and docs/w4a16-layout.md,
    "MXFP4"): the two planes qg_mxfp4_repack writes, the W4A16 frag planes of G = 32 (blocks
    int32, scales bfloat16 2^(e - 127)), which the GPU tiers read; shape=(N, K) must be given.
    Stacked experts in the frag layout (what the GPU MoE tiers read): shape=(E, N, K), parts
    (2 for w13: gate and up apart, 1 for w2) and gate_up ("interleaved" / "concat": which
    canonical rows were gate and up; the bias keeps that row order), the planes of
    qg_moe_repack.

    Optional bias [N] (or [E, N]) in float32, float16 or bfloat16, in either layout."""

    format = "mxfp4"
    _component_names = ("blocks", "scales", "bias")
    parts = 1
    gate_up = None

    def __init__(self, blocks, scales, bias=None, layout: str = "canonical", shape=None,
                 parts: int = 1, gate_up: str | None = None):
        _check_layout(layout)
        self.layout = layout
        if layout == "frag":
            self._init_frag(blocks, scales, shape, parts, gate_up)
            self.bias = _checked_bias(bias, self.shape[:-1])
            self._check_location()
            return
        if parts != 1 or gate_up is not None:
            raise _err("parts= and gate_up= describe frag-layout experts (pyquant.moe_repack)")
        if shape is not None:
            raise _err("shape= is for the frag layout; a canonical weight's shape follows from blocks")
        blocks = _require_contiguous(_component(blocks, "blocks"), "blocks")
        scales = _require_contiguous(_component(scales, "scales"), "scales")
        for a, name in ((blocks, "blocks"), (scales, "scales")):
            if np.dtype(a.dtype) != np.uint8:
                raise _err(f"{name} has dtype {dtype_name(a.dtype)}; MXFP4 {name} are uint8")
        if len(blocks.shape) not in (3, 4) or blocks.shape[-1] != 16:
            raise _err(f"blocks must be [N, K/32, 16] or [E, N, K/32, 16] uint8, got shape "
                       f"{tuple(blocks.shape)}")
        if tuple(scales.shape) != tuple(blocks.shape[:-1]):
            raise _err(f"scales has shape {tuple(scales.shape)}, expected blocks.shape[:-1] = "
                       f"{tuple(blocks.shape[:-1])} (one E8M0 byte per 32-element block)")
        lead = tuple(int(s) for s in blocks.shape[:-2])
        self.shape = lead + (int(blocks.shape[-2]) * 32,)
        self.blocks, self.scales, self.bias = blocks, scales, _checked_bias(bias, lead)
        self._check_location()

    def _init_frag(self, blocks, scales, shape, parts, gate_up):
        if shape is None or len(shape) not in (2, 3):
            raise _err("a frag-layout MXFP4Weight needs shape=(N, K), or (E, N, K) for experts")
        dims = tuple(int(v) for v in shape)
        n, k = dims[-2:]
        if min(dims) <= 0 or k % 32:
            raise _err(f"shape={dims}: every size must be positive and K a multiple of 32 (MXFP4 blocks)")
        if len(dims) == 2:
            if parts != 1 or gate_up is not None:
                raise _err("parts= and gate_up= are for experts, shape=(E, N, K)")
            planes = _mxfrag.plane_shapes(n, k)
        else:
            if parts not in (1, 2) or n % parts:
                raise _err(f"parts={parts} must be 1 (w2) or 2 (w13: gate, up) and divide N={n}")
            if (parts == 2) != (gate_up in ("interleaved", "concat")):
                raise _err(f"gate_up={gate_up!r}: 'interleaved' or 'concat' for parts=2 (w13), None for parts=1")
            planes = _mxfrag.moe_plane_shapes(dims[0], n, k, parts)
            self.parts, self.gate_up = parts, gate_up
        self.shape = dims
        arrays = _frag_planes({"blocks": (blocks, _PACKED_INT_DTYPES, False),
                               "scales": (scales, (BFLOAT16,), False)},
                              planes, f"{dims}")
        self.blocks, self.scales = arrays["blocks"], arrays["scales"]

    @property
    def num_experts(self) -> int | None:
        return self.shape[0] if len(self.shape) == 3 else None

    def _replace(self, **arrays):
        frag = self.layout == "frag"
        return MXFP4Weight(arrays["blocks"], arrays["scales"], arrays.get("bias"), layout=self.layout,
                           shape=self.shape if frag else None, parts=self.parts if frag else 1,
                           gate_up=self.gate_up if frag else None)

    def canonical_arrays(self) -> tuple:
        """(blocks, scales) in the canonical layout, as numpy arrays (a frag weight is
        unpacked with the numpy reference)."""
        b, s = self._host("blocks"), self._host("scales")
        if self.layout == "frag":
            if len(self.shape) == 3:
                return _mxfrag.moe_unpack(b, s, *self.shape, self.parts, self.gate_up or "interleaved")
            return _mxfrag.unpack(b, s, *self.shape)
        return b, s

    def _frag_refusal(self) -> str | None:
        if len(self.shape) == 2:
            return None
        return (f"stacked experts {self.shape} take the MoE frag layout, whose gate / up split "
                "only pyquant.moe_repack knows: use it")

    def moe_repack(self, parts: int, gate_up: str | None, ctx: Context, stream=None) -> "MXFP4Weight":
        """These canonical experts in the MoE frag layout (qg_moe_repack) where ctx keeps
        memory: DeviceArrays of a GPU ctx (the weight is copied there first if it is not),
        numpy on a CPU one."""
        if self.layout != "canonical" or len(self.shape) != 3:
            raise _err(f"moe_repack takes canonical experts [E, N, K]; this weight is {self.layout} {self.shape}")
        w = self if self.ctx is ctx or (not ctx.is_gpu and not self.is_device) else self.to_device(ctx, "canonical")
        e, n, k = w.shape
        args = _lib.qg_moe_repack_args(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, num_experts=e, parts=parts,
                                       gate_up_layout=_lib.GateUpLayout.QG_GATE_UP_CONCAT if gate_up == "concat"
                                       else _lib.GateUpLayout.QG_GATE_UP_INTERLEAVED, n=n, k=k)
        nb, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_moe_repack_size(ctypes.byref(args), ctypes.byref(nb), ctypes.byref(ns))
        planes = _mxfrag.moe_plane_shapes(e, n, k, parts)
        in_ctx = ctx.is_gpu
        out_b = _out_plane(planes["blocks"], np.int32, nb.value, ctx, in_ctx)
        out_s = _out_plane(planes["scales"], BFLOAT16, ns.value, ctx, in_ctx)
        args.blocks, args.scales = _address(w.blocks), _address(w.scales)
        args.out_blocks, args.out_scales = _address(out_b), _address(out_s)
        _lib.qg_moe_repack(ctx.handle, ctypes.byref(args), stream_handle(stream))
        if in_ctx:
            ctx.synchronize(stream)
        return MXFP4Weight(out_b, out_s, w.bias, layout="frag", shape=w.shape, parts=parts,
                           gate_up=gate_up if parts == 2 else None)

    def _canonical_weight(self) -> "MXFP4Weight":
        return MXFP4Weight(*self.canonical_arrays(), bias=self._host("bias"))

    def _repack_frag(self, ctx: Context, in_ctx: bool, stream) -> "MXFP4Weight":
        n, k = self.shape
        args = _lib.qg_mxfp4_repack_args(layout=_lib.MXFP4Layout.QG_MXFP4_LAYOUT_FRAG, n=n, k=k)
        nb, ns = ctypes.c_size_t(0), ctypes.c_size_t(0)
        _lib.qg_mxfp4_repack_size(ctypes.byref(args), ctypes.byref(nb), ctypes.byref(ns))
        planes = _mxfrag.plane_shapes(n, k)
        out_b = _out_plane(planes["blocks"], np.int32, nb.value, ctx, in_ctx)
        out_s = _out_plane(planes["scales"], BFLOAT16, ns.value, ctx, in_ctx)
        args.blocks, args.scales = _address(self.blocks), _address(self.scales)
        args.out_blocks, args.out_scales = _address(out_b), _address(out_s)
        _lib.qg_mxfp4_repack(ctx.handle, ctypes.byref(args), stream_handle(stream))
        return MXFP4Weight(out_b, out_s, self.bias, layout="frag", shape=self.shape)

    def dequantize(self) -> np.ndarray:
        """float32 [N, K] (or [E, N, K]) through the numpy reference, in either layout; bias
        not added."""
        return _mxfp4.dequantize(*self.canonical_arrays())


def _format_spec(name: str):
    try:
        return _formats.get(name)
    except ValueError as e:
        raise _err(str(e)) from None


# Kernel families that read each weight class, for api.gemm.
WEIGHT_CLASSES = (Int4Weight, GGUFWeight, MXFP4Weight)
SCALE_QG_DTYPE = {np.dtype(np.float16): DType.QG_DTYPE_F16, BFLOAT16: DType.QG_DTYPE_BF16}
