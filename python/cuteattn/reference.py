"""Plain PyTorch evaluation of SEMANTICS.md: the oracle of the pytest suites and of the benchmark's output check.

Loops over sequences and materialises each score matrix, so it is obviously right and slow. Differentiable:
gradients come from torch autograd. `upcast=True` evaluates in float64; `upcast=False` evaluates in the
inputs' own dtype, which is the "plain low-precision computation" of the tolerance rule.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple

import torch

__all__ = ["visible", "attention_ref", "hstu_attention_ref"]


def visible(
    sq: int,
    sk: int,
    *,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    num_contexts: int = 0,
    num_targets: int = 0,
    target_group_size: int = 1,
    device=None,
) -> torch.Tensor:
    """Boolean (sq, sk): key j is visible to query row i (SEMANTICS.md sections 1 and 2)."""
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0
    i = torch.arange(sq, device=device).unsqueeze(1)
    j = torch.arange(sk, device=device).unsqueeze(0)
    r = i + (sk - sq)
    plain = torch.ones(sq, sk, dtype=torch.bool, device=device)
    if right >= 0:
        plain &= j <= r + right
    if left >= 0:
        plain &= j >= r - left
    hist = sk - num_targets
    is_contextual = (r >= 0) & (r < num_contexts)  # rows before the first key (s_q > s_k) are never contextual
    contextual = j < hist
    group_start = hist + torch.div(r - hist, target_group_size, rounding_mode="floor") * target_group_size
    target = (j < hist) | ((j >= group_start) & (j <= r))
    mask = torch.where(r >= hist, target, torch.where(is_contextual, contextual, plain))
    return mask & (j < sk)


def attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: Optional[torch.Tensor] = None,
    cu_seqlens_k: Optional[torch.Tensor] = None,
    *,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    upcast: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Softmax attention (section 1). Returns (out, lse): out in the compute dtype, lse float32-shaped
    like cuteattn's ((b, h, s_q) fixed, (h, total_q) varlen) in the compute dtype."""
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    scale = softmax_scale if softmax_scale is not None else q.shape[-1] ** -0.5
    varlen = cu_seqlens_q is not None
    groups = q.shape[-2] // k.shape[-2]
    outs, lses = [], []
    for bi in range(len(cu_seqlens_q) - 1 if varlen else q.shape[0]):
        if varlen:
            a, b = int(cu_seqlens_q[bi]), int(cu_seqlens_q[bi + 1])
            c, d = int(cu_seqlens_k[bi]), int(cu_seqlens_k[bi + 1])
            qs, ks, vs = q[a:b], k[c:d], v[c:d]
        else:
            qs, ks, vs = q[bi], k[bi], v[bi]
        ks = ks.repeat_interleave(groups, dim=1)  # (sk, h, d)
        vs = vs.repeat_interleave(groups, dim=1)
        mask = visible(qs.shape[0], ks.shape[0], causal=causal, window_size=window_size, device=q.device)
        s = torch.einsum("ihd,jhd->hij", qs, ks) * scale  # (h, sq, sk)
        if softcap > 0:
            s = softcap * torch.tanh(s / softcap)
        s = s.masked_fill(~mask, float("-inf"))
        if s.shape[-1] == 0:  # no keys: amax has nothing to reduce
            m = s.new_zeros(*s.shape[:-1], 1)
        else:
            m = s.amax(dim=-1, keepdim=True).detach()
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        e = torch.where(mask, torch.exp(s - m), torch.zeros_like(s))
        total = e.sum(dim=-1, keepdim=True)
        p = e / torch.where(total == 0, torch.ones_like(total), total)
        outs.append(torch.einsum("hij,jhd->ihd", p, vs))  # (sq, h, d_v)
        lses.append((torch.log(total) + m).squeeze(-1))  # (h, sq)
    if varlen:
        return torch.cat(outs, dim=0), torch.cat(lses, dim=1)
    return torch.stack(outs, dim=0), torch.stack(lses, dim=0)


def hstu_attention_ref(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    scaling_seqlen: Optional[float] = None,
    num_contexts: Optional[torch.Tensor] = None,
    num_targets: Optional[torch.Tensor] = None,
    target_group_size: int = 1,
    window_size: Sequence[int] = (-1, -1),
    alpha: float = 1.0,
    rab: Optional[torch.Tensor] = None,
    causal: bool = True,
    upcast: bool = True,
) -> torch.Tensor:
    """HSTU pointwise SiLU attention (section 2), jagged layout. Returns out (total_q, h, d_v)."""
    dtype = torch.float64 if upcast else q.dtype
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    if rab is not None:
        rab = rab.to(dtype)
    scaling = float(scaling_seqlen) if scaling_seqlen is not None else float(max_seqlen_q)
    outs = []
    for bi in range(len(cu_seqlens_q) - 1):
        a, b = int(cu_seqlens_q[bi]), int(cu_seqlens_q[bi + 1])
        c, d = int(cu_seqlens_k[bi]), int(cu_seqlens_k[bi + 1])
        qs, ks, vs = q[a:b], k[c:d], v[c:d]
        sq, sk = b - a, d - c
        mask = visible(
            sq,
            sk,
            causal=causal,
            window_size=window_size,
            num_contexts=int(num_contexts[bi]) if num_contexts is not None else 0,
            num_targets=int(num_targets[bi]) if num_targets is not None else 0,
            target_group_size=target_group_size,
            device=q.device,
        )
        s = torch.einsum("ihd,jhd->hij", qs, ks)  # (h, sq, sk)
        if rab is not None:
            rows = torch.arange(sq, device=q.device) + (sk - sq)
            s = s + rab[bi][:, rows][:, :, :sk]  # rab (b, h_rab, max_k, max_k); broadcasts over heads when h_rab = 1
        s = alpha * s
        p = torch.where(mask, torch.nn.functional.silu(s) / scaling, torch.zeros_like(s))
        outs.append(torch.einsum("hij,jhd->ihd", p, vs))
    return torch.cat(outs, dim=0)
