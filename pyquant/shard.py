"""Shards of quantized weights for tensor and expert parallelism (docs/tensor-parallel.md).

Engines that run one model on several GPUs (vLLM, SGLang, TensorRT-LLM, llama.cpp's split
mode) cut every linear layer, and join the pieces with an all-reduce:
  axis "n"       column-parallel: each GPU owns whole output features; the outputs are
                 concatenated, or feed a row-parallel layer as they are;
  axis "k"       row-parallel: each GPU owns a slice of the input features; the partial
                 outputs are summed (all-reduce);
  axis "expert"  expert-parallel, stacked MoE weights [E, N, K]: each GPU owns whole experts.

A quantized weight can be cut only where no packed word, group or block straddles the cut.
Every cut (a boundary between two parts; the last part ends at N or K itself) must fall on
a multiple of:

    weight                   n                                 k
    int4 canonical           8   (qzeros: 8 rows to a word)    group_size (one scale, one zero)
    int4, mxfp4, GGUF q4_0   16  (a row block of the planes)   128 (a k-chunk of the planes)
      and q8_0 frag
    GGUF q8_0, q4_0          1                                 32  (a block)
    GGUF q4_K, q6_K, iq4_xs, 1                                 256 (a super-block)
         iq3_xxs
    mxfp4                    1                                 32  (a block); expert: 1

A frag weight whose N or K is padded (to 16 and 128) keeps that padding in its last part,
so a frag shard on these cuts is byte for byte the repack (qg_w4a16_repack, qg_mxfp4_repack)
of the canonical shard: the
planes tile rows in blocks of 16 and k in chunks of 128 and no tile straddles a cut. A cut
elsewhere is refused rather than unpacked, resharded and repacked behind the caller's back
(that would be a second, silent repack, and a part of 8 rows padded to 16 would do half of
its tensor-core work on padding): shard the canonical weight and repack each part instead.

Each component of a shard is one 2-D byte copy of that component's buffer (Copy: the
arguments of cudaMemcpy2D), which is all an engine needs on raw buffers (there is no C
function for it: docs/tensor-parallel.md gives the offsets). plan() lists the copies,
shard() makes them:
  - numpy arrays: sliced on the host into fresh 64-byte-aligned arrays;
  - device arrays (and a CPU context's DeviceArrays, host memory behind the same calls): a
    copy that is one run of bytes (n and expert shards of a C-contiguous array; GGUF rows
    keep their padded stride) is one qg_memcpy in the weight's context; a strided copy (k
    shards, n shards of stacked experts) goes through the host: the component is copied
    to the host, sliced, and the slice copied back. qg_memcpy is one-dimensional, and a
    copy per row would be N calls for an [N, K/8] qweight. The shard lives where the weight
    does; to place it on another GPU, move it (.to_host().to_device(ctx)), or shard on the
    host before the weights go to their devices, as an engine loading a checkpoint does.
Row-parallel parts of a weight with a bias: part 0 keeps the bias, the others have none, so
that the all-reduce adds it once (as vLLM's RowParallelLinear does on rank 0).
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import numpy as np

from . import _lib
from .device import DeviceArray, _err, gpu_context
from .formats import gguf_frag as _ggfrag, int4 as _int4, int4_frag as _frag, mxfp4_frag as _mxfrag
from .weights import GGUFWeight, Int4Weight, MXFP4Weight, _aligned_host, _to_host

__all__ = ["AXES", "Copy", "Plan", "axes", "rule", "plan", "shard"]

AXES = ("expert", "n", "k")
_SPLIT = {"n": "column-parallel", "k": "row-parallel", "expert": "expert-parallel"}
_EXTENT = {"n": "N", "k": "K", "expert": "E"}


@dataclass(frozen=True)
class Copy:
    """One component of a shard as a 2-D byte copy: `height` runs of `width` bytes, the
    first at byte `offset` of the source buffer and one every `pitch` bytes, written back to
    back (cudaMemcpy2D(dst, width, src + offset, pitch, width, height)). The same slice in
    array terms: elements [start, stop) along `axis` of the source viewed as `src_shape`,
    giving an array of `shape` in the component's dtype."""
    component: str
    src_shape: tuple
    axis: int
    start: int
    stop: int
    offset: int
    pitch: int
    width: int
    height: int

    @property
    def shape(self) -> tuple:
        return self.src_shape[:self.axis] + (self.stop - self.start,) + self.src_shape[self.axis + 1:]

    @property
    def contiguous(self) -> bool:
        """One run of bytes in the source: one plain copy."""
        return self.height == 1 or self.pitch == self.width


