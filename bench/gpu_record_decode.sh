#!/usr/bin/env bash
# Golden rows of the decode tiers and of the MoE layer with their peers (cuBLAS bf16, torch
# int4pack, torch _grouped_mm) in the same run, on the GPU machine: the MoE layer (issue 16),
# the GGUF frag decode rows (issue 13), W4A16 (issue 12) and MXFP4 dense decode (issue 16).
# Each record runs under its own time limit, so that one slow record cannot take the others'
# files with it when the device call ends; four files under $OUT to merge (bench/merge_golden.py:
# reproducible rows only) into bench/golden/<device>.json, the rows printed as they finish.
# The default limits add up to 450 s. bench/gpu_record_prefill.sh records the prefill rows.
#
#   PYQUANT_LIB=path/to/libquantgemm.so bench/gpu_record_decode.sh
#
# Environment: T_MOE, T_GGUF, T_W4, T_MX (time limits of the four records, s; 0 skips one).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
record() {  # name limit bench-arguments...
    local name=$1 limit=$2 t0=$SECONDS
    shift 2
    [ "$limit" -gt 0 ] || return 0
    timeout "$limit" python3 -m pyquant bench "$@" --record "$OUT/golden_$name.json" > "$OUT/rec_$name.log" 2>&1
    echo "== $name record rc=$? $((SECONDS - t0)) s"
    grep -E "^(moe|gguf|w4a16|mxfp4) " "$OUT/rec_$name.log"
}
record moe "${T_MOE:-110}" --family moe --variant gpt-oss-120b,gpt-oss-20b --m 1,8,64,512,2048 --budget 0.1
record gguf "${T_GGUF:-150}" --family gguf --format q8_0,q4_0,q4_K,q6_K,iq4_xs,iq3_xxs --variant bf16 \
    --shape 43008x5376,5376x21504 --m 1,2,4,8,16 --budget 0.05
record w4 "${T_W4:-130}" --family w4a16 --variant g128-asym-bf16,g32-asym-bf16 \
    --shape 43008x5376,16384x5376,5376x21504,14336x4096,4096x14336 --m 1,4,8,16 --budget 0.05
record mx "${T_MX:-60}" --family mxfp4 --variant bf16 --shape 43008x5376,5376x21504,14336x4096 --m 1,2,4,8,16 \
    --budget 0.05
