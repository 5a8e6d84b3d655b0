#!/usr/bin/env bash
# One device call, run from the repository root (results under $OUT/r): bench/moe_persistent_probe.cu's 'regs'
# mode, then GEMM1's cp.async ring at 3 (the tree's G1_STAGES) / 4 / 6 / 8 stages in `k3 bench block` (tp8 and
# ep16, two rounds interleaved) and gpu_moe on each variant. What it is to decide: bench/NOTES-moe.md, 2026-12-08.
set -u
export PATH=/usr/local/cuda/bin:$PATH
R=$OUT/r; mkdir -p $R; t0=$SECONDS
left() { [ $((SECONDS-t0)) -lt $1 ]; }
nvidia-smi --query-gpu=name,serial,clocks.max.sm,clocks.max.mem --format=csv,noheader
CF="-DCMAKE_BUILD_TYPE=Release -DK3_PYTHON_EXT=OFF -DK3_CUDA_GENCODE=-gencode=arch=compute_90a,code=sm_90a"
nvcc -O3 -std=c++17 -gencode arch=compute_90a,code=sm_90a -o /tmp/mppr bench/moe_persistent_probe.cu >$R/b.log 2>&1; echo "probe build rc=$? $((SECONDS-t0)) s"
timeout 80 /tmp/mppr 0 regs > $R/p_regs.txt 2>&1; echo "regs rc=$? $((SECONDS-t0)) s"; cat $R/p_regs.txt
for s in 4 6 8; do
  mkdir -p /tmp/s$s && tar cf - --exclude=./build --exclude=./scratch --exclude=./.git . | tar xf - -C /tmp/s$s
  sed -i "s/^constexpr int G1_STAGES = 3;/constexpr int G1_STAGES = $s;/" /tmp/s$s/src/cuda/moe/mainloop_async.cuh
  grep -q "G1_STAGES = $s;" /tmp/s$s/src/cuda/moe/mainloop_async.cuh || { echo "G1_STAGES = 3 not found in the tree"; exit 1; }
  ( cd /tmp/s$s && cmake -S . -B build $CF >$R/cmake_s$s.log 2>&1 && cmake --build build -j4 --target k3_cli gpu_moe >$R/build_s$s.log 2>&1; echo "s$s build rc=$? $((SECONDS-t0)) s" ) &
done
( cmake -S . -B build $CF >$R/cmake.log 2>&1 && cmake --build build -j4 --target k3_cli >$R/build.log 2>&1; echo "head build rc=$? $((SECONDS-t0)) s" ) &
wait; echo "builds $((SECONDS-t0)) s"
for i in 1 2; do for w in s3 s4 s6 s8; do K=build/k3; [ $w != s3 ] && K=/tmp/$w/build/k3
  left 480 && { timeout 30 $K bench block --config tp8 --m 1,2,4,8,16 > $R/blk_${w}_$i.txt 2>&1; echo "== block $w $i rc=$? $((SECONDS-t0)) s"; grep -E "^ +M |^ +(1|2|4|8|16) " $R/blk_${w}_$i.txt | cut -c1-100; }
  left 500 && { timeout 20 $K bench block --config ep16 --m 1,2 > $R/ep_${w}_$i.txt 2>&1; echo "== ep16 $w $i rc=$? $((SECONDS-t0)) s"; grep -E "^ +M |^ +(1|2) " $R/ep_${w}_$i.txt | cut -c1-100; }
done; done
for s in 4 6 8; do left 540 && { timeout 30 /tmp/s$s/build/gpu_moe > $R/t_s$s.txt 2>&1; echo "gpu_moe s$s rc=$? $((SECONDS-t0)) s"; grep -E "FAIL|groups" $R/t_s$s.txt | tail -3; }; done
echo "end $((SECONDS-t0)) s"
