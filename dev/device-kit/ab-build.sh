#!/usr/bin/env bash
# ab-build.sh NAME: restricted sm_90a build of the A/B instance set into build/ab-NAME; packs the library and the
# Python module into $OUT/carry-NAME.tar.xz (unpack into build/carry-NAME here, carry it back later).
set -uo pipefail
name=$1
mkdir -p /tmp/cuteattn-deps
tar xzf .deps/cutlass-include.tar.gz -C /tmp/cuteattn-deps
t0=$SECONDS
cmake -S . -B build/ab-$name -G Ninja -DCUTEATTN_PYTHON=ON -DCUTEATTN_TESTS=OFF -DCUTEATTN_CLI=OFF \
  -DCUTEATTN_CUTLASS_INCLUDE=/tmp/cuteattn-deps/cutlass-include -DCUTEATTN_ARCHS=90a \
  "-DCUTEATTN_FAMILIES=sm80_fwd;sm90_fwd;sm90_bwd" "-DCUTEATTN_HDIMS=64;128;256" -DCUTEATTN_DTYPES=bf16 \
  "-DCUTEATTN_SCORES=softmax;hstu" "-DCMAKE_CUDA_FLAGS=-Xptxas=-v" > $OUT/ab-$name-configure.log 2>&1 || { tail -30 $OUT/ab-$name-configure.log; exit 1; }
ninja -C build/ab-$name -j 16 > $OUT/ab-$name-build.log 2>&1; rc=$?
echo "build $name rc=$rc $((SECONDS-t0)) s"; grep -c "spill" $OUT/ab-$name-build.log; grep "bytes spill" $OUT/ab-$name-build.log | grep -v " 0 bytes spill stores, 0 bytes spill loads" | sort | uniq -c | head
[ $rc = 0 ] || { grep -B2 -A10 "error" $OUT/ab-$name-build.log | head -60; exit 1; }
mkdir -p /tmp/carry-$name && cp build/ab-$name/libcuteattn.so build/ab-$name/python/_cuteattn*.so /tmp/carry-$name/
tar cJf $OUT/carry-$name.tar.xz -C /tmp carry-$name && ls -la $OUT/carry-$name.tar.xz
xz -9 -f $OUT/ab-$name-build.log
