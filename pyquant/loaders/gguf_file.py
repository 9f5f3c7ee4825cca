"""Read a .gguf file into pyquant weights, through the `gguf` package's memory-mapped reader."""

from __future__ import annotations

import os

import ml_dtypes
import numpy as np

from .. import formats as _formats
from .checkpoint import Checkpoint

# GGML types the reader already hands back as typed numpy arrays (kept as they are).
_PLAIN_TYPE_NAMES = ("F32", "F16", "F64", "I8", "I16", "I32", "I64")


def _gguf():
    """The `gguf` package, imported on first use so that pyquant imports without it."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError("pyquant.load_gguf needs the `gguf` package: pip install gguf") from e
    return gguf


def gguf_type_to_format() -> dict[int, str]:
    """GGML type number -> pyquant format name, from the format registry."""
    return {spec.gguf_type: spec.name for spec in _formats.FORMATS.values()
            if spec.gguf_type is not None}


def _numpy_shape(tensor) -> tuple[int, ...]:
    # GGUF stores ne[0] (the fastest dimension, K for a weight) first: reverse it.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _metadata(reader) -> dict:
    """Key-value metadata as Python values; the GGUF.* header fields are left out."""
    out = {}
    for name, fld in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        out[name] = fld.contents()
    return out


def _quantized_weight(fmt: str, data: np.ndarray, shape: tuple[int, ...]):
    """Raw block bytes of one quantized tensor -> pyquant weight.

    A 2-D tensor [N, K] maps one to one. A vector [K] becomes one row [1, K]. MoE experts
    [E, N, K] in MXFP4 stay stacked ([E, N, K], what pyquant.moe takes); in a GGUF block
    format they are folded into [E*N, K] (GGUFWeight is 2-D): row e*N + n is expert e's
    row n, which is how the blocks lie in the file."""
    import pyquant  # late: pyquant/__init__ imports this package

    k = shape[-1]
    n = int(np.prod(shape[:-1], dtype=np.int64)) if len(shape) > 1 else 1
    raw = data.reshape(n, -1)  # a view of the memory map: no copy here
    w = pyquant.from_gguf(fmt, raw, shape=(n, k))
    if fmt == "mxfp4" and len(shape) == 3:
        e, n_e = shape[0], shape[1]
        w = pyquant.from_mxfp4(w.blocks.reshape(e, n_e, k // 32, 16),
                               w.scales.reshape(e, n_e, k // 32))
    return w


def load_gguf(path: str | os.PathLike, strict: bool = False) -> Checkpoint:
    """Load every tensor of a .gguf file.

    Quantized tensors of a registered format become pyquant weights (GGUFWeight, or
    MXFP4Weight for GGML's MXFP4, repacked to the OCP layout); float and integer tensors
    become numpy arrays (BF16 as ml_dtypes.bfloat16), views of the memory-mapped file.
    A tensor of any other GGML type is recorded in `Checkpoint.unsupported` with its type
    and the reason, never raised on (strict=True raises ValueError instead)."""
    path = os.fspath(path)
    gguf = _gguf()
    _T = gguf.GGMLQuantizationType
    plain_types = tuple(_T[name] for name in _PLAIN_TYPE_NAMES)
    reader = gguf.GGUFReader(path, "r")
    by_type = gguf_type_to_format()
    ckpt = Checkpoint(path=path, container="gguf", metadata=_metadata(reader))
    for t in reader.tensors:
        qtype = _T(int(t.tensor_type))
        shape = _numpy_shape(t)
        if qtype in plain_types:
            ckpt.tensors[t.name] = t.data.reshape(shape)
            ckpt.source[t.name] = f"gguf {qtype.name}"
        elif qtype == _T.BF16:
            # the reader hands BF16 back as raw bytes [..., 2K]
            ckpt.tensors[t.name] = t.data.view(ml_dtypes.bfloat16).reshape(shape)
            ckpt.source[t.name] = "gguf BF16"
        elif int(qtype) in by_type:
            fmt = by_type[int(qtype)]
            try:
                w = _quantized_weight(fmt, t.data, shape)
                ckpt.tensors[t.name] = w
                folded = "" if tuple(w.shape) == shape else f" ({list(shape)} as {list(w.shape)})"
                ckpt.source[t.name] = f"gguf {qtype.name}{folded}"
            except ValueError as e:  # pyquant rejects the shape (e.g. N it cannot serve)
                ckpt.unsupported[t.name] = f"{qtype.name} {list(shape)}: {e}"
        else:
            known = ", ".join(sorted(_T(v).name for v in by_type))
            ckpt.unsupported[t.name] = (
                f"GGML type {qtype.name} ({int(qtype)}) {list(shape)} has no pyquant format "
                f"(supported quantized types: {known})")
    if strict and ckpt.unsupported:
        name, why = next(iter(ckpt.unsupported.items()))
        raise ValueError(f"{name}: {why}")
    return ckpt
