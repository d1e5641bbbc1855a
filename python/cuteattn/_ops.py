"""The torch custom operators `cuteattn::*`: allocation, stream, fake (meta) kernels and autograd.

Each operator allocates its outputs with torch (so the caching allocator and CUDA graph capture work) and hands
them to the binding together with the current CUDA stream. The fake kernels give shapes to torch.compile;
register_autograd wires forward to backward. Argument checking for users lives in interface.py.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor

from ._binding import _C


def _stream_and_threads(t: Tensor) -> Tuple[int, int]:
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream, 0
    return 0, torch.get_num_threads()


def _dl(t: Optional[Tensor]):
    """A DLPack capsule of t for the binding. stream=-1 asks torch for no stream synchronisation (the library
    runs on the current stream, which produced the tensors); some torch versions otherwise make the legacy
    default stream wait on the current one, which breaks CUDA graph capture."""
    return None if t is None else t.detach().__dlpack__(stream=-1)


def _problem(score: str, q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q, cu_seqlens_k, backend: str, **kw):
    stream, threads = _stream_and_threads(q)
    for name in ("rab", "num_contexts", "num_targets"):
        if name in kw:
            kw[name] = _dl(kw[name])
    return _C.Problem(
        score,
        _dl(q),
        _dl(k),
        _dl(v),
        cu_seqlens_q=_dl(cu_seqlens_q),
        cu_seqlens_k=_dl(cu_seqlens_k),
        backend=backend,
        stream=stream,
        num_threads=threads,
        **kw,
    )


def _softmax_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, backend):  # fmt: skip
    return _problem(
        "softmax", q, k, v, cu_seqlens_q, cu_seqlens_k, backend,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal, window_left=window_left,
        window_right=window_right, softmax_scale=softmax_scale, softcap=softcap,
    )  # fmt: skip


def _hstu_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen, num_contexts,
                  num_targets, target_group_size, window_left, window_right, alpha, rab, causal, backend):  # fmt: skip
    return _problem(
        "hstu", q, k, v, cu_seqlens_q, cu_seqlens_k, backend,
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling_seqlen,
        num_contexts=num_contexts, num_targets=num_targets, target_group_size=target_group_size,
        window_left=window_left, window_right=window_right, alpha=alpha, rab=_vector_aligned(rab), causal=causal,
    )  # fmt: skip


class _on_device:
    """Makes q's CUDA device current for the call when it is not: the library launches on the current device and
    torch exports CUDA tensors through DLPack only from their own device."""

    def __init__(self, t: Tensor):
        other = t.is_cuda and t.device.index != torch.cuda.current_device()
        self.guard = torch.cuda.device(t.device) if other else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _forward(problem, out: Tensor, lse: Optional[Tensor]) -> None:
    """Runs the forward pass with a torch-allocated workspace (the tile counter of dynamically scheduled sm90
    kernels; none for most calls), so the library keeps no scratch of its own on torch's streams."""
    nbytes = _C.forward_workspace_bytes(problem, _dl(out), _dl(lse))
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=out.device) if nbytes else None
    _C.forward(problem, _dl(out), _dl(lse), workspace=_dl(workspace))


def _backward(problem, tensors, deterministic: bool, device: torch.device) -> None:
    """Runs the backward pass with a torch-allocated workspace (a capsule is consumed by one binding call, so
    each call gets fresh ones)."""
    nbytes = _C.backward_workspace_bytes(problem, *map(_dl, tensors), deterministic=deterministic)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=device) if nbytes else None
    _C.backward(problem, *map(_dl, tensors), deterministic=deterministic, workspace=_dl(workspace))


def _vector_aligned(rab: Optional[Tensor]) -> Optional[Tensor]:
    """GPU kernels load rab rows with 16-byte vectors: a CUDA rab whose address or strides are not multiples of
    16 bytes (e.g. max_seqlen_k = 1023) is copied into a row-padded buffer for the call."""
    if rab is None or not rab.is_cuda:
        return rab
    if rab.data_ptr() % 16 == 0 and all(s * rab.element_size() % 16 == 0 for s in rab.stride()[:-1]):
        return rab
    return _new_drab(rab).copy_(rab)


def _new_drab(rab: Tensor) -> Tensor:
    """Where the kernel writes dRab: on CUDA its rows are padded to 8 elements so that they can be stored with
    16-byte vectors whatever max_seqlen_k is (the op returns a contiguous copy then, as its fake kernel says)."""
    n = rab.shape[-1]
    if not rab.is_cuda or n % 8 == 0:
        return torch.empty(rab.shape, dtype=rab.dtype, device=rab.device)
    return rab.new_empty((*rab.shape[:-1], n + (-n % 8)))[..., :n]


def _out_shape(q: Tensor, v: Tensor):
    return (*q.shape[:-1], v.shape[-1])


def _lse_shape(q: Tensor, varlen: bool):
    return (q.shape[1], q.shape[0]) if varlen else (q.shape[0], q.shape[2], q.shape[1])


# ---- softmax attention ----


