#!/usr/bin/env python3
"""GQA with short query rows (decode, speculative verification, chunked prefill) on the sm90 forward: cuteattn
with the query heads of a kv head packed into one tile (CUTEATTN_SM90_PACK_GQA=1), unpacked (=0), its default
choice (unset), and PyTorch SDPA (cuDNN, FlashAttention-2) with enable_gqa=True, all on the same tensors.
Causal is bottom-right aligned everywhere (SDPA through causal_lower_right). CUDA-event median of the forward,
L2 flushed before each run; prints a markdown table (ms, and peer / packed). Every output is compared with the
packed one (2% of its largest value): a cross-check against gross errors, not the tolerance rule of the tests.

  PYTHONPATH=build/dev/python:python python3 bench/gqa_short_queries.py --d 128,64 --sq 1,16,64,128
"""

from __future__ import annotations

import argparse
import os
import statistics

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.nn.attention.bias import causal_lower_right

import cuteattn

PACK_ENV = "CUTEATTN_SM90_PACK_GQA"


def median_ms(fn, flush: torch.Tensor, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def ours(q, k, v, causal: bool, pack):
    def run():
        if pack is None:
            os.environ.pop(PACK_ENV, None)
        else:
            os.environ[PACK_ENV] = pack
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
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--heads", type=int, default=32)
    p.add_argument("--heads-k", default="4,8")
    p.add_argument("--d", default="128,64")
    p.add_argument("--sq", default="1,16,64,128")
    p.add_argument("--sk", default="4096,16384")
    p.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16")
    p.add_argument("--reps", type=int, default=30)
    args = p.parse_args()
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    ints = lambda s: [int(x) for x in s.split(",")]  # noqa: E731
    flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device="cuda")
    impls = ["packed", "unpacked", "default", "sdpa-cudnn", "sdpa-flash"]
    print(f"b={args.batch} h={args.heads} {args.dtype}; ms (median of {args.reps}); ratio = peer ms / packed ms")
    ratios = " | unpacked/packed | cudnn/packed | flash/packed |"
    print("| d | h_k | s_q | s_k | causal | " + " | ".join(impls) + ratios)
    print("|" + "---|" * (5 + len(impls) + 3))
    torch.manual_seed(0)
    for d in ints(args.d):
        for hk in ints(args.heads_k):
            for sk in ints(args.sk):
                k = torch.randn(args.batch, sk, hk, d, device="cuda", dtype=dtype)
                v = torch.randn(args.batch, sk, hk, d, device="cuda", dtype=dtype)
                for sq in ints(args.sq):
                    q = torch.randn(args.batch, sq, args.heads, d, device="cuda", dtype=dtype)
                    for causal in (False, True):
                        fns = {
                            "packed": ours(q, k, v, causal, "1"),
                            "unpacked": ours(q, k, v, causal, "0"),
                            "default": ours(q, k, v, causal, None),
                            "sdpa-cudnn": sdpa(q, k, v, causal, SDPBackend.CUDNN_ATTENTION),
                            "sdpa-flash": sdpa(q, k, v, causal, SDPBackend.FLASH_ATTENTION),
                        }
                        ms, ref = {}, None
                        for name, fn in fns.items():
                            try:
                                out = fn()
                                if ref is None:
                                    ref = out.float()
                                err = (out.float() - ref).abs().max().item()
                                if err > 0.02 * ref.abs().max().item() + 1e-4:  # a gross error, not rounding
                                    raise RuntimeError(f"differs from packed by {err:.3g}")
                                ms[name] = median_ms(fn, flush, args.reps)
                            except RuntimeError as e:
                                ms[name] = None
                                print(f"<!-- {name} d={d} hk={hk} sq={sq} sk={sk} causal={causal}: {str(e)[:160]} -->")
                        os.environ.pop(PACK_ENV, None)
                        cell = lambda x: "n/a" if x is None else f"{x:.4f}"  # noqa: E731
                        ratio = lambda a, b: "n/a" if a is None or b is None else f"{a / b:.2f}"  # noqa: E731
                        print(f"| {d} | {hk} | {sq} | {sk} | {int(causal)} | "
                              + " | ".join(cell(ms[n]) for n in impls)
                              + f" | {ratio(ms['unpacked'], ms['packed'])} | {ratio(ms['sdpa-cudnn'], ms['packed'])}"
                              f" | {ratio(ms['sdpa-flash'], ms['packed'])} |", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
