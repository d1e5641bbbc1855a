#!/usr/bin/env bash
# ab.sh "<builds>" "<groups>" [rounds]: interleaved A/B of carried builds (build/carry-<name>) on cell groups;
# results under $OUT/<build>-r<round>-<group>/, summary by ab-summary.py.
set -uo pipefail
builds=$1; groups=$2; rounds=${3:-2}
common="--no-check --target-ms 150"
declare -A G
G[bwd64]="--kind fa --backend sm90 --directions bwd --d 64 --seqlen 1024,4096,16384 --peers cuteattn,sdpa-cudnn"
G[bwd128]="--kind fa --backend sm90 --directions bwd --d 128 --seqlen 1024,4096,16384 --peers cuteattn,sdpa-cudnn"
G[bwd128s]="--kind fa --backend sm90 --directions bwd --d 128 --seqlen 512,2048 --peers cuteattn,sdpa-cudnn"
G[bwd64s]="--kind fa --backend sm90 --directions bwd --d 64 --seqlen 512,2048 --peers cuteattn,sdpa-cudnn"
G[bwd128c]="--kind fa --backend sm90 --directions bwd --d 128 --causal --seqlen 1024,4096,16384 --peers cuteattn,sdpa-cudnn"
G[bwd256]="--kind fa --backend sm90 --directions bwd --d 256 --seqlen 1024,4096 --peers cuteattn,sdpa-cudnn"
G[hstu]="--kind hstu --dense --d 128 --backend sm90 --directions fwd,bwd --seqlen 2048,4096,16384 --peers cuteattn"
G[hstubd]="--kind hstu --dense --d 128 --backend sm90 --directions bwd --seqlen 2048,4096,16384 --peers cuteattn"
G[hstuj]="--kind hstu --d 128 --backend sm90 --directions fwd,bwd --seqlen 1024,2048,4096 --peers cuteattn"
G[sfwd256]="--kind fa --backend sm90 --directions fwd --d 256 --no-causal --seqlen 512,1024,2048 --peers cuteattn,sdpa-cudnn"
G[sfwd256c]="--kind fa --backend sm90 --directions fwd --d 256 --causal --seqlen 512,1024,2048 --peers cuteattn,sdpa-cudnn"
G[sfwd128w]="--kind fa --backend sm90 --directions fwd --d 128 --no-causal --seqlen 4096,8192,16384 --peers cuteattn,sdpa-cudnn"
G[sfwd192]="--kind fa --backend sm90 --directions fwd --d 192 --seqlen 512,2048 --peers cuteattn,sdpa-cudnn"
G[sfwd64s]="--kind fa --backend sm90 --directions fwd --d 64 --no-causal --seqlen 512,1024 --peers cuteattn,sdpa-cudnn"
G[sfwd64sc]="--kind fa --backend sm90 --directions fwd --d 64 --causal --seqlen 512,1024 --peers cuteattn,sdpa-cudnn"
G[sfwd64l]="--kind fa --backend sm90 --directions fwd --d 64 --no-causal --seqlen 4096,16384 --peers cuteattn,sdpa-cudnn"
G[sfwd64lc]="--kind fa --backend sm90 --directions fwd --d 64 --causal --seqlen 4096,16384 --peers cuteattn,sdpa-cudnn"
G[sfwd128s]="--kind fa --backend sm90 --directions fwd --d 128 --no-causal --seqlen 512,1024 --peers cuteattn,sdpa-cudnn"
G[sfwd128sc]="--kind fa --backend sm90 --directions fwd --d 128 --causal --seqlen 512,1024 --peers cuteattn,sdpa-cudnn"
G[sfwd128m]="--kind fa --backend sm90 --directions fwd --d 128 --no-causal --seqlen 2048 --peers cuteattn,sdpa-cudnn"
G[sfwd128mc]="--kind fa --backend sm90 --directions fwd --d 128 --causal --seqlen 1024,2048 --peers cuteattn,sdpa-cudnn"
G[hstujf256]="--kind hstu --d 256 --backend sm90 --directions fwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[hstur]="--kind hstu --d 128 --rab --backend sm90 --directions bwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[hstub]="--kind hstu --d 128 --backend sm90 --directions bwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[hstub64]="--kind hstu --d 64 --backend sm90 --directions bwd --seqlen 1024,4096 --peers cuteattn"
G[hstub64r]="--kind hstu --d 64 --rab --backend sm90 --directions bwd --seqlen 1024,4096 --peers cuteattn"
G[hstuf80]="--kind hstu --d 128 --backend sm80 --directions fwd --seqlen 1024,4096 --peers cuteattn"
G[hstuf80r256]="--kind hstu --d 256 --rab --backend sm80 --directions fwd --seqlen 1024,4096 --peers cuteattn"
G[hstub256]="--kind hstu --d 256 --directions bwd --seqlen 1024,4096 --peers cuteattn"
G[hstur256]="--kind hstu --d 256 --rab --directions bwd --seqlen 1024,4096 --peers cuteattn"
G[hstujf]="--kind hstu --d 128 --backend sm90 --directions fwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[hstujfr]="--kind hstu --d 128 --rab --backend sm90 --directions fwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[hstujfr64]="--kind hstu --d 64 --rab --backend sm90 --directions fwd --seqlen 1024,4096 --peers cuteattn"
G[hstujfr256]="--kind hstu --d 256 --rab --backend sm90 --directions fwd --seqlen 1024,2048,4096,8192 --peers cuteattn"
G[sfwd128c]="--kind fa --backend sm90 --directions fwd --d 128 --causal --seqlen 1024,4096,16384 --peers cuteattn,sdpa-cudnn"
G[hstufwd]="--kind hstu --dense --d 128 --backend sm90 --directions fwd --seqlen 2048,4096,16384 --peers cuteattn"
G[fwd256c]="--kind fa --backend sm80 --directions fwd --d 256 --causal --seqlen 512,1024,2048 --peers cuteattn,sdpa-flash"
G[fwd256]="--kind fa --backend sm80 --directions fwd --d 256 --no-causal --seqlen 512,2048 --peers cuteattn,sdpa-flash"
G[fwd128c]="--kind fa --backend sm80 --directions fwd --d 128 --causal --seqlen 512,1024,4096 --peers cuteattn,sdpa-flash"
G[fwd64c]="--kind fa --backend sm80 --directions fwd --d 64 --causal --seqlen 512,1024,4096 --peers cuteattn,sdpa-flash"
G[fwd128]="--kind fa --backend sm80 --directions fwd --d 128 --no-causal --seqlen 512,4096 --peers cuteattn,sdpa-flash"
G[bwd80d64]="--kind fa --backend sm80 --directions bwd --d 64 --no-causal --seqlen 1024,4096 --peers cuteattn,sdpa-flash"
G[bwd80d64c]="--kind fa --backend sm80 --directions bwd --d 64 --causal --seqlen 1024,4096 --peers cuteattn,sdpa-flash"
G[bwd80d64x]="--kind fa --backend sm80 --directions bwd --d 64 --seqlen 512,16384 --peers cuteattn,sdpa-flash"
G[bwd80d128]="--kind fa --backend sm80 --directions bwd --d 128 --seqlen 1024,4096 --peers cuteattn,sdpa-flash"
G[bwd80d128c]="--kind fa --backend sm80 --directions bwd --d 128 --causal --seqlen 1024,4096 --peers cuteattn,sdpa-flash"
G[bwd80d128x]="--kind fa --backend sm80 --directions bwd --d 128 --seqlen 512,16384 --peers cuteattn,sdpa-flash"
G[bwd80d256]="--kind fa --backend sm80 --directions bwd --d 256 --seqlen 1024,4096 --peers cuteattn,sdpa-flash"
G[fwd192]="--kind fa --backend sm80 --directions fwd --d 192 --seqlen 512,2048 --peers cuteattn,sdpa-flash"
G[fwd256l]="--kind fa --backend sm80 --directions fwd --d 256 --seqlen 4096,16384 --peers cuteattn,sdpa-flash"
G[fwd192c]="--kind fa --backend sm80 --directions fwd --d 192 --causal --seqlen 512,2048 --peers cuteattn,sdpa-flash"
G[fwd256lc]="--kind fa --backend sm80 --directions fwd --d 256 --causal --seqlen 4096,16384 --peers cuteattn,sdpa-flash"
G[fwd64l]="--kind fa --backend sm80 --directions fwd --d 64 --seqlen 4096,16384 --peers cuteattn,sdpa-flash"
G[fwd64lc]="--kind fa --backend sm80 --directions fwd --d 64 --causal --seqlen 4096,16384 --peers cuteattn,sdpa-flash"
G[fwd128l]="--kind fa --backend sm80 --directions fwd --d 128 --seqlen 8192,16384 --peers cuteattn,sdpa-flash"
G[fwd128lc]="--kind fa --backend sm80 --directions fwd --d 128 --causal --seqlen 8192,16384 --peers cuteattn,sdpa-flash"
G[fwd64]="--kind fa --backend sm80 --directions fwd --d 64 --no-causal --seqlen 512,2048 --peers cuteattn,sdpa-flash"
t0=$SECONDS
for r in $(seq 1 $rounds); do
  for g in $groups; do
    for b in $builds; do
      o=$OUT/$b-r$r-$g; mkdir -p $o
      PYTHONPATH=$PWD/build/carry-$b:$PWD/python LD_LIBRARY_PATH=$PWD/build/carry-$b${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
        timeout 300 python3 bench/run_bench.py ${G[$g]} $common --commit $b --out $o > $o/log.txt 2>&1
      echo "$b r$r $g rc=$? t=$((SECONDS-t0))"
    done
  done
done
python3 dev/device-kit/ab-summary.py $OUT | tee $OUT/ab-summary-$(date +%H%M%S).txt
(cd $OUT && tar cJf ab-$(date +%H%M%S).tar.xz $(ls -d *-r*-* 2>/dev/null) && rm -rf $(ls -d *-r*-* 2>/dev/null))
