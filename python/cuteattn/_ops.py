"""The torch custom operators `cuteattn::*` (allocation, stream, fake kernels, autograd) and their eager path.

Each operator allocates its outputs with torch (so the caching allocator and CUDA graph capture work) and hands
them to the binding together with the current CUDA stream. The fake kernels give shapes to torch.compile;
register_autograd wires forward to backward. interface.py calls `flash_attention` / `hstu_attention`: a plain
eager call (plain tensors; no compilation, dispatch or function mode, or functorch transform active) runs the
same implementation without the dispatcher, through an autograd.Function when gradients are needed, which saves
most of the custom op's per-call cost; every other call goes through the operator. Argument checking for users
lives in interface.py.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable
from torch.utils.dlpack import to_dlpack

from ._binding import _C

_PLAIN_TENSOR_TYPES = (Tensor, torch.nn.Parameter)


def _dl(t: Optional[Tensor]):
    """A DLPack capsule of t for the binding. to_dlpack synchronises no stream (the library runs on the current
    stream, which produced the tensors), where Tensor.__dlpack__ may make the legacy default stream wait on the
    current one (breaking CUDA graph capture) and costs ten times as much."""
    return None if t is None else to_dlpack(t)


def _stream_and_threads(t: Tensor) -> Tuple[int, int]:
    if t.is_cuda:
        return torch._C._cuda_getCurrentRawStream(t.get_device()), 0
    return 0, torch.get_num_threads()


def _softmax_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, backend):  # fmt: skip
    stream, threads = _stream_and_threads(q)
    return _C.Problem(
        "softmax", _dl(q), _dl(k), _dl(v), cu_seqlens_q=_dl(cu_seqlens_q), cu_seqlens_k=_dl(cu_seqlens_k),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, causal=causal, window_left=window_left,
        window_right=window_right, softmax_scale=softmax_scale, softcap=softcap, backend=backend, stream=stream,
        num_threads=threads,
    )  # fmt: skip


def _hstu_problem(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen, num_contexts,
                  num_targets, target_group_size, window_left, window_right, alpha, rab, causal, backend):  # fmt: skip
    stream, threads = _stream_and_threads(q)
    return _C.Problem(
        "hstu", _dl(q), _dl(k), _dl(v), cu_seqlens_q=_dl(cu_seqlens_q), cu_seqlens_k=_dl(cu_seqlens_k),
        max_seqlen_q=max_seqlen_q, max_seqlen_k=max_seqlen_k, scaling_seqlen=scaling_seqlen,
        num_contexts=_dl(num_contexts), num_targets=_dl(num_targets), target_group_size=target_group_size,
        window_left=window_left, window_right=window_right, alpha=alpha, rab=_dl(_vector_aligned(rab)),
        causal=causal, backend=backend, stream=stream, num_threads=threads,
    )  # fmt: skip


class _on_device:
    """Makes q's CUDA device current for the call when it is not, so that everything of the call that asks for the
    current device (torch's capture check, the library's launch) concerns q's device."""

    def __init__(self, t: Tensor):
        other = t.is_cuda and t.device.index != torch.cuda.current_device()
        self.guard = torch.cuda.device(t.device) if other else None

    def __enter__(self):
        if self.guard is not None:
            self.guard.__enter__()

    def __exit__(self, *exc):
        if self.guard is not None:
            self.guard.__exit__(*exc)


def _allocator(device: torch.device):
    """The binding's `allocate`: scratch of `nbytes` bytes from torch's caching allocator, on the current stream."""
    return lambda nbytes: to_dlpack(torch.empty(nbytes, dtype=torch.uint8, device=device))


def _forward(problem, out: Tensor, lse: Optional[Tensor]) -> None:
    """Runs the forward pass. Its scratch (the tile counter of dynamically scheduled sm90 kernels; none for most
    calls) is the library's per-stream buffer, except while a CUDA graph is captured: the graph gets a buffer of
    its own from torch, since it may be replayed on another stream beside the calls of this one."""
    capturing = out.is_cuda and torch._C._cuda_isCurrentStreamCapturing()
    _C.forward(problem, _dl(out), _dl(lse), allocate=_allocator(out.device) if capturing else None)


def _backward(problem, tensors, deterministic: bool, device: torch.device) -> None:
    """Runs the backward pass with its scratch (dQ accumulators, ...) from torch's allocator."""
    _C.backward(problem, *map(_dl, tensors), deterministic, allocate=_allocator(device))


def _plain_eager(*tensors: Optional[Tensor]) -> bool:
    """Whether a call may skip the custom op: eager, on plain tensors, with nothing active that must see the op
    (torch.compile's tracing, a dispatch mode such as FakeTensorMode or make_fx, a torch function mode, a functorch
    transform)."""
    if (torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0
            or torch._C._is_torch_function_mode_enabled() or torch._C._are_functorch_transforms_active()):  # fmt: skip
        return False
    return all(t is None or type(t) in _PLAIN_TENSOR_TYPES for t in tensors)


