"""examples/tensor_parallel.py on the CPU: 2 processes joined by torch.distributed's gloo
backend (the NCCL path's twin: the same shards, GemmPlans and all-reduce, with pyquant's
CPU tier in each process). The example's --check compares the sharded Llama MLP block with
the unsharded block and both with the float64 reference, and exits 1 past its bounds; the
ratios go to the margin log (tools/margins.py). Skipped without torch (CI installs the CPU
wheel, .ci/run)."""
from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from conftest import log_margin

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "tensor_parallel.py")
CHECK = re.compile(r"check: \|\|y_tp - y_1gpu\|\| / \|\|y_1gpu\|\| = (\S+) \(bound (\S+)\); against the "
                   r"float64 reference: sharded (\S+), one device (\S+) \(bound (\S+)\)")


def _gloo():
    torch = pytest.importorskip("torch", reason="examples/tensor_parallel.py needs torch.distributed")
    if not torch.distributed.is_available() or not torch.distributed.is_gloo_available():
        pytest.skip("this torch build has no gloo backend")


def _run(args, timeout=300):
    env = dict(os.environ, PYQUANT_BACKEND="cpu")
    return subprocess.run([sys.executable, EXAMPLE, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    folder = tmp_path_factory.mktemp("tiny")
    r = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "tiny_checkpoints.py"), str(folder)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return folder / "tiny-llama.gguf"


@pytest.mark.parametrize("source", ["int4", "gguf"])
def test_two_processes_match_one(rng, source, tiny_llama):
    """--seed from the rng fixture: random weights (int4) and x are drawn afresh each run."""
    _gloo()
    extra = ["--tokens", "5"] if source == "int4" else ["--gguf", str(tiny_llama), "--dtype", "float16"]
    r = _run(["--backend", "gloo", "--world-size", "2", "--check", "--bench", "1", "--iters", "2",
              "--repeats", "1", "--seed", str(int(rng.integers(2 ** 31))), *extra])
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    m = CHECK.search(r.stdout)
    assert m, f"no check line in:\n{out}"
    diff, diff_bound, err_tp, err_1, bound = (float(v) for v in m.groups())
    assert diff <= diff_bound and err_tp <= bound and err_1 <= bound, out
    log_margin(f"tensor_parallel {source}: sharded vs one device", diff, diff_bound)
    log_margin(f"tensor_parallel {source}: sharded vs float64", err_tp, bound)
    assert "over 2 x cpu, gloo" in r.stdout, out
    assert re.search(r"bench M=1: sharded over 2 x cpu \S+ us, one cpu \S+ us", r.stdout), out


def test_a_split_the_format_refuses_exits_1():
    """int4 g128 down [512, 384] into 2 parts: 192 inputs each, one and a half groups. The
    launcher refuses before it starts a process, and says why once."""
    _gloo()
    r = _run(["--backend", "gloo", "--world-size", "2", "--intermediate", "384"])
    assert r.returncode == 1
    assert r.stderr.count("does not shard") == 1 and (
        "intermediate=384 does not shard 2 ways: k=384: a row-parallel split of an int4 weight with "
        "group_size=128 must cut K at multiples of 128 (one scale and zero-point cover 128 inputs); "
        "384/2 = 192 is not") in r.stderr, r.stderr


def test_nvlink_multicast_stays_off():
    """The example sets NCCL_NVLS_ENABLE=0 at import, before any process group exists (the
    processes it starts inherit it), whatever the environment said."""
    code = ("import importlib.util, os; os.environ['NCCL_NVLS_ENABLE'] = '1'; "
            f"spec = importlib.util.spec_from_file_location('tp', {EXAMPLE!r}); "
            "spec.loader.exec_module(importlib.util.module_from_spec(spec)); "
            "print(os.environ['NCCL_NVLS_ENABLE'])")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stdout + r.stderr
