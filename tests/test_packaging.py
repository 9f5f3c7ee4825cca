"""Packaging promises of the README: extras that match the use, an ImportError that names
its extra, and a pip build directory that keeps its GPU choice between `pip install`s.

The end-to-end form of the last one runs in .ci/run (a CPU wheel build on a machine with
nvcc, then the README's test command without QG_GPU must stay CPU-only); here the CMake
side is checked directly: two configures of one build directory with the cache deleted in
between, as scikit-build-core does for every new isolated build environment.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _pyproject() -> dict:
    with open(os.path.join(ROOT, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def test_extras_match_the_loaders():
    extras = _pyproject()["project"]["optional-dependencies"]
    assert extras["gguf"] == ["gguf"]
    assert extras["safetensors"] == ["safetensors"]
    assert {"gguf", "safetensors", "matplotlib"} <= set(extras["all"])
    assert {"gguf", "safetensors"} <= set(extras["test"])


@pytest.mark.parametrize("module, call, extra", [
    ("gguf", lambda pq, p: pq.load_gguf(p), "gguf"),
    ("safetensors", lambda pq, p: pq.load_safetensors(p), "safetensors"),
])
def test_missing_loader_package_names_the_extra(monkeypatch, tmp_path, module, call, extra):
    import pyquant
    monkeypatch.setitem(sys.modules, module, None)  # `import module` now raises ImportError
    for sub in [m for m in sys.modules if m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, sub, None)
    path = tmp_path / "model.bin"
    path.write_bytes(b"\0" * 64)
    with pytest.raises(ImportError, match=re.escape(f"pip install 'pyquant[{extra}]'")):
        call(pyquant, str(path))


def test_gpu_choice_is_passed_only_when_set():
    """No default in pyproject.toml: an unset QG_GPU is not passed, so the build directory
    keeps the previous choice (cmake/QGRememberGPU.cmake) instead of a default."""
    defines = _pyproject()["tool"]["scikit-build"]["cmake"]["define"]
    for var in ("QG_GPU", "QG_CUDA_ARCHS", "QG_HIP_ARCHS"):
        assert defines[var] == {"env": var}, f"{var}: {defines[var]!r} (a default would override the kept choice)"


def _configure(build, *defines):
    # SKBUILD marks a scikit-build-core configure; CMakeCache.txt and CMakeFiles/ go as
    # scikit-build-core removes them for a new isolated environment.
    (build / "CMakeCache.txt").unlink(missing_ok=True)
    shutil.rmtree(build / "CMakeFiles", ignore_errors=True)
    cmd = ["cmake", "-S", ROOT, "-B", str(build), "-DSKBUILD=2", *defines]
    if shutil.which("ninja"):
        cmd += ["-G", "Ninja"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    cache = (build / "CMakeCache.txt").read_text()
    return {k: v for k, v in re.findall(r"^(QG_\w+):\w+=(.*)$", cache, re.M)}, r.stdout


@pytest.mark.skipif(shutil.which("cmake") is None, reason="cmake is not installed")
def test_pip_build_directory_keeps_its_gpu_choice(tmp_path):
    build = tmp_path / "build"
    first, _ = _configure(build, "-DQG_GPU=off", "-DQG_CUDA_ARCHS=80")
    assert first["QG_GPU"] == "off" and first["QG_CUDA_ARCHS"] == "80"
    kept, out = _configure(build)  # nothing passed: what `pip install -e .` does without QG_GPU
    assert kept["QG_GPU"] == "off" and kept["QG_CUDA_ARCHS"] == "80", kept
    assert "QG_GPU=off kept from the previous build" in out
    changed, _ = _configure(build, "-DQG_CUDA_ARCHS=90a")  # a set variable still wins
    assert changed["QG_CUDA_ARCHS"] == "90a" and changed["QG_GPU"] == "off", changed
