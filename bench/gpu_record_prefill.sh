#!/usr/bin/env bash
# Golden rows of the prefill tiers with their peers (cuBLAS bf16, torch int4pack, torch
# _grouped_mm) in the same run, on the GPU machine: the W4A16 bar rows of issue 14, then the GGUF
# frag formats and MXFP4 of issues 15 and 16, then the MoE layer of issue 16. Three files under
# $OUT to merge (bench/merge_golden.py: reproducible rows only) into bench/golden/<device>.json;
# the tables printed last. The default limits add up to 640 s, more than one device call's 600:
# split it (T2=0 T3=0 in one call, T1=0 in the next).
#
#   PYQUANT_LIB=path/to/libquantgemm.so bench/gpu_record_prefill.sh
#
# Environment: M1 (W4A16 M list, default 256,300,512,517,2048), T1 / T2 / T3 (time limits of
# the three records, s; 0 skips one), REC2 (the second record's case selection).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
t0=$SECONDS
[ "${T1:-300}" -gt 0 ] && timeout "${T1:-300}" python3 -m pyquant bench --family w4a16 --variant g128-asym-bf16,g32-asym-bf16 \
    --shape 43008x5376,5376x21504,4096x14336 --m "${M1:-256,300,512,517,2048}" --budget 0.1 \
    --record "$OUT/golden_prefill_w4a16.json" > "$OUT/rec_w4a16.log" 2>&1
echo "w4a16 record rc=$? $((SECONDS - t0)) s"
tail -40 "$OUT/rec_w4a16.log"
t0=$SECONDS
# shellcheck disable=SC2086  # REC2 is a list of bench arguments
[ "${T2:-240}" -gt 0 ] && timeout "${T2:-240}" python3 -m pyquant bench ${REC2:---family gguf,mxfp4 --format q8_0,q4_0,q4_K,q6_K,iq4_xs,iq3_xxs,mxfp4 \
    --variant bf16 --shape 43008x5376,5376x21504 --m 512,517,2048} --budget 0.1 \
    --record "$OUT/golden_prefill_other.json" > "$OUT/rec_other.log" 2>&1
echo "gguf / mxfp4 record rc=$? $((SECONDS - t0)) s"
tail -40 "$OUT/rec_other.log"
t0=$SECONDS
[ "${T3:-100}" -gt 0 ] && timeout "${T3:-100}" python3 -m pyquant bench --family moe --variant gpt-oss-120b,gpt-oss-20b \
    --m 1,8,64,512,2048 --budget 0.1 --record "$OUT/golden_moe.json" > "$OUT/rec_moe.log" 2>&1
echo "moe record rc=$? $((SECONDS - t0)) s"
tail -14 "$OUT/rec_moe.log"
