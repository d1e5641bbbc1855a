"""GPU suite (device check; marked `gpu`, skipped without CUDA): the three functions against the float64
reference with the FlashAttention tolerance rule (2x forward, 3x gradients, 5x HSTU gradients and dRab against a
plain computation in the same low precision), every mask, odd lengths, GQA, varlen with zero-length sequences;
torch.compile, CUDA graph capture, side streams, determinism, fully written outputs and the binding's scratch
callback."""

import pytest
import torch
from torch.utils.dlpack import to_dlpack

import cuteattn
from cuteattn import _C
from helpers import check_flash, check_hstu, cu_seqlens, randn

pytestmark = pytest.mark.gpu
CUDA = torch.device("cuda")
LOW = [torch.bfloat16, torch.float16]
MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window_size": (100, 30)},
    "softcap": {"softcap": 30.0},
}


@pytest.mark.parametrize("backend", ["auto", "sm80"])
@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_flash_fixed_gpu(dtype, d, mask, backend):
    torch.manual_seed(d + len(mask))
    b, sq, sk, h, hk = 2, 113, 1023, 8, 2
    q = randn(b, sq, h, d, dtype=dtype, device=CUDA)
    k = randn(b, sk, hk, d, dtype=dtype, device=CUDA)
    v = randn(b, sk, hk, d, dtype=dtype, device=CUDA)
    check_flash(q, k, v, backend=backend, **MASKS[mask])


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_flash_fixed_sm90_forward(mask):
    if torch.cuda.get_device_capability()[0] != 9:
        pytest.skip("sm90 kernels need a Hopper GPU")
    torch.manual_seed(1)
    q = randn(1, 1023, 4, 128, dtype=torch.bfloat16, device=CUDA)
    k = randn(1, 4224, 4, 128, dtype=torch.bfloat16, device=CUDA)
    v = randn(1, 4224, 4, 128, dtype=torch.bfloat16, device=CUDA)
    check_flash(q, k, v, backward=False, backend="sm90", **MASKS[mask])


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_flash_varlen_gpu(dtype, mask):
    torch.manual_seed(3)
    lens_q, lens_k = [0, 1, 113, 1023, 7, 0, 300], [5, 0, 113, 1023, 64, 0, 4224]
    h, hk, d = 4, 1, 128
    q = randn(sum(lens_q), h, d, dtype=dtype, device=CUDA)
    k = randn(sum(lens_k), hk, d, dtype=dtype, device=CUDA)
    v = randn(sum(lens_k), hk, d, dtype=dtype, device=CUDA)
    check_flash(q, k, v, cu_seqlens(lens_q, CUDA), cu_seqlens(lens_k, CUDA), max(lens_q), max(lens_k),
                **MASKS[mask])  # fmt: skip


