"""CPU suite (CI): the three functions against the float64 reference of SEMANTICS.md, forward and backward,
every mask, GQA, varlen with zero-length sequences, finite differences, torch.compile, and refused inputs."""

import zlib

import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import cuteattn
from cuteattn import _C, _ops
from helpers import check_flash, check_hstu, cu_seqlens, randn

CPU = torch.device("cpu")
DTYPES = [torch.float32, torch.bfloat16, torch.float16]

# name -> keyword arguments of flash_attn_func
FLASH_MASKS = {
    "none": {},
    "causal": {"causal": True},
    "window": {"window_size": (16, 8)},
    "window_left": {"window_size": (10, -1)},
    "window_right": {"window_size": (-1, 5)},
    "causal_window": {"causal": True, "window_size": (20, -1)},
    "softcap": {"softcap": 5.0, "softmax_scale": 0.3},
}

# (b, s_q, s_k, h, h_k, d, d_v)
FIXED_SHAPES = [
    (2, 113, 113, 4, 4, 64, 64),
    (1, 1, 77, 4, 2, 32, 32),
    (2, 65, 33, 6, 2, 64, 64),  # s_q > s_k: with causal, the first rows see no key
    (1, 40, 97, 2, 1, 128, 64),  # MQA, d != d_v
]


