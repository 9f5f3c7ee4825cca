"""The tiers of this build, from qg_build_info ("...; tiers: w4a16=cpu,cuda:simt,... gguf=...;").

Each family lists its tier table (src/*_tiers.cpp) by name: "cpu" for the CPU tier,
"<backend>:<tier>" for a GPU tier ("cuda:decode_frag"). Older builds named only the
backend ("cuda", "cuda(sm_90a)"); both forms parse.
"""
from __future__ import annotations

import re

__all__ = ["parse", "backend_of", "has_backend", "tiers"]


def parse(build_info: str) -> dict[str, list[str]]:
    """'...; tiers: w4a16=cpu,cuda:simt gguf=cpu mxfp4=cpu; ...' -> {family: [tier, ...]}."""
    m = re.search(r"tiers:\s*([^;]*)", build_info)
    if not m:
        return {}
    out: dict[str, list[str]] = {}
    for item in m.group(1).split():
        family, _, names = item.partition("=")
        out[family] = [t for t in names.split(",") if t]
    return out


def backend_of(tier: str) -> str:
    """'cuda:decode_frag' -> 'cuda'; 'cuda(sm_90a)' -> 'cuda'; 'cpu' -> 'cpu'."""
    return tier.split(":")[0].split("(")[0]


def has_backend(build_info: str, family: str, backend: str) -> bool:
    """True when `family` has a tier of `backend` in this build; True also when the build
    string lists no tiers for the family (then the call decides)."""
    listed = parse(build_info)
    if family not in listed:
        return True
    return any(backend_of(t) == backend for t in listed[family])


def tiers() -> dict[str, list[str]]:
    """{family: [tier names]} of the loaded library (the names qg_context_set_tier takes)."""
    from . import api
    return parse(api.build_info())
