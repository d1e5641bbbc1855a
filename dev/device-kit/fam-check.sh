#!/usr/bin/env bash
# fam-check.sh NAME FAMILIES DTYPES GTEST_FILTER SANITIZE_FILTER "AB_GROUPS" ROUNDS: restricted sm_90a build with
# tests (restricted-build.sh), GPU gtests (8 shards, 240 s each: a shard holding CausalSections or SplitKvShapes
# needed more than 150 s), compute-sanitizer on the filter, then ab.sh "A NAME". Logs in $OUT. Environment: HDIMS
# (default "64;128;256"). Suites that compare with the sm80 kernels (Rows/HstuMatrix.*,
# Sm90BackwardHstu.RefusedCallsFallBack) need sm80_fwd;sm80_bwd in FAMILIES.
set -uo pipefail
name=$1 fams=$2 dtypes=$3 filter=$4 sfilter=$5 groups=$6 rounds=${7:-1}
t0=$SECONDS
mkdir -p $OUT/$name
LOG=$OUT/$name/build.log bash dev/device-kit/restricted-build.sh $name "$fams" "$dtypes" ON || exit 1
bin=build/$name/tests/cuteattn_gpu_tests
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 240 $bin --gtest_filter="$filter" > $OUT/$name/gtest-$i.log 2>&1 &
done
wait
for i in 0 1 2 3 4 5 6 7; do echo "shard $i: $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' $OUT/$name/gtest-$i.log | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error" $OUT/$name/gtest-$i.log | head -6; done
echo "gtests t=$((SECONDS-t0))"
RESULTS=$OUT/$name/sanitize TOOL_LIMIT=60 timeout 200 scripts/gpu-sanitize build/$name "$sfilter"
echo "sanitize t=$((SECONDS-t0))"
[ -n "$groups" ] && timeout $((590 - (SECONDS - t0))) bash dev/device-kit/ab.sh "A $name" "$groups" $rounds
echo "all t=$((SECONDS-t0))"
(cd $OUT && tar cJf $name-logs.tar.xz $name && rm -rf $name)
