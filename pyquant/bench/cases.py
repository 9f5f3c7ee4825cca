"""Benchmark cases: suites, shapes, and the bytes and FLOPs each case must move.

A Case is a pure descriptor (no arrays); the runner builds the weights. Counting follows
DESIGN.md's performance contract:

bytes  = every byte the kernel must move at least once:
           packed weights + scales + zeros (+ bias)     read
         + activations x [M, K]                           read
         + output y [M, N]                                written
         MoE: only the experts the routing actually hits (w13 and w2 with their scales and
         biases), plus x read, y written, the intermediate act [T*top_k, I] written by
         stage 1 and read by stage 2, and topk_ids / topk_weights read.
flops  = 2 * M * N * K;  MoE: 2 * T * top_k * (2I * H + H * I).

Row naming (DESIGN.md): family in w4a16 / gguf / mxfp4 / moe; format a registry name;
variant for w4a16 `g{G}-{sym|asym}-{fp16|bf16}`, for gguf and mxfp4 the activation dtype,
for moe the model shape with m = tokens, n = 2 * intermediate, k = hidden. A gguf variant
`{dtype}-blocks` keeps the .gguf blocks on a GPU where the format has a frag layout too
(every GGUF format: to_device() repacks them otherwise), so both layouts' tiers can be measured side by side;
`{dtype}-rows8` repacks the blocks into the CPU tier's rows8 layout (GGUFWeight.repack("rows8"); the CPU
backend only), against the blocks the plain variant keeps there.
"""
from __future__ import annotations

import dataclasses
import math
import re
import zlib

import numpy as np

from .. import formats as _formats

FAMILIES = ("w4a16", "gguf", "mxfp4", "moe")
# Every GGUF format of the registry (pyquant/formats/__init__.py), in QG_FORMAT order: a new
# registry row is benched by the default suite without an edit here.
GGUF_FORMATS = tuple(name for name, spec in _formats.FORMATS.items() if spec.kind == "gguf")
FAMILY_FORMATS = {"w4a16": ("int4",), "gguf": GGUF_FORMATS, "mxfp4": ("mxfp4",), "moe": ("mxfp4",)}
# What --format accepts: the formats of every family, in that order.
BENCH_FORMATS = tuple(dict.fromkeys(f for fs in FAMILY_FORMATS.values() for f in fs))

# Standard shapes N x K and M values of DESIGN.md's performance contract.
STANDARD_SHAPES = ((43008, 5376), (16384, 5376), (5376, 21504), (14336, 4096), (4096, 14336))
STANDARD_M = (1, 2, 4, 8, 16, 32, 64, 128, 512, 2048)

# Variants run by default; others are reachable with --variant.
DEFAULT_VARIANTS = {"w4a16": ("g128-asym-bf16",), "gguf": ("bf16",), "mxfp4": ("bf16",),
                    "moe": ("gpt-oss-120b", "gpt-oss-20b")}

# CPU tier scaling: two shared cores cannot run the GPU shapes in reasonable time, so on
# the CPU backend every N, K (and MoE hidden / intermediate) is divided by CPU_SHAPE_DIV
# and rounded down to a multiple of CPU_SHAPE_ALIGN (256 = the largest block, so every
# format accepts the shape), and M is capped at CPU_MAX_M.
CPU_SHAPE_DIV = 4
CPU_SHAPE_ALIGN = 256
CPU_MAX_M = 64


@dataclasses.dataclass(frozen=True)
class MoEModel:
    experts: int
    top_k: int
    hidden: int        # H
    intermediate: int  # I


# GPT-OSS configurations (config.json of openai/gpt-oss-120b and -20b: num_local_experts,
# num_experts_per_tok, hidden_size, intermediate_size). Both ship biases (bf16).
MOE_MODELS = {
    "gpt-oss-120b": MoEModel(experts=128, top_k=4, hidden=2880, intermediate=2880),
    "gpt-oss-20b": MoEModel(experts=32, top_k=4, hidden=2880, intermediate=2880),
}

