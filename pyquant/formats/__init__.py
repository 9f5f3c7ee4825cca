"""Format registry: the one list of weight formats pyquant knows.

Each entry ties a registry name to its C enum value (QG_FORMAT_* in include/quantgemm.h),
its block geometry, its GGUF type number where it has one, and the module holding its
numpy reference (the specification). Adding a format is one entry here plus its module;
tests/test_gguf_reference.py and the other format tests parametrise over FORMATS.

    from pyquant import formats
    spec = formats.get("q4_K")
    raw = spec.module.quantize(W)           # GGUF formats: quantize / dequantize / random_blocks

Block sizes are written as the sum of the block fields, mirroring the static_asserts of
src/formats/blocks.h; the tests check them against gguf.GGML_QUANT_SIZES and each module's
BLOCK_BYTES. Modules are imported on first use of `spec.module` (int4 and mxfp4 live in
modules of their own with a different function set; see the pyquant contract).

`pyquant.formats` is both this subpackage and the documented call `pyquant.formats()` ->
list of names: the module object is callable (see _CallableRegistry at the end), so that a
function of that name in pyquant/__init__.py is not needed and cannot shadow the package
for `from pyquant import formats`.
"""
from __future__ import annotations

import importlib
import sys
from dataclasses import dataclass
from types import ModuleType

__all__ = ["FormatSpec", "FORMATS", "get", "names"]

QK_K = 256  # GGUF super-block (elements)


@dataclass(frozen=True)
class FormatSpec:
    name: str                # registry name, e.g. "q4_K"
    qg_format: int           # QG_FORMAT_* value of include/quantgemm.h
    block_elems: int         # weights per block along K
    block_bytes: int         # bytes per block (int4: one int32 word of 8 nibbles)
    kind: str                # "int4" | "gguf" | "mxfp4": which function set the module has
    gguf_type: int | None    # gguf.GGMLQuantizationType value, None if GGUF has no such type
    module_name: str         # module with the numpy reference, relative to pyquant.formats

    @property
    def module(self) -> ModuleType:
        """The reference module (imported on first use)."""
        return importlib.import_module(f".{self.module_name}", __name__)


_SPECS = (
    # int4 group (W4A16): the "block" is one int32 word of 8 nibbles along K.
    FormatSpec("int4", 0, 8, 4, "int4", None, "int4"),
    # GGUF blocks; gguf_type = GGMLQuantizationType value, sizes = ggml-common.h fields.
    FormatSpec("q8_0", 1, 32, 2 + 32, "gguf", 8, "q8_0"),                       # d, qs
    FormatSpec("q4_0", 2, 32, 2 + 32 // 2, "gguf", 2, "q4_0"),                  # d, qs
    FormatSpec("q4_K", 3, QK_K, 2 * 2 + 12 + QK_K // 2, "gguf", 12, "q4_k"),    # d, dmin, scales, qs
    FormatSpec("q6_K", 4, QK_K, QK_K // 2 + QK_K // 4 + QK_K // 16 + 2, "gguf", 14, "q6_k"),  # ql, qh, sc, d
    FormatSpec("iq4_xs", 5, QK_K, 2 + 2 + QK_K // 64 + QK_K // 2, "gguf", 23, "iq4_xs"),  # d, sh, sl, qs
    FormatSpec("iq3_xxs", 6, QK_K, 2 + 3 * QK_K // 8, "gguf", 18, "iq3_xxs"),   # d, qs
    # MXFP4: 32 E2M1 codes = 16 bytes + one E8M0 scale byte (GGUF's block holds both: 17).
    FormatSpec("mxfp4", 7, 32, 1 + 16, "mxfp4", 39, "mxfp4"),
)

FORMATS: dict[str, FormatSpec] = {s.name: s for s in _SPECS}

assert len(FORMATS) == len(_SPECS), "duplicate format name"
assert sorted(s.qg_format for s in _SPECS) == list(range(len(_SPECS))), "QG_FORMAT values must be 0..n-1"


def names() -> list[str]:
    """Registered format names, in QG_FORMAT order."""
    return list(FORMATS)


def get(name: str) -> FormatSpec:
    """The FormatSpec of `name`; ValueError naming the known formats otherwise."""
    spec = FORMATS.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ValueError(f"unknown format {name!r}; known formats: {', '.join(FORMATS)}")
    return spec


class _CallableRegistry(ModuleType):
    """Module type of this package: calling the module returns names() (pyquant.formats())."""

    def __call__(self) -> list[str]:
        return names()


sys.modules[__name__].__class__ = _CallableRegistry
