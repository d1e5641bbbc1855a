#!/usr/bin/env bash
# dev/pending/ab-pending.sh (on the GPU machine, .deps carried): A/B of the three pending sm80 forward patches
# against the tree they apply to, two rounds each (restricted bf16 d 64 / 128 softmax builds, dev/device-kit/ab.sh).
set -uo pipefail
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv
declare -A PATCHES
PATCHES[A]=""
PATCHES[P1]="sm80-fwd-d64-64x64-three-per-sm"
PATCHES[P2]="sm80-fwd-d64-64x64-three-per-sm sm80-fwd-d64-64x64-four-per-sm-lean"
PATCHES[P3]="sm80-fwd-d64-64x64-three-per-sm sm80-fwd-d128-64x64-three-per-sm"
for v in A P1 P2 P3; do
  mkdir -p /tmp/t$v
  tar c --exclude=./build . | tar x -C /tmp/t$v
  (cd /tmp/t$v && for p in ${PATCHES[$v]}; do git apply dev/pending/$p.patch || exit 1; done) \
    || { echo "ab-pending: a patch of $v does not apply"; exit 1; }
done
for v in A P1 P2 P3; do
  (cd /tmp/t$v && JOBS=4 HDIMS="64;128" SCORES=softmax LOG=$OUT/$v-build.log \
     bash dev/device-kit/restricted-build.sh $v sm80_fwd bf16 OFF > $OUT/$v-build.txt 2>&1) &
done
wait
for v in A P1 P2 P3; do cat $OUT/$v-build.txt; mkdir -p build; cp -r /tmp/t$v/build/carry-$v build/; done
xz -9 $OUT/*-build.log
bash dev/device-kit/ab.sh "A P1 P2" "fwd64 fwd64c fwd64l fwd64lc" 2
bash dev/device-kit/ab.sh "A P3" "fwd128 fwd128c fwd128l fwd128lc" 2
