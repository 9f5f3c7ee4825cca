"""What a perfect streaming reader reaches under the bench's timer, by size.

The bench times each call between two device events, calls enqueued behind a backlog copy
(pyquant/bench/timing.py), and charges every byte at the copy bandwidth of a 2 GiB copy. A
kernel that reads S bytes therefore pays, besides S / bandwidth, a fixed cost no kernel
design removes: the launch between the events, the first round trips before the DRAM
stream is full, the drain after it. This script measures that floor with the same method:

- an empty kernel (one block): the events and the launch alone;
- a read-only kernel (every SM busy, 16-byte loads four deep a thread, one word written a
  block): the best a weight stream of S bytes can do, as a percentage of the copy bandwidth
  measured here the way the bench does (device-to-device copy of 2 GiB, read + write);
- torch.matmul (cuBLAS bf16) of one token on a dense weight of S bytes.

Percentages are of S / copy bandwidth (the bench's roofline at M = 1); "less empty" takes the
empty kernel's time off the read's, what is left being the stream's own ramp and drain.

Weights are copies cycled past 200 MB, as the bench's. Needs CuPy and torch (device only).

    python bench/launch_floor.py            # sizes 8, 16, 30, 60, 120, 480 MB
    python bench/launch_floor.py 30,120
"""
import statistics
import sys

from pyquant.bench.timing import EventTimer

ROTATION_BYTES = 200 << 20
GROUP = EventTimer.GROUP  # calls enqueued behind one backlog copy, as the bench's timer does

READ_SRC = r"""
extern "C" __global__ void read_all(const uint4* __restrict__ p, long long n16, unsigned* out) {
    const long long stride = (long long)gridDim.x * blockDim.x;
    unsigned acc = 0;
    long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    for (; i + 3 * stride < n16; i += 4 * stride) {
        const uint4 a = __ldg(p + i), b = __ldg(p + i + stride), c = __ldg(p + i + 2 * stride),
                    d = __ldg(p + i + 3 * stride);
        acc ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n16; i += stride) {
        const uint4 a = __ldg(p + i);
        acc ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    if (acc == 0x9e3779b9u) out[blockIdx.x] = acc;  // keeps the loads; almost never taken
}
extern "C" __global__ void empty_kernel(unsigned* out) {
    if (threadIdx.x == 1024) out[0] = 0;
}
"""


def timed(cp, stream, backlog, fn, reps=200, warm=3):
    """Median us a call: start / stop events around each call, GROUP calls behind a backlog."""
    for i in range(warm):
        fn(i)
    stream.synchronize()
    times = []
    i = 0
    while len(times) < reps:
        ev = [(cp.cuda.Event(), cp.cuda.Event()) for _ in range(GROUP)]
        backlog()
        for start, stop in ev:
            start.record(stream)
            fn(i)
            stop.record(stream)
            i += 1
        ev[-1][1].synchronize()
        times += [cp.cuda.get_elapsed_time(a, b) * 1000 for a, b in ev]
    return statistics.median(times)


def main(argv):
    try:
        import cupy as cp
        import torch
    except ImportError as e:
        sys.exit(f"launch_floor.py needs CuPy and torch (the GPU machine has both): {e}")

    sizes = [int(v) for v in (argv[0] if argv else "8,16,30,60,120,480").split(",")]
    mod = cp.RawModule(code=READ_SRC)
    read_all, empty = mod.get_function("read_all"), mod.get_function("empty_kernel")
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    stream = cp.cuda.Stream(non_blocking=True)
    tstream = torch.cuda.ExternalStream(stream.ptr)
    out = cp.zeros(4 * sms * 8, dtype=cp.uint32)
    big_a = cp.empty(1 << 31, dtype=cp.uint8)
    big_b = cp.empty(1 << 31, dtype=cp.uint8)
    back_a, back_b = big_a[: 256 << 20], big_b[: 256 << 20]

    def backlog():
        back_b.data.copy_from_device_async(back_a.data, back_a.nbytes, stream)

    with stream:
        copy_us = timed(cp, stream, backlog, lambda i: big_b.data.copy_from_device_async(big_a.data, big_a.nbytes, stream),
                        reps=16)
    copy_gbps = 2 * big_a.nbytes / copy_us / 1e3
    del big_a, big_b
    with stream:
        empty_us = timed(cp, stream, backlog, lambda i: empty((1,), (32,), (out,), stream=stream))
    print(f"{dev.pci_bus_id} {torch.cuda.get_device_name()}: copy {copy_gbps:.0f} GB/s (2 GiB, read + write), "
          f"empty kernel {empty_us:.2f} us between events")
    # read % less empty: the read's share of copy once the empty kernel's time is taken off
    print(f"{'MB':>6} {'floor us':>9} {'read us':>8} {'read %':>7} {'less empty %':>13} {'cuBLAS M=1 us':>14} {'cuBLAS %':>9}")
    for mb in sizes:
        nbytes = mb * 1000 * 1000 // 16 * 16
        copies = [cp.empty(nbytes, dtype=cp.uint8) for _ in range(max(1, -(-ROTATION_BYTES // nbytes)))]
        for c in copies:
            c.fill(1)
        blocks = sms * 8
        with stream:
            read_us = timed(cp, stream, backlog,
                            lambda i: read_all((blocks,), (256,), (copies[i % len(copies)], cp.int64(nbytes // 16), out),
                                               stream=stream))
        floor_us = nbytes / copy_gbps / 1e3
        # cuBLAS: one bf16 token on a [n, k] weight of nbytes (k = 4096 or the size's divisor)
        k = 4096
        n = nbytes // 2 // k
        with torch.cuda.stream(tstream):
            ws = [torch.ones(n, k, dtype=torch.bfloat16, device="cuda") for _ in range(len(copies))]
            x = torch.ones(1, k, dtype=torch.bfloat16, device="cuda")
            y = torch.empty(1, n, dtype=torch.bfloat16, device="cuda")
            mm_us = timed(cp, stream, backlog, lambda i: torch.matmul(x, ws[i % len(ws)].t(), out=y))
        mm_floor = n * k * 2 / copy_gbps / 1e3
        print(f"{mb:>6} {floor_us:>9.2f} {read_us:>8.2f} {100 * floor_us / read_us:>6.1f}% "
              f"{100 * floor_us / max(read_us - empty_us, 1e-9):>12.1f}% {mm_us:>14.2f} {100 * mm_floor / mm_us:>8.1f}%")
        del copies, ws


if __name__ == "__main__":
    main(sys.argv[1:])