def test_device_contents_refused_gpu():
    """cu_seqlens / num_targets / num_contexts on the GPU are read back (through page-locked staging that grows
    with the batch) and checked before any launch: each bad content is refused naming its argument, and a good
    call after the refusals, with the staging grown (3000 sequences), forward and backward, passes the
    tolerance rule."""
    torch.manual_seed(5)
    q, k = randn(10, 2, 64, dtype=torch.bfloat16, device=CUDA), randn(10, 2, 64, dtype=torch.bfloat16, device=CUDA)
    fv, hs = cuteattn.flash_attn_varlen_func, cuteattn.hstu_attn_varlen_func
    cu = cu_seqlens([4, 6], CUDA)
    bad = [
        (lambda: fv(q, k, k, torch.tensor([0, 7, 5, 10], dtype=torch.int32, device=CUDA), cu_seqlens([3, 2, 5], CUDA),
                    8, 8), "cu_seqlens_q"),  # fmt: skip
        (lambda: fv(q, k, k, cu_seqlens([4, 5], CUDA), cu, 6, 6), "cu_seqlens_q"),
        (lambda: fv(q, k, k, cu, cu, 6, 5), "cu_seqlens_k"),
        (lambda: hs(q, k, k, cu, cu, 6, 6, num_targets=torch.tensor([1, 7], dtype=torch.int32, device=CUDA)),
         "num_targets"),  # fmt: skip
        (lambda: hs(q, k, k, cu, cu, 6, 6, num_contexts=torch.tensor([3, 4], dtype=torch.int32, device=CUDA),
                    num_targets=torch.tensor([1, 3], dtype=torch.int32, device=CUDA)), "num_contexts"),  # fmt: skip
    ]
    for call, argument in bad:
        with pytest.raises(ValueError, match=rf"^{argument}\b"):
            call()
    lens = [int(n) for n in torch.randint(0, 9, (3000,))]
    qs, ks, vs = (randn(sum(lens), 2, 64, dtype=torch.bfloat16, device=CUDA) for _ in range(3))
    targets = torch.tensor([min(n, 1) for n in lens], dtype=torch.int32, device=CUDA)
    cus = cu_seqlens(lens, CUDA)
    check_hstu(qs, ks, vs, cus, cus, max(lens), max(lens), num_targets=targets, alpha=1.0 / 64)


HSTU_MASKS = {
    "causal": {},
    "none": {"causal": False},
    "window": {"window_size": (64, 0)},
    "contexts_targets": {"num_contexts": [3, 0, 10, 0, 40], "num_targets": [5, 0, 20, 1, 17], "target_group_size": 4},
}


@pytest.mark.parametrize("rab", ["none", "shared_drab", "per_head_drab", "per_head"])
@pytest.mark.parametrize("mask", HSTU_MASKS)
@pytest.mark.parametrize("d", [64, 128, 256])
@pytest.mark.parametrize("dtype", LOW, ids=str)
def test_hstu_gpu(dtype, d, mask, rab):
    torch.manual_seed(d)
    lens = [113, 0, 1023, 1, 511]
    h, max_len = 4, max(lens)
    cu = cu_seqlens(lens, CUDA)
    q, k, v = (randn(sum(lens), h, d, dtype=dtype, device=CUDA) for _ in range(3))
    kw = {n: torch.tensor(x, dtype=torch.int32, device=CUDA) if isinstance(x, list) else x
          for n, x in HSTU_MASKS[mask].items()}  # fmt: skip
    if rab != "none":
        kw["rab"] = randn(len(lens), 1 if rab.startswith("shared") else h, max_len, max_len, dtype=dtype, device=CUDA)
        kw["has_drab"] = rab.endswith("drab")
    check_hstu(q, k, v, cu, cu, max_len, max_len, alpha=1.0 / d, **kw)


def _problems():
    """(name, function of (q, k, v[, rab]), inputs) for the three functions."""
    torch.manual_seed(5)
    kw = dict(dtype=torch.bfloat16, device=CUDA)
    lens = [100, 0, 257, 64]
    cu = cu_seqlens(lens, CUDA)
    targets = torch.tensor([3, 0, 10, 2], dtype=torch.int32, device=CUDA)
    total = sum(lens)
    return [
        ("flash", lambda q, k, v: cuteattn.flash_attn_func(q, k, v, causal=True),
         [randn(2, 257, 8, 128, **kw), randn(2, 257, 2, 128, **kw), randn(2, 257, 2, 128, **kw)]),
        ("varlen", lambda q, k, v: cuteattn.flash_attn_varlen_func(q, k, v, cu, cu, 257, 257, window_size=(32, 32)),
         [randn(total, 8, 64, **kw), randn(total, 8, 64, **kw), randn(total, 8, 64, **kw)]),
        ("hstu", lambda q, k, v, rab: cuteattn.hstu_attn_varlen_func(q, k, v, cu, cu, 257, 257, num_targets=targets,
                                                                     alpha=1 / 128, rab=rab, has_drab=True),
         [randn(total, 4, 128, **kw), randn(total, 4, 128, **kw), randn(total, 4, 128, **kw),
          randn(4, 1, 257, 257, **kw)]),
    ]  # fmt: skip


