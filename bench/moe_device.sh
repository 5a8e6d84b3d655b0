#!/usr/bin/env bash
# One device call for the GPU MoE (issue 6), in stages (logs to $OUT, at most 8 files come back):
#   build   configure (sm_90a only) and build the targets k3_cli and gpu_moe in build-dev
#   test    gpu_moe (every group)
#   san     compute-sanitizer memcheck (all groups) and racecheck (groups $RACE_GROUPS: dispatch and the expert
#           groups with both main loops, split-K and graph replay) on gpu_moe in its quick mode (K3_MOE_QUICK=1)
#   sanall  memcheck over every group in one process and racecheck over every group, one process per group,
#           all at once (racecheck is slow; $SAN_TIMEOUT caps each); summary in $OUT/san_all.log
#   ncu     Nsight Compute warp-state and memory sections of one TP8 M = 4 GEMM1 launch
#   bench   k3 bench moe at decode sizes with the per-stage breakdown, then at prefill sizes
#   demo    k3 demo (the K3 TP8 latent block on the GPU)
. "$(dirname "$0")/device_common.sh"
for stage in "$@"; do
    case "$stage" in
    build)
        log build
        k3_build_dev k3_cli gpu_moe
        nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv | tee "$OUT/info.txt"
        ;;
    test)
        log gpu_moe
        timeout 150 $B/gpu_moe >"$OUT/gpu_moe.log" 2>&1
        echo "gpu_moe exit $?"
        grep -E "^FAIL" "$OUT/gpu_moe.log" | head -20
        grep -E "gpu_moe: group|passed, " "$OUT/gpu_moe.log" | tail -12
        ;;
    san)
        log sanitizers
        for tool in memcheck racecheck; do
            groups=""
            [ $tool = racecheck ] && groups=${RACE_GROUPS:-1,2,3,7}
            echo "--- $tool gpu_moe (K3_MOE_QUICK=1 K3_MOE_NOFORK=1 K3_MOE_GROUPS=$groups)"
            env K3_MOE_QUICK=1 K3_MOE_NOFORK=1 ${groups:+K3_MOE_GROUPS=$groups} timeout ${SAN_TIMEOUT:-80} \
                compute-sanitizer --tool $tool --error-exitcode 9 $B/gpu_moe >"$OUT/san_$tool.log" 2>&1
            echo "exit $?"
            grep -E "ERROR SUMMARY|RACECHECK SUMMARY|passed, |^FAIL|Invalid|hazard" "$OUT/san_$tool.log" | tail -6
        done
        ;;
    sanall)
        log sanitizers, all groups
        rm -f /tmp/san_*.log
        env K3_MOE_QUICK=1 K3_MOE_NOFORK=1 timeout ${SAN_TIMEOUT:-100} compute-sanitizer --tool memcheck \
            --error-exitcode 9 $B/gpu_moe >/tmp/san_memcheck.log 2>&1 &
        for g in 0 1 2 3 4 5 6 7 8; do
            env K3_MOE_QUICK=1 K3_MOE_NOFORK=1 K3_MOE_GROUPS=$g timeout ${SAN_TIMEOUT:-100} compute-sanitizer \
                --tool racecheck --error-exitcode 9 $B/gpu_moe >/tmp/san_race_$g.log 2>&1 &
        done
        wait
        for f in /tmp/san_memcheck.log /tmp/san_race_*.log; do
            echo "--- $f: $(grep -E "passed, " $f | tail -1) | $(grep -E "ERROR SUMMARY|RACECHECK SUMMARY" $f | tail -1)"
            grep -E "^FAIL|Invalid|hazard" $f | head -5
        done | tee "$OUT/san_all.log"
        ;;
    bench)
        log bench moe decode
        timeout 150 $B/k3 bench moe --m 1,4,16 --reps 7 --stages >"$OUT/bench_moe.txt" 2>&1
        echo "exit $?"
        cat "$OUT/bench_moe.txt"
        log bench moe prefill
        timeout 120 $B/k3 bench moe --m 512,4096 --reps 7 >"$OUT/bench_moe_prefill.txt" 2>&1
        echo "exit $?"
        cat "$OUT/bench_moe_prefill.txt"
        ;;
    demo)
        log demo
        timeout 60 $B/k3 demo >"$OUT/demo.txt" 2>&1
        echo "exit $?"
        tail -12 "$OUT/demo.txt"
        ;;
    ncu)
        log ncu
        command -v ncu >/dev/null || { echo "no ncu"; continue; }
        timeout ${NCU_TIMEOUT:-45} ncu --kernel-name regex:gemm1 --launch-count 1 --section SpeedOfLight \
            --section WarpStateStats --section Occupancy --section MemoryWorkloadAnalysis \
            $B/k3 bench moe --config tp8 --m 4 --reps 7 >"$OUT/ncu.txt" 2>&1
        echo "exit $?"
        grep -E "Duration|Throughput|Stall|Warp Cycles|Achieved Occupancy|Theoretical Occupancy|Issued Ipc|Eligible" \
            "$OUT/ncu.txt" | head -30
        ;;
    *) echo "unknown stage $stage"; exit 2 ;;
    esac
done
log done
