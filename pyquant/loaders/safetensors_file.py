"""Read a .safetensors checkpoint into pyquant weights (safetensors' numpy API).

Conventions recognised, by tensor names and shapes (N = output features, K = input):

| convention               | tensors of one linear layer `X`                                   |
|--------------------------|-------------------------------------------------------------------|
| AutoAWQ GEMM             | X.qweight [K, N/8] i32, X.qzeros [K/G, N/8] i32, X.scales [K/G, N] |
| GPTQ (v1)                | X.qweight [K/8, N] i32, X.qzeros [K/G, N/8] i32, X.scales [K/G, N], X.g_idx [K] |
| compressed-tensors pack  | X.weight_packed [N, K/8] i32, X.weight_scale [N, K/G], X.weight_zero_point [N/8, K/G] (asym), X.weight_shape [2] |
| GPT-OSS MXFP4            | X_blocks [E, N, K/32, 16] u8, X_scales [E, N, K/32] u8             |

AWQ and GPTQ share their names; they differ in the packed axis: GPTQ packs qweight along K
(qweight.shape[1] == N), AWQ along N. The bit width follows from qzeros, which both pack
along N: bits = 32 * qzeros.shape[1] / N. A `config.json` beside the file, when there is
one, is read for its `quantization_config` and cross-checked.
"""

from __future__ import annotations

import glob
import json
import math
import os

import numpy as np

from .. import progress as _progress
from .checkpoint import Checkpoint

_AWQ_GPTQ_PARTS = ("qweight", "qzeros", "scales", "g_idx")
_CT_PARTS = ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape", "weight_g_idx")


class _Unsupported(Exception):
    """A tensor group this build cannot load; the message says why."""


def _read_quant_config(path: str) -> dict:
    cfg_path = os.path.join(os.path.dirname(os.path.abspath(path)), "config.json")
    if not os.path.isfile(cfg_path):
        return {}
    try:
        with open(cfg_path, encoding="utf-8") as f:
            cfg = json.load(f)
    except (OSError, ValueError):
        return {}
    qc = cfg.get("quantization_config") if isinstance(cfg, dict) else None
    return qc if isinstance(qc, dict) else {}


def _group_awq_gptq(arrays: dict, prefix: str, quant_config: dict):
    """AWQ or GPTQ tensors of one layer -> (Int4Weight, convention name)."""
    import pyquant

    qweight, qzeros, scales = (arrays[f"{prefix}.{p}"] for p in ("qweight", "qzeros", "scales"))
    g_idx = arrays.get(f"{prefix}.g_idx")
    if qweight.ndim != 2 or qzeros.ndim != 2 or scales.ndim != 2:
        raise _Unsupported(f"qweight {qweight.shape}, qzeros {qzeros.shape}, scales "
                           f"{scales.shape}: expected 2-D tensors")
    n = scales.shape[1]
    bits = 32 * qzeros.shape[1] / n if n else 0
    if bits != 4:
        raise _Unsupported(f"{bits:g}-bit weights (qzeros {qzeros.shape} for N={n}); "
                           f"only 4-bit AWQ/GPTQ is supported")
    packed_along_k = qweight.shape[1] == n  # GPTQ; AWQ packs along N (qweight.shape[1] == N/8)
    method = str(quant_config.get("quant_method", "")).lower()
    convention = "gptq" if (packed_along_k or g_idx is not None) else "awq"
    if method in ("awq", "gptq") and method != convention:
        raise _Unsupported(f"config.json says quant_method={method!r} but the shapes "
                           f"(qweight {qweight.shape}, scales {scales.shape}) are {convention}")
    if convention == "gptq":
        if str(quant_config.get("checkpoint_format", "gptq")).lower() not in ("gptq", ""):
            raise _Unsupported(f"GPTQ checkpoint_format={quant_config['checkpoint_format']!r}: "
                               f"only the v1 format (zero points stored minus 1) is supported")
        return pyquant.Int4Weight.from_gptq(qweight, qzeros, scales, g_idx=g_idx), "gptq"
    return pyquant.Int4Weight.from_awq(qweight, qzeros, scales), "awq"


