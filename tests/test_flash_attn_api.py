"""flash-attention's functions over fa2gen: the same names, defaults and layouts, the same
results as fa2gen's own functions, and a clear refusal for what fa2gen does not support."""

import inspect

import pytest
import torch
from helpers import rand_qkv
from test_kvcache import cache_inputs
from test_varlen import packed

import fa2gen

# flash-attention 2.8's signatures, as users call them: (name, default) in order
FLASH_ATTN = {
    "flash_attn_func": [
        ("q", None),
        ("k", None),
        ("v", None),
        ("dropout_p", 0.0),
        ("softmax_scale", None),
        ("causal", False),
        ("window_size", (-1, -1)),
        ("softcap", 0.0),
        ("alibi_slopes", None),
        ("deterministic", False),
        ("return_attn_probs", False),
    ],
    "flash_attn_varlen_func": [
        ("q", None),
        ("k", None),
        ("v", None),
        ("cu_seqlens_q", None),
        ("cu_seqlens_k", None),
        ("max_seqlen_q", None),
        ("max_seqlen_k", None),
        ("dropout_p", 0.0),
        ("softmax_scale", None),
        ("causal", False),
        ("window_size", (-1, -1)),
        ("softcap", 0.0),
        ("alibi_slopes", None),
        ("deterministic", False),
        ("return_attn_probs", False),
        ("block_table", None),
    ],
    "flash_attn_with_kvcache": [
        ("q", None),
        ("k_cache", None),
        ("v_cache", None),
        ("k", None),
        ("v", None),
        ("rotary_cos", None),
        ("rotary_sin", None),
        ("cache_seqlens", None),
        ("cache_batch_idx", None),
        ("cache_leftpad", None),
        ("block_table", None),
        ("softmax_scale", None),
        ("causal", False),
        ("window_size", (-1, -1)),
        ("softcap", 0.0),
        ("rotary_interleaved", True),
        ("alibi_slopes", None),
        ("num_splits", 0),
        ("return_softmax_lse", False),
    ],
}


@pytest.mark.parametrize("name", sorted(FLASH_ATTN))
def test_the_signatures_are_flash_attentions(name):
    params = inspect.signature(getattr(fa2gen, name)).parameters.values()
    got = [(p.name, None if p.default is inspect.Parameter.empty else p.default) for p in params]
    assert got == FLASH_ATTN[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)  # positional calls work


@pytest.mark.interpreter
@pytest.mark.parametrize(
    "options", [{}, {"causal": True, "softmax_scale": 0.2}, {"window_size": (7, 3), "softcap": 5.0}]
)
def test_flash_attn_func_is_attention_in_the_other_layout(options):
    q, k, v = rand_qkv(2, 4, 2, 33, 47, 64, layout="bnhd")  # (B, H, N, D) views of (B, N, H, D) memory
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))  # flash-attention's (B, N, H, D)
    out, lse, probs = fa2gen.flash_attn_func(q, k, v, return_attn_probs=True, **options)
    ours = {"sm_scale": options.get("softmax_scale")} | {k: v for k, v in options.items() if k != "softmax_scale"}
    want, want_lse = fa2gen.attention(*(t.transpose(1, 2) for t in (q, k, v)), return_lse=True, **ours)
    assert out.shape == q.shape and out.is_contiguous() and probs is None
    assert torch.equal(out, want.transpose(1, 2)) and torch.equal(lse, want_lse)
    positional = (0.0, options.get("softmax_scale"), options.get("causal", False), options.get("window_size", (-1, -1)))
    assert torch.equal(fa2gen.flash_attn_func(q, k, v, *positional, options.get("softcap", 0.0)), out)


