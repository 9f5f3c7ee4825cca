#!/usr/bin/env bash
# One call on the GPU machine: build the CUDA tier, run the GPU tests, compute-sanitizer,
# and the benchmark; full logs under $OUT, a short summary last.
#
#   bench/gpu_check.sh [build] [test] [memcheck] [racecheck] [initcheck] [synccheck] [profile]
#                      [bench] [record] [compare]
#   (no stage named = build test memcheck bench)
#
# Environment: QG_PREBUILT (a libquantgemm.so built elsewhere, e.g. carried from the
# development machine: used instead of building when it loads here),
# QG_BENCH_ARGS (extra arguments for `python -m pyquant bench`),
# QG_TEST_ARGS (extra pytest arguments of the test stage), QG_SANITIZE_ARGS (of the
# compute-sanitizer stages, see bench/gpu_sanitize.sh), QG_CUDA_ARCHS (default 90a).
# Missing pure-Python packages (gguf) travel as wheels in .whl/ (see README).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(build test memcheck bench)
has() { local s; for s in "${stages[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
summary=()
export PYQUANT_LIB=$PWD/build-gpu/libquantgemm.so

if has build; then
    t0=$(date +%s)
    if [ -n "${QG_PREBUILT:-}" ] && [ -f "$QG_PREBUILT" ] && \
       PYQUANT_LIB="$PWD/$QG_PREBUILT" python3 -c "import pyquant" > "$OUT/build.log" 2>&1; then
        export PYQUANT_LIB="$PWD/$QG_PREBUILT"
        rc=0
        summary+=("build: prebuilt $QG_PREBUILT loads here")
    else
        qg_build_gpu "$OUT/build.log"
        rc=$?
        summary+=("build rc=$rc ($(( $(date +%s) - t0 )) s)")
    fi
    if [ $rc -ne 0 ]; then tail -40 "$OUT/build.log"; printf '%s\n' "${summary[@]}"; exit 1; fi
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader \
        > "$OUT/gpu.txt" 2>&1
    python3 -c "import pyquant; print(pyquant.build_info())" >> "$OUT/gpu.txt" 2>&1
fi

if has test; then
    python3 -m pytest -q -m gpu tests ${QG_TEST_ARGS:-} > "$OUT/gpu_tests.log" 2>&1
    summary+=("gpu tests rc=$? : $(tail -1 "$OUT/gpu_tests.log")")
fi

# compute-sanitizer stages run through bench/gpu_sanitize.sh on the library just built
for tool in memcheck racecheck initcheck synccheck; do
    if has $tool; then
        bench/gpu_sanitize.sh $tool > "$OUT/sanitize_$tool.out" 2>&1
        summary+=("$tool rc=$? : $(grep -E "^$tool rc=" "$OUT/sanitize_$tool.out" | tail -1)")
    fi
done

if has profile; then
    # one kernel under ncu per case: duration, DRAM and SM throughput, occupancy
    # (QG_PROFILE_KERNEL: ncu's -k filter; the GGUF int8 tier's kernel is gguf_mma_kernel)
    for c in ${QG_PROFILE_CASES:-"w4a16 43008 5376 1" "w4a16 43008 5376 16" "w4a16:32 14336 4096 4"}; do
        QG_LOG=1 ncu --clock-control none -k ${QG_PROFILE_KERNEL:-regex:decode} --launch-skip 2 --launch-count 1 \
            --section SpeedOfLight --section Occupancy --section WarpStateStats \
            --metrics gpu__time_duration.sum,dram__bytes_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active,launch__grid_size,launch__registers_per_thread \
            python3 bench/profile_gemm.py $c >> "$OUT/profile.log" 2>&1
    done
    grep -E "quantgemm\]|decode|mma_kernel|Duration|Throughput|Stall|Warp Cycles|Occupancy|dram__|lts__|inst_executed|issue_active|grid_size|registers|^ok" "$OUT/profile.log" | tail -80
    summary+=("profile done")
fi

if has bench; then
    QG_LOG=1 python3 -m pyquant bench ${QG_BENCH_ARGS:---quick} --json "$OUT/bench.json" > "$OUT/bench.log" 2>&1
    summary+=("bench rc=$?")
    tail -60 "$OUT/bench.log"
fi

if has record; then
    # golden protocol: every case measured 3 times, reproducible entries only as truth
    python3 -m pyquant bench ${QG_BENCH_ARGS:-} --record "$OUT/h200.json" > "$OUT/record.log" 2>&1
    summary+=("record rc=$?")
    tail -60 "$OUT/record.log"
fi

if has compare; then
    # a second run against the golden just recorded must report no reproduced regression
    python3 -m pyquant bench ${QG_BENCH_ARGS:-} --compare "$OUT/h200.json" > "$OUT/compare.log" 2>&1
    summary+=("compare rc=$? (0: no reproduced regression)")
    tail -30 "$OUT/compare.log"
fi

echo "---- gpu_check summary"
cat "$OUT/gpu.txt" 2>/dev/null
printf '%s\n' "${summary[@]}"
