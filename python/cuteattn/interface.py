"""The public functions, with the argument conventions of flash-attn and FBGEMM/generative-recommenders HSTU.

Python checks what only Python can see (tensor-ness, None-ness, types, ranks, dtypes, devices) and raises
TypeError/ValueError naming the argument before anything is launched; the library checks everything else
(SEMANTICS.md section 3) and its refusals surface as ValueError too. NotImplementedError means a valid call the
chosen backend has no kernel for (e.g. a head dim that was not compiled, or float32 HSTU on a GPU).
float32 CUDA tensors compute with tf32 tensor-core math (inputs rounded to tf32, float32 accumulation), as
PyTorch does with torch.backends.cuda.matmul.allow_tf32; the CPU backends compute float32 in float32.
"""

from __future__ import annotations

from typing import Optional, Sequence, Tuple, Union

import torch
from torch import Tensor

from . import _ops

__all__ = ["flash_attn_func", "flash_attn_varlen_func", "hstu_attn_varlen_func", "BACKENDS"]

BACKENDS = ("auto", "cpu", "ref", "sm80", "sm90")
_FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _is_int(x) -> bool:
    return isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool)


def _is_real(x) -> bool:
    return isinstance(x, (int, float, torch.SymInt, torch.SymFloat)) and not isinstance(x, bool)


def _check_tensor(x, name: str, ndim: int, layout: str) -> None:
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(x).__name__}")
    if x.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions {layout}, got shape {tuple(x.shape)}")


def _check_inputs(q, k, v, ndim: int, layouts: Tuple[str, str, str]) -> None:
    for t, name, layout in zip((q, k, v), ("q", "k", "v"), layouts):
        _check_tensor(t, name, ndim, layout)
    if q.dtype not in _FLOAT_DTYPES:
        raise ValueError(f"q: dtype {q.dtype} is not one of float16, bfloat16, float32")
    for t, name in ((k, "k"), (v, "v")):
        if t.dtype != q.dtype:
            raise ValueError(f"{name}: dtype {t.dtype} differs from q's {q.dtype}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device} but q is on {q.device}")


def _check_index_tensor(x, name: str, q: Tensor, optional: bool) -> None:
    if x is None:
        if optional:
            return
        raise TypeError(f"{name}: expected an int32 torch.Tensor, got None")
    if not isinstance(x, Tensor):
        raise TypeError(f"{name}: expected an int32 torch.Tensor, got {type(x).__name__}")
    if x.dtype != torch.int32:
        raise ValueError(f"{name}: dtype {x.dtype}, expected torch.int32")
    if x.dim() != 1:
        raise ValueError(f"{name}: expected 1 dimension, got shape {tuple(x.shape)}")
    if x.device != q.device:
        raise ValueError(f"{name}: on {x.device} but q is on {q.device}")


def _check_int(x, name: str) -> None:
    if not _is_int(x):
        raise TypeError(f"{name}: expected an int, got {type(x).__name__}")


def _check_real(x, name: str, optional: bool = False) -> None:
    if x is None and optional:
        return
    if not _is_real(x):
        raise TypeError(f"{name}: expected a number{' or None' if optional else ''}, got {type(x).__name__}")


def _window(window_size, causal: bool) -> Tuple[int, int]:
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2 or not all(map(_is_int, window_size)):
        raise TypeError(f"window_size: expected a pair of ints (left, right), got {window_size!r}")
    left, right = window_size
    return left, 0 if causal else right


def _check_backend(backend) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"backend: {backend!r} is not one of {', '.join(BACKENDS)}")


def _last_dim_contiguous(t: Tensor) -> Tensor:
    return t if t.stride(-1) == 1 else t.contiguous()


def _softmax(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size,
             softcap, deterministic, return_lse, backend):  # fmt: skip
    """The scalar checks and the call shared by both softmax entry points (their tensors are checked)."""
    _check_real(softmax_scale, "softmax_scale", optional=True)
    _check_real(softcap, "softcap")
    _check_backend(backend)
    left, right = _window(window_size, causal)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    out, lse = _ops.flash_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, float(softmax_scale or 0.0),
        bool(causal), left, right, float(softcap), bool(deterministic), backend,
    )  # fmt: skip
    return (out, lse) if return_lse else out