@pytest.mark.parametrize("shape", FIXED_SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("mask", FLASH_MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flash_fixed(shape, mask, dtype):
    torch.manual_seed(zlib.crc32(repr((shape, mask)).encode()))
    b, sq, sk, h, hk, d, dv = shape
    q = randn(b, sq, h, d, dtype=dtype, device=CPU)
    k = randn(b, sk, hk, d, dtype=dtype, device=CPU)
    v = randn(b, sk, hk, dv, dtype=dtype, device=CPU)
    check_flash(q, k, v, **FLASH_MASKS[mask])


VARLEN_Q = [0, 5, 113, 1, 0, 64, 9]
VARLEN_K = [3, 5, 100, 0, 7, 64, 30]  # sequence 3 has a query row and no key; sequence 0 keys and no query


@pytest.mark.parametrize("mask", ["none", "causal", "window", "causal_window", "softcap"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_flash_varlen(mask, dtype):
    torch.manual_seed(7)
    h, hk, d = 4, 2, 64
    cu_q, cu_k = cu_seqlens(VARLEN_Q, CPU), cu_seqlens(VARLEN_K, CPU)
    q = randn(sum(VARLEN_Q), h, d, dtype=dtype, device=CPU)
    k = randn(sum(VARLEN_K), hk, d, dtype=dtype, device=CPU)
    v = randn(sum(VARLEN_K), hk, d, dtype=dtype, device=CPU)
    res = check_flash(q, k, v, cu_q, cu_k, max(VARLEN_Q), max(VARLEN_K), **FLASH_MASKS[mask])
    row = int(cu_q[3])  # the row of sequence 3, which has no key
    assert torch.all(res.values["out"][row] == 0)
    assert torch.all(res.values["lse"][:, row] == float("-inf"))


@pytest.mark.parametrize("backend", ["cpu", "ref"])
def test_flash_backends(backend):
    torch.manual_seed(3)
    q = randn(2, 57, 8, 64, dtype=torch.float32, device=CPU)
    k = randn(2, 91, 2, 64, dtype=torch.float32, device=CPU)
    v = randn(2, 91, 2, 64, dtype=torch.float32, device=CPU)
    check_flash(q, k, v, causal=True, backend=backend)


# name -> keyword arguments of hstu_attn_varlen_func (besides rab)
HSTU_MASKS = {
    "causal": {},
    "none": {"causal": False},
    "window": {"window_size": (8, 0)},
    "window_two_sided": {"causal": False, "window_size": (6, 4)},
    "contexts": {"num_contexts": [0, 3, 5, 1, 0]},
    "targets": {"num_targets": [0, 4, 7, 1, 2]},
    "targets_grouped": {"num_targets": [0, 4, 9, 1, 6], "target_group_size": 3},
    "contexts_targets": {"num_contexts": [0, 2, 6, 0, 3], "num_targets": [0, 5, 8, 1, 4], "target_group_size": 2},
}
HSTU_LENGTHS = [0, 17, 64, 1, 33]


@pytest.mark.parametrize("rab", ["none", "shared", "per_head", "shared_drab", "per_head_drab"])
@pytest.mark.parametrize("mask", HSTU_MASKS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_hstu(mask, rab, dtype):
    torch.manual_seed(zlib.crc32(repr((mask, rab)).encode()))
    h, d, max_len = 4, 32, max(HSTU_LENGTHS)
    b, total = len(HSTU_LENGTHS), sum(HSTU_LENGTHS)
    cu = cu_seqlens(HSTU_LENGTHS, CPU)
    q, k = randn(total, h, d, dtype=dtype, device=CPU), randn(total, h, d, dtype=dtype, device=CPU)
    v = randn(total, h, 48, dtype=dtype, device=CPU)
    kw = {n: torch.tensor(x, dtype=torch.int32) if isinstance(x, list) else x for n, x in HSTU_MASKS[mask].items()}
    if rab != "none":
        kw["rab"] = randn(b, 1 if rab.startswith("shared") else h, max_len, max_len, dtype=dtype, device=CPU)
        kw["has_drab"] = rab.endswith("drab")
    check_hstu(q, k, v, cu, cu, max_len, max_len, alpha=1.0 / d, **kw)


def test_hstu_delta_q_and_scaling():
    """Fewer queries than keys per sequence (the last queries align with the last keys) and an explicit
    scaling_seqlen."""
    torch.manual_seed(11)
    lens_q, lens_k = [3, 0, 20, 1], [10, 4, 20, 9]
    h, d = 2, 64
    q = randn(sum(lens_q), h, d, dtype=torch.float32, device=CPU)
    k = randn(sum(lens_k), h, d, dtype=torch.float32, device=CPU)
    v = randn(sum(lens_k), h, d, dtype=torch.float32, device=CPU)
    rab = randn(4, h, 20, 20, dtype=torch.float32, device=CPU)
    check_hstu(q, k, v, cu_seqlens(lens_q, CPU), cu_seqlens(lens_k, CPU), 20, 20, scaling_seqlen=7.0, alpha=0.5,
               rab=rab, has_drab=True)  # fmt: skip


def test_hstu_more_queries_than_keys():
    """s_q > s_k: the first rows sit before key 0 (r < 0), see nothing and are never contextual."""
    torch.manual_seed(12)
    lens_q, lens_k = [12, 5, 0, 30], [7, 5, 3, 22]
    h, d = 2, 32
    q = randn(sum(lens_q), h, d, dtype=torch.float32, device=CPU)
    k = randn(sum(lens_k), h, d, dtype=torch.float32, device=CPU)
    v = randn(sum(lens_k), h, d, dtype=torch.float32, device=CPU)
    contexts = torch.tensor([3, 2, 0, 6], dtype=torch.int32)
    res = check_hstu(q, k, v, cu_seqlens(lens_q, CPU), cu_seqlens(lens_k, CPU), 30, 22, num_contexts=contexts,
                     alpha=0.5)  # fmt: skip
    assert torch.all(res.values["out"][:5] == 0)  # rows 0..4 of sequence 0 precede its first key


def test_finite_differences():
    """Our backward against central differences of our own forward, fp32, tiny shapes."""
    torch.manual_seed(5)
    kw = dict(dtype=torch.float32, device=CPU)
    q, k, v = randn(1, 5, 2, 8, **kw), randn(1, 7, 1, 8, **kw), randn(1, 7, 1, 8, **kw)
    fd = dict(eps=1e-2, atol=2e-3, rtol=2e-2, nondet_tol=0.0)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(lambda *t: cuteattn.flash_attn_func(*t, causal=True), (q, k, v), **fd)
    cu = cu_seqlens([3, 0, 4], CPU)
    q, k, v = randn(7, 2, 8, **kw), randn(7, 2, 8, **kw), randn(7, 2, 8, **kw)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(
            lambda *t: cuteattn.flash_attn_varlen_func(*t, cu, cu, 4, 4, window_size=(1, 1)), (q, k, v), **fd)
    rab = randn(3, 1, 4, 4, **kw)
    with pytest.warns(UserWarning, match="double precision"):
        assert torch.autograd.gradcheck(
            lambda q, k, v, rab: cuteattn.hstu_attn_varlen_func(q, k, v, cu, cu, 4, 4, rab=rab, has_drab=True,
                                                                alpha=0.7),
            (q, k, v, rab), **fd)  # fmt: skip


def test_deterministic():
    torch.manual_seed(2)
    q = randn(2, 70, 4, 64, dtype=torch.bfloat16, device=CPU)
    k = randn(2, 70, 1, 64, dtype=torch.bfloat16, device=CPU)
    v = randn(2, 70, 1, 64, dtype=torch.bfloat16, device=CPU)
    dout = torch.randn(2, 70, 4, 64, dtype=torch.bfloat16)
    runs = [torch.autograd.grad(cuteattn.flash_attn_func(q, k, v, causal=True, deterministic=True), (q, k, v), dout)
            for _ in range(2)]  # fmt: skip
    for a, b in zip(*runs):
        assert torch.equal(a, b)


def test_strided_inputs():
    """q, k, v as views of one packed (b, s, 3, h, d) tensor; k with a non-contiguous last dim is copied."""
    torch.manual_seed(4)
    qkv = torch.randn(2, 50, 3, 4, 32)
    q, k, v = (qkv[:, :, i].detach().requires_grad_() for i in range(3))
    assert q.stride() == (19200, 384, 32, 1)
    check_flash(q, k, v, causal=True)
    kt = torch.randn(2, 50, 32, 4).transpose(-1, -2)  # last-dim stride 4
    out = cuteattn.flash_attn_func(q, kt, v)
    torch.testing.assert_close(out, cuteattn.flash_attn_func(q, kt.contiguous(), v))


def test_lse_and_rab_gradients_policy():
    """lse carries no gradient; rab gets one only with has_drab=True."""
    torch.manual_seed(6)
    q = randn(1, 9, 2, 16, dtype=torch.float32, device=CPU)
    out, lse = cuteattn.flash_attn_func(q, q, q, return_lse=True)
    assert out.requires_grad and not lse.requires_grad
    cu = cu_seqlens([9], CPU)
    x = q[0].detach().requires_grad_()
    rab = randn(1, 1, 9, 9, dtype=torch.float32, device=CPU)
    cuteattn.hstu_attn_varlen_func(x, x, x, cu, cu, 9, 9, rab=rab).sum().backward()
    assert rab.grad is None and x.grad is not None
    cuteattn.hstu_attn_varlen_func(x, x, x, cu, cu, 9, 9, rab=rab, has_drab=True).sum().backward()
    assert rab.grad is not None and torch.isfinite(rab.grad).all()


def _poison(*shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype)


@pytest.mark.parametrize("score", ["softmax", "hstu"])
def test_every_output_element_written(score):
    """Outputs prefilled with NaN through the binding: every element must be written (rows without keys
    included: out 0, lse -inf)."""
    torch.manual_seed(8)
    lens_q, lens_k = [4, 0, 9, 2], [4, 3, 9, 0]
    if score == "hstu":
        lens_k = lens_q
    h, d = 2, 32
    cu_q, cu_k = cu_seqlens(lens_q, CPU), cu_seqlens(lens_k, CPU)
    q = torch.randn(sum(lens_q), h, d)
    k, v = torch.randn(sum(lens_k), h, d), torch.randn(sum(lens_k), h, d)
    problem = _C.Problem(score, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=9, max_seqlen_k=9,
                         causal=True)  # fmt: skip
    out = _poison(*q.shape, dtype=q.dtype)
    lse = _poison(h, q.shape[0], dtype=torch.float32) if score == "softmax" else None
    _C.forward(problem, out, lse)
    assert not out.isnan().any()
    if lse is not None:
        assert not lse.isnan().any()
    grads = [_poison(*t.shape, dtype=t.dtype) for t in (q, k, v)]
    _C.backward(problem, out if lse is not None else None, lse, torch.randn_like(out), *grads)
    for g in grads:
        assert not g.isnan().any()


@pytest.mark.parametrize("name", ["flash", "varlen", "hstu"])
def test_torch_compile_fullgraph(name):
    torch._dynamo.reset()
    torch.manual_seed(9)
    kw = dict(dtype=torch.float32, device=CPU)
    lens = [5, 0, 12]
    cu = cu_seqlens(lens, CPU)
    if name == "flash":
        args = (randn(2, 12, 4, 32, **kw), randn(2, 12, 2, 32, **kw), randn(2, 12, 2, 32, **kw))

        def fn(q, k, v):
            return cuteattn.flash_attn_func(q, k, v, causal=True, window_size=(4, -1))
    elif name == "varlen":
        args = (randn(17, 4, 32, **kw), randn(17, 2, 32, **kw), randn(17, 2, 32, **kw))

        def fn(q, k, v):
            out, lse = cuteattn.flash_attn_varlen_func(q, k, v, cu, cu, 12, 12, causal=True, return_lse=True)
            return out * 2 + lse.transpose(0, 1).unsqueeze(-1).detach()
    else:
        args = (randn(17, 2, 32, **kw), randn(17, 2, 32, **kw), randn(17, 2, 32, **kw), randn(3, 1, 12, 12, **kw))
        targets = torch.tensor([1, 0, 3], dtype=torch.int32)

        def fn(q, k, v, rab):
            return cuteattn.hstu_attn_varlen_func(q, k, v, cu, cu, 12, 12, num_targets=targets, alpha=0.5, rab=rab,
                                                  has_drab=True).sin()  # fmt: skip

    compiled = torch.compile(fn, fullgraph=True)
    eager_out = fn(*args)
    eager_grads = torch.autograd.grad(eager_out.sum(), args)
    out = compiled(*args)
    grads = torch.autograd.grad(out.sum(), args)
    torch.testing.assert_close(out, eager_out, rtol=1e-5, atol=1e-5)
    for g, e in zip(grads, eager_grads):
        torch.testing.assert_close(g, e, rtol=1e-5, atol=1e-5)


def _op_inputs(name):
    """(eager entry point, operator, its inputs, the differentiable ones) for flash and HSTU, CPU float32."""
    torch.manual_seed(12)
    kw = dict(dtype=torch.float32, device=CPU)
    if name == "flash":
        q, k, v = randn(2, 9, 4, 32, **kw), randn(2, 9, 2, 32, **kw), randn(2, 9, 2, 32, **kw)
        inputs = (q, k, v, None, None, 0, 0, 0.0, True, -1, 0, 0.0, False, "auto")
        return _ops.flash_attention, torch.ops.cuteattn.fwd.default, inputs, (q, k, v)
    cu = cu_seqlens([5, 0, 12], CPU)
    q, k, v, rab = randn(17, 2, 32, **kw), randn(17, 2, 32, **kw), randn(17, 2, 32, **kw), randn(3, 1, 12, 12, **kw)
    targets = torch.tensor([1, 0, 3], dtype=torch.int32)
    inputs = (q, k, v, cu, cu, 12, 12, 0.0, None, targets, 1, -1, 0, 0.5, rab, True, True, False, "auto")
    return _ops.hstu_attention, torch.ops.cuteattn.hstu_fwd.default, inputs, (q, k, v, rab)


def _first(out):
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("name", ["flash", "hstu"])
def test_eager_path_matches_operator(name):
    """A plain eager call skips the custom op (an autograd.Function runs the same implementation): outputs and
    gradients must equal the operator's bit for bit, with and without gradients."""
    eager, op, inputs, leaves = _op_inputs(name)
    got, expected = eager(*inputs), op(*inputs)
    assert type(_first(got).grad_fn).__name__.endswith("FunctionBackward")  # the eager path was taken
    dout = torch.randn_like(_first(got))
    for a, b in zip(torch.autograd.grad(_first(got), leaves, dout), torch.autograd.grad(_first(expected), leaves, dout)):
        assert torch.equal(a, b)
    with torch.no_grad():
        for a, b in zip(_as_tuple(eager(*inputs)), _as_tuple(expected)):
            assert torch.equal(a, b)


def _as_tuple(out):
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("mode", ["real", "fake"])
@pytest.mark.parametrize("name", ["flash", "hstu"])
def test_tracing_sees_the_operator(name, mode):
    """Under a dispatch mode (make_fx here, FakeTensorMode in torch.compile) calls go through the operator."""
    eager, op, inputs, _ = _op_inputs(name)
    positions = [i for i, x in enumerate(inputs) if isinstance(x, torch.Tensor)]

    def fn(*tensors):
        args = list(inputs)
        for i, t in zip(positions, tensors):
            args[i] = t
        return eager(*args)

    graph = make_fx(fn, tracing_mode=mode)(*(inputs[i].detach() for i in positions)).graph
    assert any(node.target is op for node in graph.nodes)


def test_profiler_names_the_operator():
    eager, _, inputs, _ = _op_inputs("flash")
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        eager(*inputs)
    assert any(event.name == "cuteattn::fwd" for event in prof.events())


def _bad_calls():
    f32 = dict(dtype=torch.float32)
    q, k, v = torch.randn(2, 8, 4, 32), torch.randn(2, 8, 2, 32), torch.randn(2, 8, 2, 32)
    qv, kv = torch.randn(10, 4, 32), torch.randn(10, 2, 32)
    cu = torch.tensor([0, 4, 10], dtype=torch.int32)
    hq = torch.randn(10, 2, 32)
    fa, fv, hs = cuteattn.flash_attn_func, cuteattn.flash_attn_varlen_func, cuteattn.hstu_attn_varlen_func
    return [
        ("q not a tensor", lambda: fa(q.numpy(), k, v), TypeError, "q"),
        ("k rank", lambda: fa(q, k[0], v), ValueError, "k"),
        ("v dtype", lambda: fa(q, k, v.double()), ValueError, "v"),
        ("q dtype", lambda: fa(q.double(), k.double(), v.double()), ValueError, "q"),
        ("int inputs", lambda: fa(q.int(), k.int(), v.int()), ValueError, "q"),
        ("heads not divisible", lambda: fa(q, torch.randn(2, 8, 3, 32), torch.randn(2, 8, 3, 32)), ValueError, "k"),
        ("head dim mismatch", lambda: fa(q, torch.randn(2, 8, 2, 16), v), ValueError, "k"),
        ("batch mismatch", lambda: fa(q, k[:1], v[:1]), ValueError, "k"),
        ("window type", lambda: fa(q, k, v, window_size=3), TypeError, "window_size"),
        ("window value", lambda: fa(q, k, v, window_size=(-3, 0)), ValueError, "window_left"),
        ("softcap type", lambda: fa(q, k, v, softcap="x"), TypeError, "softcap"),
        ("softcap negative", lambda: fa(q, k, v, softcap=-1.0), ValueError, "softcap"),
        ("scale type", lambda: fa(q, k, v, softmax_scale=[1.0]), TypeError, "softmax_scale"),
        ("backend name", lambda: fa(q, k, v, backend="tpu"), ValueError, "backend"),
        ("gpu backend on cpu", lambda: fa(q, k, v, backend="sm80"), ValueError, "backend"),
        ("cu_seqlens None", lambda: fv(qv, kv, kv, None, cu, 6, 6), TypeError, "cu_seqlens_q"),
        ("cu_seqlens dtype", lambda: fv(qv, kv, kv, cu.long(), cu, 6, 6), ValueError, "cu_seqlens_q"),
        ("cu_seqlens rank", lambda: fv(qv, kv, kv, cu, cu[None], 6, 6), ValueError, "cu_seqlens_k"),
        ("cu_seqlens decreasing", lambda: fv(qv, kv, kv, torch.tensor([0, 7, 5, 10], dtype=torch.int32),
                                             torch.tensor([0, 3, 5, 10], dtype=torch.int32), 6, 6),
         ValueError, "cu_seqlens_q"),  # fmt: skip
        ("cu_seqlens total", lambda: fv(qv, kv, kv, torch.tensor([0, 4, 9], dtype=torch.int32), cu, 6, 6),
         ValueError, "cu_seqlens_q"),  # fmt: skip
        ("cu_seqlens length", lambda: fv(qv, kv, kv, cu, torch.tensor([0, 10], dtype=torch.int32), 6, 6),
         ValueError, "cu_seqlens_k"),  # fmt: skip
        ("max_seqlen type", lambda: fv(qv, kv, kv, cu, cu, 6.0, 6), TypeError, "max_seqlen_q"),
        ("max_seqlen too small", lambda: fv(qv, kv, kv, cu, cu, 5, 6), ValueError,
         "(max_seqlen_q|cu_seqlens_q)"),  # fmt: skip
        ("hstu gqa", lambda: hs(hq, torch.randn(10, 1, 32), torch.randn(10, 1, 32), cu, cu, 6, 6), ValueError, "k"),
        ("hstu targets dtype", lambda: hs(hq, hq, hq, cu, cu, 6, 6, num_targets=torch.tensor([1, 2])),
         ValueError, "num_targets"),  # fmt: skip
        ("hstu targets too many", lambda: hs(hq, hq, hq, cu, cu, 6, 6,
                                             num_targets=torch.tensor([1, 7], dtype=torch.int32)),
         ValueError, "num_targets"),  # fmt: skip
        ("hstu targets need causal", lambda: hs(hq, hq, hq, cu, cu, 6, 6, causal=False,
                                                num_targets=torch.tensor([1, 2], dtype=torch.int32)),
         ValueError, "num_targets"),  # fmt: skip
        ("hstu contexts not a tensor", lambda: hs(hq, hq, hq, cu, cu, 6, 6, num_contexts=[1, 2]), TypeError,
         "num_contexts"),  # fmt: skip
        ("hstu group size", lambda: hs(hq, hq, hq, cu, cu, 6, 6, target_group_size=0,
                                       num_targets=torch.tensor([1, 2], dtype=torch.int32)),
         ValueError, "target_group_size"),  # fmt: skip
        ("hstu rab shape", lambda: hs(hq, hq, hq, cu, cu, 6, 6, rab=torch.randn(2, 1, 5, 6)), ValueError, "rab"),
        ("hstu rab heads", lambda: hs(hq, hq, hq, cu, cu, 6, 6, rab=torch.randn(2, 3, 6, 6)), ValueError, "rab"),
        ("hstu rab dtype", lambda: hs(hq, hq, hq, cu, cu, 6, 6, rab=torch.randn(2, 1, 6, 6, **f32).half()),
         ValueError, "rab"),  # fmt: skip
        ("hstu alpha type", lambda: hs(hq, hq, hq, cu, cu, 6, 6, alpha=None), TypeError, "alpha"),
    ]


@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_inputs(case):
    _, call, error, argument = case
    with pytest.raises(error, match=rf"^{argument}\b"):
        call()


def test_backend_resolution_and_info():
    q = torch.randn(1, 4, 2, 32)
    problem = _C.Problem("softmax", q, q, q)
    assert _C.resolve_forward_backend(problem, torch.empty_like(q), torch.empty(1, 2, 4)) == "cpu"
    assert isinstance(cuteattn.__version__, str) and cuteattn.__version__
    assert isinstance(cuteattn.compiled_archs(), str)
