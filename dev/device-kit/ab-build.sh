#!/usr/bin/env bash
# ab-build.sh NAME: restricted-build.sh of the A/B instance set (sm80 and sm90 forward, sm90 backward, bf16) into
# build/NAME, packed as $OUT/carry-NAME.tar.xz (unpack here under build/, carry build/carry-NAME to later calls).
set -uo pipefail
name=$1
bash dev/device-kit/restricted-build.sh "$name" "sm80_fwd;sm90_fwd;sm90_bwd" bf16 OFF || exit 1
tar cJf "$OUT/carry-$name.tar.xz" -C build "carry-$name" && ls -la "$OUT/carry-$name.tar.xz"
xz -9 -f "$OUT/$name-build.log"
