#!/usr/bin/env bash
# Each W4A16 GPU tier on a few small shapes, one process per case (a device fault poisons
# a process's context): bench/gpu_tier_smoke.py. A failing case is re-run under
# compute-sanitizer memcheck so that the log names the faulting kernel line.
#
#   bench/gpu_smoke.sh            (uses PYQUANT_LIB, or QG_PREBUILT, or builds: bench/gpu_env.sh)
# Environment: QG_SMOKE_CASES: lines "TIER LAYOUT M N K G sym|asym bf16|fp16" (default below).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
if [ -z "${PYQUANT_LIB:-}" ]; then
    if [ -n "${QG_PREBUILT:-}" ] && [ -f "$QG_PREBUILT" ]; then
        export PYQUANT_LIB=$PWD/$QG_PREBUILT
    else
        qg_build_gpu "$OUT/smoke_build.log" || { tail -30 "$OUT/smoke_build.log"; exit 1; }
        export PYQUANT_LIB=$PWD/build-gpu/libquantgemm.so
    fi
fi
CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)}
CASES=${QG_SMOKE_CASES:-"cuda:simt frag 5 264 512 128 asym bf16
cuda:simt canonical 5 264 512 128 asym bf16
cuda:decode_mma canonical 5 264 512 128 asym bf16
cuda:decode_frag frag 1 264 512 128 asym bf16
cuda:decode_frag frag 5 264 512 32 sym fp16
cuda:decode_frag frag 16 4104 4096 64 asym bf16
cuda:prefill_wgmma frag 17 264 512 128 asym bf16
cuda:prefill_wgmma frag 300 264 512 32 sym fp16
cuda:prefill_wgmma frag 517 4104 2048 64 asym bf16"}
fails=0
while read -r c; do
    [ -z "$c" ] && continue
    # shellcheck disable=SC2086  # a case is a list of arguments
    if ! timeout 60 python3 bench/gpu_tier_smoke.py $c 2>&1 | tail -3; then
        fails=$((fails + 1))
        echo "  -> memcheck of: $c"
        # shellcheck disable=SC2086
        timeout 120 "$CS" --tool memcheck --print-limit 8 python3 bench/gpu_tier_smoke.py $c 2>&1 \
            | grep -E "=========|FAIL|ok  |Error|error" | head -40
    fi
done <<< "$CASES"
echo "smoke: $fails failing case(s)"