def _run(fn, inputs, dout):
    out = fn(*inputs)
    return (out, *torch.autograd.grad(out, inputs, dout))


def _assert_same_run(got, expected):
    """The forward is deterministic; gradients may differ by accumulation order (atomics) unless
    deterministic=True, so they are compared to within a bf16 ulp-level tolerance."""
    torch.testing.assert_close(got[0], expected[0], rtol=0, atol=0)
    for a, b in zip(got[1:], expected[1:]):
        torch.testing.assert_close(a, b, rtol=1e-2, atol=1e-2)


@pytest.mark.parametrize("index", range(3), ids=["flash", "varlen", "hstu"])
def test_torch_compile_gpu(index):
    torch._dynamo.reset()
    _, fn, inputs = _problems()[index]
    dout = torch.randn_like(fn(*inputs))
    eager = _run(fn, inputs, dout)
    _assert_same_run(_run(torch.compile(fn, fullgraph=True), inputs, dout), eager)


@pytest.mark.parametrize("index", range(3), ids=["flash", "varlen", "hstu"])
def test_cuda_graph_capture(index):
    """Forward and backward captured in one CUDA graph, replayed on new input values."""
    _, fn, inputs = _problems()[index]
    dout = torch.randn_like(fn(*inputs))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            _run(fn, inputs, dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = _run(fn, inputs, dout)
    with torch.no_grad():
        for t in inputs:
            t.copy_(torch.randn_like(t))
    graph.replay()
    torch.cuda.synchronize()
    _assert_same_run(captured, _run(fn, inputs, dout))


def test_side_stream():
    _, fn, inputs = _problems()[0]
    dout = torch.randn_like(fn(*inputs))
    expected = _run(fn, inputs, dout)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        got = _run(fn, inputs, dout)
    torch.cuda.current_stream().wait_stream(stream)
    _assert_same_run(got, expected)


@pytest.mark.parametrize("score", ["softmax", "hstu"])
def test_deterministic_gpu(score):
    torch.manual_seed(6)
    lens = [1023, 0, 511, 2047]
    cu = cu_seqlens(lens, CUDA)
    h_k = 1 if score == "softmax" else 8
    q = randn(sum(lens), 8, 128, dtype=torch.bfloat16, device=CUDA)
    k = randn(sum(lens), h_k, 128, dtype=torch.bfloat16, device=CUDA)
    v = randn(sum(lens), h_k, 128, dtype=torch.bfloat16, device=CUDA)
    dout = torch.randn_like(q)

    def grads():
        if score == "softmax":
            out = cuteattn.flash_attn_varlen_func(q, k, v, cu, cu, 2047, 2047, causal=True, deterministic=True)
        else:
            out = cuteattn.hstu_attn_varlen_func(q, k, v, cu, cu, 2047, 2047, deterministic=True)
        return torch.autograd.grad(out, (q, k, v), dout)

    first = grads()
    for _ in range(3):
        for a, b in zip(grads(), first):
            assert torch.equal(a, b)


@pytest.mark.parametrize("score", ["softmax", "hstu"])
def test_every_output_element_written_gpu(score):
    torch.manual_seed(8)
    lens_q, lens_k = [4, 0, 300, 129, 2], [4, 3, 300, 129, 0]
    if score == "hstu":
        lens_k = lens_q
    h, d = 4, 128
    q = torch.randn(sum(lens_q), h, d, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(sum(lens_k), h, d, dtype=torch.bfloat16, device=CUDA)
    v = torch.randn(sum(lens_k), h, d, dtype=torch.bfloat16, device=CUDA)
    stream = torch.cuda.current_stream().cuda_stream
    problem = _C.Problem(score, q, k, v, cu_seqlens_q=cu_seqlens(lens_q, CUDA), cu_seqlens_k=cu_seqlens(lens_k, CUDA),
                         max_seqlen_q=300, max_seqlen_k=300, causal=True, stream=stream)  # fmt: skip
    out = torch.full_like(q, float("nan"))
    lse = torch.full((h, q.shape[0]), float("nan"), device=CUDA) if score == "softmax" else None
    _C.forward(problem, out, lse)
    grads = [torch.full_like(t, float("nan")) for t in (q, k, v)]
    fwd_out = out if lse is not None else None
    args = (fwd_out, lse, torch.randn_like(out), *grads)
    nbytes = _C.backward_workspace_bytes(problem, *args)
    workspace = torch.empty(nbytes, dtype=torch.uint8, device=CUDA) if nbytes else None
    _C.backward(problem, *args, workspace=workspace)
    torch.cuda.synchronize()
    for name, t in [("out", out), ("lse", lse), ("dq", grads[0]), ("dk", grads[1]), ("dv", grads[2])]:
        if t is not None:
            assert not t.isnan().any(), f"{name}: elements left unwritten"


def test_binding_allocate_gpu():
    """The binding's `allocate` callback (the ops pass torch's allocator) supplies scratch exactly when a call needs
    some: the forward then uses it instead of the library's per-stream buffer, with the same result."""
    torch.manual_seed(14)
    q, k, v = (torch.randn(2, 300, 4, 128, dtype=torch.bfloat16, device=CUDA) for _ in range(3))
    problem = _C.Problem("softmax", q, k, v, causal=True, window_right=0, stream=torch.cuda.current_stream().cuda_stream)
    requests = []

    def allocate(nbytes):
        requests.append(nbytes)
        return to_dlpack(torch.empty(nbytes, dtype=torch.uint8, device=CUDA))

    out, out_allocated = torch.empty_like(q), torch.empty_like(q)
    lse, lse_allocated = torch.empty(2, 4, 300, device=CUDA), torch.empty(2, 4, 300, device=CUDA)
    _C.forward(problem, out, lse)
    _C.forward(problem, out_allocated, lse_allocated, allocate=allocate)
    assert requests == [n for n in [_C.forward_workspace_bytes(problem, out, lse)] if n]
    assert torch.equal(out, out_allocated) and torch.equal(lse, lse_allocated)
    requests.clear()
    args = (out, lse, torch.randn_like(q), torch.empty_like(q), torch.empty_like(k), torch.empty_like(v))
    _C.backward(problem, *args, allocate=allocate)
    assert requests == [n for n in [_C.backward_workspace_bytes(problem, *args)] if n]


def test_gpu_backend_resolution():
    q = torch.randn(1, 128, 4, 128, dtype=torch.bfloat16, device=CUDA)
    problem = _C.Problem("softmax", q, q, q, stream=torch.cuda.current_stream().cuda_stream)
    chosen = _C.resolve_forward_backend(problem, torch.empty_like(q), torch.empty(1, 4, 128, device=CUDA))
    expected = "sm90" if torch.cuda.get_device_capability()[0] == 9 else "sm80"
    assert chosen == expected, f"auto picked {chosen}"
    assert cuteattn.compiled_archs()


# ---- fp32 inputs: tf32 tensor-core math on the sm80 kernels ----


def _round_tf32(x: torch.Tensor) -> torch.Tensor:
    """fp32 -> tf32 (10-bit mantissa), to nearest with ties away from zero, as cvt.rna.tf32.f32."""
    bits = x.contiguous().view(torch.int32)
    return ((bits + 0x1000) & -0x2000).view(torch.float32).view_as(x)


class _Tf32Operand(torch.autograd.Function):
    """A matmul operand rounded to tf32; the gradient passes through."""

    @staticmethod
    def forward(ctx, x):
        return _round_tf32(x)

    @staticmethod
    def backward(ctx, g):
        return g


class _Tf32Grad(torch.autograd.Function):
    """Identity whose incoming gradient is rounded to tf32: the gradient of a matmul result is the operand of the
    backward matmuls (dO in dP = dO V^T and dV = P^T dO, dS in dQ = dS K and dK = dS^T Q)."""

    @staticmethod
    def forward(ctx, x):
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return _round_tf32(g)


@pytest.fixture
def tf32_plain(monkeypatch):
    """fp32 CUDA inputs run on tf32 MMAs, so the plain yardstick of the rule is the fp32 computation with tf32
    matmuls: every matmul operand rounded to tf32 (q, k, v, P, and dO, dS in the backward), fp32 accumulation,
    fp32 softmax. allow_tf32 alone does not give that (cuBLAS keeps full fp32 for some shapes, e.g. d = 32), so
    the einsums of the reference round their fp32 operands explicitly; float64 (the oracle) is untouched."""
    einsum = torch.einsum

    def tf32_einsum(eq, *ops):
        if all(isinstance(t, torch.Tensor) and t.dtype == torch.float32 for t in ops):
            return _Tf32Grad.apply(einsum(eq, *(_Tf32Operand.apply(t) for t in ops)))
        return einsum(eq, *ops)

    monkeypatch.setattr(torch, "einsum", tf32_einsum)
    yield


@pytest.mark.parametrize("mask", MASKS)
@pytest.mark.parametrize("d", [32, 64, 96, 128, 192, 256])
def test_flash_fixed_fp32_gpu(tf32_plain, d, mask):
    torch.manual_seed(d + 7 * len(mask))
    b, sq, sk, h, hk = 2, 113, 1023, 8, 2
    q = randn(b, sq, h, d, dtype=torch.float32, device=CUDA)
    k = randn(b, sk, hk, d, dtype=torch.float32, device=CUDA)
    v = randn(b, sk, hk, d, dtype=torch.float32, device=CUDA)
    check_flash(q, k, v, **MASKS[mask])


@pytest.mark.parametrize("mask", MASKS)
def test_flash_varlen_fp32_gpu(tf32_plain, mask):
    torch.manual_seed(11)
    lens_q, lens_k = [0, 1, 113, 1023, 7, 0, 300], [5, 0, 113, 1023, 64, 0, 4224]
    h, hk, d = 4, 1, 128
    q = randn(sum(lens_q), h, d, dtype=torch.float32, device=CUDA)
    k = randn(sum(lens_k), hk, d, dtype=torch.float32, device=CUDA)
    v = randn(sum(lens_k), hk, d, dtype=torch.float32, device=CUDA)
    check_flash(q, k, v, cu_seqlens(lens_q, CUDA), cu_seqlens(lens_k, CUDA), max(lens_q), max(lens_k),
                **MASKS[mask])  # fmt: skip


def test_flash_fp32_deterministic_gpu():
    torch.manual_seed(13)
    q = randn(2, 515, 8, 64, dtype=torch.float32, device=CUDA)
    k = randn(2, 515, 2, 64, dtype=torch.float32, device=CUDA)
    v = randn(2, 515, 2, 64, dtype=torch.float32, device=CUDA)
    dout = torch.randn(2, 515, 8, 64, device=CUDA)
    runs = [_run(lambda q, k, v: cuteattn.flash_attn_func(q, k, v, causal=True, deterministic=True), [q, k, v], dout)
            for _ in range(3)]  # fmt: skip
    for got in runs[1:]:
        for a, b in zip(got, runs[0]):
            assert torch.equal(a, b)


def test_hstu_fp32_gpu_refused():
    lens = [113, 0, 64]
    cu = cu_seqlens(lens, CUDA)
    q, k, v = (randn(sum(lens), 2, 64, dtype=torch.float32, device=CUDA) for _ in range(3))
    with pytest.raises(NotImplementedError, match="fp32"):
        cuteattn.hstu_attn_varlen_func(q, k, v, cu, cu, 113, 113, alpha=1.0 / 64)
