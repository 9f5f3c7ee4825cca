"""What a loader returns: tensors by name, where they came from, and what was skipped."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np


@dataclass
class Checkpoint(Mapping):
    """Tensors of one checkpoint file, read-only mapping name -> weight or array.

    A quantized tensor maps to a pyquant weight (Int4Weight, GGUFWeight, MXFP4Weight)
    holding the canonical layout; any other tensor maps to its numpy array as stored.
    Names follow the un-quantized checkpoint: AWQ/GPTQ `X.qweight` + `X.qzeros` +
    `X.scales` become `X.weight`, compressed-tensors `X.weight_packed` + ... become
    `X.weight`, GPT-OSS `X_blocks` + `X_scales` become `X`; GGUF names are kept.
    """

    path: str
    container: str                                              # "gguf" or "safetensors"
    tensors: dict[str, Any] = field(default_factory=dict)       # name -> weight | np.ndarray
    source: dict[str, str] = field(default_factory=dict)        # name -> convention it came in
    metadata: dict[str, Any] = field(default_factory=dict)      # GGUF key-values / safetensors header
    unsupported: dict[str, str] = field(default_factory=dict)   # name -> why it was not loaded
    file_tensors: list[str] = field(default_factory=list)       # every tensor name in the file(s)
    members: dict[str, list[str]] = field(default_factory=dict) # grouped name -> its file tensors

    def members_of(self, name: str) -> list[str]:
        """The file tensors a loaded or unsupported name came from (itself when not grouped)."""
        return self.members.get(name, [name])

    def __getitem__(self, name: str) -> Any:
        return self.tensors[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.tensors)

    def __len__(self) -> int:
        return len(self.tensors)

    def quantized(self) -> dict[str, Any]:
        """The pyquant weights only (every value that is not a plain numpy array)."""
        return {n: t for n, t in self.tensors.items() if not isinstance(t, np.ndarray)}

    def __repr__(self) -> str:
        n_q = len(self.quantized())
        return (f"Checkpoint({self.path!r}, {self.container}: {n_q} quantized, "
                f"{len(self.tensors) - n_q} other, {len(self.unsupported)} unsupported)")