def flash_attn_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    backend: str = "auto",
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Softmax attention, fixed-length layout.

    q (b, s_q, h, d), k (b, s_k, h_k, d), v (b, s_k, h_k, d_v) with h % h_k == 0 (GQA/MQA). Returns out
    (b, s_q, h, d_v), and with return_lse also lse (b, h, s_q) float32 (natural log; -inf for rows that see
    no key). lse carries no gradient. causal aligns the last query with the last key (window (-1, 0));
    window_size -1 means unbounded on that side; softcap > 0 applies softcap * tanh(S / softcap).
    """
    _check_inputs(q, k, v, 4, ("(b, s_q, h, d)", "(b, s_k, h_k, d)", "(b, s_k, h_k, d_v)"))
    return _softmax(q, k, v, None, None, 0, 0, softmax_scale, causal, window_size, softcap, deterministic,
                    return_lse, backend)  # fmt: skip


def flash_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: Optional[float] = None,
    causal: bool = False,
    window_size: Sequence[int] = (-1, -1),
    softcap: float = 0.0,
    deterministic: bool = False,
    return_lse: bool = False,
    *,
    backend: str = "auto",
) -> Union[Tensor, Tuple[Tensor, Tensor]]:
    """Softmax attention, variable-length (jagged) layout.

    q (total_q, h, d), k (total_k, h_k, d), v (total_k, h_k, d_v); cu_seqlens_q/k int32 (b + 1) on q's device,
    sequence i owning rows cu[i] .. cu[i+1]-1 (zero-length sequences are fine); max_seqlen_q/k bound the
    lengths. Returns out (total_q, h, d_v), and with return_lse also lse (h, total_q) float32.
    Other arguments as flash_attn_func.
    """
    _check_inputs(q, k, v, 3, ("(total_q, h, d)", "(total_k, h_k, d)", "(total_k, h_k, d_v)"))
    _check_index_tensor(cu_seqlens_q, "cu_seqlens_q", q, optional=False)
    _check_index_tensor(cu_seqlens_k, "cu_seqlens_k", q, optional=False)
    _check_int(max_seqlen_q, "max_seqlen_q")
    _check_int(max_seqlen_k, "max_seqlen_k")
    return _softmax(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                    window_size, softcap, deterministic, return_lse, backend)  # fmt: skip


def hstu_attn_varlen_func(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scaling_seqlen: Optional[float] = None,
    num_contexts: Optional[Tensor] = None,
    num_targets: Optional[Tensor] = None,
    target_group_size: int = 1,
    window_size: Sequence[int] = (-1, -1),
    alpha: float = 1.0,
    rab: Optional[Tensor] = None,
    has_drab: bool = False,
    causal: bool = True,
    *,
    deterministic: bool = False,
    backend: str = "auto",
) -> Tensor:
    """HSTU pointwise attention: out = (silu(alpha * (q k^T + rab)) / scaling_seqlen on visible keys) v.

    q, k (total, h, d), v (total, h, d_v), jagged by cu_seqlens_q/k (int32, b + 1). causal defaults to True as
    in generative-recommenders; num_contexts / num_targets (int32 (b), counted inside the sequence lengths) need
    causal; target_group_size groups the targets; window_size as flash_attn_func. scaling_seqlen defaults to
    max_seqlen_q. rab (b, 1 or h, max_seqlen_k, max_seqlen_k), dtype of q, is added to q k^T; rab receives a
    gradient only when has_drab=True (otherwise it is treated as a constant); on CUDA a rab with strides that
    are not multiples of 8 elements is copied to an aligned buffer first. Returns out (total_q, h, d_v).
    """
    _check_inputs(q, k, v, 3, ("(total_q, h, d)", "(total_k, h, d)", "(total_k, h, d_v)"))
    _check_index_tensor(cu_seqlens_q, "cu_seqlens_q", q, optional=False)
    _check_index_tensor(cu_seqlens_k, "cu_seqlens_k", q, optional=False)
    _check_index_tensor(num_contexts, "num_contexts", q, optional=True)
    _check_index_tensor(num_targets, "num_targets", q, optional=True)
    _check_int(max_seqlen_q, "max_seqlen_q")
    _check_int(max_seqlen_k, "max_seqlen_k")
    _check_int(target_group_size, "target_group_size")
    _check_real(scaling_seqlen, "scaling_seqlen", optional=True)
    _check_real(alpha, "alpha")
    _check_backend(backend)
    if rab is not None:
        _check_tensor(rab, "rab", 4, "(b, 1 or h, max_seqlen_k, max_seqlen_k)")
        if rab.dtype != q.dtype:
            raise ValueError(f"rab: dtype {rab.dtype} differs from q's {q.dtype}")
        if rab.device != q.device:
            raise ValueError(f"rab: on {rab.device} but q is on {q.device}")
        rab = _last_dim_contiguous(rab)
    left, right = _window(window_size, causal)
    q, k, v = _last_dim_contiguous(q), _last_dim_contiguous(k), _last_dim_contiguous(v)
    return _ops.hstu_attention(
        q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        float(scaling_seqlen) if scaling_seqlen is not None else 0.0, num_contexts, num_targets,
        target_group_size, left, right, float(alpha), rab, bool(causal), bool(has_drab), bool(deterministic),
        backend,
    )  # fmt: skip
