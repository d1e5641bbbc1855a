"""Shared pieces of the pytest suites: random problems, the FlashAttention tolerance rule, and runners that
evaluate cuteattn, the float64 reference and the plain low-precision reference on the same inputs."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Sequence

import torch

import cuteattn
from cuteattn.reference import attention_ref, hstu_attention_ref


def cu_seqlens(lengths: Sequence[int], device) -> torch.Tensor:
    cu = [0]
    for n in lengths:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def randn(*shape, dtype, device, requires_grad=True) -> torch.Tensor:
    return torch.randn(*shape, dtype=dtype, device=device).requires_grad_(requires_grad)


def max_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_rule(name: str, ours: torch.Tensor, ref: torch.Tensor, plain: torch.Tensor, factor: float, atol: float):
    """FlashAttention's rule: |ours - ref64| <= factor * |plain low-precision - ref64| + atol (max norms).
    Infinities (lse of rows without keys) must match exactly; everything else must be finite."""
    assert ours.shape == ref.shape, f"{name}: shape {tuple(ours.shape)} != reference {tuple(ref.shape)}"
    ours, ref, plain = ours.double(), ref.double(), plain.double()
    inf = torch.isinf(ref)
    assert torch.equal(torch.isinf(ours), inf), f"{name}: infinities differ from the reference"
    assert torch.isfinite(ours[~inf]).all(), f"{name}: NaN or inf where the reference is finite"
    assert torch.equal(ours[inf], ref[inf]), f"{name}: wrong-signed infinity"
    err = max_err(ours[~inf], ref[~inf])
    base = max_err(plain[~inf], ref[~inf])
    assert err <= factor * base + atol, f"{name}: error {err:.3g} > {factor} x plain error {base:.3g} + {atol:g}"


# Tolerances per dtype: the rule's atol for values and for gradients.
ATOL = {torch.float32: (2e-5, 1e-4), torch.bfloat16: (1e-3, 2e-3), torch.float16: (2e-4, 5e-4)}


@dataclass
class Outcome:
    """Values and gradients (by name) of one evaluation."""

    values: Dict[str, torch.Tensor] = field(default_factory=dict)
    grads: Dict[str, torch.Tensor] = field(default_factory=dict)


def _grads(out: torch.Tensor, inputs: Dict[str, torch.Tensor], dout: torch.Tensor) -> Dict[str, torch.Tensor]:
    names = [n for n, t in inputs.items() if t is not None and t.requires_grad]
    got = torch.autograd.grad(out, [inputs[n] for n in names], dout.to(out.dtype), allow_unused=True)
    return {n: g for n, g in zip(names, got)}


def _leaf(t: Optional[torch.Tensor], dtype=None) -> Optional[torch.Tensor]:
    if t is None:
        return None
    return t.detach().to(dtype or t.dtype).requires_grad_(t.requires_grad)


def check_flash(q, k, v, cu_q=None, cu_k=None, max_q=0, max_k=0, backward=True, factors=(2, 3), **kw):
    """Runs flash_attn(_varlen)_func, the float64 reference and the plain reference in q's dtype on the same
    inputs, and applies the tolerance rule to out, lse and (with backward) dq, dk, dv."""
    backend = kw.pop("backend", "auto")
    ref_kw = {n: kw[n] for n in ("softmax_scale", "causal", "window_size", "softcap") if n in kw}
    out_shape = (*q.shape[:-1], v.shape[-1])
    dout = torch.randn(out_shape, dtype=torch.float64, device=q.device)
    results = []
    for mode in ("ours", "ref", "plain"):
        dtype = torch.float64 if mode == "ref" else None
        inputs = {"q": _leaf(q, dtype), "k": _leaf(k, dtype), "v": _leaf(v, dtype)}
        if mode == "ours":
            if cu_q is None:
                out, lse = cuteattn.flash_attn_func(**inputs, return_lse=True, backend=backend, **kw)
            else:
                out, lse = cuteattn.flash_attn_varlen_func(
                    **inputs, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=max_q, max_seqlen_k=max_k,
                    return_lse=True, backend=backend, **kw)  # fmt: skip
            assert lse.dtype == torch.float32
        else:
            out, lse = attention_ref(**inputs, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, upcast=mode == "ref", **ref_kw)
        res = Outcome(values={"out": out.detach(), "lse": lse.detach()})
        if backward:
            res.grads = _grads(out, inputs, dout)
        results.append(res)
    _compare(results, q.dtype, factors)
    return results[0]


def check_hstu(q, k, v, cu_q, cu_k, max_q, max_k, backward=True, factors=(2, 5), **kw):
    """As check_flash, for hstu_attn_varlen_func (grads of q, k, v and rab when has_drab)."""
    backend = kw.pop("backend", "auto")
    has_drab = kw.pop("has_drab", False)
    rab = kw.pop("rab", None)
    dout = torch.randn((*q.shape[:-1], v.shape[-1]), dtype=torch.float64, device=q.device)
    results = []
    for mode in ("ours", "ref", "plain"):
        dtype = torch.float64 if mode == "ref" else None
        inputs = {"q": _leaf(q, dtype), "k": _leaf(k, dtype), "v": _leaf(v, dtype), "rab": _leaf(rab, dtype)}
        if inputs["rab"] is not None:
            inputs["rab"].requires_grad_(has_drab)
        if mode == "ours":
            out = cuteattn.hstu_attn_varlen_func(
                inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, max_q, max_k, rab=inputs["rab"],
                has_drab=has_drab, backend=backend, **kw)  # fmt: skip
        else:
            out = hstu_attention_ref(
                inputs["q"], inputs["k"], inputs["v"], cu_q, cu_k, max_q, max_k, rab=inputs["rab"],
                upcast=mode == "ref", **kw)  # fmt: skip
        res = Outcome(values={"out": out.detach()})
        if backward:
            res.grads = _grads(out, inputs, dout)
        results.append(res)
    _compare(results, q.dtype, factors)
    return results[0]


def _compare(results: List[Outcome], dtype, factors):
    ours, ref, plain = results
    atol_value, atol_grad = ATOL[dtype]
    for name in ref.values:
        assert_rule(name, ours.values[name], ref.values[name], plain.values[name], factors[0], atol_value)
    assert set(ours.grads) == set(ref.grads), f"gradients {sorted(ours.grads)} != {sorted(ref.grads)}"
    for name in ref.grads:
        assert ours.grads[name] is not None, f"d{name}: missing"
        assert ours.grads[name].dtype == dtype, f"d{name}: dtype {ours.grads[name].dtype}, expected {dtype}"
        assert_rule("d" + name, ours.grads[name], ref.grads[name], plain.grads[name], factors[1], atol_grad)
