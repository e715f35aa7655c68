import pytest
import torch

import fa2gen


def qkv(B=1, Hq=2, Hkv=2, Nq=8, Nk=8, D=32, dtype=torch.float16):
    return (
        torch.randn(B, Hq, Nq, D).to(dtype),
        torch.randn(B, Hkv, Nk, D).to(dtype),
        torch.randn(B, Hkv, Nk, D).to(dtype),
    )


def call(q, k, v, **kw):
    return fa2gen.attention(q, k, v, **kw)


@pytest.mark.parametrize(
    "mutate,exc,match",
    [
        (lambda q, k, v: (q[0], k, v), ValueError, "q must have 4 dims"),
        (lambda q, k, v: (q, k[..., None], v), ValueError, "k must have 4 dims"),
        (lambda q, k, v: ("q", k, v), TypeError, "q must be a torch.Tensor"),
        (lambda q, k, v: (q.float(), k.float(), v.float()), TypeError, "q has dtype torch.float32"),
        (lambda q, k, v: (q, k.bfloat16(), v), TypeError, "k has dtype"),
        (lambda q, k, v: (q, k, v.bfloat16()), TypeError, "v has dtype"),
        (lambda q, k, v: (q, torch.cat([k, k]), torch.cat([v, v])), ValueError, "batch mismatch"),
        (lambda q, k, v: (q, k[..., :16], v[..., :16]), ValueError, "head_dim mismatch"),
        (lambda q, k, v: (q, k, v[:, :, :4]), ValueError, "v must have the same shape as k"),
        (lambda q, k, v: (torch.cat([q, q[:, :1]], 1), k, v), ValueError, "divisible"),
        (
            lambda q, k, v: (q[..., :12].contiguous(), k[..., :12].contiguous(), v[..., :12].contiguous()),
            ValueError,
            "head_dim 12",
        ),
        (
            lambda q, k, v: (q.transpose(-1, -2).contiguous().transpose(-1, -2), k, v),
            ValueError,
            "q must have a contiguous last dim",
        ),
        (lambda q, k, v: (q[:, :, :0], k, v), ValueError, "q must have seqlen >= 1"),
        (lambda q, k, v: (q, k[:, :, :0], v[:, :, :0]), ValueError, "k must have seqlen >= 1"),
        (lambda q, k, v: (q, k.to("meta"), v.to("meta")), ValueError, "k is on meta"),
    ],
)
def test_bad_tensors(mutate, exc, match):
    with pytest.raises(exc, match=match):
        call(*mutate(*qkv()))


@pytest.mark.parametrize(
    "kw,exc,match",
    [
        ({"causal": 1}, TypeError, "causal must be a bool"),
        ({"window_size": (-2, 0)}, ValueError, r"window_size\[0\] must be >= 0"),
        ({"window_size": (3, -5)}, ValueError, r"window_size\[1\]"),
        ({"window_size": 3}, TypeError, "window_size must be a"),
        ({"window_size": (1.5, 2)}, TypeError, r"window_size\[0\] must be an int"),
        ({"softcap": -1.0}, ValueError, "softcap must be finite and >= 0"),
        ({"softcap": float("nan")}, ValueError, "softcap"),
        ({"softcap": "1"}, TypeError, "softcap must be a real number"),
        ({"sm_scale": 0.0}, ValueError, "sm_scale must be finite and > 0"),
        ({"sm_scale": float("inf")}, ValueError, "sm_scale"),
        ({"return_lse": "yes"}, TypeError, "return_lse must be a bool"),
        ({"sm_scale": 1e-46}, ValueError, "sm_scale must be representable in fp32"),
        ({"softcap": 3e39}, ValueError, "softcap must be representable in fp32"),
    ],
)
def test_bad_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        call(*qkv(), **kw)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA to mix devices")
def test_cpu_cuda_mix():
    q, k, v = qkv()
    with pytest.raises(ValueError, match="k is on cuda"):
        call(q, k.cuda(), v.cuda())


