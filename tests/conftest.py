"""Shared fixtures of the test suite.

- marker `gpu`: tests that need a CUDA/HIP context; skipped (with the reason) when none
  can be created, e.g. on CI or with PYQUANT_BACKEND=cpu.
- `rng`: a fresh numpy Generator per test; its seed is printed (pytest shows it with a
  failure) so a failing draw can be replayed with PYQUANT_TEST_SEED=<seed>.
- `ctx` (CPU context), `gpu_ctx` (skips without a GPU).
- `fp32_exact`: the shared CPU context on the fp32-exact path (cpu_precision = 1) for the
  test, for tests whose bounds are the fp32 path's; the default int8 path is held to its
  own model in tests/test_cpu_int8*.py. FP32_EXACT is the option value, for raw contexts.
- `poisoned_output`, `assert_close`, `assert_bitwise_equal`: the checking helpers
  (DESIGN "Correctness contract": poisoned outputs with guard bands, normalised error
  with a named bound and the worst coordinate, first mismatch reported bit for bit).
- `cancelling_gemm_bound(x, w_deq, ref, y_dtype)`: the fp32-exact CPU tier's GEMM bound,
  widened where the outputs cancel (a one-row weight, one output of few terms).
- `registry_formats(kind)`: the names of the format registry (pyquant/formats/__init__.py),
  optionally of one kind ("gguf"), in QG_FORMAT order: what a per-format test parametrises
  over, so that a new registry row is tested by default.
- `format_entry(table, table_name, fmt)`: the entry of a hand-written per-format table (a
  measured bound, a byte offset: facts the registry does not hold); a registry format with
  no entry fails naming the format and the table, instead of being left out.
- PYQUANT_TEST_MARGIN_LOG=<path>: every passing assert_close appends its err/bound there
  (tools/margins.py runs the suite over many seeds and reports the tightest bounds).
- the terminal summary ends with the ABI fuzz's case counts ("quantgemm ABI fuzz: N cases"),
  summed over every tests/test_fuzz_*.py that ran (tests/fuzz_harness.py counts them).
"""
from __future__ import annotations

import os
import sys

import numpy as np
import pytest


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "gpu: needs a CUDA or HIP device (skipped when no GPU context can be created)")


def pytest_terminal_summary(terminalreporter):
    harness = sys.modules.get("fuzz_harness")  # imported by the fuzz files that were collected
    if harness is not None:
        harness.write_summary(terminalreporter)


def _gpu_skip_reason() -> str | None:
    try:
        import pyquant
        from pyquant import device
        if not pyquant._lib.library_loaded():
            return "libquantgemm is not loaded"
        if pyquant.gpu_available():
            return None
        return f"no GPU context: {device._probe_gpu()[1]}"
    except Exception as e:  # the library itself failing is reported by the CPU tests
        return f"no GPU context ({type(e).__name__}: {e})"


def pytest_collection_modifyitems(config, items):
    gpu_items = [it for it in items if "gpu" in it.keywords]
    if not gpu_items:
        return
    reason = _gpu_skip_reason()
    if reason is not None:
        for it in gpu_items:
            it.add_marker(pytest.mark.skip(reason=reason))


def registry_formats(kind: str | None = None) -> list[str]:
    """Registry names of `kind` ("int4" | "gguf" | "mxfp4"; None: all), in QG_FORMAT order."""
    from pyquant.formats import FORMATS
    return [name for name, spec in FORMATS.items() if kind is None or spec.kind == kind]


def format_entry(table, table_name: str, fmt: str):
    """table[fmt]; a format without an entry fails the test with a sentence naming the format
    and the table (`table_name`: the table and its file) that needs a row for it."""
    if fmt not in table:
        pytest.fail(f"{fmt}: a registry format (pyquant/formats/__init__.py) with no entry in "
                    f"{table_name}; add one (docs/architecture.md, \"How to add a GGUF format\")")
    return table[fmt]


@pytest.fixture
def rng():
    seed = int(os.environ.get("PYQUANT_TEST_SEED", 0)) or np.random.SeedSequence().entropy
    print(f"rng seed: PYQUANT_TEST_SEED={seed}")
    return np.random.default_rng(seed)


@pytest.fixture
def ctx():
    import pyquant
    return pyquant.cpu_context()


FP32_EXACT = 1  # qg_context_set_option "cpu_precision": 1 = fp32-exact (include/quantgemm.h)


def pinned_precision(value: int):
    """The shared CPU context with cpu_precision = value until the generator closes (back to 0,
    auto): the body of a fixture."""
    import pyquant
    ctx = pyquant.cpu_context()
    ctx.set_option("cpu_precision", value)
    yield ctx
    ctx.set_option("cpu_precision", 0)


@pytest.fixture
def fp32_exact():
    yield from pinned_precision(FP32_EXACT)


@pytest.fixture
def gpu_ctx():
    import pyquant
    reason = _gpu_skip_reason()
    if reason is not None:
        pytest.skip(reason)
    return pyquant.gpu_context()


# ---------------------------------------------------------------- guard bands

