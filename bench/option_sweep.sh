#!/usr/bin/env bash
# One context option swept over values, the bench's cases timed at each, alternating runs,
# one table back: the tiers' own choice ("auto": the option unset) against each forced value.
#
#   QG_SWEEP_OPTION=split_k QG_SWEEP_VALUES="auto 16 32 64" \
#   QG_BENCH_ARGS="--family w4a16 --variant g128-asym-bf16 --shape 14336x4096 --m 1,16 --budget 0.04 --no-peers" \
#   bench/option_sweep.sh
#
# Environment: QG_SWEEP_OPTION (a qg_context_set_option name), QG_SWEEP_VALUES (values; "auto"
# leaves the option unset), QG_SWEEP_RUNS (rounds, default 2), QG_SWEEP_SECONDS (no new run
# starts past this many seconds, default 400: a device call has 600), QG_BENCH_ARGS (the cases).
# Output: $OUT/sweep.json (every run's medians) and the table printed last, the median of the
# rounds a case and value. Logs stay in a temporary folder: the device returns few files.
set -uo pipefail
cd "$(dirname "$0")/.."
[ -f bench/gpu_env.sh ] && . bench/gpu_env.sh
OUT=${OUT:-/tmp/qg_out}
mkdir -p "$OUT"
NAME=${QG_SWEEP_OPTION:?set QG_SWEEP_OPTION}
VALUES=${QG_SWEEP_VALUES:?set QG_SWEEP_VALUES}
tmp=$(mktemp -d)
for r in $(seq "${QG_SWEEP_RUNS:-2}"); do
    for v in $VALUES; do
        [ "$SECONDS" -gt "${QG_SWEEP_SECONDS:-400}" ] && break 2
        opt=()
        [ "$v" != auto ] && opt=(--option "$NAME=$v")
        # shellcheck disable=SC2086  # QG_BENCH_ARGS is a list of bench arguments
        python3 -m pyquant bench ${QG_BENCH_ARGS:-} "${opt[@]}" --json "$tmp/$v.$r.json" > "$tmp/$v.$r.log" 2>&1 ||
            { echo "run $r of $NAME=$v failed:"; tail -3 "$tmp/$v.$r.log"; }
    done
done
python3 - "$tmp" "$OUT/sweep.json" "$NAME" "$VALUES" <<'PY'
import glob, json, os, statistics, sys
tmp, out, name, values = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4].split()
cases = {}
for path in glob.glob(os.path.join(tmp, "*.json")):
    value = os.path.basename(path).rsplit(".", 2)[0]
    for r in json.load(open(path))["rows"]:
        key = f'{r["family"]} {r["format"]} {r["variant"]} {r["n"]}x{r["k"]} M={r["m"]}'
        cases.setdefault(key, {}).setdefault(value, []).append(r["median_us"])
json.dump({"option": name, "values": values, "cases": cases}, open(out, "w"), indent=1)
print(f"median us over the rounds, {name} = " + " | ".join(values))
for key in sorted(cases):
    cells = [f"{statistics.median(cases[key][v]):.1f}" if v in cases[key] else "-" for v in values]
    print(f"{key}: " + " | ".join(cells))
PY
