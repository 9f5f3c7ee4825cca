"""Device time of one GPU GEMM with its weight resident in L2 against streamed from DRAM.

The bench charges a kernel its weight's trip from DRAM (it rotates copies past the L2). On a
GPU whose DRAM the kernel cannot saturate, that time mixes the two limits; replaying the call
on ONE weight small enough for the L2 takes DRAM out and leaves what the SMs take to consume
the bytes (their instruction streams, barriers, latencies), so a change to a kernel's
instructions shows there even where DRAM hides it. Each time is a CUDA graph of `calls`
launches on a torch stream (no Python between launches), median of 5 replays.

    python bench/time_resident.py w4a16 8192x5376,43008x5376 1,16
    python bench/time_resident.py gguf:q4_K 8192x5376 1
"""
import sys

import ml_dtypes
import numpy as np

import pyquant
from profile_gemm import make_weight  # bench/ is the script's directory: sys.path[0]

L2_ROTATION_BYTES = 200 << 20  # the streamed case cycles copies through at least this much


def graph_time(torch, stream, launch, calls: int) -> float:
    """Median us a launch over 5 replays of a graph of `calls` launches."""
    with torch.cuda.stream(stream):
        for i in range(3):
            launch(i)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=stream):
            for i in range(calls):
                launch(i)
        g.replay()
        times = []
        for _ in range(5):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record(stream)
            g.replay()
            b.record(stream)
            b.synchronize()
            times.append(a.elapsed_time(b) * 1000 / calls)
    return float(np.median(times))


def main(argv):
    import torch
    fam = argv[0]
    shapes = [tuple(int(v) for v in s.split("x")) for s in argv[1].split(",")]
    ms = [int(v) for v in argv[2].split(",")]
    rng = np.random.default_rng(0)
    ctx = pyquant.gpu_context()
    stream = torch.cuda.Stream()
    print(f"{fam}: us a call, graph-replayed; resident = one weight (L2 when it fits), "
          f"streamed = copies cycled through {L2_ROTATION_BYTES >> 20} MB")
    for n, k in shapes:
        host = make_weight(fam, n, k, rng)
        nbytes = host.nbytes
        copies = [host.to_device(ctx) for _ in range(max(1, -(-L2_ROTATION_BYTES // nbytes)))]
        for m in ms:
            x = pyquant.DeviceArray.from_numpy(rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16), ctx)
            y = pyquant.DeviceArray.empty((m, n), ml_dtypes.bfloat16, ctx)
            plans = [pyquant.gemm_plan(x, w, out=y, ctx=ctx, stream=stream.cuda_stream) for w in copies]
            resident = graph_time(torch, stream, lambda i: plans[0](), 50)
            streamed = graph_time(torch, stream, lambda i: plans[i % len(plans)](), 50)
            print(f"{n}x{k} M={m}: resident {resident:8.2f} us  streamed {streamed:8.2f} us  "
                  f"({len(copies)} copies of {nbytes / 1e6:.1f} MB)")


if __name__ == "__main__":
    main(sys.argv[1:])
