#!/usr/bin/env bash
# ncu profiles of single GEMM kernels (bench/profile_gemm.py), the numbers that decide a
# kernel change: duration, DRAM and L2 traffic, tensor-pipe and issue utilization, occupancy,
# registers, and the top warp stall reasons. Full reports under $OUT/profile_<i>.txt.
#
#   QG_PROFILE_CASES="w4a16 43008 5376 1;w4a16:32 43008 5376 2048" bench/gpu_profile.sh
#   QG_PROFILE_CASES="moe gpt-oss-120b 1" bench/gpu_profile.sh   (the MoE layer's third moe_gemm
#   launch: the second layer's stage 1, bench/profile_moe.py in its ncu mode)
# Environment: QG_PROFILE_KERNEL (ncu -k filter, default regex:decode|prefill|mma_kernel),
# PYQUANT_LIB / QG_PREBUILT (see bench/gpu_env.sh and bench/gpu_smoke.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
. bench/gpu_env.sh
if [ -z "${PYQUANT_LIB:-}" ] && [ -n "${QG_PREBUILT:-}" ]; then export PYQUANT_LIB=$PWD/$QG_PREBUILT; fi
KERNEL=${QG_PROFILE_KERNEL:-"regex:decode|prefill|mma_kernel|gemm|Kernel"}
METRICS=gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,smsp__inst_executed.sum,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,\
launch__grid_size,launch__registers_per_thread,sm__warps_active.avg.pct_of_peak_sustained_active,\
smsp__average_warp_latency_issue_stalled_barrier,smsp__average_warp_latency_issue_stalled_long_scoreboard,\
smsp__average_warp_latency_issue_stalled_wait,smsp__average_warp_latency_issue_stalled_math_pipe_throttle,\
smsp__average_warp_latency_issue_stalled_short_scoreboard,smsp__average_warp_latency_issue_stalled_not_selected,\
smsp__average_warp_latency_issue_stalled_membar,smsp__average_warp_latency_issue_stalled_dispatch_stall,\
lts__throughput.avg.pct_of_peak_sustained_elapsed,l1tex__throughput.avg.pct_of_peak_sustained_active,\
sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active,\
sm__pipe_alu_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_fma_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__average_warp_latency_issue_stalled_lg_throttle,smsp__average_warp_latency_issue_stalled_mio_throttle
i=0
IFS=';' read -ra cases <<< "${QG_PROFILE_CASES:-w4a16 43008 5376 1;w4a16 43008 5376 16;w4a16 43008 5376 2048;w4a16:32 43008 5376 2048}"
for c in "${cases[@]}"; do
    i=$((i + 1))
    # shellcheck disable=SC2086  # a case is a list of arguments
    script=bench/profile_gemm.py
    case "$c" in
    cublas*) script=bench/profile_cublas.py; c=${c#cublas } ;;
    moe*) script=bench/profile_moe.py; c="${c#moe } 0 ncu" ;;
    esac
    # shellcheck disable=SC2086
    timeout 180 ncu --clock-control none -k "$KERNEL" --launch-skip 2 --launch-count 1 --metrics "$METRICS" \
        python3 $script $c > "$OUT/profile_$i.txt" 2>&1
    echo "== $c (rc=$?)"
    grep -E "^\s+(gpu__time|dram__|lts__|l1tex__|sm__inst|smsp__inst|smsp__issue|sm__pipe|launch__|sm__warps|smsp__average)" \
        "$OUT/profile_$i.txt" | grep -v -E "max_rate|\.pct " | sed -E 's/smsp__average_warp_latency_issue_stalled_/stall_/; s/ +/ /g'
    grep -E "^\s+(void |qg::)" "$OUT/profile_$i.txt" | head -2 | cut -c1-140
done
