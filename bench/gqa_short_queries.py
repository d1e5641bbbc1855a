#!/usr/bin/env python3
"""GQA with short query rows (decode, speculative verification, chunked prefill) on the sm90 forward, A/B of one
of its choices against PyTorch SDPA (cuDNN, FlashAttention-2) with enable_gqa=True, all on the same tensors.
--ab pack: the query heads of a kv head packed into one tile (CUTEATTN_SM90_PACK_GQA=1), unpacked (=0), the
default choice (unset). --ab split: the key range split over CTAs as the default heuristic picks
(CUTEATTN_SM90_NUM_SPLITS unset), unsplit (=1), and split counts forced with --splits. Causal is bottom-right
aligned everywhere (SDPA through causal_lower_right). CUDA-event median of the forward's kernels (the host's
launch cost hidden, see median_ms), L2 flushed before each run; prints a markdown table (ms, and peer / first
column). Every output is compared with the first column's (2% of its largest value): a cross-check against
gross errors, not the tolerance rule of the tests.

  PYTHONPATH=build/dev/python:python python3 bench/gqa_short_queries.py --d 128,64 --sq 1,16,64,128
  PYTHONPATH=build/dev/python:python python3 bench/gqa_short_queries.py --ab split --batch 1,8
      --heads-k 4,8,32 --sq 1,16 --sk 4096,16384,65536 --causal 0   (one line)
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import cuteattn

PACK_ENV = "CUTEATTN_SM90_PACK_GQA"
SPLIT_ENV = "CUTEATTN_SM90_NUM_SPLITS"


def median_ms(fn, flush: torch.Tensor, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # The GPU spins (~0.5 ms) while the host enqueues the call: the events then time the kernels alone, not
        # the host path (40-70 us per call in Python, longer than a decode kernel).
        torch.cuda._sleep(1_000_000)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ours(q, k, v, causal: bool, env: dict):
    """The sm90 forward with the environment `env` (name -> value, None = unset) set for the call."""

    def run():
        for name, value in env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        return cuteattn.flash_attn_func(q, k, v, causal=causal, backend="sm90")

    return run


def sdpa(q, k, v, causal: bool, backend):
    qt, kt, vt = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    mask = causal_lower_right(q.shape[1], k.shape[1]) if causal else None

    def run():
        with sdpa_kernel([backend]):
            return F.scaled_dot_product_attention(qt, kt, vt, attn_mask=mask, enable_gqa=True).transpose(1, 2)

    return run


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ab", choices=["pack", "split"], default="pack")
    p.add_argument("--splits", default="", help="--ab split: forced split counts to time too, e.g. 4,16")
    p.add_argument("--batch", default="8")
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-k", default="4,8")
    p.add_argument("--d", default="128,64")
    p.add_argument("--sq", default="1,16,64,128")
    p.add_argument("--sk", default="4096,16384")
    p.add_argument("--causal", default="0,1")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    if args.ab == "pack":
        envs = {"packed": {PACK_ENV: "1"}, "unpacked": {PACK_ENV: "0"}, "default": {PACK_ENV: None}}
    else:
        envs = {"split": {SPLIT_ENV: None}, "unsplit": {SPLIT_ENV: "1"}}
        envs.update({f"split{n}": {SPLIT_ENV: str(n)} for n in ints(args.splits)} if args.splits else {})
    first, second = list(envs)[:2]
    impls = list(envs) + ["sdpa-cudnn", "sdpa-flash"]
    print(f"h={args.heads} {args.dtype}; ms (median of {args.reps}); ratio = peer ms / {first} ms")
    ratios = f" | {second}/{first} | cudnn/{first} | flash/{first} |"
    print("| b | d | h_k | s_q | s_k | causal | " + " | ".join(impls) + ratios)
    print("|" + "---|" * (6 + len(impls) + 3))
    torch.manual_seed(0)
    for batch, d, hk, sk in itertools.product(ints(args.batch), ints(args.d), ints(args.heads_k), ints(args.sk)):
        k = torch.randn(batch, sk, hk, d, device="cuda", dtype=dtype)
        v = torch.randn(batch, sk, hk, d, device="cuda", dtype=dtype)
        for sq in ints(args.sq):
            q = torch.randn(batch, sq, args.heads, d, device="cuda", dtype=dtype)
            for causal in (bool(c) for c in ints(args.causal)):
                fns = {name: ours(q, k, v, causal, env) for name, env in envs.items()}
                fns.update({
                    "sdpa-cudnn": sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION),
                    "sdpa-flash": sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION),
                })
                ms, ref = {}, None
                for name, fn in fns.items():
                    try:
                        out = fn()
                        if ref is None:
                            ref = out.float()
                        err = (out.float() - ref).abs().max().item()
                        if err > 0.02 * ref.abs().max().item() + 1e-4:  # a gross error, not rounding
                            raise RuntimeError(f"differs from {first} by {err:.3g}")
                        ms[name] = median_ms(fn, flush, args.reps)
                    except RuntimeError as e:
                        ms[name] = None
                        print(f"<!-- {name} b={batch} d={d} hk={hk} sq={sq} sk={sk} causal={causal}: {str(e)[:160]} -->")
                os.environ.pop(PACK_ENV, None)
                os.environ.pop(SPLIT_ENV, None)
                cell = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
                ratio = lambda a, b: "n/a" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
                print(f"| {batch} | {d} | {hk} | {sq} | {sk} | {int(causal)} | "
                      + " | ".join(cell(ms[n]) for n in impls)
                      + f" | {ratio(ms[second], ms[first])} | {ratio(ms['sdpa-cudnn'], ms[first])}"
                      f" | {ratio(ms['sdpa-flash'], ms[first])} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
