"""fa2gen's calls as PyTorch custom operators (``torch.library.custom_op``), which is how
``torch.compile`` sees them: each an opaque node with a fake implementation (output shapes,
strides and dtypes, no kernels) and, where differentiable, a backward operator of its own.

``attention()``, ``attention_varlen()`` and ``attention_with_kvcache()`` call them while the
compiler traces (``torch.compiler.is_compiling()``), and run their eager work directly
otherwise (no dispatcher on the per-call path). Each operator runs that same eager work:

- ``fa2gen::attention`` (q, k, v, options, ALiBi's slopes, dropout's seed) -> (out, lse), and
  ``fa2gen::attention_backward`` -> (dq, dk, dv);
- ``fa2gen::attention_fp8`` -> (out bf16, lse), forward only;
- ``fa2gen::attention_varlen`` and ``fa2gen::attention_varlen_backward``, packed batches;
- ``fa2gen::attention_with_kvcache`` -> (out, lse), which writes the new keys and values into
  the caches it is given (declared as mutated).

Dropout's seed is drawn before the operator is called, from torch's generator, so that the
compiled graph draws a new one each call (and a CUDA graph's replay too); the backward takes
the forward's.
"""

from __future__ import annotations

import torch
from torch import Tensor

from . import api
from .dropout import check_dropout, draw_seed
from .fp8 import FP8_TORCH

_NO_DESCALES = (None, None, None)


def _window(window_size) -> tuple[int, int]:
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair of ints, got {window_size!r}")
    return int(window_size[0]), int(window_size[1])


def _like(t: Tensor, reference: Tensor) -> Tensor:
    """``t`` in the strides ``torch.empty_like(reference)`` gives (what the fake implementations
    promise): the kernels allocate so; only the CPU reference path may differ."""
    if t.stride() == reference.stride():  # (every kernel call: no allocation to compare)
        return t
    want = torch.empty_like(reference, dtype=t.dtype)
    if want.stride() == t.stride():
        return t
    return want.copy_(t)


# -- dense ---------------------------------------------------------------------------------


@torch.library.custom_op("fa2gen::attention", mutates_args=())
def attention_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    seed: Tensor | None,
) -> tuple[Tensor, Tensor]:
    window = (window_left, window_right)
    with torch.no_grad():  # (the operator's autograd is registered below)
        out, lse = api.eager_attention(
            q, k, v, causal, sm_scale, window, softcap, deterministic, _NO_DESCALES, alibi_slopes, dropout_p, seed
        )
    return _like(out, q), lse.contiguous()


@attention_op.register_fake
def _(q, k, v, causal, sm_scale, window_left, window_right, softcap, deterministic, alibi_slopes, dropout_p, seed):
    return torch.empty_like(q), q.new_empty(q.shape[:3], dtype=torch.float32)


@torch.library.custom_op("fa2gen::attention_backward", mutates_args=())
def attention_backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    seed: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    window = (window_left, window_right)
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    grads = api.eager_attention_backward(
        dout, q, k, v, out, lse, causal, sm_scale, window, softcap, deterministic, alibi_slopes, dropout_p, seed
    )
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v)))


@attention_backward_op.register_fake
def _(dout, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _attention_setup(ctx, inputs, output):
    q, k, v, causal, sm_scale, wl, wr, softcap, deterministic, alibi, dropout_p, seed = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi, seed)
    ctx.options = (causal, sm_scale, wl, wr, softcap, deterministic)
    ctx.dropout_p = dropout_p
    ctx.mark_non_differentiable(lse)


def _attention_backward(ctx, dout, _dlse):
    q, k, v, out, lse, alibi, seed = ctx.saved_tensors
    grads = attention_backward_op(dout, q, k, v, out, lse, *ctx.options, alibi, ctx.dropout_p, seed)
    return (*grads, *([None] * 9))


attention_op.register_autograd(_attention_backward, setup_context=_attention_setup)


@torch.library.custom_op("fa2gen::attention_fp8", mutates_args=())
def attention_fp8_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    descale_q: Tensor | None,
    descale_k: Tensor | None,
    descale_v: Tensor | None,
) -> tuple[Tensor, Tensor]:
    window = (window_left, window_right)
    descales = (descale_q, descale_k, descale_v)
    out, lse = api.eager_attention(q, k, v, causal, sm_scale, window, softcap, False, descales, None, 0.0)
    return _like(out, q), lse.contiguous()


@attention_fp8_op.register_fake
def _(q, *rest):
    return torch.empty_like(q, dtype=torch.bfloat16), q.new_empty(q.shape[:3], dtype=torch.float32)


def compiled_attention(
    q, k, v, causal, sm_scale, window_size, softcap, deterministic, descales, alibi_slopes, dropout_p, *, return_lse
):
    """``attention()`` as the compiler sees it: one operator (the seed drawn beside it)."""
    wl, wr = _window(window_size)
    if q.dtype == FP8_TORCH:
        out, lse = attention_fp8_op(q, k, v, causal, sm_scale, wl, wr, softcap, *descales)
    else:
        if any(d is not None for d in descales):
            raise ValueError("descale_q, descale_k, descale_v are for fp8 inputs only")
        p = check_dropout(dropout_p)
        seed = draw_seed(q.device) if p > 0.0 else None
        out, lse = attention_op(q, k, v, causal, sm_scale, wl, wr, softcap, deterministic, alibi_slopes, p, seed)
    return (out, lse) if return_lse else out


