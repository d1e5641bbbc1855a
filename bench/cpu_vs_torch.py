#!/usr/bin/env python3
"""CPU backend vs PyTorch's CPU scaled_dot_product_attention, side by side in one process on the same tensors.

Default cell: fp32, b=1, h=8, s=2048, d=128 (issue 2's speed target: ours within 2x of PyTorch), forward and
backward, causal and not. Rounds alternate between the two implementations; the best of each is reported.
"""
import argparse
import time

import torch
import torch.nn.functional as F

import cuteattn


def best_ms(fn, repeats):
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return min(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    a = ap.parse_args()
    if a.threads:
        torch.set_num_threads(a.threads)

    shape = (a.batch, a.seqlen, a.heads, a.head_dim)
    print(f"fp32 b={a.batch} h={a.heads} s={a.seqlen} d={a.head_dim}, torch threads {torch.get_num_threads()}")
    print(f"{'cell':<18}{'cuteattn ms':>12}{'torch ms':>10}{'ours/torch time':>17}")
    for causal in (False, True):
        q, k, v = (torch.randn(shape, requires_grad=True) for _ in range(3))
        do = torch.randn(shape)
        qt, kt, vt = (x.detach().transpose(1, 2).requires_grad_() for x in (q, k, v))
        dot = do.transpose(1, 2)

        def ours_fwd():
            with torch.no_grad():
                return cuteattn.flash_attn_func(q, k, v, causal=causal)

        def torch_fwd():
            with torch.no_grad():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)

        def ours_bwd():
            torch.autograd.grad(cuteattn.flash_attn_func(q, k, v, causal=causal), (q, k, v), do)

        def torch_bwd():
            torch.autograd.grad(F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal), (qt, kt, vt), dot)

        err = (ours_fwd() - torch_fwd().transpose(1, 2)).abs().max().item()
        assert err < 1e-3, f"outputs differ by {err}"
        for name, ours, theirs in (("fwd", ours_fwd, torch_fwd), ("fwd+bwd", ours_bwd, torch_bwd)):
            o, t = float("inf"), float("inf")
            for _ in range(3):  # alternate, so load changes hit both
                o = min(o, best_ms(ours, a.repeats))
                t = min(t, best_ms(theirs, a.repeats))
            cell = f"{name}{' causal' if causal else ''}"
            print(f"{cell:<18}{o:>12.1f}{t:>10.1f}{o / t:>17.2f}")


if __name__ == "__main__":
    main()
