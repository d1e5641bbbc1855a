"""Measuring one implementation on one cell: the output check (once, against the float64 reference on a slice),
the median time with CUDA events (L2 flushed before each run), and the peak memory of one call."""

from __future__ import annotations

import statistics
from typing import Callable, Dict, List

import torch

from cells import Inputs
from cuteattn.reference import attention_ref, hstu_attention_ref

FACTORS = {"fa": (2.0, 3.0), "hstu": (2.0, 5.0)}  # (forward, gradients) of the tolerance rule
REL_ATOL = {"bf16": 2e-3, "fp16": 5e-4}  # times max |reference|


class Timer:
    def __init__(self, device: torch.device, target_ms: float, min_rep: int = 5, max_rep: int = 100):
        self.flush = torch.empty(256 * 1024 * 1024, dtype=torch.int8, device=device)  # larger than L2
        self.target_ms, self.min_rep, self.max_rep = target_ms, min_rep, max_rep

    def median_ms(self, fn: Callable) -> float:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(2):
            fn()
        end.record()
        torch.cuda.synchronize()
        estimate = max(start.elapsed_time(end) / 2, 1e-3)
        reps = int(min(self.max_rep, max(self.min_rep, self.target_ms / estimate)))
        events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(reps)]
        for s, e in events:
            self.flush.zero_()
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in events)


def matmul_ceiling(timer: Timer, dtype: torch.dtype, n: int = 8192) -> float:
    """TFLOP/s of one n^3 torch.matmul (cuBLAS) on random data: the practical ceiling the plots relate to."""
    a, b = (torch.randn(n, n, device=timer.flush.device, dtype=dtype) for _ in range(2))
    return 2 * n**3 / timer.median_ms(lambda: a @ b) / 1e9


def peak_mb(fn: Callable) -> float:
    """Memory one call allocates at its peak beyond what was allocated before it, in MiB."""
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2**20


def _rule(name: str, got: torch.Tensor, ref: torch.Tensor, plain: torch.Tensor, factor: float, rel_atol: float):
    got, ref, plain = got.double(), ref.double(), plain.double()
    if not torch.isfinite(got).all():
        return {"name": name, "ok": False, "why": "non-finite values"}
    err = (got - ref).abs().max().item()
    base = (plain - ref).abs().max().item()
    atol = rel_atol * ref.abs().max().item()
    return {"name": name, "ok": err <= factor * base + atol, "err": err, "plain_err": base, "factor": factor}


def _slice_problem(inputs: Inputs, tensors: List[torch.Tensor]):
    """The slice the check evaluates: fa batch 0 / head 0, hstu the first sequence (all heads)."""
    if inputs.cell.kind == "fa":
        return [t[:1, :, :1] for t in tensors]
    n0 = inputs.lengths[0]
    return [t[:n0] for t in tensors[:3]] + [t[:1] for t in tensors[3:]]


def _reference(inputs: Inputs, q, k, v, rab, upcast: bool):
    cell = inputs.cell
    if cell.kind == "fa":
        return attention_ref(q, k, v, causal=cell.causal, upcast=upcast)[0]
    cu = torch.tensor([0, q.shape[0]], dtype=torch.int32, device=q.device)
    targets = inputs.num_targets[:1] if inputs.num_targets is not None else None
    return hstu_attention_ref(q, k, v, cu, cu, cell.seqlen, cell.seqlen, num_targets=targets, alpha=1.0 / cell.d,
                              rab=rab, causal=cell.causal, upcast=upcast)  # fmt: skip


def check(inputs: Inputs, direction: str, args: List[torch.Tensor], result) -> Dict:
    """Compares an implementation's output (forward) or gradients (backward) with the float64 reference on a
    slice, by the tolerance rule against a plain computation in the cell's dtype."""
    cell = inputs.cell
    rel_atol = REL_ATOL[cell.dtype]
    fwd_factor, grad_factor = FACTORS[cell.kind]
    names = ["q", "k", "v", "rab"][: len(args)]
    dout = _slice_problem(inputs, [inputs.dout])[0]
    evaluations = []
    for upcast in (True, False):
        leaves = [t.detach().clone().requires_grad_(direction == "bwd") for t in _slice_problem(inputs, args)]
        out = _reference(inputs, *leaves[:3], leaves[3] if len(leaves) > 3 else None, upcast)
        if direction == "fwd":
            evaluations.append([out.detach()])
        else:
            evaluations.append(list(torch.autograd.grad(out, leaves, dout.to(out.dtype))))
    got = _slice_problem(inputs, list(result))
    if direction == "fwd":
        checks = [_rule("out", got[0], evaluations[0][0], evaluations[1][0], fwd_factor, rel_atol)]
    else:
        checks = [_rule("d" + n, g, r, p, grad_factor, rel_atol) for n, g, r, p in zip(names, got, *evaluations)]
    return {"ok": all(c["ok"] for c in checks), "items": checks}