def _needs_grad(*tensors: Optional[Tensor]) -> bool:
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def _profiled(name: str, fn, *inputs):
    """fn(*inputs), under the operator's name in torch.profiler traces when a profiler is recording."""
    if torch.autograd._profiler_enabled():
        with torch.autograd.profiler.record_function(name):
            return fn(*inputs)
    return fn(*inputs)


def _eager_function(name: str, impl, setup_context, grads, impl_backward):
    """An operator's autograd for plain eager calls, as an autograd.Function: the operator's implementation `impl`,
    its `setup_context` and its gradients `grads(ctx, dout, impl_backward)` (dout: the first output's gradient; the
    other outputs are not differentiable), without the dispatcher."""

    def forward(ctx, *inputs):  # no separate setup_context: Function.apply would then bind arguments by signature
        output = impl(*inputs)
        setup_context(ctx, inputs, output)
        return output

    @once_differentiable
    def backward(ctx, dout, *unused_output_grads):
        return grads(ctx, dout, impl_backward)

    methods = {"forward": staticmethod(forward), "backward": staticmethod(backward)}
    return type(name, (torch.autograd.Function,), methods)


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


def _flash_forward(
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


def _flash_backward(
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


fwd = torch.library.custom_op("cuteattn::fwd", _flash_forward, mutates_args=())
bwd = torch.library.custom_op("cuteattn::bwd", _flash_backward, mutates_args=())


@fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
      window_right, softcap, deterministic, backend):  # fmt: skip
    out = q.new_empty(_out_shape(q, v))
    lse = q.new_empty(_lse_shape(q, cu_seqlens_q is not None), dtype=torch.float32)
    return out, lse


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


def _fwd_grads(ctx, dout, backward):
    """Gradients of fwd's inputs from the context of _fwd_setup_context; `backward` computes (dq, dk, dv) with the
    arguments of bwd."""
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k = ctx.saved_tensors
    dq, dk, dv = backward(dout.contiguous(), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, *ctx.options)
    return (dq, dk, dv) + (None,) * (len(ctx.options) + 2)


fwd.register_autograd(lambda ctx, dout, dlse: _fwd_grads(ctx, dout, bwd), setup_context=_fwd_setup_context)


_FlashFunction = _eager_function("_FlashFunction", _flash_forward, _fwd_setup_context, _fwd_grads, _flash_backward)


def flash_attention(*inputs):
    """Softmax attention with fwd's arguments and results: through the operator, or its eager path."""
    if not _plain_eager(*inputs[:5]):
        return fwd(*inputs)
    if _needs_grad(*inputs[:3]):
        return _profiled("cuteattn::fwd", _FlashFunction.apply, *inputs)
    return _profiled("cuteattn::fwd", _flash_forward, *inputs)


# ---- HSTU attention ----


def _hstu_forward(
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


def _hstu_backward(
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


hstu_fwd = torch.library.custom_op("cuteattn::hstu_fwd", _hstu_forward, mutates_args=())
hstu_bwd = torch.library.custom_op("cuteattn::hstu_bwd", _hstu_backward, mutates_args=())


@hstu_fwd.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, scaling_seqlen, num_contexts, num_targets,
      target_group_size, window_left, window_right, alpha, rab, causal, has_drab, deterministic, backend):  # fmt: skip
    return q.new_empty(_out_shape(q, v))


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


def _hstu_grads(ctx, dout, backward):
    """Gradients of hstu_fwd's inputs from the context of _hstu_setup_context; `backward` computes
    (dq, dk, dv, drab) with the arguments of hstu_bwd."""
    q, k, v, cu_seqlens_q, cu_seqlens_k, num_contexts, num_targets, rab = ctx.saved_tensors
    opts = list(ctx.options)
    opts[3], opts[4], opts[9] = num_contexts, num_targets, rab  # the saved tensors, by position after cu_seqlens_k
    dq, dk, dv, drab = backward(dout.contiguous(), q, k, v, cu_seqlens_q, cu_seqlens_k, *opts)
    has_drab = opts[11]
    grads = [dq, dk, dv] + [None] * len(opts) + [None, None]
    grads[14] = drab if has_drab and rab is not None else None
    return tuple(grads)


hstu_fwd.register_autograd(lambda ctx, dout: _hstu_grads(ctx, dout, hstu_bwd), setup_context=_hstu_setup_context)


_HstuFunction = _eager_function("_HstuFunction", _hstu_forward, _hstu_setup_context, _hstu_grads, _hstu_backward)


def hstu_attention(*inputs):
    """HSTU attention with hstu_fwd's arguments and result: through the operator, or its eager path."""
    q, k, v, cu_seqlens_q, cu_seqlens_k = inputs[:5]
    num_contexts, num_targets, rab = inputs[8], inputs[9], inputs[14]
    if not _plain_eager(q, k, v, cu_seqlens_q, cu_seqlens_k, num_contexts, num_targets, rab):
        return hstu_fwd(*inputs)
    if _needs_grad(q, k, v, rab):
        return _profiled("cuteattn::hstu_fwd", _HstuFunction.apply, *inputs)
    return _profiled("cuteattn::hstu_fwd", _hstu_forward, *inputs)