DTYPE_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
MOE_ACT_DTYPE = "bf16"   # x, act, y and biases of the MoE cases (GPT-OSS runs in bf16)


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    format: str
    variant: str
    m: int
    n: int
    k: int

    @property
    def key(self) -> tuple:
        return (self.family, self.format, self.variant, self.m, self.n, self.k)

    @property
    def weight_key(self) -> tuple:
        """Cases with the same weight_key share one set of weights (everything but m)."""
        return (self.family, self.format, self.variant, self.n, self.k)

    @property
    def label(self) -> str:
        return f"{self.family} {self.format} {self.variant} m={self.m} {self.n}x{self.k}"

    def moe_model(self) -> MoEModel:
        """The MoE configuration of a moe case, with hidden / intermediate from its k / n."""
        base = MOE_MODELS[self.variant]
        return dataclasses.replace(base, hidden=self.k, intermediate=self.n // 2)


# ---------------------------------------------------------------------------- variants

_W4A16_VARIANT = re.compile(r"^g(32|64|128)-(sym|asym)-(fp16|bf16)$")


@dataclasses.dataclass(frozen=True)
class W4A16Variant:
    group_size: int
    symmetric: bool
    dtype: str  # activations, output and scales


def parse_w4a16_variant(variant: str) -> W4A16Variant:
    m = _W4A16_VARIANT.match(variant)
    if not m:
        raise ValueError(f"w4a16 variant {variant!r} is not g{{32|64|128}}-{{sym|asym}}-{{fp16|bf16}}")
    return W4A16Variant(int(m.group(1)), m.group(2) == "sym", m.group(3))


GGUF_BLOCKS = "-blocks"   # gguf variant suffix: the .gguf block layout on a GPU (module docstring)
GGUF_ROWS8 = "-rows8"     # gguf variant suffix: the rows8 layout on the CPU (module docstring)


def gguf_keeps_blocks(case: Case) -> bool:
    """A gguf case that runs on the .gguf blocks on a GPU: asked by its variant, or fp32 x
    (the frag layout's GPU tiers take 16-bit x)."""
    return case.family == "gguf" and (case.variant.endswith(GGUF_BLOCKS) or act_dtype(case) == "fp32")


def gguf_rows8(case: Case) -> bool:
    """A gguf case that runs on the rows8 layout (the CPU tier's): asked by its variant."""
    return case.family == "gguf" and case.variant.endswith(GGUF_ROWS8)


def _gguf_blocks_dtype(variant: str) -> str | None:
    """The activation dtype of a gguf `{dtype}-blocks` or `{dtype}-rows8` variant, else None."""
    for suffix in (GGUF_BLOCKS, GGUF_ROWS8):
        if variant.endswith(suffix):
            return variant[: -len(suffix)]
    return None


def act_dtype(case: Case) -> str:
    """Activation (and output) dtype name of a case."""
    if case.family == "w4a16":
        return parse_w4a16_variant(case.variant).dtype
    if case.family == "moe":
        return MOE_ACT_DTYPE
    dtype = (case.family == "gguf" and _gguf_blocks_dtype(case.variant)) or case.variant
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"{case.family} variant {case.variant!r} is not an activation dtype "
                         f"({', '.join(DTYPE_BYTES)})")
    return dtype


def check_variant(family: str, variant: str) -> None:
    """Raise ValueError when `variant` is not valid for `family`."""
    if family == "w4a16":
        parse_w4a16_variant(variant)
    elif family == "moe":
        if variant not in MOE_MODELS:
            raise ValueError(f"moe variant {variant!r} is not one of {', '.join(MOE_MODELS)}")
    elif family == "gguf" and _gguf_blocks_dtype(variant) in DTYPE_BYTES:
        return
    elif variant not in DTYPE_BYTES:
        raise ValueError(f"{family} variant {variant!r} is not one of {', '.join(DTYPE_BYTES)}"
                         + (f" (with {GGUF_BLOCKS}: the block layout on a GPU; with {GGUF_ROWS8}: the "
                            "rows8 layout on the CPU)" if family == "gguf" else ""))


def check_case(case: Case) -> None:
    """Raise ValueError, naming the case, when its shape cannot hold its format: the bench
    checks every case before it measures anything (a shape the library would refuse is
    otherwise found seconds in, after the roofline has been measured)."""
    check_variant(case.family, case.variant)
    if min(case.m, case.n, case.k) < 1:
        raise ValueError(f"{case.label}: M, N and K must be >= 1")
    if case.family == "moe":
        return  # the model shapes are fixed (MOE_MODELS)
    if case.family == "w4a16":
        g = parse_w4a16_variant(case.variant).group_size
        if case.k % g or case.n % 8:
            raise ValueError(f"{case.label}: int4 needs K a multiple of the group size {g} and N a "
                             f"multiple of 8 (qzeros pack 8 rows per word); K={case.k}, N={case.n}")
        return
    block = _block(case.format)[0]
    if case.k % block:
        raise ValueError(f"{case.label}: {case.format} needs K a multiple of its block of {block} "
                         f"elements; K={case.k}")


# ---------------------------------------------------------------------------- counting

def _block(fmt: str) -> tuple[int, int]:
    spec = _formats.get(fmt)
    return spec.block_elems, spec.block_bytes


