#!/usr/bin/env bash
# One call on the GPU machine for the MoE tiers (bench/NOTES.md, "MXFP4 MoE on the GPU",
# "Next GPU session, MoE"): the MoE GPU tests, compute-sanitizer memcheck and racecheck over
# them, and the per-launch profile of both GPT-OSS models with the tiles and splits to decide.
# Full logs under $OUT, a short summary last.
#
#   bench/gpu_moe_check.sh [test] [memcheck] [racecheck] [profile]   (none named = all)
#
# Environment: PYQUANT_LIB (a prebuilt library, e.g. carried in .devlib/; else build-gpu is
# built as bench/gpu_check.sh does), OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(test memcheck racecheck profile)
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
if [ -z "${PYQUANT_LIB:-}" ] || [ ! -f "$PYQUANT_LIB" ]; then
    qg_build_gpu "$OUT/build.log" || { tail -40 "$OUT/build.log"; exit 1; }
    export PYQUANT_LIB=$PWD/build-gpu/libquantgemm.so
fi
tests=(-m gpu tests/test_gpu_moe.py tests/test_moe_frag_layout.py)

if has test; then
    python3 -m pytest -q -p no:cacheprovider "${tests[@]}" > "$OUT/moe_tests.log" 2>&1
    summary+=("moe tests rc=$? : $(tail -1 "$OUT/moe_tests.log")")
fi
CS=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
for tool in memcheck racecheck; do
    if has $tool; then
        # racecheck: the small cases (GPT-OSS sizes add blocks, not access patterns)
        sel=("${tests[@]}")
        [ $tool = racecheck ] && sel+=(-k "not gpt_oss and not 1024")
        "$CS" --tool $tool --error-exitcode 9 --target-processes all --print-limit 20 \
            python3 -m pytest -q -p no:cacheprovider "${sel[@]}" > "$OUT/moe_$tool.log" 2>&1
        summary+=("$tool rc=$? : $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/moe_$tool.log" | tail -1)")
    fi
done
if has profile; then
    {
        python3 bench/profile_moe.py gpt-oss-120b 1,8,64,512,2048
        QG_SPLIT_K=2 python3 bench/profile_moe.py gpt-oss-120b 1,8
        QG_SPLIT_K=4 python3 bench/profile_moe.py gpt-oss-120b 1,8
        python3 bench/profile_moe.py gpt-oss-120b 2048 128
        python3 bench/profile_moe.py gpt-oss-20b 1,8,64,512,2048
        python3 bench/profile_moe.py gpt-oss-20b 512,2048 128
        python3 bench/profile_moe.py gpt-oss-20b 2048 256
    } > "$OUT/moe_profile.log" 2>&1
    summary+=("profile rc=$?")
    grep -vE "^\[quantgemm\]" "$OUT/moe_profile.log" | tail -40
fi
echo "---- gpu_moe_check summary"
printf '%s\n' "${summary[@]}"
