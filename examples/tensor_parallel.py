"""One Llama-style MLP block across the GPUs of one host, tensor-parallel:
y = down(silu(gate(x)) * up(x)), gate and up column-parallel (process r owns intermediate
features r*I/p .. (r+1)*I/p), down row-parallel on the same features (its partial outputs
are summed by an all-reduce), one process per GPU. pyquant runs the GEMMs on each
process's own device; NCCL does the all-reduce, through torch.distributed (pyquant itself
needs neither). NVLink multicast stays off (NCCL_NVLS_ENABLE=0).

    python examples/tensor_parallel.py --world-size 2 --check            # NCCL on 2 GPUs
    python examples/tensor_parallel.py --backend gloo --world-size 2 --check   # CPU, 2 processes
    python examples/tensor_parallel.py --world-size 2 --hidden 4096 --intermediate 14336 --bench 1,512
    torchrun --nproc-per-node 2 examples/tensor_parallel.py --check      # torchrun starts them

The weights are random (--format: int4 g128, or any registry format; the GPU tiers serve
int4 and the GGUF formats), or blk.N.ffn_gate/up/down of a llama.cpp .gguf file (--gguf).
Every process builds the same weights and keeps its shards (Int4Weight / GGUFWeight /
MXFP4Weight.shard, cut on the host, then moved to its device). With --backend gloo every
process runs pyquant's CPU tier and gloo sums on the host: what CI runs. The RMS norm and
the residual add of a full block are the same on every process and are left out.

--check: process 0 also runs the unsharded block on its device (the one-GPU result) and
compares both with the float64 reference of the block; exit 1 past the bounds.
--bench M,M,...: the time of one sharded block (GEMMs + SiLU-GLU + all-reduce) against the
unsharded block on one device, per M (median of --repeats runs of --iters steps each,
GemmPlans so that Python costs a few microseconds per GEMM; on a GPU the steps cycle
through copies of the weights, 180 MB at least, so that none is read from the L2).
"""
from __future__ import annotations

import argparse
import importlib.util
import multiprocessing
import os
import socket
import sys
import time

import ml_dtypes
import numpy as np

os.environ["NCCL_NVLS_ENABLE"] = "0"  # NVLink multicast (NVLS) off, in every process started here

import pyquant  # noqa: E402
from pyquant.shard import plan as shard_plan  # noqa: E402

DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16}
UNIT = {"bfloat16": 2.0 ** -8, "float16": 2.0 ** -11}  # unit roundoff of the activation dtype
U32 = 2.0 ** -24


def weights(args):
    """(gate [I, H], up [I, H], down [H, I]) on the host, the same in every process."""
    if args.gguf:
        ckpt = pyquant.load_gguf(args.gguf)
        return tuple(ckpt[f"blk.{args.layer}.ffn_{n}.weight"] for n in ("gate", "up", "down"))
    rng = np.random.default_rng(args.seed)
    h, i = args.hidden, args.intermediate
    kw = {"group_size": 128} if args.format == "int4" else {}
    return tuple(pyquant.quantize((rng.standard_normal(shape) / np.sqrt(shape[1])).astype(np.float32),
                                  args.format, **kw) for shape in ((i, h), (i, h), (h, i)))


class Block:
    """The MLP block on one device, with fixed buffers for M rows: step() runs gate and up
    (GemmPlans), the SiLU-GLU in torch and down into self.y (float32, ready for the
    all-reduce). x, the intermediates and y are torch tensors on the process's device."""

    def __init__(self, gate, up, down, ctx, device, dtype, m: int):
        import torch
        self.torch = torch
        self.ctx, self.device = ctx, device
        self.gate, self.up, self.down = (w.to_device(ctx) for w in (gate, up, down))
        tdt = {ml_dtypes.bfloat16: torch.bfloat16, np.float16: torch.float16}[dtype]
        inter, hidden = gate.shape
        self.x = torch.empty(m, hidden, dtype=tdt, device=device)
        self.g = torch.empty(m, inter, dtype=tdt, device=device)
        self.u = torch.empty(m, inter, dtype=tdt, device=device)
        self.act = torch.empty(m, inter, dtype=tdt, device=device)
        self.y = torch.empty(m, hidden, dtype=torch.float32, device=device)
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        plan = lambda x, w, out: pyquant.gemm_plan(x, w, out=out, ctx=ctx, stream=stream)  # noqa: E731
        self.steps = (plan(self.x, self.gate, self.g), plan(self.x, self.up, self.u))
        self.down_step = plan(self.act, self.down, self.y)

    def step(self):
        for s in self.steps:
            s()
        self.torch.mul(self.torch.nn.functional.silu(self.g), self.u, out=self.act)
        self.down_step()
        return self.y


