#!/usr/bin/env bash
# restricted-build.sh NAME FAMILIES DTYPES TESTS: scripts/build of a restricted sm_90a instance set into build/NAME
# (TESTS: ON or OFF) with the headers carried in .deps; the ptxas -v log goes to $LOG (default $OUT/NAME-build.log),
# spill lines and failing functions are printed, and the library and Python module are copied into
# build/carry-NAME (ab.sh's layout). Environment: HDIMS (default "64;128;256"), SCORES (default "softmax;hstu").
set -uo pipefail
name=$1 fams=$2 dtypes=$3 tests=$4
log=${LOG:-$OUT/$name-build.log}
# Unpacked once per machine: builds running side by side share the headers.
mkdir -p /tmp/cuteattn-deps
[ -d /tmp/cuteattn-deps/cutlass-include ] || tar xzf .deps/cutlass-include.tar.gz -C /tmp/cuteattn-deps
[ -d /tmp/cuteattn-deps/googletest ] || tar xzf .deps/googletest-src.tar.gz -C /tmp/cuteattn-deps
t0=$SECONDS
scripts/build "$name" -DCUTEATTN_TESTS="$tests" -DCUTEATTN_CLI=OFF -DCUTEATTN_ARCHS=90a \
  -DCUTEATTN_CUTLASS_INCLUDE=/tmp/cuteattn-deps/cutlass-include -DCUTEATTN_GTEST_SOURCE=/tmp/cuteattn-deps/googletest \
  "-DCUTEATTN_FAMILIES=$fams" "-DCUTEATTN_HDIMS=${HDIMS:-64;128;256}" "-DCUTEATTN_DTYPES=$dtypes" \
  "-DCUTEATTN_SCORES=${SCORES:-softmax;hstu}" "-DCMAKE_CUDA_FLAGS=-Xptxas=-v" > "$log" 2>&1
rc=$?
echo "build $name rc=$rc $((SECONDS - t0)) s"
grep "bytes spill" "$log" | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c
grep "Registers are spilled" "$log" | grep -o "function '[^']*'" | sort -u | head
[ $rc = 0 ] || { grep -A12 "error" "$log" | head -60; exit 1; }
mkdir -p "build/carry-$name" && cp "build/$name/libcuteattn.so" build/"$name"/python/_cuteattn*.so "build/carry-$name/"