@torch.library.custom_op("cuteattn::fwd", mutates_args=())
def fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: str,
) -> Tuple[Tensor, Tensor]:
    """Softmax attention forward; returns (out, lse). `deterministic` is kept for the backward pass."""
    out = q.new_empty(_out_shape(q, v))
    lse = torch.empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32, device=q.device)
    with _on_device(q):
        problem = _softmax_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                   causal, window_left, window_right, softcap, backend)  # fmt: skip
        _forward(problem, out, lse)
    return out, lse


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, softcap, deterministic, backend):  # fmt: skip
    out = q.new_empty(_out_shape(q, v))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


@torch.library.custom_op("cuteattn::bwd", mutates_args=())
def bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Optional[Tensor],
    cu_seqlens_k: Optional[Tensor],
    max_seqlen_q: int,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    backend: str,
) -> Tuple[Tensor, Tensor, Tensor]:
    """Softmax attention backward; returns (dq, dk, dv)."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    tensors = (out, lse, dout, dq, dk, dv, None)
    with _on_device(q):
        problem = _softmax_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale,
                                   causal, window_left, window_right, softcap, backend)  # fmt: skip
        _backward(problem, tensors, deterministic, q.device)
    return dq, dk, dv


@bwd.register_fake
def _(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
      window_left, window_right, softcap, deterministic, backend):  # fmt: skip
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
    ctx.options = inputs[5:]  # scalars only
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = bwd(dout.contiguous(), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options)
    return (dq, dk, dv) + (None,) * (len(ctx.options) + 2)


fwd.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)


# ---- HSTU attention ----


@torch.library.custom_op("cuteattn::hstu_fwd", mutates_args=())
def hstu_fwd(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scaling_seqlen: float,
    num_contexts: Optional[Tensor],
    num_targets: Optional[Tensor],
    target_group_size: int,
    window_left: int,
    window_right: int,
    alpha: float,
    rab: Optional[Tensor],
    causal: bool,
    has_drab: bool,
    deterministic: bool,
    backend: str,
) -> Tensor:
    """HSTU attention forward; returns out. `has_drab` and `deterministic` are kept for the backward pass."""
    out = q.new_empty(_out_shape(q, v))
    with _on_device(q):
        problem = _hstu_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen,
                                num_contexts, num_targets, target_group_size, window_left, window_right, alpha,
                                rab, causal, backend)  # fmt: skip
        _forward(problem, out, None)
    return out


@hstu_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen, num_contexts, num_targets,
      target_group_size, window_left, window_right, alpha, rab, causal, has_drab, deterministic, backend):  # fmt: skip
    return q.new_empty(_out_shape(q, v))


@torch.library.custom_op("cuteattn::hstu_bwd", mutates_args=())
def hstu_bwd(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    scaling_seqlen: float,
    num_contexts: Optional[Tensor],
    num_targets: Optional[Tensor],
    target_group_size: int,
    window_left: int,
    window_right: int,
    alpha: float,
    rab: Optional[Tensor],
    causal: bool,
    has_drab: bool,
    deterministic: bool,
    backend: str,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    """HSTU attention backward; returns (dq, dk, dv, drab), drab empty (0 elements) unless has_drab."""
    dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    want_drab = has_drab and rab is not None
    drab = _new_drab(rab) if want_drab else q.new_empty(0)
    tensors = (None, None, dout, dq, dk, dv, drab if want_drab else None)
    with _on_device(q):
        problem = _hstu_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen,
                                num_contexts, num_targets, target_group_size, window_left, window_right, alpha,
                                rab, causal, backend)  # fmt: skip
        _backward(problem, tensors, deterministic, q.device)
    return dq, dk, dv, drab.contiguous()


@hstu_bwd.register_fake
def _(dout, q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen, num_contexts,
      num_targets, target_group_size, window_left, window_right, alpha, rab, causal, has_drab, deterministic,
      backend):  # fmt: skip
    drab = rab.new_empty(rab.shape) if has_drab and rab is not None else q.new_empty(0)
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v), drab


def _hstu_setup_context(ctx, inputs, output):
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    num_contexts, num_targets, rab = inputs[8], inputs[9], inputs[14]
    ctx.save_for_backward(q, k, v, cu_seqlens_q, cu_seqlens_k, num_contexts, num_targets, rab)
    ctx.options = [None if isinstance(x, Tensor) else x for x in inputs[5:]]  # tensors travel as saved tensors


def _hstu_backward(ctx, dout):
    q, k, v, cu_seqlens_q, cu_seqlens_k, num_contexts, num_targets, rab = ctx.saved_tensors
    opts = list(ctx.options)
    opts[3], opts[4], opts[9] = num_contexts, num_targets, rab  # the saved tensors, by position after cu_seqlens_k
    dq, dk, dv, drab = hstu_bwd(dout.contiguous(), q, k, v, cu_seqlens_q, cu_seqlens_k, *opts)
    has_drab = opts[11]
    grads = [dq, dk, dv] + [None] * len(opts) + [None, None]
    grads[14] = drab if has_drab and rab is not None else None
    return tuple(grads)


hstu_fwd.register_autograd(_hstu_backward, setup_context=_hstu_setup_context)