@dataclass(frozen=True)
class Plan:
    """Part [start, stop) of `axis` of a weight: the shard's shape, the Copy of each
    component it keeps, and the components it drops (the bias of row-parallel parts after
    part 0)."""
    axis: str
    start: int
    stop: int
    shape: tuple
    copies: tuple
    dropped: tuple = ()


def _copy(component: str, src_shape, itemsize: int, axis: int, start: int, stop: int,
          row_pitch: int | None = None) -> Copy:
    """The slice [start, stop) along `axis` of a C-contiguous array of `src_shape`, or of a
    2-D one whose rows lie row_pitch bytes apart (GGUF rows padded for the GPU)."""
    src_shape = tuple(int(s) for s in src_shape)
    inner = itemsize * math.prod(src_shape[axis + 1:])      # bytes of one step along axis
    if row_pitch is None:
        height, pitch = math.prod(src_shape[:axis]), src_shape[axis] * inner
        offset, width = start * inner, (stop - start) * inner
    elif axis == 0:
        height, pitch, offset, width = stop - start, row_pitch, start * row_pitch, inner
    else:
        height, pitch, offset, width = src_shape[0], row_pitch, start * inner, (stop - start) * inner
    return Copy(component, src_shape, axis, start, stop, offset, pitch, width, height)


# ---------------------------------------------------------------- rules

def axes(w) -> tuple:
    """The axis names of w.shape: ("n", "k"), or ("expert", "n", "k") for stacked experts."""
    return AXES[3 - len(w.shape):]


def _axis_name(w, axis) -> str:
    names = axes(w)
    if isinstance(axis, str) and axis.lower() in names:
        return axis.lower()
    if not isinstance(axis, (str, bool)):
        try:
            i = operator.index(axis)
        except TypeError:
            i = None
        if i is not None and -len(names) <= i < len(names):
            return names[i]
    if isinstance(axis, str) and axis.lower() in AXES:
        raise _err(f"axis={axis!r}: {type(w).__name__} of shape {w.shape} has no {axis} axis "
                   f"(its axes are {', '.join(names)})")
    raise _err(f"axis={axis!r} is not one of {', '.join(repr(n) for n in names)} or an index "
               f"into shape {w.shape}")


def _describe(w) -> str:
    if isinstance(w, Int4Weight):
        if w.layout == "frag":
            return f"a frag-layout int4 weight (group_size={w.group_size})"
        return f"an int4 weight with group_size={w.group_size}"
    if isinstance(w, GGUFWeight):
        return f"a frag-layout {w.format} weight" if w.layout == "frag" else f"a {w.format} weight"
    return "a frag-layout mxfp4 weight" if w.layout == "frag" else "an mxfp4 weight"


def rule(w, axis) -> tuple[int, str]:
    """(granule, why): the cuts along `axis` must fall on multiples of granule."""
    name = _axis_name(w, axis)
    if getattr(w, "layout", None) == "frag":  # int4, mxfp4 or gguf q4_0 / q8_0: the same planes
        return {"n": (_frag.ROW_BLOCK, "whole 16-row blocks of the frag planes"),
                "k": (_frag.K_CHUNK, "whole 128-k chunks of the frag planes")}[name]
    if isinstance(w, Int4Weight):
        return {"n": (8, "qzeros pack the zero-points of 8 rows into one int32 word"),
                "k": (w.group_size, f"one scale and zero-point cover {w.group_size} inputs")}[name]
    if isinstance(w, GGUFWeight):
        if name == "k":
            return w.spec.block_elems, f"one {w.format} block covers {w.spec.block_elems} inputs"
        return 1, "whole rows"
    if name == "k":
        return 32, "one E8M0 scale covers a block of 32 inputs"
    return 1, "whole rows" if name == "n" else "whole experts"


