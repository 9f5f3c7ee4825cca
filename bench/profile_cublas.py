"""cuBLAS bf16 (torch.matmul) on a dense weight, for ncu to compare with our kernels:
    ncu --clock-control none -k regex:gemm|Kernel python3 bench/profile_cublas.py 43008 5376 2048
"""
import sys

import torch


def main(argv):
    n, k, m = (int(v) for v in argv[:3])
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    for _ in range(5):
        y = x @ w.T
    torch.cuda.synchronize()
    print("ok cublas", n, k, m, float(y.float().abs().mean()))


if __name__ == "__main__":
    main(sys.argv[1:])