def _group_compressed(arrays: dict, prefix: str):
    """compressed-tensors pack-quantized tensors of one layer -> Int4Weight."""
    import pyquant

    packed = arrays[f"{prefix}.weight_packed"]
    scale = arrays[f"{prefix}.weight_scale"]
    zero = arrays.get(f"{prefix}.weight_zero_point")
    shape = arrays.get(f"{prefix}.weight_shape")
    g_idx = arrays.get(f"{prefix}.weight_g_idx")
    if packed.ndim != 2:
        raise _Unsupported(f"weight_packed {packed.shape}: expected [N, K/8]")
    if shape is not None:
        n, k = (int(v) for v in np.asarray(shape).reshape(-1)[:2])
        if n != packed.shape[0] or k != packed.shape[1] * 8:
            bits = 32 * packed.shape[1] / k if k else 0
            raise _Unsupported(f"weight_shape ({n}, {k}) with weight_packed {packed.shape}: "
                               f"{bits:g} bits per value; only 4-bit packing with K a "
                               f"multiple of 8 is supported")
    kwargs = {} if g_idx is None else {"g_idx": g_idx}
    return pyquant.Int4Weight.from_compressed_tensors(packed, scale, zero, **kwargs)


def _group_mxfp4(arrays: dict, prefix: str):
    """GPT-OSS `X_blocks` + `X_scales` -> MXFP4Weight (experts stacked first when 4-D)."""
    import pyquant

    blocks, scales = arrays[f"{prefix}_blocks"], arrays[f"{prefix}_scales"]
    if blocks.dtype != np.uint8 or scales.dtype != np.uint8:
        raise _Unsupported(f"_blocks {blocks.dtype} / _scales {scales.dtype}: MXFP4 needs uint8")
    if blocks.shape[:-1] != scales.shape or blocks.shape[-1] != 16:
        raise _Unsupported(f"_blocks {blocks.shape} and _scales {scales.shape} do not "
                           f"match [..., N, K/32, 16] and [..., N, K/32]")
    return pyquant.from_mxfp4(blocks, scales)


# safetensors dtype -> numpy dtype name (BF16 through ml_dtypes); others are listed unsupported.
_NP_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "I64": "<i8", "I32": "<i4", "I16": "<i2",
              "I8": "i1", "U64": "<u8", "U32": "<u4", "U16": "<u2", "U8": "u1", "BOOL": "?"}


def _tensor_views(file: str, header_names) -> tuple[dict, dict]:
    """{name: read-only memory-mapped array} of a file the safetensors package has already
    validated (header, offsets, sizes), and {name: why} for dtypes numpy cannot hold.
    Views, not copies: listing or loading a checkpoint reads only what is used."""
    import ml_dtypes

    with open(file, "rb") as f:
        (hlen,) = np.frombuffer(f.read(8), "<u8")
        header = json.loads(f.read(int(hlen)))
    base = 8 + int(hlen)
    size = os.path.getsize(file)
    views, unreadable = {}, {}
    for name in header_names:
        info = header[name]
        dt = info["dtype"]
        shape = tuple(int(d) for d in info["shape"])
        start, end = (int(v) for v in info["data_offsets"])
        if dt == "BF16":
            np_dt = np.dtype(ml_dtypes.bfloat16)
        elif dt in _NP_DTYPES:
            np_dt = np.dtype(_NP_DTYPES[dt])
        else:
            unreadable[name] = f"dtype {dt} has no numpy type here"
            continue
        if end == start or base + start >= size:  # empty tensor: nothing to map
            views[name] = np.zeros(shape, np_dt)
            continue
        views[name] = np.memmap(file, dtype=np_dt, mode="r", offset=base + start, shape=shape)
    return views, unreadable


# Bytes per element of the safetensors dtypes (safetensors' Dtype enum); a dtype not
# listed here is left to the safetensors package to judge.
_DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "F8_E8M0": 1, "I16": 2,
                "U16": 2, "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8,
                "F64": 8}