def _bounds(w, name: str, parts, index) -> tuple[int, int, int]:
    """(start, stop, number of parts) of part `index`, every cut checked against rule()."""
    extent = int(w.shape[axes(w).index(name)])
    granule, why = rule(w, name)
    x = _EXTENT[name]
    lead = f"{name}={extent}: a {_SPLIT[name]} split of {_describe(w)}"
    fix = ""
    if getattr(w, "layout", None) == "frag":
        fix = ("; to cut elsewhere, shard the canonical weight and repack each part: "
               "w.repack('canonical').shard(...).repack() on host weights")
    if isinstance(parts, (int, np.integer)) and not isinstance(parts, bool):
        count = int(parts)
        if count < 1:
            raise _err(f"parts={count} must be at least 1")
        if extent % count:
            if granule == 1:
                raise _err(f"{lead} into {count} equal parts needs {x} % parts == 0; {extent}/{count} "
                           "is not an integer (parts may be a list of sizes)")
            raise _err(f"{lead} must cut {x} at multiples of {granule} ({why}); {extent}/{count} "
                       f"is not{fix}")
        size = extent // count
        if count > 1 and size % granule:  # a single part has no cut
            raise _err(f"{lead} must cut {x} at multiples of {granule} ({why}); {extent}/{count} = "
                       f"{size} is not{fix}")
        sizes = [size] * count
    else:
        try:
            sizes = [operator.index(s) for s in parts]
        except TypeError:
            raise _err(f"parts={parts!r} must be a number of equal parts or a list of sizes") from None
        count = len(sizes)
        if not sizes or min(sizes) < 1 or sum(sizes) != extent:
            raise _err(f"parts={sizes} must be positive sizes that add up to {x}={extent}")
        cuts = np.cumsum(sizes)[:-1]
        bad = [int(c) for c in cuts if c % granule]
        if bad:
            raise _err(f"{lead} must cut {x} at multiples of {granule} ({why}); the cut at "
                       f"{x}={bad[0]} (parts={sizes}) is not{fix}")
    try:
        i = operator.index(index)
    except TypeError:
        raise _err(f"index={index!r} must be an integer") from None
    if not 0 <= i < count:
        raise _err(f"index={i} is not a part of {count} (0..{count - 1})")
    start = sum(sizes[:i])
    return start, start + sizes[i], count


def _check_valid(w) -> None:
    """The sizes the library requires of the whole weight (a shard of an invalid weight would
    slice arrays of the wrong extents); its own sentence, as the first gemm would say it."""
    n, k = w.shape[-2:]
    try:
        if isinstance(w, Int4Weight):
            _int4._check_group_size(w.group_size)
            _int4._check_n(n)
            _int4._check_k(k, w.group_size)
        elif isinstance(w, GGUFWeight) and k % w.spec.block_elems:
            raise ValueError(f"k={k} is not a multiple of the {w.format} block "
                             f"({w.spec.block_elems} elements)")
    except ValueError as e:
        raise _err(f"cannot shard {w!r}: {e}") from None


# ---------------------------------------------------------------- plans per weight class

