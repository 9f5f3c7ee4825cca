"""examples/: the README's C example is examples/c/ex.c and CMakeLists.txt to the byte;
the Llama MLP block, the GPT-OSS MoE layer and the C GGUF program run on the small files
examples/tiny_checkpoints.py writes and agree with the float64 reference (each example's
own --check). CI builds the C programs against a `cmake --install` prefix as well."""
from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(ROOT, "examples")


def _module(relpath: str):
    spec = importlib.util.spec_from_file_location(os.path.basename(relpath)[:-3],
                                                  os.path.join(EXAMPLES, relpath))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _readme_blocks(lang: str) -> list[str]:
    with open(os.path.join(ROOT, "README.md"), encoding="utf-8") as f:
        return re.findall(rf"^```{lang}\n(.*?)^```$", f.read(), re.S | re.M)


def test_readme_c_example_is_the_file_ci_builds():
    with open(os.path.join(EXAMPLES, "c", "ex.c"), encoding="utf-8") as f:
        assert _readme_blocks("c")[0] == f.read()
    with open(os.path.join(EXAMPLES, "c", "CMakeLists.txt"), encoding="utf-8") as f:
        cmake = f.read()
    assert cmake in _readme_blocks("cmake") and len(cmake.splitlines()) == 5
    assert "find_package(quantgemm" in cmake and "quantgemm::quantgemm" in cmake


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    assert _module("tiny_checkpoints.py").main([str(folder)]) == 0
    return folder


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_llama_mlp_block_from_gguf(tiny, dtype, capsys):
    mod = _module("llama_mlp.py")
    assert mod.main([str(tiny / "tiny-llama.gguf"), "--check", "--dtype", dtype, "--tokens", "3"]) == 0
    assert "check: ||h - ref||" in capsys.readouterr().out


def test_gpt_oss_moe_layer_from_safetensors(tiny, capsys):
    mod = _module("gpt_oss_moe.py")
    assert mod.main([str(tiny / "tiny-gpt-oss"), "--check", "--tokens", "5"]) == 0
    assert "check: ||y - ref||" in capsys.readouterr().out


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")
def test_c_program_runs_a_gguf_tensor(tiny, tmp_path):
    import pyquant
    lib = pyquant._lib.LIB_PATH
    binary = tmp_path / "gguf_gemm"
    subprocess.run(["cc", "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror",
                    os.path.join(EXAMPLES, "c", "gguf_gemm.c"), "-I", os.path.join(ROOT, "include"),
                    lib, f"-Wl,-rpath,{os.path.dirname(lib)}", "-o", str(binary)], check=True)
    check = _module(os.path.join("c", "check_gguf_gemm.py"))
    for tensor in ("blk.0.ffn_gate.weight", "blk.0.ffn_down.weight"):
        err, bound, head = check.run(str(binary), str(tiny / "tiny-llama.gguf"), tensor, 3)
        assert err <= bound, f"{head}: {err} > {bound}"
    out = subprocess.run([str(binary), str(tiny / "tiny-llama.gguf"), "blk.0.ffn_norm.weight"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and "has GGML type 0; qg_gguf_gemm reads" in out.stderr
