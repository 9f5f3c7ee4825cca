"""Times the W4A16 / MXFP4 prefill at every token tile x split-K the context options force
(prefill_tile, split_k), beside the auto plan, on the bench's weights and timer: the numbers
prefill_plan's rule (src/gpu/w4a16_prefill_launch.cpp) is chosen from.

    python bench/sweep_prefill.py [--family w4a16] [--variant g128-asym-bf16]
        [--shape 43008x5376,5376x21504,4096x14336] [--m 128,256,512,2048]
        [--tiles 64,128,256] [--splits 1,2,3,4] [--budget 0.02] [--json PATH]

One line per case: the auto plan's time, then each forced (tile, split) as time / auto.
"""
import argparse
import json
import sys

from pyquant.bench import cases as C
from pyquant.bench.runner import LibraryRunner


def _ints(text):
    return [int(v) for v in text.split(",")]


def main(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--family", default="w4a16", choices=("w4a16", "mxfp4"))
    p.add_argument("--variant", default="g128-asym-bf16")
    p.add_argument("--shape", default="43008x5376,5376x21504,4096x14336")
    p.add_argument("--m", type=_ints, default=[128, 256, 512, 2048])
    p.add_argument("--tiles", type=_ints, default=[64, 128, 256])
    p.add_argument("--splits", type=_ints, default=[1, 2, 3, 4])
    p.add_argument("--budget", type=float, default=0.02)
    p.add_argument("--json", default=None)
    a = p.parse_args(argv)
    shapes = [C.parse_shape(s) for s in a.shape.split(",")]
    fmt = "int4" if a.family == "w4a16" else "mxfp4"
    cases = C.order_for_weights([C.Case(a.family, fmt, a.variant, m, n, k) for n, k in shapes for m in a.m])
    runner = LibraryRunner(backend="auto", budget_s=a.budget, peers=False)
    if not runner.gpu:
        sys.exit("sweep_prefill: needs a GPU context (the prefill tier)")
    combos = [(0, 0)] + [(t, s) for t in a.tiles for s in a.splits]
    rows = []
    print(f"{'case':<34} {'auto us':>8}  " + "  ".join(f"{t:>3}/{s:<2}" for t, s in combos[1:]))
    try:
        for case in cases:
            times = {}
            for tile, split in combos:
                runner.ctx.set_option("prefill_tile", tile)
                runner.ctx.set_option("split_k", split)
                runner._ckey = None  # new plans: the workspace follows the split
                times[(tile, split)] = runner.measure(case) * 1e6
            auto = times[(0, 0)]
            best = min(times, key=times.get)
            print(f"{case.label:<34} {auto:8.1f}  " + "  ".join(f"{times[c] / auto:6.3f}" for c in combos[1:]) +
                  f"   best {best[0]}/{best[1]} {times[best]:.1f} us", flush=True)
            rows.append(dict(case=case.label, m=case.m, n=case.n, k=case.k,
                             times={f"{t}/{s}": round(v, 2) for (t, s), v in times.items()}))
    finally:
        runner.ctx.set_option("prefill_tile", 0)
        runner.ctx.set_option("split_k", 0)
        runner.close()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(dict(device=runner.device, family=a.family, variant=a.variant, rows=rows), f, indent=1)


if __name__ == "__main__":
    main(sys.argv[1:])