def reference(gate, up, down, x: np.ndarray) -> np.ndarray:
    """float64: the block on the dequantized weights."""
    g, u = (x.astype(np.float64) @ w.dequantize().astype(np.float64).T for w in (gate, up))
    return (g / (1 + np.exp(-g)) * u) @ down.dequantize().astype(np.float64).T


def bound(args, w, on_gpu: bool) -> float:
    """||y - ref|| / ||ref|| of one run of the block (sharded or not). x is exact in its
    dtype; g and u are rounded to it, the SiLU output and the product once more each: four
    roundings of at most its unit roundoff u, relative and normwise through these random
    weights, x2 margin. The GPU's GGUF tier and the CPU tier's default precision
    (cpu_precision auto, every format) quantize the activations to int8 per 32 (2^-8
    relative, for gate/up and for down). fp32 accumulation over H and I: the test
    suite's 4 k u32 (tests/test_api_cpu.py gemm_bound), the all-reduce adding p - 1 more
    roundings of the sum."""
    inter, hidden = w[0].shape
    int8 = 2 * 2.0 ** -8 if not on_gpu or isinstance(w[0], pyquant.GGUFWeight) else 0.0
    return 2 * (4 * UNIT[args.dtype] + int8) + 4 * (hidden + inter + args.world_size) * U32


# Weight bytes that consecutive timed steps cycle through on a GPU: three times the H200's
# 60 MB L2, so that no step finds its weights cached by the previous ones (DESIGN.md,
# "Performance contract": the bench rotates weight copies the same way).
ROTATE_BYTES = 3 * 60 << 20