def plan(w, axis, parts, index) -> Plan:
    """The copies that make part `index` of `parts` (a count of equal parts, or a list of
    sizes) along `axis` ("n", "k", "expert", or an index into w.shape) of weight w."""
    name = _axis_name(w, axis)
    _check_valid(w)
    if isinstance(w, GGUFWeight) and w.layout == "frag" and w.format not in ("q4_0", "q8_0"):
        raise _err(f"a frag-layout {w.format} weight does not shard (its scales plane holds the records and "
                   "the super-block words in one array); shard the block weight and repack each part: "
                   "w.repack('canonical').shard(...).repack() on host weights")
    start, stop, count = _bounds(w, name, parts, index)
    shape = tuple(stop - start if a == name else s for a, s in zip(axes(w), w.shape))
    if isinstance(w, Int4Weight):
        copies = _int4_frag_copies(w, name, start, stop) if w.layout == "frag" else \
            _int4_copies(w, name, start, stop)
    elif isinstance(w, MXFP4Weight) and w.layout == "frag":
        copies = _frag_copies(w, _mxfrag.plane_shapes(*w.shape), {"blocks": 4, "scales": 2}, "blocks",
                              name, start, stop)
    elif isinstance(w, GGUFWeight) and w.layout == "frag":  # the W4A16 planes of G = 32, as MXFP4's
        planes = _ggfrag.plane_shapes(w.format, *w.shape)
        copies = _frag_copies(w, {"raw": planes["w"], "scales": planes["scales"]}, {"raw": 4, "scales": 2}, "raw",
                              name, start, stop)
    elif isinstance(w, GGUFWeight):
        n, row_bytes = int(w.raw.shape[0]), int(w.raw.shape[1])
        be, bb = w.spec.block_elems, w.spec.block_bytes  # k shards: whole blocks of bytes
        lo, hi = (start, stop) if name == "n" else (start // be * bb, stop // be * bb)
        copies = (_copy("raw", (n, row_bytes), 1, 0 if name == "n" else 1, lo, hi, row_pitch=w.ldw),)
    else:
        copies = _mxfp4_copies(w, name, start, stop)
    bias, dropped = _bias_copies(w, name, start, stop, index)
    return Plan(name, start, stop, shape, copies + bias, dropped)


def _int4_copies(w, name: str, start: int, stop: int) -> tuple:
    n, k = w.shape
    g, s_size = w.group_size, np.dtype(w.scales.dtype).itemsize
    if name == "n":  # rows; qzeros rows are words of 8 rows
        spans = {"qweight": (start, stop), "scales": (start, stop), "qzeros": (start // 8, stop // 8)}
    else:            # qweight words of 8 k, one scale / zero column per group
        spans = {"qweight": (start // 8, stop // 8), "scales": (start // g, stop // g),
                 "qzeros": (start // g, stop // g)}
    shapes = {"qweight": ((n, k // 8), 4), "scales": ((n, k // g), s_size), "qzeros": ((n // 8, k // g), 4)}
    ax = 0 if name == "n" else 1
    return tuple(_copy(c, *shapes[c], ax, *spans[c]) for c in ("qweight", "scales", "qzeros")
                 if getattr(w, c) is not None)


def _int4_frag_copies(w, name: str, start: int, stop: int) -> tuple:
    """Planes qweight [RB, KT, 32, 4], scales [RB, KC, 8, GC, 2], qzeros [RB, KC, 8, GC]
    (pyquant.formats.int4_frag)."""
    n, k = w.shape
    items = {"qweight": 4, "scales": np.dtype(w.scales.dtype).itemsize, "qzeros": 1}
    return _frag_copies(w, _frag.plane_shapes(n, k, w.group_size), items, "qweight", name, start, stop)


def _frag_copies(w, planes: dict, items: dict, words: str, name: str, start: int, stop: int) -> tuple:
    """The frag planes of w ({component: shape}, {component: itemsize}), the weight words
    `words` [RB, KT, ...], the others [RB, KC, ...] (an MXFP4 frag weight's are the int4 ones
    of G = 32: pyquant.formats.mxfp4_frag): an n shard is row blocks rb, a k shard k-tiles
    of the words (two per 128-k chunk; four of a GGUF q8_0 byte plane) and k-chunks of the rest."""
    up = lambda v, m: -(-v // m)  # noqa: E731
    if name == "n":
        rb = (start // _frag.ROW_BLOCK, up(stop, _frag.ROW_BLOCK))
        spans = {c: rb for c in planes}
    else:
        kc = (start // _frag.K_CHUNK, up(stop, _frag.K_CHUNK))
        per = planes[words][1] // -(-w.shape[-1] // _frag.K_CHUNK)  # word tiles a chunk
        spans = {c: (kc[0] * per, kc[1] * per) if c == words else kc for c in planes}
    ax = 0 if name == "n" else 1
    return tuple(_copy(c, planes[c], items[c], ax, *spans[c]) for c in planes if getattr(w, c) is not None)


def _mxfp4_copies(w, name: str, start: int, stop: int) -> tuple:
    """blocks [..., N, K/32, 16], scales [..., N, K/32] ("..." = E or nothing)."""
    lead = len(w.shape) - 2
    ax = {"expert": 0, "n": lead, "k": lead + 1}[name]
    lo, hi = (start // 32, stop // 32) if name == "k" else (start, stop)
    return (_copy("blocks", w.blocks.shape, 1, ax, lo, hi), _copy("scales", w.scales.shape, 1, ax, lo, hi))


def _bias_copies(w, name: str, start: int, stop: int, index: int) -> tuple:
    """(copies, dropped) of the bias [..., N]: an expert or n part keeps its slice, a k part
    all of it for part 0 and none after (the all-reduce adds the parts: the bias goes to one
    of them)."""
    if w.bias is None:
        return (), ()
    it = np.dtype(w.bias.dtype).itemsize
    if name != "k":
        return (_copy("bias", w.bias.shape, it, 0 if name == "expert" else len(w.bias.shape) - 1, start, stop),), ()
    if index == 0:
        return (_copy("bias", w.bias.shape, it, 0, 0, int(w.bias.shape[0])),), ()
    return (), ("bias",)


# ---------------------------------------------------------------- making the copies

def _host_slice(a: np.ndarray, c: Copy) -> np.ndarray:
    src = a.reshape(c.src_shape) if tuple(a.shape) != c.src_shape else a
    out = _aligned_host(math.prod(c.shape) * a.dtype.itemsize).view(a.dtype).reshape(c.shape)
    out[...] = src[(slice(None),) * c.axis + (slice(c.start, c.stop),)]
    return out


def _device_copy(ctx, a, dst: int, c: Copy, nbytes: int) -> None:
    kind = ctx.copy_kind(dst_on_device=a.on_device, src_on_device=a.on_device)
    _lib.qg_memcpy(ctx.handle, dst, a.ptr + c.offset, nbytes, kind, None)


def _take(a, c: Copy, ctx):
    """Component `a` (numpy, DeviceArray or DeviceView) sliced as Copy c, in a's place."""
    if isinstance(a, np.ndarray):
        return _host_slice(a, c)
    if isinstance(a, DeviceArray):
        a._live("shard")
    if c.contiguous:
        out = DeviceArray.empty(c.shape, a.dtype, ctx)
        if out.nbytes:
            _device_copy(ctx, a, out.ptr, c, out.nbytes)
            ctx.synchronize()
        return out
    if c.axis == 0:
        # the only strided axis-0 copy: GGUF rows padded by to_device(); one copy of the
        # span keeps their stride
        rows = c.stop - c.start
        buf = DeviceArray.empty((rows, c.pitch), np.uint8, ctx)
        _device_copy(ctx, a, buf.ptr, c, (rows - 1) * c.pitch + c.width)
        ctx.synchronize()
        return buf.window(0, 0, rows, c.width)
    return DeviceArray.from_numpy(_host_slice(_to_host(a, ctx), c), ctx)


def shard(w, axis, parts, index):
    """Part `index` of `parts` along `axis` of weight w, as a weight of the same class,
    format and layout, in the same place (module docstring: the rules and the copies)."""
    p = plan(w, axis, parts, index)
    ctx = w.ctx
    if ctx is None and w.is_device:  # foreign device arrays (CuPy, torch): the GPU context
        ctx = gpu_context()
    if isinstance(w, GGUFWeight) and w.layout == "canonical" and p.axis == "k" and not isinstance(w.raw, np.ndarray):
        # through the host, then rows padded as to_device() pads them (when the source's are)
        host = {c.component: _host_slice(_to_host(getattr(w, c.component), ctx), c) for c in p.copies}
        return GGUFWeight(w.format, host["raw"], p.shape, bias=host.get("bias")).to_device(
            ctx, layout="canonical", row_align=16 if w.ldw % 16 == 0 else None)
    arrays = {c.component: _take(getattr(w, c.component), c, ctx) for c in p.copies}
    if isinstance(w, Int4Weight):
        frag = w.layout == "frag"
        return Int4Weight(arrays["qweight"], arrays["scales"], arrays.get("qzeros"), w.group_size,
                          layout=w.layout, shape=p.shape if frag else None, bias=arrays.get("bias"))
    if isinstance(w, GGUFWeight):
        return GGUFWeight(w.format, arrays["raw"], p.shape, bias=arrays.get("bias"), layout=w.layout,
                          scales=arrays.get("scales"))
    assert isinstance(w, MXFP4Weight)
    return MXFP4Weight(arrays["blocks"], arrays["scales"], arrays.get("bias"), layout=w.layout,
                       shape=p.shape if w.layout == "frag" else None)
