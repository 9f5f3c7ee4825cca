#!/usr/bin/env bash
# Two builds of libquantgemm timed against each other on one GPU machine: the bench runs
# alternate A, B, A, B, ... (a fresh device machine's clocks and a neighbour's load move
# whole runs, so only runs of the same call compare), and one summary comes back.
#
#   QG_AB_A=.devlib/libqg_main.so QG_AB_B=.devlib/libqg_new.so bench/gpu_ab.sh
#
# Environment: QG_AB_A, QG_AB_B (libraries, plain or .gz: the device machine takes at most
# 64 MiB a call, and a gzip -1 of a stripped CUDA build is half its size), QG_AB_RUNS (runs
# of each, default 2), QG_BENCH_ARGS (the cases; default: the W4A16 prefill rows of issue 14
# with --no-peers), QG_AB_C (a third library, timed after B in each round, its column C / A),
# QG_AB_ENV_A / _B / _C (NAME=VALUE settings for that side's runs alone) and QG_AB_ARGS_A / _B /
# _C (bench arguments added to that side's runs alone, e.g. `--option prefill_tile=64`): one
# library, two or three settings, QG_AB_DIR_A (a checkout whose pyquant A's runs use, where B's tree
# packs a format version A's library does not read). Output: $OUT/ab.json (every run's rows) and the table printed last, A's
# and B's medians side by side. Two files only: the device returns a few files a call.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
unpack() {  # the library's path, gunzipped beside it when given as .gz
    case "$1" in
    *.gz) gunzip -kf "$1" && echo "${1%.gz}" ;;
    *) echo "$1" ;;
    esac
}
A=$(unpack "${QG_AB_A:?set QG_AB_A}") || exit 1
B=$(unpack "${QG_AB_B:?set QG_AB_B}") || exit 1
C=""
[ -n "${QG_AB_C:-}" ] && { C=$(unpack "$QG_AB_C") || exit 1; }
ARGS=${QG_BENCH_ARGS:-"--family w4a16 --variant g128-asym-bf16 --shape 43008x5376,5376x21504,4096x14336 \
--m 32,512,2048 --budget 0.05 --no-peers"}
tmp=$(mktemp -d)
for r in $(seq "${QG_AB_RUNS:-2}"); do
    for side in A B ${C:+C}; do
        lib=$A
        [ "$side" = B ] && lib=$B
        [ "$side" = C ] && lib=$C
        case "$lib" in /*) ;; *) lib=$PWD/$lib ;; esac
        # shellcheck disable=SC2086  # ARGS is a list of bench arguments
        envs=()
        side_env=QG_AB_ENV_$side side_arg=QG_AB_ARGS_$side
        [ -n "${!side_env:-}" ] && read -ra envs <<< "${!side_env}"
        dir=$PWD
        [ "$side" = A ] && [ -n "${QG_AB_DIR_A:-}" ] && dir=$QG_AB_DIR_A
        side_args=${!side_arg:-}
        # shellcheck disable=SC2086  # lists of bench arguments
        (cd "$dir" && env "${envs[@]}" PYQUANT_LIB="$lib" python3 -m pyquant bench $ARGS $side_args --json "$tmp/$side.$r.json") \
            > "$tmp/$side.$r.log" 2>&1 || { echo "run $r of $side ($lib) failed:"; tail -5 "$tmp/$side.$r.log"; }
    done
done
python3 - "$tmp" "$OUT/ab.json" "$A" "$B" "$C" <<'PY'
import glob, json, os, statistics, sys
tmp, out, lib_a, lib_b, lib_c = sys.argv[1:]
runs, cases = {}, {}
for path in sorted(glob.glob(os.path.join(tmp, "*.json"))):
    side, run = os.path.basename(path).split(".")[:2]
    rows = json.load(open(path))["rows"]
    runs[f"{side}{run}"] = rows
    for r in rows:
        key = (r["family"], r["format"], r["variant"], r["n"], r["k"], r["m"])
        cases.setdefault(key, {}).setdefault(side, []).append(r["median_us"])
json.dump({"A": lib_a, "B": lib_b, "C": lib_c, "runs": runs}, open(out, "w"), indent=1)
print(f"A = {lib_a}, B = {lib_b}" + (f", C = {lib_c}" if lib_c else "") + ": median us of each run")
for (fam, fmt, var, n, k, m), v in sorted(cases.items()):
    a = v.get("A", [])
    line = f"{fam} {fmt} {var} {n}x{k} M={m}: A {' '.join(f'{t:.1f}' for t in a)}"
    for side in "BC" if lib_c else "B":
        t = v.get(side, [])
        ratio = f"{statistics.median(t) / statistics.median(a):.3f}" if a and t else "-"
        line += f" | {side} {' '.join(f'{x:.1f}' for x in t)} | {side}/A {ratio}"
    print(line)
PY
rm -rf "$tmp"
