#!/usr/bin/env bash
# dev/device-kit/sm80-fwd-check.sh (on the GPU machine, .deps carried; REV names the results): every sm80 forward
# instance with the GPU tests, the Sm80Forward / Fp32Forward / Fp32Hstu gtests, the sanitizer over
# Sanitize.Sm80Forward*, and the sm80 forward FA grid against FlashAttention-2 (results under $OUT/grid).
set -uo pipefail
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv | tee $OUT/gpu.txt
rev=${REV:-wip}
HDIMS="32;64;96;128;192;256" SCORES="softmax;hstu" JOBS=16 LOG=$OUT/T-build.log \
  bash dev/device-kit/restricted-build.sh T sm80_fwd "bf16;fp16;fp32" ON || exit 1
xz -9 $OUT/T-build.log
t0=$SECONDS
timeout 200 build/T/tests/cuteattn_gpu_tests --gtest_filter='Sm80Forward.*:Fp32Forward.*:Fp32Hstu.*' \
  > $OUT/gtest.log 2>&1
echo "gtest rc=$? $((SECONDS-t0)) s"; grep -E "^\[  (PASSED|FAILED) |FAILED|OK \]" $OUT/gtest.log | tail -25
RESULTS=$OUT/sanitize TOOL_LIMIT=150 timeout 420 scripts/gpu-sanitize build/T 'Sanitize.Sm80Forward*'
echo "sanitize rc=$?"
t0=$SECONDS
PYTHONPATH=$PWD/build/carry-T:$PWD/python LD_LIBRARY_PATH=$PWD/build/carry-T timeout 240 python3 bench/run_bench.py \
  --grid fa --backend sm80 --directions fwd --peers cuteattn,sdpa-flash --target-ms 200 --commit $rev \
  --out $OUT/grid > $OUT/grid.log 2>&1
echo "grid rc=$? $((SECONDS-t0)) s"; tail -5 $OUT/grid.log
