"""`python -m pyquant`: the command line.

    python -m pyquant info             build, backends, devices and formats of this install
    python -m pyquant bench [...]      benchmark (pyquant.bench; --help for its options)
    python -m pyquant inspect FILE     tensors of a .gguf / .safetensors file (pyquant.loaders.inspect)

`bench` and `inspect` own their arguments: everything after the subcommand is passed to
them unchanged, so `python -m pyquant bench --help` is the benchmark's own help.
"""
from __future__ import annotations

import argparse
import sys

_DELEGATED = {
    "bench": ("pyquant.bench", "benchmark the kernels against the measured roofline, with "
                               "peers and golden record / compare"),
    "inspect": ("pyquant.loaders.inspect", "list the tensors of a .gguf or .safetensors file "
                                           "with format, shape, bytes and bits per weight"),
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pyquant",
        description="pyquant: fused dequantize + GEMM kernels for low-bit LLM weights "
                    "(libquantgemm), with numpy reference implementations.",
        epilog="Run `python -m pyquant COMMAND --help` for the options of a command. "
               "PYQUANT_LIB=/path/to/libquantgemm.so selects the library; "
               "PYQUANT_BACKEND=cpu|cuda|hip forces the default backend.")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.add_parser("info", help="print the build (backends, tiers), device counts and formats",
                   description="Print the library path and build info, the device count of "
                               "each backend, the default context and the registered formats.")
    for name, (_, help_text) in _DELEGATED.items():
        sub.add_parser(name, help=help_text, add_help=False)
    return p


def info() -> int:
    import pyquant
    from pyquant import _lib, device

    print(f"pyquant {pyquant.__version__}")
    if not _lib.library_loaded():
        print(f"library: not loaded ({_lib._LOAD_ERROR})")
        print(f"formats: {', '.join(pyquant.formats())}")
        return 1
    print(f"library: {_lib.LIB_PATH}")
    print(f"build:   {pyquant.build_info()}")
    for family, names in pyquant.tiers.tiers().items():
        print(f"tiers:   {family:6s} {', '.join(names)}")
    for backend in ("cpu", "cuda", "hip"):
        print(f"devices: {backend:4s} {device.device_count(backend)}")
    try:
        ctx = pyquant.default_context()
        print(f"default: {ctx.backend} device {ctx.device} ({ctx.device_name})")
    except pyquant.QuantGemmError as e:
        print(f"default: none ({e})")
    print(f"formats: {', '.join(pyquant.formats())}")
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in _DELEGATED:
        import importlib
        module = importlib.import_module(_DELEGATED[argv[0]][0])
        return int(module.main(argv[1:]) or 0)
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command == "info":
        return info()
    parser.print_help()
    return 2 if argv else 0