class Guarded:
    """An output [rows, cols] inside a larger buffer: `before` rows above, `after` rows
    below, `left` columns to the left (the pointer is offset into the row) and `right`
    columns to the right (ldy = left + cols + right). The output is poisoned with NaN,
    the bands hold a different fixed pattern; check() verifies the bands are
    byte-identical and no poison is left in the output."""

    BEFORE, AFTER, LEFT, RIGHT = 2, 3, 3, 5

    def __init__(self, rows, cols, dtype, device_ctx=None, aligned=False):
        """aligned: every output row starts 16 bytes aligned (LEFT and ldy multiples of 16
        bytes): the form the GPU prefill's staged epilogue takes; the default's odd offset
        takes its element-wise stores."""
        from pyquant.device import as_dtype
        self.rows, self.cols, self.dtype = rows, cols, as_dtype(dtype)
        if aligned:
            per16 = 16 // self.dtype.itemsize
            self.LEFT = per16
            self.RIGHT = -(per16 + cols) % per16  # ldy a multiple of 16 bytes, at least 3 columns of band
            self.RIGHT += per16 if self.RIGHT < 3 else 0
        R = self.BEFORE + rows + self.AFTER
        C = self.LEFT + cols + self.RIGHT
        band = np.full((R, C), -4099.0, dtype=np.float32).astype(self.dtype)  # finite, odd pattern
        band[self._inner()] = np.float32(np.nan)
        self.initial = band
        self.ld = C
        if device_ctx is None:
            self.buf = band.copy()
            self.y = self.buf[self._inner()]
        else:
            from pyquant import DeviceArray
            self.buf = DeviceArray.from_numpy(band, device_ctx)
            self.y = self.buf.window(self.BEFORE, self.LEFT, rows, cols)

    def _inner(self):
        return (slice(self.BEFORE, self.BEFORE + self.rows), slice(self.LEFT, self.LEFT + self.cols))

    def host(self) -> np.ndarray:
        return self.buf if isinstance(self.buf, np.ndarray) else self.buf.to_numpy()

    def value(self) -> np.ndarray:
        """The output region (a copy), after checking the guard bands."""
        full = self.host()
        self.check_bands(full)
        return full[self._inner()].copy()

    def check_bands(self, full=None) -> None:
        full = self.host() if full is None else full
        mask = np.ones(full.shape, dtype=bool)
        mask[self._inner()] = False
        got = full.view(np.uint8 if full.dtype.itemsize == 1 else f"u{full.dtype.itemsize}")
        want = self.initial.view(got.dtype)
        bad = np.argwhere(mask & (got != want))
        if bad.size:
            r, c = bad[0]
            raise AssertionError(
                f"guard band written at buffer ({r}, {c}) = output ({r - self.BEFORE}, "
                f"{c - self.LEFT}) of a {self.rows}x{self.cols} output: {full[r, c]!r} "
                f"({len(bad)} band elements changed)")

    def unchanged(self) -> bool:
        """True when the whole buffer (output included) is byte-identical to before."""
        full = self.host()
        return full.tobytes() == self.initial.tobytes()


@pytest.fixture
def poisoned_output():
    """poisoned_output(rows, cols, dtype, device_ctx=None) -> Guarded; pass `.y` as out=."""
    return Guarded


# ---------------------------------------------------------------- one-hot activations

# ---------------------------------------------------------------- repack argument tests

def aligned_bytes(nbytes: int, align: int = 64) -> np.ndarray:
    """Zeroed uint8 host buffer of `nbytes` starting at an `align`-byte boundary."""
    raw = np.zeros(nbytes + align, np.uint8)
    off = (-raw.ctypes.data) % align
    return raw[off: off + nbytes]


def set_repack_fields(args, change: dict, src: np.ndarray, base: int) -> None:
    """The fields of a repack's argument struct from `change` (a refusal test's case): the
    value "src" is the input buffer's address, "+N" an address N bytes past `base` (the output
    buffer's), anything else the value itself."""
    for field, v in change.items():
        if v == "src":
            v = src.ctypes.data
        elif isinstance(v, str):
            v = base + int(v)
        setattr(args, field, v)


def one_hot_case(rng, w_deq, extra: int = 0):
    """x [M, K] float32 of one-hot rows (a single 1 at column perm[i] of row i: every column
    once in a random order, then `extra` more) and the output that a GEMM with the decoded
    weight w_deq [N, K] must give bit for bit: want[i, n] = w_deq[n, perm[i]], -0 as +0
    (one exact product plus exact zeros)."""
    k = w_deq.shape[1]
    perm = np.concatenate([rng.permutation(k), rng.permutation(k)[:extra]])
    x = np.zeros((len(perm), k), np.float32)
    x[np.arange(len(perm)), perm] = 1
    return x, np.ascontiguousarray(w_deq[:, perm].T + np.float32(0))


# ---------------------------------------------------------------- comparisons