def test_mask_normalisation():
    from fa2gen.runtime.problem import make_problem

    q, k, v = qkv()
    assert make_problem(q, k, v).mask == "none"
    assert make_problem(q, k, v, causal=True).mask == "causal"
    assert make_problem(q, k, v, window_size=(-1, 0)).mask == "causal"
    p = make_problem(q, k, v, causal=True, window_size=(4, 7))
    assert (p.mask, p.window_left, p.window_right) == ("local", 4, 0)
    p = make_problem(q, k, v, window_size=(4, -1))
    assert (p.mask, p.window_left, p.window_right) == ("local", 4, -1)
    assert make_problem(q, k, v, softcap=2).kernel_spec().softcap


def test_call_key_only_for_exactly_typed_cuda_calls():
    """attention() reuses the launch of an earlier identical call; anything validation
    would treat differently must key differently, or not be keyed at all."""
    from fa2gen.runtime.api import _call_key

    meta = torch.empty(2, 4, 100, 64, dtype=torch.float16, device="meta")
    cpu = torch.empty(2, 4, 100, 64, dtype=torch.float16)
    assert _call_key(cpu, cpu, cpu, False, None, (-1, -1), 0.0) is None  # CPU paths are not keyed
    assert _call_key(meta, meta, meta, False, None, (-1, -1), 0.0) is None
    # Values equal to accepted ones but of a type validation rejects (or converts):
    for kw in (
        {"causal": 1},
        {"softcap": 0},
        {"sm_scale": 1},
        {"window_size": [-1, -1]},
        {"window_size": (True, 0)},
        {"window_size": (-1, -1, -1)},
    ):
        args = dict(causal=False, sm_scale=None, window_size=(-1, -1), softcap=0.0) | kw
        assert _call_key(cpu, cpu, cpu, **args) is None, kw
    assert _call_key("q", cpu, cpu, False, None, (-1, -1), 0.0) is None


@pytest.mark.gpu
def test_repeated_calls_reuse_one_launch_and_still_validate():
    from fa2gen.runtime import dispatch
    from fa2gen.runtime.api import _call_key

    dispatch.clear_memo()
    q = torch.randn(2, 4, 100, 64, dtype=torch.float16, device="cuda")
    k = torch.randn(2, 2, 130, 64, dtype=torch.float16, device="cuda")
    a = fa2gen.attention(q, k, k, causal=True)
    assert len(dispatch._launches) == 1
    b = fa2gen.attention(q.clone(), k.clone(), k.clone(), causal=True)
    assert len(dispatch._launches) == 1 and torch.equal(a, b)
    assert _call_key(q, k, k, True, None, (-1, -1), 0.0) != _call_key(q, k, k, False, None, (-1, -1), 0.0)
    assert _call_key(q.transpose(1, 2).contiguous().transpose(1, 2), k, k, True, None, (-1, -1), 0.0) != _call_key(
        q, k, k, True, None, (-1, -1), 0.0
    )
    with pytest.raises(TypeError, match="causal"):
        fa2gen.attention(q, k, k, causal=1)
    with pytest.raises(TypeError, match="window_size"):
        fa2gen.attention(q, k, k, window_size=(True, 0))
    dispatch.clear_memo()
    assert not dispatch._launches


def test_sparse_and_meta_inputs_get_a_clear_error():
    """A sparse q got a message about strides; meta tensors passed validation and failed deep
    inside Triton under the interpreter."""
    q = torch.randn(1, 2, 8, 64, dtype=torch.float16)
    with pytest.raises(TypeError, match="q must be a dense .strided. tensor, got layout torch.sparse_coo"):
        fa2gen.attention(q.to_sparse(), q, q)
    meta = q.to("meta")
    for call in (
        lambda: fa2gen.attention(meta, meta, meta),
        lambda: fa2gen.attention_varlen(
            meta[0].transpose(0, 1),
            meta[0].transpose(0, 1),
            meta[0].transpose(0, 1),
            torch.tensor([0, 8], dtype=torch.int32, device="meta"),
            torch.tensor([0, 8], dtype=torch.int32, device="meta"),
            8,
            8,
        ),
    ):
        with pytest.raises(ValueError, match="meta device"):
            call()