def check_file(file: str) -> None:
    """Refuses a file that is not a whole, self-consistent .safetensors file with a
    sentence that says which it is (the words gguf_file uses): "not a .safetensors file"
    (a GGUF file, a zip, text ...), "truncated" (the file ends before its header or a
    tensor's data), "inconsistent header" (a tensor's offsets disagree with its shape and
    dtype, or two tensors overlap), "corrupt header" (not JSON). The safetensors package
    says "header too large" or "invalid shape, data type, or offset" for all of these."""
    size = os.path.getsize(file)
    with open(file, "rb") as f:
        head = f.read(9)
        if head[:4] == b"GGUF":
            raise ValueError(f"{file}: not a .safetensors file: it is a GGUF file (GGUF magic): "
                             "use load_gguf")
        if size < 9:
            raise ValueError(f"{file}: truncated, or not a .safetensors file: {size} bytes, too "
                             "short for the 8-byte header length and a JSON header")
        if head[8:9] != b"{":
            kind = "a zip archive (a PyTorch .pt/.bin checkpoint?)" if head[:4] == b"PK\x03\x04" \
                else f"its header is not JSON (it starts with {head[:9].hex(' ')})"
            raise ValueError(f"{file}: not a .safetensors file: {kind}")
        hlen = int.from_bytes(head[:8], "little")
        if 8 + hlen > size:
            raise ValueError(f"{file}: truncated: its header declares {hlen} bytes of JSON, the file "
                             f"holds {size - 8} after the length field")
        f.seek(8)
        try:
            header = json.loads(f.read(hlen))
        except ValueError as e:
            raise ValueError(f"{file}: corrupt header: the {hlen}-byte header is not JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{file}: corrupt header: a JSON {type(header).__name__}, not an object")
    data_bytes = size - 8 - hlen
    spans = []
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dt, shape = info["dtype"], [int(d) for d in info["shape"]]
            start, end = (int(v) for v in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{file}: corrupt header: tensor {name!r} lacks a dtype, shape or "
                             f"data_offsets pair ({info!r})") from None
        if dt in _DTYPE_BYTES and not (0 <= start <= end):
            raise ValueError(f"{file}: inconsistent header: tensor {name!r} has data_offsets "
                             f"[{start}, {end}]")
        if dt in _DTYPE_BYTES and end - start != math.prod(shape) * _DTYPE_BYTES[dt]:
            raise ValueError(f"{file}: inconsistent header: tensor {name!r} declares {dt} {shape} "
                             f"({math.prod(shape) * _DTYPE_BYTES[dt]} bytes) but its data_offsets "
                             f"[{start}, {end}] span {end - start} bytes")
        spans.append((start, end, name))
    spans.sort()
    for (a0, a1, a), (b0, b1, b) in zip(spans, spans[1:]):
        if b0 < a1:
            raise ValueError(f"{file}: inconsistent header: tensor {a!r} (data bytes {a0}..{a1}) "
                             f"overlaps tensor {b!r} (data bytes {b0}..{b1})")
    past = [sp for sp in spans if sp[1] > data_bytes]
    if past:
        start, end, name = past[0]
        raise ValueError(f"{file}: truncated: the header places tensor {name!r} at data bytes "
                         f"{start}..{end}, but the file holds {data_bytes} bytes of data "
                         f"({max(sp[1] for sp in spans) - data_bytes} bytes missing)")


def _files(path: str) -> list[str]:
    if os.path.isdir(path):
        found = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not found:
            raise FileNotFoundError(f"no .safetensors file in directory {path}")
        return found
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such file: {path}")
    return [path]


