#!/usr/bin/env bash
# fam-check.sh NAME FAMILIES DTYPES GTEST_FILTER SANITIZE_FILTER "AB_GROUPS" ROUNDS: restricted sm_90a build with
# tests, GPU gtests (8 shards), compute-sanitizer on the filter, then ab.sh "A NAME". Logs in $OUT. Environment: HDIMS (default "64;128;256").
set -uo pipefail
name=$1 fams=$2 dtypes=$3 filter=$4 sfilter=$5 groups=$6 rounds=${7:-1}
t0=$SECONDS
mkdir -p /tmp/cuteattn-deps $OUT/$name
tar xzf .deps/cutlass-include.tar.gz -C /tmp/cuteattn-deps
tar xzf .deps/googletest-src.tar.gz -C /tmp/cuteattn-deps
cmake -S . -B build/$name -G Ninja -DCUTEATTN_PYTHON=ON -DCUTEATTN_TESTS=ON -DCUTEATTN_CLI=OFF \
  -DCUTEATTN_CUTLASS_INCLUDE=/tmp/cuteattn-deps/cutlass-include -DCUTEATTN_GTEST_SOURCE=/tmp/cuteattn-deps/googletest \
  -DCUTEATTN_ARCHS=90a "-DCUTEATTN_FAMILIES=$fams" "-DCUTEATTN_HDIMS=${HDIMS:-64;128;256}" "-DCUTEATTN_DTYPES=$dtypes" \
  "-DCUTEATTN_SCORES=softmax;hstu" "-DCMAKE_CUDA_FLAGS=-Xptxas=-v" > $OUT/$name/configure.log 2>&1 || { tail -30 $OUT/$name/configure.log; exit 1; }
ninja -C build/$name -j 16 > $OUT/$name/build.log 2>&1; rc=$?
echo "build rc=$rc t=$((SECONDS-t0))"
grep "bytes spill" $OUT/$name/build.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c
grep "Registers are spilled" $OUT/$name/build.log | grep -o "function '[^']*'" | sort -u | head
[ $rc = 0 ] || { grep -A12 "error" $OUT/$name/build.log | head -60; exit 1; }
mkdir -p build/carry-$name && cp build/$name/libcuteattn.so build/$name/python/_cuteattn*.so build/carry-$name/
bin=build/$name/tests/cuteattn_gpu_tests
for i in 0 1 2 3 4 5 6 7; do
  GTEST_TOTAL_SHARDS=8 GTEST_SHARD_INDEX=$i timeout 150 $bin --gtest_filter="$filter" > $OUT/$name/gtest-$i.log 2>&1 &
done
wait
for i in 0 1 2 3 4 5 6 7; do echo "shard $i: $(grep -E '^\[  PASSED|^\[  FAILED|tests ran' $OUT/$name/gtest-$i.log | tr '\n' ' ')"; grep -E "^\[  FAILED|Failure|error" $OUT/$name/gtest-$i.log | head -6; done
echo "gtests t=$((SECONDS-t0))"
RESULTS=$OUT/$name/sanitize TOOL_LIMIT=60 timeout 200 scripts/gpu-sanitize build/$name "$sfilter"
echo "sanitize t=$((SECONDS-t0))"
[ -n "$groups" ] && timeout $((590 - (SECONDS - t0))) bash dev/device-kit/ab.sh "A $name" "$groups" $rounds
echo "all t=$((SECONDS-t0))"
(cd $OUT && tar cJf $name-logs.tar.xz $name && rm -rf $name)