def _rotating(ws, ctx, device, dtype, m: int, args):
    """An endless cycle of Blocks on copies of the weights ws (one copy on the CPU, enough
    copies to make ROTATE_BYTES on a GPU), their x filled with the same random rows."""
    import itertools
    per = sum(w.nbytes for w in ws)
    copies = 1 if device.type == "cpu" else min(args.max_copies, -(-ROTATE_BYTES // per))
    blocks = [Block(*ws, ctx, device, dtype, m) for _ in range(copies)]
    blocks[0].x.normal_()
    for b in blocks[1:]:
        b.x.copy_(blocks[0].x)
    return itertools.cycle(blocks)


def _timed(fn, sync, iters: int, repeats: int) -> float:
    """Median over `repeats` of the mean time of one fn() in a run of `iters`, in us."""
    fn()
    sync()
    runs = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        runs.append((time.perf_counter() - t0) / iters * 1e6)
    return float(np.median(runs))


def shards(ws, world: int, rank: int, loud: bool, cut=None):
    """Process rank's parts of (gate, up, down): gate and up cut along N, down along K, by
    cut(weight, axis) (default: Weight.shard; shard_plan checks the same rules without copying
    a byte). A split the format refuses exits 1, with the reason where loud."""
    cut = cut or (lambda w, ax: w.shard(ax, world, rank))
    try:
        return [cut(w, ax) for w, ax in zip(ws, ("n", "n", "k"))]
    except pyquant.InvalidArgumentError as e:
        raise SystemExit(f"intermediate={ws[0].shape[0]} does not shard {world} ways: {e}" if loud else 1)


def worker(rank: int, world: int, args, port: int | None) -> int:
    gate, up, down = weights(args)
    inter, hidden = gate.shape
    mine = shards((gate, up, down), world, rank, loud=rank == 0)  # under torchrun: process 0 says why
    import torch
    import torch.distributed as dist
    if not dist.is_available():
        raise SystemExit("this torch build has no torch.distributed")
    local = int(os.environ.get("LOCAL_RANK", rank))
    if port is None:       # torchrun: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE are set
        dist.init_process_group(args.backend)
    else:
        dist.init_process_group(args.backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world)
    if args.backend == "gloo":
        ctx, device = pyquant.cpu_context(), torch.device("cpu")
        sync = lambda: None  # noqa: E731
    else:
        # this process's GPU only (gpu_context() would open device 0 in every process)
        backend = next((b for b in ("cuda", "hip") if pyquant.device_count(b) > local), None)
        if backend is None:
            raise SystemExit(f"rank {rank}: --backend {args.backend} needs a GPU build of pyquant and "
                             f"GPU {local} (pyquant sees {pyquant.device_count('cuda')} CUDA devices)")
        torch.cuda.set_device(local)
        ctx, device = pyquant.Context(backend, local), torch.device("cuda", local)
        sync = torch.cuda.synchronize
    dtype = DTYPES[args.dtype]
    where = f"{world} x {device.type}" + (f" ({ctx.device_name})" if device.type == "cuda" else "")
    if rank == 0:
        print(f"MLP {gate.format} gate/up [{inter}, {hidden}], {down.format} down [{hidden}, {inter}] "
              f"over {where}, {args.backend}"
              f"{' (NCCL_NVLS_ENABLE=' + os.environ['NCCL_NVLS_ENABLE'] + ')' if args.backend == 'nccl' else ''}"
              f": each process holds [{inter // world}, {hidden}] x 2 "
              f"and [{hidden}, {inter // world}]")
    status = 0

    if args.check:
        x = np.random.default_rng(args.seed + 1).standard_normal((args.tokens, hidden)).astype(dtype)
        tp = Block(*mine, ctx, device, dtype, args.tokens)
        tp.x.copy_(torch.from_numpy(x.view(np.int16)).view(tp.x.dtype))
        y = tp.step()
        dist.all_reduce(y)
        if rank == 0:
            one = Block(gate, up, down, ctx, device, dtype, args.tokens)
            one.x.copy_(tp.x)
            y1 = one.step().cpu().numpy().astype(np.float64)
            y_tp = y.cpu().numpy().astype(np.float64)
            ref = reference(gate, up, down, x)
            b = bound(args, (gate, up, down), device.type == "cuda")
            err_tp, err_1 = (np.linalg.norm(v - ref) / np.linalg.norm(ref) for v in (y_tp, y1))
            diff = np.linalg.norm(y_tp - y1) / np.linalg.norm(y1)
            # both within b of the reference, hence within 2b of each other
            print(f"check: ||y_tp - y_1gpu|| / ||y_1gpu|| = {diff:.2e} (bound {2 * b:.1e}); against the "
                  f"float64 reference: sharded {err_tp:.2e}, one device {err_1:.2e} (bound {b:.1e})")
            status = 0 if (err_tp <= b and err_1 <= b and diff <= 2 * b) else 1
        dist.barrier()

    for m in args.bench:
        tp = _rotating(mine, ctx, device, dtype, m, args)
        step = lambda: dist.all_reduce(next(tp).step())  # noqa: E731
        dist.barrier()
        t_tp = _timed(step, sync, args.iters, args.repeats)
        dist.barrier()
        if rank == 0:
            one = _rotating((gate, up, down), ctx, device, dtype, m, args)
            t_1 = _timed(lambda: next(one).step(), sync, args.iters, args.repeats)
            print(f"bench M={m}: sharded over {where} {t_tp:.1f} us, one {device.type} {t_1:.1f} us "
                  f"(x{t_1 / t_tp:.2f})")
        dist.barrier()
    dist.destroy_process_group()
    return status


def _spawned(rank: int, world: int, args, port: int) -> None:
    status = worker(rank, world, args, port)
    if status:
        sys.exit(status)


def spawn(args) -> int:
    """One process per rank (the spawn start method: nothing of this process, CUDA least of
    all, is inherited); when one fails the others are stopped, since they would wait for it
    at the next collective. A split the format refuses is refused here, before any process
    starts (were it left to them, the first to exit could have the others stopped before
    process 0 said why). Returns the first non-zero exit code of a process that was not
    stopped, else that of one stopped, else 0."""
    ws, world = weights(args), args.world_size
    for rank in range(world):
        shards(ws, world, rank, loud=True, cut=lambda w, ax: shard_plan(w, ax, world, rank))
    del ws
    with socket.socket() as s:  # a free port for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp = multiprocessing.get_context("spawn")
    procs = [mp.Process(target=_spawned, args=(r, args.world_size, args, port))
             for r in range(args.world_size)]
    for p in procs:
        p.start()
    while any(p.exitcode is None for p in procs):
        if any(p.exitcode for p in procs):
            for p in procs:
                if p.exitcode is None:
                    p.terminate()
        time.sleep(0.05)
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    return next((c for c in codes if c > 0), next((c for c in codes if c), 0))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", choices=["nccl", "gloo"], default="nccl",
                    help="nccl: one GPU per process; gloo: the CPU tier in every process")
    ap.add_argument("--world-size", type=int, default=2, help="processes (GPUs); torchrun sets it itself")
    ap.add_argument("--format", default="int4", help="format of the random weights (pyquant.formats())")
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--intermediate", type=int, default=2048)
    ap.add_argument("--gguf", help="a llama.cpp .gguf file: its blk.LAYER.ffn_gate/up/down instead")
    ap.add_argument("--layer", type=int, default=0)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    ap.add_argument("--tokens", type=int, default=4, help="rows of x for --check")
    ap.add_argument("--check", action="store_true", help="compare with one device and the float64 reference")
    ap.add_argument("--bench", type=lambda s: [int(v) for v in s.split(",") if v], default=[],
                    help="comma-separated M to time, e.g. 1,512")
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--max-copies", type=int, default=16,
                    help="most weight copies --bench cycles through on a GPU (to defeat the L2)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if importlib.util.find_spec("torch") is None:
        raise SystemExit("examples/tensor_parallel.py needs torch (torch.distributed): pip install torch")
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # started by torchrun
        args.world_size = int(os.environ["WORLD_SIZE"])
        return worker(int(os.environ["RANK"]), args.world_size, args, None)
    return spawn(args)


if __name__ == "__main__":
    sys.exit(main())