def load_safetensors(path: str | os.PathLike, strict: bool = False,
                     progress: bool | None = None) -> Checkpoint:
    """Load a .safetensors file (or every *.safetensors file of a directory).

    Recognised quantized layers become canonical pyquant weights named `X.weight` (AWQ,
    GPTQ, compressed-tensors) or `X` (GPT-OSS `X_blocks`); every other tensor is returned as
    the numpy array stored: a read-only view of the memory-mapped file (copy it to modify
    it), so listing or loading a checkpoint reads only the tensors used. A tensor whose
    dtype numpy cannot hold (FP8, ...) is listed in `Checkpoint.unsupported`. A layer that cannot be loaded (act-order GPTQ, another bit
    width, a zero point that does not fit 4 bits, ...) is recorded in
    `Checkpoint.unsupported` with the reason, or raised as ValueError when strict=True.
    progress: a line on stderr while the quantized layers are converted (AWQ and GPTQ are
    repacked, a copy of every byte); None shows it on a terminal for 256 MiB and more."""
    try:
        from safetensors import safe_open
    except ImportError as e:
        raise ImportError("pyquant.load_safetensors needs the `safetensors` package: "
                          "pip install 'pyquant[safetensors]' (or pip install safetensors)") from e
    path = os.fspath(path)
    files = _files(path)
    arrays: dict[str, np.ndarray] = {}
    header: dict = {}
    unreadable: dict[str, str] = {}  # a dtype numpy cannot hold (FP8, ...): recorded, not raised
    where: dict[str, str] = {}
    for file in files:
        check_file(file)
        try:
            f = safe_open(file, framework="np")
        except Exception as e:  # safetensors raises its own SafetensorError for a bad header
            raise ValueError(f"{file}: not a readable .safetensors file: {e}") from None
        with f:
            header.update(f.metadata() or {})
            names = list(f.keys())
        for name in names:
            if name in where:
                raise ValueError(f"tensor {name!r} is in both {where[name]} and {file}")
            where[name] = file
        views, bad = _tensor_views(file, names)
        arrays.update(views)
        unreadable.update(bad)
    quant_config = _read_quant_config(files[0])
    ckpt = Checkpoint(path=path, container="safetensors", metadata=dict(header))
    if strict and unreadable:
        name, why = next(iter(unreadable.items()))
        raise ValueError(f"{name}: {why}")
    ckpt.unsupported.update(unreadable)
    if quant_config:
        ckpt.metadata["quantization_config"] = quant_config

    used: set[str] = set()
    groups = []  # (output name, member names, builder, convention)
    for name in arrays:
        if name.endswith(".qweight"):
            prefix = name[: -len(".qweight")]
            members = [f"{prefix}.{p}" for p in _AWQ_GPTQ_PARTS if f"{prefix}.{p}" in arrays]
            groups.append((f"{prefix}.weight", prefix, members, "awq/gptq"))
        elif name.endswith(".weight_packed"):
            prefix = name[: -len(".weight_packed")]
            members = [f"{prefix}.{p}" for p in _CT_PARTS if f"{prefix}.{p}" in arrays]
            groups.append((f"{prefix}.weight", prefix, members, "compressed-tensors"))
        elif name.endswith("_blocks") and name[: -len("_blocks")] + "_scales" in arrays:
            prefix = name[: -len("_blocks")]
            groups.append((prefix, prefix, [name, f"{prefix}_scales"], "gpt-oss mxfp4"))

    bar = _progress.for_work(sum(arrays[m].nbytes for g in groups for m in g[2]),
                             f"load_safetensors {os.path.basename(os.path.normpath(path))}", progress)
    for out_name, prefix, members, convention in groups:
        bar.step(out_name, sum(arrays[m].nbytes for m in members))
        used.update(members)
        try:
            if convention == "awq/gptq":
                missing = [p for p in ("qzeros", "scales") if f"{prefix}.{p}" not in arrays]
                if missing:
                    raise _Unsupported(f"qweight without {', '.join(missing)}")
                weight, convention = _group_awq_gptq(arrays, prefix, quant_config)
            elif convention == "compressed-tensors":
                if f"{prefix}.weight_scale" not in arrays:
                    raise _Unsupported("weight_packed without weight_scale")
                weight = _group_compressed(arrays, prefix)
            else:
                weight = _group_mxfp4(arrays, prefix)
        except (_Unsupported, ValueError, OverflowError, IndexError, TypeError) as e:
            why = f"{convention}: {e if isinstance(e, (_Unsupported, ValueError)) else repr(e)}"
            if strict:
                raise ValueError(f"{out_name}: {why}") from e
            ckpt.unsupported[out_name] = why
            continue
        ckpt.tensors[out_name] = weight
        ckpt.source[out_name] = convention
        ckpt.members[out_name] = list(members)

    bar.close()
    for name, arr in arrays.items():
        if name not in used:
            ckpt.tensors[name] = arr
            ckpt.source[name] = "safetensors"
    ckpt.file_tensors = sorted(set(arrays) | set(unreadable))
    for out_name, _, members, _ in groups:
        ckpt.members.setdefault(out_name, list(members))  # unsupported groups too
    ckpt.tensors = dict(sorted(ckpt.tensors.items()))
    return ckpt
