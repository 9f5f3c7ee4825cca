"""`python -m pyquant bench`: roofline %, peers side by side, goldens.

    python -m pyquant bench --quick                       # a handful of cases
    python -m pyquant bench                               # every family x format x shape x M
    python -m pyquant bench --family gguf --format q4_K --m 1,16 --shape 14336x4096
    python -m pyquant bench --record bench/golden/h200.json
    python -m pyquant bench --compare bench/golden/h200.json   # exit 1 on a regression
    python -m pyquant bench --quick --json out.json --plot out.png --html out.html

Modules: cases (suites, bytes and FLOPs), timing (device events, host timer, fake timer),
roofline (copy bandwidth, FLOP ceiling), peers (torch / CuPy / numpy), golden (record and
compare protocol), report (table, plot, HTML), runner (the library-backed measurements).
"""
from __future__ import annotations

import argparse
import os
import sys

from . import cases as C
from . import golden as G
from . import report
from .._lib import QuantGemmError

EXIT_OK = 0
EXIT_REGRESSION = 1
EXIT_USAGE = 2

_EPILOG = f"""
suites: the default suite is every family ({', '.join(C.FAMILIES)}) x format x default variant
x the standard shapes ({', '.join(f'{n}x{k}' for n, k in C.STANDARD_SHAPES)}) x M in
{{{', '.join(map(str, C.STANDARD_M))}}}; moe runs its model shapes (gpt-oss-120b, gpt-oss-20b)
with M = tokens. On the CPU backend the standard shapes are scaled: N and K divided by
{C.CPU_SHAPE_DIV}, rounded down to a multiple of {C.CPU_SHAPE_ALIGN}, M capped at {C.CPU_MAX_M}
(shapes and M given with --shape / --m are used as given).

goldens: --record measures every case {G.REPEATS} times; an entry is reproducible when the
spread is within the noise band (default {G.GPU_NOISE_BAND * 100:.0f} % on a GPU, {G.CPU_NOISE_BAND * 100:.0f} % on the CPU).
--compare re-measures the golden's cases; one that moved beyond the band is re-run
{G.RERUNS} more times and reported as a regression or improvement only when the re-runs
reproduce it (exit status {EXIT_REGRESSION} on a reproduced regression); the rest is noise.

exit status: 0 success, {EXIT_REGRESSION} reproduced regression, {EXIT_USAGE} bad arguments or missing tool.
"""


def _csv(kind):
    def parse(text):
        return [kind(x) for x in text.replace(",", " ").split()]
    return parse


def _flatten(lists):
    return [x for lst in lists for x in lst] if lists else None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m pyquant bench",
        description="Benchmark the quantgemm kernels against the machine's measured roofline "
                    "(copy bandwidth and FLOP ceiling measured in the same run), with peers "
                    "side by side and golden record / compare.",
        epilog=_EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sel = p.add_argument_group("case selection (lists: comma separated or repeated)")
    sel.add_argument("--quick", action="store_true", help="a handful of cases (under a minute)")
    sel.add_argument("--family", type=_csv(str), action="append", metavar="F",
                     help=f"families: {', '.join(C.FAMILIES)}")
    sel.add_argument("--format", type=_csv(str), action="append", metavar="FMT",
                     help=f"registry formats: {', '.join(C.BENCH_FORMATS)}")
    sel.add_argument("--variant", type=_csv(str), action="append", metavar="V",
                     help="w4a16: g{32|64|128}-{sym|asym}-{fp16|bf16}; gguf/mxfp4: fp32|fp16|bf16 (gguf also "
                          "{fp32|fp16|bf16}-blocks: the .gguf blocks on a GPU where q8_0, q4_0, q4_K, iq4_xs or q6_K would be repacked; "
                          "{fp32|fp16|bf16}-rows8: the CPU tier's rows8 layout, repacked once); "
                          "moe: gpt-oss-120b|gpt-oss-20b")
    sel.add_argument("--shape", type=_csv(C.parse_shape), action="append", metavar="NxK",
                     help="weight shapes N x K, e.g. 14336x4096 (replace the standard shapes; "
                          "with --quick, pick among its cases)")
    sel.add_argument("--m", type=_csv(int), action="append", metavar="M",
                     help="M values (tokens), e.g. 1,16,128 (replace the standard M list; "
                          "with --quick, pick among its cases)")
    sel.add_argument("--list", action="store_true", help="print the selected cases and exit")
    run = p.add_argument_group("measurement")
    run.add_argument("--backend", choices=("auto", "cpu", "cuda", "hip"), default="auto",
                     help="auto: the GPU when there is one, else the CPU tier")
    run.add_argument("--device", type=int, default=0, help="GPU index")
    run.add_argument("--budget", type=float, default=None, metavar="SECONDS",
                     help="timing budget of one measurement (default 0.25 s GPU, 0.5 s CPU)")
    run.add_argument("--no-peers", action="store_true", help="skip torch / CuPy / numpy peers")
    run.add_argument("--option", type=_option, action="append", metavar="NAME=VALUE", default=[],
                     help="a context option (qg_context_set_option: split_k, prefill_tile, ...) for "
                          "every library call, to measure a choice the tiers make; not with --record")
    gold = p.add_argument_group("goldens")
    mode = gold.add_mutually_exclusive_group()
    mode.add_argument("--record", metavar="PATH", help="record a golden file (bench/golden/<device>.json)")
    mode.add_argument("--compare", metavar="PATH", help="compare with a golden file")
    gold.add_argument("--band", type=float, default=None, metavar="FRAC",
                      help="noise band as a fraction (0.03 = 3 %%)")
    out = p.add_argument_group("output")
    out.add_argument("--json", metavar="PATH", help="write the results in the golden schema")
    out.add_argument("--plot", metavar="PATH.png", help="roofline %% and time against M (needs matplotlib)")
    out.add_argument("--html", metavar="PATH", help="one-page report: table and plots")
    return p


