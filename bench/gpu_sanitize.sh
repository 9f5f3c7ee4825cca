#!/usr/bin/env bash
# compute-sanitizer over the GPU tests, on the GPU machine (H200): memcheck, racecheck,
# initcheck and synccheck. Each tool is one stage; stages run in the order given.
#
#   bench/gpu_sanitize.sh [build] [memcheck] [racecheck] [initcheck] [synccheck]
#   (no stage named = build memcheck racecheck initcheck)
#
# build      CUDA build in build-gpu (skipped when PYQUANT_LIB names an existing library)
# memcheck   out-of-bounds and misaligned device accesses, hardware exceptions: all GPU
#            tests (pytest -m gpu tests)
# racecheck  shared-memory hazards: the GPU tests on small shapes (racecheck is slow per
#            shared-memory access; the large-N cases add blocks, not new access patterns)
# initcheck  reads of device memory never written: all GPU tests
# synccheck  invalid __syncthreads / warp-synchronous use: the small-shape set
#
# Every tool runs with --error-exitcode 9, so a finding fails the stage even when the
# test itself passed. Full logs under $OUT (default /tmp/qg_out): <tool>.log holds the
# pytest output and the sanitizer report; the last lines printed are the summary.
#
# Environment: OUT, QG_CUDA_ARCHS (default 90a), PYQUANT_LIB (use this library, no build),
# QG_SANITIZE_ARGS (extra pytest arguments for every tool, e.g. "-x" or "-k w4a16"),
# QG_SANITIZE_SMALL_K (the -k expression of the small-shape set, default below),
# COMPUTE_SANITIZER (path of the tool, default: found on PATH or in /usr/local/cuda/bin).
# Each stage takes a few minutes; run them as separate calls where a call is time-limited.
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build memcheck racecheck initcheck)
summary=()

# small-shape set: kernel tests without the N = 4099/4104 cases, the torch/CuPy interop,
# the multi-stream repetitions (the same kernels, many times) and the MoE tests' GPT-OSS
# sizes and 1024-expert align (more blocks, not new access patterns)
SMALL_FILES=(tests/test_gpu_gemm.py tests/test_nonfinite.py tests/test_concurrency.py tests/test_gpu_moe.py)
SMALL_K=${QG_SANITIZE_SMALL_K:-"not (4104 or 4099 or interop or host_threads or streams_match or gpt_oss or 1024)"}

CS=${COMPUTE_SANITIZER:-$(command -v compute-sanitizer || true)}
[ -z "$CS" ] && [ -x /usr/local/cuda/bin/compute-sanitizer ] && CS=/usr/local/cuda/bin/compute-sanitizer
if [ -z "$CS" ]; then echo "compute-sanitizer not found (set COMPUTE_SANITIZER)"; exit 2; fi

for stage in "${stages[@]}"; do
    case "$stage" in
    build)
        if [ -n "${PYQUANT_LIB:-}" ] && [ -f "$PYQUANT_LIB" ]; then
            summary+=("build: using PYQUANT_LIB=$PYQUANT_LIB")
            continue
        fi
        t0=$(date +%s)
        qg_build_gpu "$OUT/sanitize_build.log"
        rc=$?
        summary+=("build rc=$rc ($(( $(date +%s) - t0 )) s)")
        if [ $rc -ne 0 ]; then tail -40 "$OUT/sanitize_build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi
        ;;
    memcheck|racecheck|initcheck|synccheck)
        export PYQUANT_LIB=${PYQUANT_LIB:-$PWD/build-gpu/libquantgemm.so}
        if [ "$stage" = racecheck ] || [ "$stage" = synccheck ]; then
            sel=(-m gpu "${SMALL_FILES[@]}" -k "$SMALL_K")
        else
            sel=(-m gpu tests)
        fi
        extra=()
        [ "$stage" = racecheck ] && extra=(--racecheck-report all)
        t0=$(date +%s)
        # shellcheck disable=SC2086  # QG_SANITIZE_ARGS is a list of pytest arguments
        "$CS" --tool "$stage" --error-exitcode 9 --target-processes all --print-limit 50 "${extra[@]}" \
            python3 -m pytest -q -p no:cacheprovider "${sel[@]}" ${QG_SANITIZE_ARGS:-} \
            > "$OUT/$stage.log" 2>&1
        rc=$?
        errors=$(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/$stage.log" | tail -1)
        summary+=("$stage rc=$rc ($(( $(date +%s) - t0 )) s): ${errors:-no summary line} | $(grep -E ' in [0-9.]+s' "$OUT/$stage.log" | tail -1)")
        ;;
    *)
        echo "unknown stage '$stage' (build memcheck racecheck initcheck synccheck)"; exit 2 ;;
    esac
done

echo "---- gpu_sanitize summary ($CS)"
printf '%s\n' "${summary[@]}"
for s in "${summary[@]}"; do
    case "$s" in *"rc=0"*|build:*) ;; *) exit 1 ;; esac
done
