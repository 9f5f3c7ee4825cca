"""Bad input to the command-line tools and the checkpoint loaders: one clear line and
exit status 2 (usage), never a traceback, a crash or an allocation the file cannot back,
and nothing measured before an argument is known to be bad. Each case was a defect a
review found (stop 10)."""
from __future__ import annotations

import json
import struct
import time

import numpy as np
import pytest

from pyquant import bench
from pyquant.loaders import inspect as qinspect
from pyquant.loaders import load_gguf, load_safetensors

USAGE = 2


class _NoRunner:
    """A runner that must never be used: the argument checks come first."""

    def __getattr__(self, name):
        raise AssertionError(f"bench used the runner ({name}) before refusing its arguments")


@pytest.mark.parametrize("argv, says", [
    (["--quick", "--band", "-1"], "--band -1.0: the noise band is a fraction"),
    (["--quick", "--band", "1.5"], "--band 1.5"),
    (["--quick", "--budget", "0"], "--budget 0.0: the timing budget must be > 0"),
    (["--quick", "--shape", "0x256"], "--shape 0x256: N and K must be >= 1"),
    (["--quick", "--json", "/nonexistent-dir/x.json"], "does not exist"),
])
def test_bench_refuses_bad_arguments_before_measuring(argv, says, capsys, tmp_path):
    assert bench.main(argv, runner=_NoRunner()) == USAGE
    assert says in capsys.readouterr().err


def test_bench_refuses_a_directory_as_output(capsys, tmp_path):
    assert bench.main(["--quick", "--html", str(tmp_path)], runner=_NoRunner()) == USAGE
    assert "is a directory" in capsys.readouterr().err


def test_bench_list_of_nothing_is_a_usage_error(capsys):
    assert bench.main(["--list", "--quick", "--family", "gguf", "--format", "int4"]) == USAGE
    assert "no case matches" in capsys.readouterr().err


GOOD_ROW = {"family": "gguf", "format": "q4_K", "variant": "bf16", "m": 1, "n": 256, "k": 256,
            "median_us": 10.0, "reproducible": True}


@pytest.mark.parametrize("row, says", [
    (1, "row 0 is int, not an object"),
    ({**GOOD_ROW, "family": "zzz"}, "family 'zzz'"),
    ({**GOOD_ROW, "m": 0}, "m 0 is not a positive integer"),
    ({**GOOD_ROW, "median_us": "abc"}, "median_us 'abc' is not a positive number"),
    ({**GOOD_ROW, "median_us": 0}, "median_us 0 is not a positive number"),
    ({**GOOD_ROW, "reproducible": "yes"}, "reproducible 'yes'"),
])
def test_bench_compare_names_a_bad_golden_row(row, says, tmp_path, capsys):
    path = tmp_path / "golden.json"
    path.write_text(json.dumps({"device": "x", "rows": [row]}))
    assert bench.main(["--compare", str(path)], runner=_NoRunner()) == USAGE
    assert says in capsys.readouterr().err


# ---------------------------------------------------------------- loaders

def _gguf_header(n_tensors: int, kvs: bytes, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + kvs


def _kv_key(name: bytes) -> bytes:
    return struct.pack("<Q", len(name)) + name


@pytest.mark.parametrize("content, says", [
    (b"", "empty file"),
    (b"GGUF", "version at byte 4"),
    # an array of 2^40 uint32 in a 67-byte file: the gguf package would allocate for it
    (_gguf_header(0, _kv_key(b"arr") + struct.pack("<IIQ", 9, 4, 2 ** 40), 1), "2^40"),
    (_gguf_header(0, struct.pack("<Q", 2 ** 62), 1), "key 0 at byte 32 needs"),
    (_gguf_header(2 ** 62, b"", 0), "more than"),
    (_gguf_header(0, _kv_key(b"k") + struct.pack("<I", 77), 1), "value type 77"),
], ids=["empty", "magic only", "huge array", "huge key", "huge tensor count", "bad value type"])
def test_gguf_header_is_checked_before_the_reader(tmp_path, content, says):
    path = tmp_path / "bad.gguf"
    path.write_bytes(content)
    t0 = time.perf_counter()
    with pytest.raises(ValueError) as e:
        load_gguf(path)
    assert time.perf_counter() - t0 < 5, "refusing a small file must not walk its declared sizes"
    assert says.replace("2^40", str(2 ** 40)) in str(e.value)


@pytest.mark.parametrize("content", [b"", b"\x08\x00\x00\x00\x00\x00\x00\x00{bad json", b"\xff" * 64],
                         ids=["empty", "bad json", "garbage"])
def test_inspect_prints_one_line_for_a_malformed_file(tmp_path, capsys, content):
    path = tmp_path / "bad.safetensors"
    path.write_bytes(content)
    assert qinspect.main([str(path)]) == USAGE
    err = capsys.readouterr().err
    assert err.startswith("inspect: cannot read") and err.count("\n") == 1 and "Traceback" not in err


def test_a_tensor_in_two_shards_is_refused(tmp_path):
    from safetensors.numpy import save_file
    shards = tmp_path / "shards"
    shards.mkdir()
    for name in ("a", "b"):
        save_file({"w": np.zeros((2, 2), np.float32)}, str(shards / f"{name}.safetensors"))
    with pytest.raises(ValueError, match="tensor 'w' is in both"):
        load_safetensors(shards)


def test_a_tensor_numpy_cannot_hold_is_listed_not_raised(tmp_path):
    """An FP8 tensor (no numpy dtype) goes to Checkpoint.unsupported; the rest loads."""
    header = {"w": {"dtype": "F8_E4M3", "shape": [2, 2], "data_offsets": [0, 4]},
              "v": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}}
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    path = tmp_path / "f8.safetensors"
    path.write_bytes(struct.pack("<Q", len(blob)) + blob + bytes(4) + np.ones(2, np.float32).tobytes())
    ckpt = load_safetensors(path)
    np.testing.assert_array_equal(ckpt.tensors["v"], np.ones(2, np.float32))
    if "w" not in ckpt.tensors:  # numpy without float8 (as today): listed with the reason
        assert "w" in ckpt.unsupported


def test_safetensors_tensors_are_mapped_not_read(tmp_path):
    """Plain tensors come back as read-only views of the memory-mapped file: inspecting a
    large checkpoint reads only its header (a 1 GiB file peaked at 2.1 GB when they were
    copies)."""
    from safetensors.numpy import save_file
    path = tmp_path / "plain.safetensors"
    want = np.arange(12, dtype=np.float32).reshape(3, 4)
    save_file({"w": want}, str(path))
    got = load_safetensors(path).tensors["w"]
    assert isinstance(got, np.memmap) and not got.flags.writeable
    np.testing.assert_array_equal(got, want)
