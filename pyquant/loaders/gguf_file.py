"""Read a .gguf file into pyquant weights, through the `gguf` package's memory-mapped reader."""

from __future__ import annotations

import mmap
import os

import ml_dtypes
import numpy as np

from .. import formats as _formats
from .. import progress as _progress
from .checkpoint import Checkpoint

# GGML types the reader already hands back as typed numpy arrays (kept as they are).
_PLAIN_TYPE_NAMES = ("F32", "F16", "F64", "I8", "I16", "I32", "I64")


def _gguf():
    """The `gguf` package, imported on first use so that pyquant imports without it."""
    try:
        import gguf
    except ImportError as e:
        raise ImportError("pyquant.load_gguf needs the `gguf` package: "
                          "pip install 'pyquant[gguf]' (or pip install gguf)") from e
    return gguf


def gguf_type_to_format() -> dict[int, str]:
    """GGML type number -> pyquant format name, from the format registry."""
    return {spec.gguf_type: spec.name for spec in _formats.FORMATS.values()
            if spec.gguf_type is not None}


def _numpy_shape(tensor) -> tuple[int, ...]:
    # GGUF stores ne[0] (the fastest dimension, K for a weight) first: reverse it.
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


# GGUF metadata value types: fixed sizes; 8 = string (u64 length + bytes), 9 = array.
_GGUF_FIXED = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def check_header(path: str) -> None:
    """Walks a GGUF file's header and key-value section with every length checked against
    the file size, so that a corrupt or hostile file is refused with a sentence before the
    gguf package's reader, which trusts the declared counts (a 67-byte file declaring an
    array of 2^40 items made it allocate without bound), sees it."""
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{path}: empty file, not a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        _walk_header(path, data, size)


def _walk_header(path: str, data, size: int) -> None:
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise ValueError(f"{path}: {what} at byte {pos} needs {n} bytes, past the end of the file")
        out = data[pos:pos + n] if n <= 64 else b""  # long values are skipped, not copied
        pos += n
        return out

    def u32(what):
        return int.from_bytes(take(4, what), "little")

    def u64(what):
        return int.from_bytes(take(8, what), "little")

    def value(vtype: int, what: str, depth: int = 0) -> None:
        if vtype in _GGUF_FIXED:
            take(_GGUF_FIXED[vtype], what)
        elif vtype == 8:
            take(u64(f"{what} length"), what)
        elif vtype == 9 and depth == 0:
            itype, count = u32(f"{what} item type"), u64(f"{what} count")
            if itype in _GGUF_FIXED:
                take(count * _GGUF_FIXED[itype], f"{what} ({count} items)")
            elif count > size - pos:  # every item takes at least one byte
                raise ValueError(f"{path}: {what} declares {count} items, more than the file holds")
            else:
                for _ in range(count):
                    value(itype, what, depth + 1)
        else:
            raise ValueError(f"{path}: {what} has value type {vtype}, not a GGUF type")

    if take(4, "magic") != b"GGUF":
        raise ValueError(f"{path}: not a GGUF file (no GGUF magic)")
    u32("version")
    n_tensors, n_kv = u64("tensor count"), u64("key-value count")
    if n_tensors > size // 24 or n_kv > size // 12:  # smallest tensor info / key-value entry
        raise ValueError(f"{path}: header declares {n_tensors} tensors and {n_kv} key-values, "
                         f"more than {size} bytes can hold")
    for i in range(n_kv):
        key = take(u64(f"key {i} length"), f"key {i}")
        value(u32(f"key {i} type"), f"value of {key.decode('utf-8', 'replace')!r}")


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


def load_gguf(path: str | os.PathLike, strict: bool = False, progress: bool | None = None) -> Checkpoint:
    """Load every tensor of a .gguf file.

    Quantized tensors of a registered format become pyquant weights (GGUFWeight, or
    MXFP4Weight for GGML's MXFP4, repacked to the OCP layout); float and integer tensors
    become numpy arrays (BF16 as ml_dtypes.bfloat16), views of the memory-mapped file.
    A tensor of any other GGML type is recorded in `Checkpoint.unsupported` with its type
    and the reason, never raised on (strict=True raises ValueError instead).
    progress: a line on stderr while the tensors are read (the MXFP4 repack copies every
    byte); None shows it on a terminal for files of 256 MiB and more (pyquant.progress)."""
    path = os.fspath(path)
    gguf = _gguf()
    _T = gguf.GGMLQuantizationType
    plain_types = tuple(_T[name] for name in _PLAIN_TYPE_NAMES)
    check_header(path)
    try:
        reader = gguf.GGUFReader(path, "r")
    except (ValueError, KeyError, IndexError, TypeError, AssertionError) as e:
        raise ValueError(f"{path}: the gguf package cannot read it: {type(e).__name__}: {e}") from None
    by_type = gguf_type_to_format()
    ckpt = Checkpoint(path=path, container="gguf", metadata=_metadata(reader))
    bar = _progress.for_work(sum(int(t.n_bytes) for t in reader.tensors),
                             f"load_gguf {os.path.basename(path)}", progress)
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
        bar.step(t.name, int(t.n_bytes))
    bar.close()
    if strict and ckpt.unsupported:
        name, why = next(iter(ckpt.unsupported.items()))
        raise ValueError(f"{name}: {why}")
    return ckpt
