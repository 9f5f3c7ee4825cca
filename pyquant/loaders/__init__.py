"""Checkpoint loaders: .gguf (gguf's memory-mapped reader) and .safetensors (AWQ, GPTQ,
compressed-tensors pack-quantized, GPT-OSS MXFP4) into canonical pyquant weights."""

from .checkpoint import Checkpoint
from .gguf_file import load_gguf
from .safetensors_file import load_safetensors

__all__ = ["Checkpoint", "load_gguf", "load_safetensors"]