def dense_weight_bytes(case: Case) -> int:
    """Bytes of one weight [N, K] with its scales and zeros (the moe family excluded)."""
    n, k = case.n, case.k
    if case.family == "w4a16":
        v = parse_w4a16_variant(case.variant)
        qweight = n * (k // 8) * 4                        # int32 [N, K/8]
        scales = n * (k // v.group_size) * DTYPE_BYTES[v.dtype]   # [N, K/G]
        qzeros = 0 if v.symmetric else (n // 8) * (k // v.group_size) * 4  # int32 [N/8, K/G]
        return qweight + scales + qzeros
    if case.family == "gguf":
        elems, nbytes = _block(case.format)
        return n * (k // elems) * nbytes
    if case.family == "mxfp4":
        return n * (k // 32) * 16 + n * (k // 32)         # blocks [N, K/32, 16] + E8M0 scales
    raise ValueError(f"dense_weight_bytes: family {case.family!r} has no single weight")


def moe_expert_bytes(model: MoEModel, bias_dtype: str = MOE_ACT_DTYPE) -> int:
    """Bytes of one expert: w13 [2I, H] and w2 [H, I] in MXFP4 with their scales and biases."""
    h, i = model.hidden, model.intermediate
    w13 = 2 * i * (h // 32) * 17 + 2 * i * DTYPE_BYTES[bias_dtype]
    w2 = h * (i // 32) * 17 + h * DTYPE_BYTES[bias_dtype]
    return w13 + w2


def moe_routing(case: Case) -> tuple[np.ndarray, np.ndarray]:
    """Deterministic uniform routing of a moe case: (topk_ids int32 [T, top_k], weights f32).

    Each token picks top_k distinct experts uniformly. The generator is seeded from the
    case key so that repeated measurements of one case route (and so move) the same bytes.
    """
    model = case.moe_model()
    rng = np.random.default_rng(zlib.crc32(repr(case.key).encode()))
    scores = rng.random((case.m, model.experts))
    ids = np.argsort(scores, axis=1)[:, :model.top_k].astype(np.int32)
    weights = rng.random((case.m, model.top_k)).astype(np.float32) + 0.1
    weights /= weights.sum(axis=1, keepdims=True)
    return ids, weights


def moe_experts_hit(case: Case) -> int:
    ids, _ = moe_routing(case)
    return int(np.unique(ids).size)


def case_bytes(case: Case) -> int:
    """Every byte the kernel must move for this case (see the module doc)."""
    a = DTYPE_BYTES[act_dtype(case)]
    if case.family == "moe":
        model = case.moe_model()
        t, top_k, h, i = case.m, model.top_k, model.hidden, model.intermediate
        weights = moe_experts_hit(case) * moe_expert_bytes(model)
        x_y = 2 * t * h * a                       # x read, y written
        act = 2 * t * top_k * i * a               # intermediate written (stage 1), read (stage 2)
        routing = t * top_k * (4 + 4)             # topk_ids int32 + topk_weights fp32
        return weights + x_y + act + routing
    return dense_weight_bytes(case) + case.m * case.k * a + case.m * case.n * a


def case_flops(case: Case) -> int:
    if case.family == "moe":
        model = case.moe_model()
        h, i = model.hidden, model.intermediate
        return 2 * case.m * model.top_k * (2 * i * h + h * i)
    return 2 * case.m * case.n * case.k


def weight_footprint(case: Case) -> int:
    """Bytes of one copy of all the weights a case allocates (all experts for moe)."""
    if case.family == "moe":
        model = case.moe_model()
        return model.experts * moe_expert_bytes(model)
    return dense_weight_bytes(case)


def touched_weight_bytes(case: Case) -> int:
    """Bytes of weights one call reads: what must be pushed out of the cache between calls."""
    if case.family == "moe":
        return moe_experts_hit(case) * moe_expert_bytes(case.moe_model())
    return dense_weight_bytes(case)


def rotation_copies(touched: int, footprint: int, flush_bytes: int, budget_bytes: int) -> int:
    """Weight copies to rotate through so that a call never finds its weights in the cache.

    ceil(flush_bytes / touched) copies, at least 1, at most what fits in budget_bytes.
    flush_bytes is what must stream through the cache between two uses of one copy:
    3 x L2 on a GPU (the L2 also holds activations and outputs, and replacement is not
    perfectly LRU), 2 x the last-level cache on a CPU.
    """
    want = max(1, math.ceil(flush_bytes / max(1, touched)))
    fit = max(1, budget_bytes // max(1, footprint))
    return int(min(want, fit))


# ---------------------------------------------------------------------------- suites

def cpu_scale_dim(d: int) -> int:
    return max(CPU_SHAPE_ALIGN, (d // CPU_SHAPE_DIV) // CPU_SHAPE_ALIGN * CPU_SHAPE_ALIGN)


def cpu_scale_case(case: Case) -> Case:
    """The CPU-tier counterpart of a GPU-sized case (see CPU_SHAPE_DIV)."""
    if case.family == "moe":
        n = 2 * cpu_scale_dim(case.n // 2)
    else:
        n = cpu_scale_dim(case.n)
    return dataclasses.replace(case, n=n, k=cpu_scale_dim(case.k), m=min(case.m, CPU_MAX_M))


def _moe_nk(variant: str) -> tuple[int, int]:
    model = MOE_MODELS[variant]
    return 2 * model.intermediate, model.hidden


def quick_suite() -> list[Case]:
    """A handful of cases, one decode and one prefill point per family, on one shape."""
    n, k = 14336, 4096
    return [
        Case("w4a16", "int4", "g128-asym-bf16", 1, n, k),
        Case("w4a16", "int4", "g128-asym-bf16", 64, n, k),
        Case("gguf", "q4_K", "bf16", 1, n, k),
        Case("gguf", "q4_K", "bf16", 64, n, k),
        Case("gguf", "q8_0", "bf16", 1, n, k),
        Case("mxfp4", "mxfp4", "bf16", 1, n, k),
        Case("moe", "mxfp4", "gpt-oss-20b", 1, *_moe_nk("gpt-oss-20b")),
        Case("moe", "mxfp4", "gpt-oss-20b", 32, *_moe_nk("gpt-oss-20b")),
    ]


def _variant_fits(family: str, variant: str) -> bool:
    try:
        check_variant(family, variant)
        return True
    except ValueError:
        return False


def build_suite(*, quick=False, families=None, formats=None, variants=None, shapes=None,
                ms=None, cpu=False) -> list[Case]:
    """The cases to run.

    default : every family x format x default variant x standard shape x standard M
              (MoE: its model shape instead of the standard shapes);
    quick   : quick_suite() (CPU-scaled on a CPU); the filters, shapes and ms included, pick
              among its cases;
    filters : families / formats / variants keep matching cases (a variant that is not a
              default one, e.g. g64-sym-fp16, is added for the families it fits); shapes and
              ms replace the standard lists (MoE keeps its model shape and is dropped when
              shapes are given that do not include it).
    cpu     : the standard shapes and M list are scaled (cpu_scale_case); shapes and ms given
              explicitly are used as given.
    """
    if variants:
        for v in variants:
            if not any(_variant_fits(f, v) for f in FAMILIES):
                raise ValueError(f"variant {v!r} fits no family (w4a16: g128-asym-bf16, "
                                 f"gguf/mxfp4: {'/'.join(DTYPE_BYTES)}, moe: {'/'.join(MOE_MODELS)})")
    if quick:  # the filters pick among the quick cases, as --list shows them (scaled on a CPU)
        out = quick_suite()
        if cpu:
            out = dedupe(cpu_scale_case(c) for c in out)
        return select(out, families, formats, variants, shapes, ms)
    out = []
    for family in families or FAMILIES:
        vs = [v for v in variants if _variant_fits(family, v)] if variants else DEFAULT_VARIANTS[family]
        for fmt in FAMILY_FORMATS[family]:
            if formats and fmt not in formats:
                continue
            for variant in vs:
                if family == "moe":
                    nk = _moe_nk(variant)
                    if shapes and nk not in shapes:
                        continue
                    nks, scale_nk = [nk], cpu
                else:
                    nks, scale_nk = (shapes or STANDARD_SHAPES), cpu and not shapes
                for n, k in nks:
                    for m in (ms or STANDARD_M):
                        c = Case(family, fmt, variant, m, n, k)
                        if scale_nk:
                            s = cpu_scale_case(c)
                            c = dataclasses.replace(c, n=s.n, k=s.k)
                        if cpu and not ms:
                            c = dataclasses.replace(c, m=min(c.m, CPU_MAX_M))
                        out.append(c)
    return dedupe(out)


def parse_shape(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"\s*(\d+)\s*[xX]\s*(\d+)\s*", text)
    if not m:
        raise ValueError(f"shape {text!r} is not NxK (for example 14336x4096)")
    return int(m.group(1)), int(m.group(2))


def select(cases, families=None, formats=None, variants=None, shapes=None, ms=None) -> list[Case]:
    """Keep the cases matching every given filter (None = no filter on that field)."""
    out = []
    for c in cases:
        if families and c.family not in families:
            continue
        if formats and c.format not in formats:
            continue
        if variants and c.variant not in variants:
            continue
        if shapes and (c.n, c.k) not in shapes:
            continue
        if ms and c.m not in ms:
            continue
        out.append(c)
    return out


def order_for_weights(cases) -> list[Case]:
    """Group cases sharing weights (stable), so each weight set is built once."""
    first = {}
    for i, c in enumerate(cases):
        first.setdefault(c.weight_key, i)
    return sorted(cases, key=lambda c: (first[c.weight_key], c.m))


def dedupe(cases) -> list[Case]:
    seen, out = set(), []
    for c in cases:
        if c.key not in seen:
            seen.add(c.key)
            out.append(c)
    return out
