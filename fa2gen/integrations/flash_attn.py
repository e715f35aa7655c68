"""flash-attention's functions, with its argument names, defaults, (batch, seqlen, heads,
head_dim) layout and return values, over fa2gen's kernels. Switching is one import::

    from fa2gen import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache

Arguments fa2gen does not support raise NotImplementedError naming the argument. With
``return_attn_probs=True`` the third value, flash-attention's dropout-encoded probabilities
(a testing aid), is None: ``fa2gen.runtime.dropout.keep_mask`` gives the mask instead.
"""

from __future__ import annotations

import torch

from ..runtime.api import attention, attention_varlen, attention_with_kvcache


def _unsupported(**given) -> None:
    for name, value in given.items():
        if value is not None:
            raise NotImplementedError(f"{name}: fa2gen does not support it; pass None")


def flash_attn_func(
    q,
    k,
    v,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
):
    """Attention over q (batch, seqlen_q, heads, head_dim) and k, v (batch, seqlen_k,
    heads_k, head_dim); returns out (batch, seqlen_q, heads, head_dim), or with
    ``return_attn_probs`` (out, softmax_lse (batch, heads, seqlen_q), None)."""
    out = attention(
        *(_heads_first(name, t) for name, t in zip("qkv", (q, k, v))),
        causal=causal,
        sm_scale=softmax_scale,
        window_size=window_size,
        softcap=softcap,
        return_lse=bool(return_attn_probs),
        deterministic=deterministic,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
    )
    if return_attn_probs:
        return out[0].transpose(1, 2), out[1], None
    return out.transpose(1, 2)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """Attention over a packed batch: q (total_q, heads, head_dim), k, v (total_k, heads_k,
    head_dim), int32 offsets of batch + 1 entries; returns out (total_q, heads, head_dim), or
    with ``return_attn_probs`` (out, softmax_lse (heads, total_q), None)."""
    _unsupported(block_table=block_table)
    out = attention_varlen(
        q,
        k,
        v,
        cu_seqlens_q,
        cu_seqlens_k,
        max_seqlen_q,
        max_seqlen_k,
        causal=causal,
        sm_scale=softmax_scale,
        window_size=window_size,
        softcap=softcap,
        return_lse=bool(return_attn_probs),
        deterministic=deterministic,
        alibi_slopes=alibi_slopes,
        dropout_p=dropout_p,
    )
    return (*out, None) if return_attn_probs else out


def flash_attn_with_kvcache(
    q,
    k_cache,
    v_cache,
    k=None,
    v=None,
    rotary_cos=None,
    rotary_sin=None,
    cache_seqlens=None,
    cache_batch_idx=None,
    cache_leftpad=None,
    block_table=None,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),
    softcap=0.0,
    rotary_interleaved=True,
    alibi_slopes=None,
    num_splits=0,
    return_softmax_lse=False,
):
    """Attention of q (batch, seqlen_q, heads, head_dim) over a KV cache, k and v appended
    into it first; ``cache_seqlens`` an int32 tensor (batch,), an int for every sequence, or
    None for full caches. Returns out, or (out, softmax_lse (batch, heads, seqlen_q)).
    ``num_splits`` 0 (the tuned or heuristic split count) only."""
    _unsupported(rotary_cos=rotary_cos, rotary_sin=rotary_sin, cache_batch_idx=cache_batch_idx)
    _unsupported(cache_leftpad=cache_leftpad)
    if num_splits != 0:
        raise NotImplementedError("num_splits: fa2gen chooses the split count (tuned per bucket); pass 0")
    if not isinstance(q, torch.Tensor) or q.dim() != 4:
        raise ValueError("q must be a (batch, seqlen_q, heads, head_dim) tensor")
    if cache_seqlens is None:  # full contiguous caches, nothing appended
        if block_table is not None or k is not None or not isinstance(k_cache, torch.Tensor) or k_cache.dim() != 4:
            raise ValueError("cache_seqlens: None means full contiguous caches and no new k, v; give the lengths")
        cache_seqlens = k_cache.shape[1]
    if isinstance(cache_seqlens, int) and not isinstance(cache_seqlens, bool):
        cache_seqlens = torch.full((q.shape[0],), cache_seqlens, dtype=torch.int32, device=q.device)
    return attention_with_kvcache(
        q,
        k_cache,
        v_cache,
        cache_seqlens,
        block_table=block_table,
        k=k,
        v=v,
        causal=causal,
        sm_scale=softmax_scale,
        window_size=window_size,
        softcap=softcap,
        return_lse=bool(return_softmax_lse),
        alibi_slopes=alibi_slopes,
    )


def _heads_first(name: str, t):
    """(batch, seqlen, heads, head_dim) viewed as fa2gen's (batch, heads, seqlen, head_dim):
    no copy, so the output fa2gen allocates like q comes back contiguous after the inverse."""
    if not isinstance(t, torch.Tensor) or t.dim() != 4:
        shape = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"{name} must be a (batch, seqlen, heads, head_dim) tensor, got {shape}")
    return t.transpose(1, 2)