# -- packed batches ------------------------------------------------------------------------


@torch.library.custom_op("fa2gen::attention_varlen", mutates_args=())
def attention_varlen_op(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    seed: Tensor | None,
) -> tuple[Tensor, Tensor]:
    call = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    window = (window_left, window_right)
    with torch.no_grad():
        out, lse = api.eager_attention_varlen(
            *call, causal, sm_scale, window, softcap, deterministic, False, alibi_slopes, dropout_p, seed
        )
    return _like(out, q), lse.contiguous()


@attention_varlen_op.register_fake
def _(q, k, v, cu_seqlens_q, *rest):
    return torch.empty_like(q), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("fa2gen::attention_varlen_backward", mutates_args=())
def attention_varlen_backward_op(
    dout: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    lse: Tensor,
    cu_seqlens_q: Tensor,
    cu_seqlens_k: Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    deterministic: bool,
    alibi_slopes: Tensor | None,
    dropout_p: float,
    seed: Tensor | None,
) -> tuple[Tensor, Tensor, Tensor]:
    call = (dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    options = (causal, sm_scale, (window_left, window_right), softcap, deterministic)
    grads = api.eager_attention_varlen_backward(*call, *options, alibi_slopes, dropout_p, seed)
    return tuple(_like(g, t) for g, t in zip(grads, (q, k, v)))


@attention_varlen_backward_op.register_fake
def _(dout, q, k, v, *rest):
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _varlen_setup(ctx, inputs, output):
    q, k, v, cu_q, cu_k, max_q, max_k, causal, sm_scale, wl, wr, softcap, deterministic, alibi, dropout_p, seed = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_q, cu_k, alibi, seed)
    ctx.sizes = (max_q, max_k)
    ctx.options = (causal, sm_scale, wl, wr, softcap, deterministic)
    ctx.dropout_p = dropout_p
    ctx.mark_non_differentiable(lse)


def _varlen_backward(ctx, dout, _dlse):
    q, k, v, out, lse, cu_q, cu_k, alibi, seed = ctx.saved_tensors
    grads = attention_varlen_backward_op(
        dout, q, k, v, out, lse, cu_q, cu_k, *ctx.sizes, *ctx.options, alibi, ctx.dropout_p, seed
    )
    return (*grads, *([None] * 13))


attention_varlen_op.register_autograd(_varlen_backward, setup_context=_varlen_setup)


def compiled_attention_varlen(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    sm_scale,
    window_size,
    softcap,
    deterministic,
    validate,
    alibi_slopes,
    dropout_p,
    *,
    return_lse,
):
    """``attention_varlen()`` as the compiler sees it (``validate`` would read the offsets on
    the host: not while compiling)."""
    if validate:
        raise ValueError("validate=True reads the offsets on the host: validate outside torch.compile")
    wl, wr = _window(window_size)
    p = check_dropout(dropout_p)
    seed = draw_seed(q.device) if p > 0.0 else None
    call = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out, lse = attention_varlen_op(*call, causal, sm_scale, wl, wr, softcap, deterministic, alibi_slopes, p, seed)
    return (out, lse) if return_lse else out


# -- KV cache ------------------------------------------------------------------------------


@torch.library.custom_op("fa2gen::attention_with_kvcache", mutates_args=("k_cache", "v_cache"))
def attention_with_kvcache_op(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    cache_seqlens: Tensor,
    block_table: Tensor | None,
    k: Tensor | None,
    v: Tensor | None,
    causal: bool,
    sm_scale: float | None,
    window_left: int,
    window_right: int,
    softcap: float,
    alibi_slopes: Tensor | None,
) -> tuple[Tensor, Tensor]:
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    out, lse = api.eager_attention_with_kvcache(
        *tensors, causal, sm_scale, (window_left, window_right), softcap, False, alibi_slopes
    )
    return _like(out, q), lse.contiguous()


@attention_with_kvcache_op.register_fake
def _(q, *rest):
    return torch.empty_like(q), q.new_empty((q.shape[0], q.shape[2], q.shape[1]), dtype=torch.float32)


def compiled_attention_with_kvcache(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    k,
    v,
    causal,
    sm_scale,
    window_size,
    softcap,
    validate,
    alibi_slopes,
    *,
    return_lse,
):
    """``attention_with_kvcache()`` as the compiler sees it."""
    if validate:
        raise ValueError("validate=True reads the lengths on the host: validate outside torch.compile")
    wl, wr = _window(window_size)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    out, lse = attention_with_kvcache_op(*tensors, causal, sm_scale, wl, wr, softcap, alibi_slopes)
    return (out, lse) if return_lse else out