def _option(text: str) -> tuple[str, int]:
    name, _, value = text.partition("=")
    try:
        return name, int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected NAME=INTEGER, e.g. split_k=2") from None


def _check_filters(args) -> None:
    if args.option and args.record:
        raise ValueError("--option with --record: golden rows are of the library's own choices")
    for fam in args.family or []:
        if fam not in C.FAMILIES:
            raise ValueError(f"unknown family {fam!r}; families: {', '.join(C.FAMILIES)}")
    for fmt in args.format or []:
        if fmt not in C.BENCH_FORMATS:
            raise ValueError(f"unknown format {fmt!r}; formats: {', '.join(sorted(C.BENCH_FORMATS))}")
    for m in args.m or []:
        if m < 1:
            raise ValueError(f"--m {m}: M must be >= 1")
    for n, k in args.shape or []:
        if n < 1 or k < 1:
            raise ValueError(f"--shape {n}x{k}: N and K must be >= 1")
    if args.band is not None and not 0 < args.band < 1:
        raise ValueError(f"--band {args.band}: the noise band is a fraction in (0, 1), e.g. 0.03")
    if args.budget is not None and not args.budget > 0:
        raise ValueError(f"--budget {args.budget}: the timing budget must be > 0 seconds")
    for flag in ("record", "json", "plot", "html"):
        path = getattr(args, flag)
        if path:
            _check_writable(f"--{flag}", path)


