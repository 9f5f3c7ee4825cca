"""The two ceilings every case is judged against, measured in the same run.

copy bandwidth : GPU: a 2 GiB device-to-device copy (qg_memcpy), bytes read + written per
                 second, median of COPY_REPS; CPU: np.copyto of a 512 MiB array, read +
                 written, median of COPY_REPS.
flop ceiling   : GPU: torch.matmul bf16 8192^3 when torch with a GPU is importable, else
                 none ("n/a": roofline_pct then counts bytes only). CPU: numpy float32
                 matmul 2048^3 (the BLAS numpy links), stated as such in the report.

roofline_pct = 100 * max(bytes / copy_Bps, flops / flop_peak) / time: the share of the
roofline floor reached, whichever of bytes or arithmetic bounds the case (DESIGN.md).
"""
from __future__ import annotations

import dataclasses
import statistics
import time

import numpy as np

GPU_COPY_BYTES = 2 << 30
CPU_COPY_BYTES = 512 << 20
COPY_REPS = 10
GPU_MATMUL_N = 8192
CPU_MATMUL_N = 2048
MATMUL_REPS = 10


@dataclasses.dataclass
class Machine:
    device: str
    backend: str                # "cpu", "cuda", "hip" or "fake"
    copy_Bps: float             # measured copy bandwidth, bytes read + written per second
    copy_source: str            # how it was measured
    flop_peak: float | None     # measured FLOP/s ceiling, None when not measurable
    flop_source: str            # how it was measured, or why it is missing

    @property
    def copy_GBps(self) -> float:
        return self.copy_Bps / 1e9

    @property
    def flop_TFLOPs(self) -> float | None:
        return None if self.flop_peak is None else self.flop_peak / 1e12


def floor_seconds(nbytes: float, flops: float, copy_Bps: float, flop_peak: float | None) -> float:
    """The roofline floor: the least time the bytes and the FLOPs allow."""
    t_mem = nbytes / copy_Bps
    t_flop = flops / flop_peak if flop_peak else 0.0
    return max(t_mem, t_flop)


def roofline_pct(nbytes: float, flops: float, seconds: float, copy_Bps: float,
                 flop_peak: float | None) -> float:
    return 100.0 * floor_seconds(nbytes, flops, copy_Bps, flop_peak) / seconds


def bound(nbytes: float, flops: float, copy_Bps: float, flop_peak: float | None) -> str:
    """'mem' or 'flop': which side of the roofline the floor comes from."""
    if flop_peak and flops / flop_peak > nbytes / copy_Bps:
        return "flop"
    return "mem"


# ------------------------------------------------------------------ CPU


def cpu_copy_bandwidth(nbytes: int = CPU_COPY_BYTES, reps: int = COPY_REPS) -> float:
    src = np.ones(nbytes // 8, dtype=np.float64)
    dst = np.empty_like(src)
    np.copyto(dst, src)  # first touch of dst pages
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        times.append(time.perf_counter() - t0)
    return 2 * src.nbytes / statistics.median(times)


# OpenBLAS's worker threads spin for a while after a numpy matmul before they sleep (~70 ms on
# a 2-vCPU VM, bench/NOTES.md session 49): a CPU-tier case timed right after one shared the
# cores with them and ran 2-4x slow. What runs numpy's matmul on the CPU backend (this
# ceiling, the numpy peer) waits them out before the next timing.
BLAS_SETTLE_S = 0.2


def settle_blas() -> None:
    time.sleep(BLAS_SETTLE_S)


def cpu_flop_peak(n: int = CPU_MATMUL_N, reps: int = MATMUL_REPS) -> float:
    rng = np.random.default_rng()
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    settle_blas()
    return 2 * n ** 3 / statistics.median(times)


def cpu_machine(device: str) -> Machine:
    return Machine(device, "cpu", cpu_copy_bandwidth(),
                   f"np.copyto {CPU_COPY_BYTES >> 20} MiB, read+write",
                   cpu_flop_peak(), f"numpy float32 matmul {CPU_MATMUL_N}^3 (CPU FLOP ceiling, not bf16)")


# ------------------------------------------------------------------ GPU


def gpu_copy_bandwidth(ctx, copy, nbytes: int = GPU_COPY_BYTES, reps: int = COPY_REPS) -> float:
    """copy(dst, src, nbytes) enqueues a device-to-device copy of `nbytes` on the default stream."""
    import pyquant
    src = pyquant.DeviceArray.empty((nbytes,), np.uint8, ctx=ctx)
    dst = pyquant.DeviceArray.empty((nbytes,), np.uint8, ctx=ctx)
    copy(dst, src, nbytes)
    ctx.synchronize()
    times = []
    for _ in range(reps):
        start, stop = ctx.event(), ctx.event()
        start.record()
        copy(dst, src, nbytes)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_ms(stop) * 1e-3)
    del src, dst
    return 2 * nbytes / statistics.median(times)


def torch_bf16_peak(n: int = GPU_MATMUL_N, reps: int = MATMUL_REPS) -> tuple[float | None, str]:
    """cuBLAS (or hipBLASLt) bf16 GEMM rate through torch, or (None, reason)."""
    try:
        import torch
    except ImportError:
        return None, "n/a (torch not importable: roofline_pct counts bytes only)"
    if not torch.cuda.is_available():
        return None, "n/a (torch sees no GPU: roofline_pct counts bytes only)"
    a = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(n, n, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        torch.matmul(a, b)
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)
        start.record()
        torch.matmul(a, b)
        stop.record()
        stop.synchronize()
        times.append(start.elapsed_time(stop) * 1e-3)
    del a, b
    torch.cuda.empty_cache()
    return 2 * n ** 3 / statistics.median(times), f"torch.matmul bf16 {n}^3"