# Unit roundoff of each float output dtype (half an ulp at 1): fp32 24 significant bits, fp16
# 11, bf16 8; keyed by numpy dtype name so that conftest needs no ml_dtypes import.
_UNIT_ROUNDOFF = {"float32": 2.0 ** -24, "float16": 2.0 ** -11, "bfloat16": 2.0 ** -8}
_U32 = 2.0 ** -24


def cancelling_gemm_bound(x, w_deq, ref, y_dtype) -> float:
    """Bound on ||y - ref|| / ||ref|| for the fp32-exact CPU tier where the outputs may cancel
    (edge shapes: one output of k = 32 terms; a one-row weight). fp32 accumulation error
    scales with |x| @ |w|^T, not with |y|: a random walk of k roundings gives about
    sqrt(k) * u32 * || |x| @ |w|^T ||, which is the plain k * u32 normwise bound when
    || |x| @ |w|^T || ~ sqrt(k) ||y|| (no cancellation); the larger of the two, x4 margin, so
    cancellation widens the bound and nothing else changes it. Plus y's rounding (u_y)."""
    k = x.shape[1]
    absref = np.abs(np.asarray(x, np.float64)) @ np.abs(np.asarray(w_deq, np.float64)).T
    kappa = np.linalg.norm(absref) / max(np.linalg.norm(ref), 1e-300)
    return _UNIT_ROUNDOFF[np.dtype(y_dtype).name] + 4 * _U32 * max(k, np.sqrt(k) * kappa)


def _assert_close(y, ref, bound: float, name: str) -> float:
    y = np.asarray(y).astype(np.float64)
    ref = np.asarray(ref, dtype=np.float64)
    assert y.shape == ref.shape, f"{name}: shape {y.shape} != reference {ref.shape}"
    bad = np.argwhere(~np.isfinite(y))
    if bad.size:
        i = tuple(bad[0])
        raise AssertionError(f"{name}: non-finite output at {i}: {y[i]!r} (reference {ref[i]!r}); "
                             f"{len(bad)} non-finite of {y.size} (NaN = poison left unwritten)")
    ref_norm = np.linalg.norm(ref)
    assert ref_norm > 0, f"{name}: the reference is all zeros; test inputs must not be zero"
    err = np.linalg.norm(y - ref) / ref_norm
    if not err <= bound:
        i = np.unravel_index(np.argmax(np.abs(y - ref)), y.shape)
        raise AssertionError(
            f"{name}: normalised error {err:.3e} > bound {bound:.3e}; worst at {tuple(int(v) for v in i)}: "
            f"got {y[i]!r}, reference {ref[i]!r}")
    log_margin(name, err, bound)
    return err


def assert_elementwise(y, want, bound, name: str, what: str = "exact") -> None:
    """|y - want| <= bound elementwise (float64), naming the worst element against its bound."""
    err = np.abs(np.asarray(y, np.float64) - want)
    worst = tuple(int(v) for v in np.unravel_index(np.argmax(err - bound), err.shape))
    assert np.all(err <= bound), (f"{name}: at {worst} got {y[worst]!r}, {what} {want[worst]!r}, "
                                  f"bound {bound[worst]:.3g}")


def call(fn, *args):
    """(status, message) of a qg_* call; pyquant._lib raises on a non-QG_OK status."""
    from pyquant import _lib
    try:
        fn(*args)
        return 0, ""
    except _lib.QuantGemmError as e:
        return int(e.status), e.message


def log_margin(name: str, err: float, bound: float) -> None:
    """With PYQUANT_TEST_MARGIN_LOG=path, append 'test<TAB>check<TAB>err/bound' for every
    passing comparison: run the suite over many seeds and a ratio near 1 names a bound that
    random inputs will one day break (tools/margins.py summarises the log)."""
    path = os.environ.get("PYQUANT_TEST_MARGIN_LOG")
    if path and bound > 0:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").split(" ")[0]
        with open(path, "a") as f:
            f.write(f"{test}\t{name}\t{err / bound:.4f}\n")


@pytest.fixture
def assert_close():
    """assert_close(y, ref, bound, name): ||y - ref|| / ||ref|| <= bound, every y finite."""
    return _assert_close


def _assert_bitwise_equal(got, want, name: str) -> None:
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, f"{name}: shape {got.shape} != {want.shape}"
    assert got.dtype == want.dtype, f"{name}: dtype {got.dtype} != {want.dtype}"
    ut = np.dtype(f"u{got.dtype.itemsize}") if got.dtype.itemsize in (1, 2, 4, 8) else None
    gb, wb = (got.view(ut), want.view(ut)) if ut is not None else (got, want)
    bad = np.argwhere(gb != wb)
    if bad.size:
        i = tuple(int(v) for v in bad[0])
        raise AssertionError(
            f"{name}: first mismatch at {i}: got {got[i]!r} (bits {int(gb[i]):#x}), want "
            f"{want[i]!r} (bits {int(wb[i]):#x}); {len(bad)} of {got.size} differ")


@pytest.fixture
def assert_bitwise_equal():
    """assert_bitwise_equal(got, want, name): same shape, dtype and bits; first mismatch reported."""
    return _assert_bitwise_equal