@pytest.mark.interpreter
def test_flash_attn_func_trains_with_dropout_and_gqa():
    q, k, v = (t.transpose(1, 2).contiguous().requires_grad_() for t in rand_qkv(1, 6, 2, 21, 21, 40, seed=2))
    torch.manual_seed(3)
    out = fa2gen.flash_attn_func(q, k, v, dropout_p=0.25, causal=True, deterministic=True)
    out.float().square().sum().backward()
    leaves = [t.detach().transpose(1, 2).requires_grad_() for t in (q, k, v)]
    torch.manual_seed(3)
    want = fa2gen.attention(*leaves, dropout_p=0.25, causal=True)
    want.float().square().sum().backward()
    assert torch.equal(out, want.transpose(1, 2))
    assert all(torch.equal(a.grad, b.grad.transpose(1, 2)) for a, b in zip((q, k, v), leaves))


@pytest.mark.interpreter
def test_flash_attn_varlen_func_is_attention_varlen():
    lq, lk = [3, 0, 17], [5, 2, 17]
    q, k, v, cq, ck = packed(lq, lk, Hq=4, Hkv=2, D=32, seed=4)
    out, lse, probs = fa2gen.flash_attn_varlen_func(q, k, v, cq, ck, 17, 17, 0.0, None, True, return_attn_probs=True)
    want, want_lse = fa2gen.attention_varlen(q, k, v, cq, ck, 17, 17, causal=True, return_lse=True)
    assert probs is None and torch.equal(out, want) and torch.equal(lse, want_lse)
    with pytest.raises(NotImplementedError, match="block_table"):
        fa2gen.flash_attn_varlen_func(q, k, v, cq, ck, 17, 17, block_table=torch.zeros(3, 1, dtype=torch.int32))


@pytest.mark.interpreter
def test_flash_attn_with_kvcache_is_attention_with_kvcache():
    q, kc, vc, lens, table, k, v = cache_inputs(2, 3, 4, 2, 64, 48, [7, 30], page=16, new=2, seed=5)
    kc2, vc2 = kc.clone(), vc.clone()
    out, lse = fa2gen.flash_attn_with_kvcache(
        q, kc, vc, k, v, cache_seqlens=lens, block_table=table, causal=True, return_softmax_lse=True
    )
    want, want_lse = fa2gen.attention_with_kvcache(
        q, kc2, vc2, lens, block_table=table, k=k, v=v, causal=True, return_lse=True
    )
    assert torch.equal(out, want) and torch.equal(lse, want_lse) and torch.equal(kc, kc2)
    # an int for every sequence, or None for full contiguous caches
    q, kc, vc, lens, _, _, _ = cache_inputs(2, 1, 4, 2, 64, 40, [40, 40], seed=6)
    full = fa2gen.attention_with_kvcache(q, kc, vc, lens)
    assert torch.equal(fa2gen.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=40), full)
    assert torch.equal(fa2gen.flash_attn_with_kvcache(q, kc, vc), full)


@pytest.mark.parametrize(
    "name, value",
    [
        ("rotary_cos", torch.ones(4, 8)),
        ("rotary_sin", torch.ones(4, 8)),
        ("cache_batch_idx", torch.zeros(2, dtype=torch.int32)),
        ("cache_leftpad", torch.zeros(2, dtype=torch.int32)),
        ("num_splits", 4),
    ],
)
def test_what_fa2gen_does_not_support_is_refused_by_name(name, value):
    q, kc, vc, lens, _, _, _ = cache_inputs(2, 1, 4, 2, 64, 40, [3, 9])
    with pytest.raises(NotImplementedError, match=name):
        fa2gen.flash_attn_with_kvcache(q, kc, vc, cache_seqlens=lens, **{name: value})


def test_bad_layouts_are_named():
    q, k, v = rand_qkv(1, 2, 2, 8, 8, 64)
    with pytest.raises(ValueError, match="^k must be a .batch, seqlen, heads, head_dim"):
        fa2gen.flash_attn_func(q, k[0], v)
    q, kc, vc, lens, table, _, _ = cache_inputs(1, 1, 2, 2, 64, 32, [5], page=16)
    with pytest.raises(ValueError, match="cache_seqlens"):
        fa2gen.flash_attn_with_kvcache(q, kc, vc, block_table=table)
