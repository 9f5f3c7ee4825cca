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
_GGUF_DEFAULT_ALIGNMENT = 32  # GGUF's own default when general.alignment is absent

# What a refusal of a file says it is (the words a user searches for):
#   "truncated"           the file ends before what its header declares (header or data);
#   "not a GGUF file"     another kind of file (a .safetensors one is named as such);
#   "inconsistent header" the header contradicts itself (overlapping tensors, a shape that
#                         is not whole blocks, a GGML type no version defines, ...).


def check_header(path: str) -> None:
    """Walks a GGUF file's header, key-value section and tensor infos with every length
    checked against the file size, and checks that every tensor's bytes lie inside the
    file without overlapping another: a corrupt, truncated or hostile file is refused with
    a sentence saying which it is before the gguf package's reader, which trusts the
    declared counts (a 67-byte file declaring an array of 2^40 items made it allocate
    without bound) and reports a cut file as a numpy reshape error, sees it."""
    size = os.path.getsize(path)
    if size == 0:
        raise ValueError(f"{path}: empty file, not a GGUF file")
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
        if data[:4] != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file: {_what_it_is(data)}")
        infos, data_start = _walk_header(path, data, size)
    _check_extents(path, infos, data_start, size)


def _what_it_is(data) -> str:
    """A guess at what a file without the GGUF magic is, for the refusal."""
    head = bytes(data[:16])
    if len(head) >= 9 and head[8:9] == b"{":
        return "it starts like a .safetensors file (8-byte header length, then JSON): use load_safetensors"
    if head[:4] == b"PK\x03\x04":
        return "it is a zip archive (a PyTorch .pt/.bin checkpoint?), not GGUF"
    if head[:1] in (b"{", b"["):
        return "it is a JSON text file"
    return f"no GGUF magic (it starts with {head[:8].hex(' ')})"


def _walk_header(path: str, data, size: int):
    """-> ([(name, n_dims dims, ggml type, offset)], data start offset)."""
    pos = 0

    def take(n: int, what: str) -> bytes:
        nonlocal pos
        if n < 0 or pos + n > size:
            raise ValueError(f"{path}: truncated, or a corrupt length: {what} at byte {pos} needs "
                             f"{n} bytes, past the end of the file ({size} bytes)")
        out = data[pos:pos + n] if n <= 256 else b""  # long values are skipped, not copied
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
                raise ValueError(f"{path}: inconsistent header: {what} declares {count} items, "
                                 f"more than the file holds")
            else:
                for _ in range(count):
                    value(itype, what, depth + 1)
        else:
            raise ValueError(f"{path}: inconsistent header: {what} has value type {vtype}, "
                             "not a GGUF type")

    take(4, "magic")
    u32("version")
    n_tensors, n_kv = u64("tensor count"), u64("key-value count")
    if n_tensors > size // 24 or n_kv > size // 12:  # smallest tensor info / key-value entry
        raise ValueError(f"{path}: truncated, or an inconsistent header: it declares {n_tensors} "
                         f"tensors and {n_kv} key-values, more than {size} bytes can hold")
    alignment = _GGUF_DEFAULT_ALIGNMENT
    for i in range(n_kv):
        key = take(u64(f"key {i} length"), f"key {i}")
        vtype = u32(f"key {i} type")
        if key == b"general.alignment" and vtype == 4:
            alignment = u32("general.alignment")
            if alignment == 0 or alignment & (alignment - 1):
                raise ValueError(f"{path}: inconsistent header: general.alignment={alignment} "
                                 "is not a power of two")
        else:
            value(vtype, f"value of {key.decode('utf-8', 'replace')!r}")
    infos = []
    for i in range(n_tensors):
        name = take(u64(f"tensor {i} name length"), f"tensor {i} name").decode("utf-8", "replace")
        n_dims = u32(f"tensor {name!r} dimension count")
        if not 1 <= n_dims <= 4:
            raise ValueError(f"{path}: inconsistent header: tensor {name!r} has {n_dims} "
                             "dimensions (GGUF allows 1 to 4)")
        dims = [u64(f"tensor {name!r} dimension") for _ in range(n_dims)]
        infos.append((name, dims, u32(f"tensor {name!r} type"), u64(f"tensor {name!r} offset")))
    return infos, -(-pos // alignment) * alignment


def _check_extents(path: str, infos, data_start: int, size: int) -> None:
    """Every tensor is whole blocks of a known GGML type, lies inside the file and
    overlaps no other (the reader would slice past the end or alias two tensors)."""
    gguf = _gguf()
    sizes = {int(t): v for t, v in gguf.GGML_QUANT_SIZES.items()}
    spans = []
    for name, dims, ggml_type, offset in infos:
        if ggml_type not in sizes:
            raise ValueError(f"{path}: inconsistent header: tensor {name!r} has GGML type "
                             f"{ggml_type}, which the gguf package ({gguf.__name__}) does not define")
        block, type_size = sizes[ggml_type]
        type_name = gguf.GGMLQuantizationType(ggml_type).name
        if dims[0] % block:
            raise ValueError(f"{path}: inconsistent header: tensor {name!r} has {dims[0]} elements "
                             f"per row, not whole {type_name} blocks of {block}")
        nbytes = int(np.prod(dims, dtype=object)) // block * type_size
        spans.append((data_start + offset, data_start + offset + nbytes, name, type_name, dims))
    spans.sort()
    for (a0, a1, a, _, _), (b0, b1, b, _, _) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(f"{path}: inconsistent header: tensor {a!r} (bytes {a0}..{a1}) "
                             f"overlaps tensor {b!r} (bytes {b0}..{b1})")
    if spans and spans[-1][1] > size:
        start, end, name, type_name, dims = max(spans, key=lambda sp: sp[1])
        first_cut = min((sp for sp in spans if sp[1] > size), key=lambda sp: sp[0])
        raise ValueError(f"{path}: truncated: the header places tensor {first_cut[2]!r} "
                         f"({first_cut[3]} {list(reversed(first_cut[4]))}) at bytes "
                         f"{first_cut[0]}..{first_cut[1]}, but the file ends at byte {size}; "
                         f"{end - size} bytes of tensor data are missing")


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
    ckpt.file_tensors = [t.name for t in reader.tensors]
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