def _check_writable(flag: str, path: str) -> None:
    """Refuses an output path before anything is measured: a directory, or a file whose
    folder does not exist or cannot be written."""
    if os.path.isdir(path):
        raise ValueError(f"{flag} {path}: is a directory")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise ValueError(f"{flag} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
        raise ValueError(f"{flag} {path}: not writable")


def _suite(args, cpu: bool, golden_doc=None) -> list[C.Case]:
    """The cases to run, each checked (cases.check_case): a bad one fails the call here,
    before a runner measures the machine or any case."""
    if golden_doc is not None:
        cases = [report.row_case(r) for r in golden_doc["rows"]]
        cases = C.select(cases, args.family, args.format, args.variant, args.shape, args.m)
    else:
        cases = C.build_suite(quick=args.quick, families=args.family, formats=args.format,
                              variants=args.variant, shapes=args.shape, ms=args.m, cpu=cpu)
    for case in cases:
        C.check_case(case)
    return C.order_for_weights(cases)


def main(argv=None, *, runner=None) -> int:
    """Entry point of `python -m pyquant bench`; returns the exit status.

    runner: what measures (see runner.py). None = the library on --backend; tests pass a
    timing.FakeRunner to drive the whole tool without a library or a device.
    """
    parser = build_parser()
    args = parser.parse_args(argv)
    for name in ("family", "format", "variant", "shape", "m"):
        setattr(args, name, _flatten(getattr(args, name)))
    try:
        _check_filters(args)
        golden_doc = G.load(args.compare) if args.compare else None
    except (ValueError, OSError) as e:
        print(f"bench: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.plot and not report.have_matplotlib():
        print("bench: --plot needs matplotlib, which is not installed "
              "(pip install 'pyquant[bench]' or pip install matplotlib)", file=sys.stderr)
        return EXIT_USAGE

    # Every argument is checked before anything is measured: the cases too, on the shapes
    # of the backend that will run them (the runner says; else the same rule it follows).
    if runner is not None:
        cpu = runner.backend == "cpu"
    else:
        cpu = args.backend == "cpu" or (args.backend == "auto" and not _gpu_present())
    try:
        cases = _suite(args, cpu, golden_doc)
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.list:
        for c in cases:
            print(c.label)
        kind = "the golden file's" if golden_doc is not None else "CPU-scaled" if cpu else "GPU"
        print(f"{len(cases)} cases ({kind} shapes)")
        if not cases:
            print("bench: no case matches the filters", file=sys.stderr)
            return EXIT_USAGE
        return EXIT_OK

    own_runner = runner is None
    if own_runner:
        from .runner import LibraryRunner
        try:
            runner = LibraryRunner(backend=args.backend, device=args.device, budget_s=args.budget,
                                   peers=not args.no_peers, options=dict(args.option))
        except (ImportError, OSError, ValueError, RuntimeError, QuantGemmError) as e:
            print(f"bench: cannot start the library runner: {e}", file=sys.stderr)
            return EXIT_USAGE
    try:
        return _run(args, runner, golden_doc)
    except ValueError as e:
        print(f"bench: {e}", file=sys.stderr)
        return EXIT_USAGE
    finally:
        if own_runner:
            runner.close()


def _gpu_present() -> bool:
    try:
        import pyquant
        return bool(pyquant.gpu_available())
    except Exception:  # no library at all: --list still works, on CPU shapes
        return False


def _run(args, runner, golden_doc) -> int:
    cpu = runner.backend == "cpu"
    band = args.band if args.band is not None else (G.CPU_NOISE_BAND if cpu else G.GPU_NOISE_BAND)
    cases = _suite(args, cpu, golden_doc)
    if not cases:
        raise ValueError("no case matches the filters (try --list)")
    if golden_doc is not None and golden_doc.get("device") != runner.device:
        print(f"bench: warning: golden {args.compare} was recorded on {golden_doc.get('device')!r}, "
              f"this is {runner.device!r}", file=sys.stderr)

    machine = runner.machine()
    timer_kind = getattr(runner, "timer_kind", "")
    header = report.header_lines(machine, timer_kind)
    print("\n".join(header))
    mode = "record" if args.record else "compare" if args.compare else "run"
    print(f"cases         : {len(cases)} ({mode}; noise band {band * 100:.1f} %)")
    if args.option:
        print("options       : " + ", ".join(f"{k}={v}" for k, v in args.option))
    sys.stdout.flush()

    peers_on = mode != "compare" and not args.no_peers
    progress = report.Progress(len(cases))
    step = lambda case: progress.step(case.label)  # noqa: E731
    extra = ""
    exit_status = EXIT_OK
    rows = []
    skipped = []  # (case, reason): the build or the device cannot run it

    def skip(case, reason):
        skipped.append((case, reason))

    if mode == "record":
        recorded = G.record(cases, runner.measure, band, progress=step, on_skip=skip)
        for r in recorded:
            rows.append(report.make_row(r.case, r.median_s, machine, r.reproducible,
                                        runner.peers(r.case) if peers_on else None))
        repeats = G.REPEATS
    elif mode == "compare":
        results = G.compare(cases, golden_doc["rows"], runner.measure, band, progress=step)
        for r in results:
            if r.current_s is not None:
                rows.append(report.make_row(r.case, r.current_s, machine, None))
        extra = report.compare_summary(results, band)
        if G.has_regression(results):
            exit_status = EXIT_REGRESSION
        repeats = 1
    else:
        for case in cases:
            try:
                t = runner.measure(case)
            except G.Unsupported as e:
                skip(case, str(e))
            else:
                rows.append(report.make_row(case, t, machine, None, runner.peers(case) if peers_on else None))
            step(case)
        repeats = 1

    print()
    print(report.table(rows, recorded=mode == "record"))
    if skipped:
        groups = {}
        for case, reason in skipped:
            groups.setdefault((case.family, case.format, case.variant, reason), []).append(case.m)
        print(f"\nskipped {len(skipped)} cases this build or device cannot run:")
        for (family, fmt, variant, reason), ms in groups.items():
            print(f"  {family} {fmt} {variant} m={','.join(map(str, sorted(set(ms))))}: {reason}")
    for note in getattr(runner, "notes", lambda: [])():
        print(f"bench: note: {note}")
    if extra:
        print()
        print(extra)
    doc = report.document(machine, rows, band=band, repeats=repeats, timer=timer_kind,
                          build=getattr(runner, "build", ""))
    if args.option:
        doc["options"] = dict(args.option)
    if args.record:
        report.write_json(args.record, doc)
        bad = sum(not r["reproducible"] for r in rows)
        print(f"\nrecorded {len(rows)} entries in {args.record}; {bad} not reproducible "
              f"within {band * 100:.1f} % (kept with reproducible: false, never used as truth)")
    if args.json:
        report.write_json(args.json, doc)
        print(f"wrote {args.json}")
    if args.plot:
        report.save_plot(rows, args.plot, machine.device)
        print(f"wrote {args.plot}")
    if args.html:
        report.write_html(args.html, doc, header, extra)
        print(f"wrote {args.html}")
    return exit_status
