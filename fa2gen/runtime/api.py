"""The public entry point: fa2gen.attention()."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import threading
import warnings

import torch

from ..generator.cache import interpreting
from .autograd import differentiable, kept_backward, run_backward
from .backward import BackwardLaunch
from .device import cuda_device_info
from .dispatch import cached_launch, remember_launch, select_params
from .dropout import check_dropout, draw_seed
from .fp8 import FP8_TORCH, check_descales, dequantized, no_descales
from .kvcache import (
    CacheLaunch,
    attention_as_cache,
    cache_forward,
    kvcache_reference,
    serves_as_cache,
)
from .launch import Launch, _sm_count, forward
from .problem import cache_problem, check_alibi, make_kvcache_problem, make_problem, make_varlen_problem
from .reference import attention_reference
from .varlen import VarlenAttention, varlen_backward, varlen_forward, varlen_reference

_warned_cpu = False


@dataclasses.dataclass(frozen=True)
class _Varlen:
    """A packed-batch call shape's forward launch, and its backward's, made on first need."""

    problem: object
    launch: Launch
    backward: dict  # {deterministic: BackwardLaunch}
    device: object  # its DeviceInfo (None: the interpreter)

    def backward_launch(self, deterministic: bool) -> BackwardLaunch:
        """The backward's launch; ``deterministic`` (or torch.use_deterministic_algorithms):
        one without atomics."""
        return kept_backward(self.backward, self.problem, self.device, deterministic)


@dataclasses.dataclass(frozen=True)
class _AsCache:
    """An attention() call shape the decode kernels run: its problem and their launch."""

    problem: object
    launch: CacheLaunch


def attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
    descale_q: torch.Tensor | None = None,
    descale_k: torch.Tensor | None = None,
    descale_v: torch.Tensor | None = None,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
):
    """Exact softmax attention, FlashAttention-2 style, with a tuned generated kernel.

    q: (B, Hq, Nq, D); k, v: (B, Hkv, Nk, D) with Hq % Hkv == 0 (MQA/GQA). Any strides
    with a contiguous last dim. fp16 or bf16; D a multiple of 8 in [16, 256]. Or fp8
    (torch.float8_e4m3fn, forward only, sm89+ or the interpreter): the output is bf16.
    causal: bottom-right aligned (query i sees keys j <= i + Nk - Nq).
    sm_scale: score scale, default 1/sqrt(D).
    window_size: (left, right) sliding window as in flash-attention; -1 = unbounded.
    softcap: if > 0, scores become softcap * tanh(scores / softcap).
    return_lse: also return the log-sum-exp of the scaled scores, (B, Hq, Nq) fp32 (not
        differentiable).
    deterministic: require bit-identical gradients across runs: the backward then computes
        dQ in its own kernel, never with atomics, whatever the tuned config says. Also
        implied by torch.use_deterministic_algorithms(True).
    descale_q, descale_k, descale_v: fp8 inputs only. An fp8 tensor holds x / descale; each
        factor is a float32 tensor of one value (per tensor) or one per (batch, head): (B, Hq)
        for q (or (B, Hkv), shared by each GQA group), (B, Hkv) for k and v. None means 1.
        fp8 trades accuracy for speed: P is rounded to e4m3 for the P @ V matmul, as in
        FlashAttention-3 (docs/fp8.md has the measured error).
    alibi_slopes: ALiBi, float32 (Hq,) or (B, Hq): each score gets -slope * |j - (i + Nk - Nq)|
        (after the softcap), as flash-attention's alibi_slopes. fp16 and bf16; runs the Triton
        template with its default config (no tuned entries yet).
    dropout_p: drop each attention probability with this chance (in [0, 1)), the kept ones
        scaled by 1 / (1 - dropout_p), as flash-attention's dropout_p (0 for evaluation). The
        mask comes from Philox under a seed drawn per call from torch's generator of q's
        device (``torch.manual_seed`` repeats it); the backward draws the same mask again
        (``fa2gen.runtime.dropout``). fp16 and bf16; the Triton templates with their default
        configs. The CPU path without the interpreter uses torch's dropout instead.

    Differentiable in q, k and v for fp16 and bf16 (generated backward kernels; the forward
    keeps only O and the log-sum-exp).

    A call without a gradient (fp16, bf16) of one query token over 8k keys or more, of up to 16
    over 32k or more, or of up to 16 over 512 or more where k and v have fewer heads than q and
    batch x k/v heads is 64 or more, runs the decode kernels of ``attention_with_kvcache``,
    whose tiles share each K/V load among a k/v head's query heads and whose programs split the
    keys, rather than the dense forward (``runtime.kvcache.serves_as_cache``).

    Under ``torch.compile`` the call is one custom operator (``fa2gen::attention``, with its
    backward ``fa2gen::attention_backward``: ``runtime.ops``), which the compiler does not trace
    into.

    Rows that see no key return zeros (lse = -inf). Returns out, or (out, lse).
    """
    _check_flags(return_lse=return_lse, deterministic=deterministic)
    descales = (descale_q, descale_k, descale_v)
    if torch.compiler.is_compiling():
        from .ops import compiled_attention

        options = (causal, sm_scale, window_size, softcap, deterministic, descales, alibi_slopes, dropout_p)
        return compiled_attention(q, k, v, *options, return_lse=return_lse)
    out, lse = eager_attention(
        q, k, v, causal, sm_scale, window_size, softcap, deterministic, descales, alibi_slopes, dropout_p
    )
    return (out, lse) if return_lse else out


def eager_attention(
    q, k, v, causal, sm_scale, window_size, softcap, deterministic, descales, alibi_slopes, dropout_p, seed=None
):
    """``attention()``'s work, (out, lse), through autograd where a gradient is wanted;
    ``seed``: dropout's (None: drawn here)."""
    descale_q, descale_k, descale_v = descales
    extra = (descale_q, descale_k, descale_v, alibi_slopes)
    key = _call_key(q, k, v, causal, sm_scale, window_size, softcap, extra, dropout_p)
    launch = None if key is None else cached_launch(key)
    as_cache = None if key is None or launch is not None else cached_launch(("as-cache", *key))
    if launch is None and as_cache is None:
        problem = make_problem(q, k, v, causal=causal, sm_scale=sm_scale, window_size=window_size, softcap=softcap)
        problem = _with_options(problem, q, alibi_slopes, dropout_p)
        _check_computable(q)
    else:  # an identical call (shapes, strides, dtypes, devices, options) passed validation before
        problem = (launch or as_cache).problem
    alibi = check_alibi(alibi_slopes, problem, q.device)
    dropout = ((draw_seed(q.device) if seed is None else seed), dropout_p) if problem.dropout else None
    if q.dtype == FP8_TORCH:
        return _attention_fp8(q, k, v, problem, launch, key, (descale_q, descale_k, descale_v))
    no_descales(descale_q, descale_k, descale_v, q.dtype)
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if q.is_cuda and not grad and (as_cache is not None or serves_as_cache(problem)):
        # a few query tokens over long keys, no gradient: the decode kernels (runtime.kvcache)
        if as_cache is None and key is not None:  # (a gradient call of this shape kept the dense launch)
            as_cache = cached_launch(("as-cache", *key))
        if as_cache is None:
            info = cuda_device_info(_index(q))
            cache = cache_problem(problem)
            as_cache = _AsCache(
                problem, CacheLaunch(cache, select_params(cache, info, "decode"), info.sm_count, heads_major=True)
            )
            if key is not None:
                remember_launch(("as-cache", *key), as_cache)
        run = functools.partial(attention_as_cache, q, k, v, as_cache.launch, alibi=alibi)
        index = q.device.index
        out, lse = run() if index is None or index == _current_device() else _on_device(index, run)
    elif q.is_cuda:
        launch, other = _cuda_launch(q, problem, launch, key)
        run = functools.partial(forward, q, k, v, problem, launch.params, launch=launch, alibi=alibi, dropout=dropout)
        if other is not None:  # Triton launches on the current device
            run = functools.partial(_on_device, other, run)
        out, lse = differentiable(
            q, k, v, problem, run, deterministic=deterministic, launches=launch.backward, alibi=alibi, dropout=dropout
        )
    elif interpreting():
        params = select_params(problem, None)
        run = functools.partial(forward, q, k, v, problem, params, alibi=alibi, dropout=dropout)
        out, lse = differentiable(q, k, v, problem, run, deterministic=deterministic, alibi=alibi, dropout=dropout)
    else:
        _warn_cpu()
        out, lse = attention_reference(q, k, v, problem, alibi=alibi_slopes, dropout=_torch_dropout(problem, dropout_p))
    return out, lse


def eager_attention_backward(
    dout, q, k, v, out, lse, causal, sm_scale, window_size, softcap, deterministic, alibi_slopes, dropout_p, seed
):
    """(dq, dk, dv) of an ``eager_attention`` call with these options, from its out and lse and
    the output's gradient ``dout`` (``runtime.ops``' backward); ``seed``: the forward's."""
    key = _call_key(q, k, v, causal, sm_scale, window_size, softcap, (None, None, None, alibi_slopes), dropout_p)
    launch = None if key is None else cached_launch(key)
    if launch is None:
        problem = make_problem(q, k, v, causal=causal, sm_scale=sm_scale, window_size=window_size, softcap=softcap)
        problem = _with_options(problem, q, alibi_slopes, dropout_p)
    else:
        problem = launch.problem
    alibi = check_alibi(alibi_slopes, problem, q.device)
    dropout = (seed, dropout_p) if problem.dropout else None
    if q.is_cuda:
        launch, _ = _cuda_launch(q, problem, launch, key)  # (the forward's launch keeps the backward's)
        return run_backward(
            q, k, v, out, lse, dout, problem, deterministic, launch.backward, alibi=alibi, dropout=dropout
        )
    if interpreting():
        return run_backward(q, k, v, out, lse, dout, problem, deterministic, None, alibi=alibi, dropout=dropout)
    if problem.dropout:  # (the CPU reference's mask comes from torch's generator: not drawn again)
        raise NotImplementedError("dropout_p: the CPU reference has no backward for dropout; set TRITON_INTERPRET=1")
    leaves = [t.detach().requires_grad_() for t in (q, k, v)]
    with torch.enable_grad():
        ref, _ = attention_reference(*leaves, problem, alibi=alibi_slopes)
        return torch.autograd.grad(ref, leaves, dout)


def attention_varlen(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    cu_seqlens_k: torch.Tensor,
    max_seqlen_q: int,
    max_seqlen_k: int,
    *,
    causal: bool = False,
    sm_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    deterministic: bool = False,
    validate: bool = False,
    alibi_slopes: torch.Tensor | None = None,
    dropout_p: float = 0.0,
):
    """Attention over a packed batch of sequences of their own lengths (flash-attention's
    ``flash_attn_varlen_func`` layout).

    q: (total_q, Hq, D); k, v: (total_k, Hkv, D), fp16 or bf16, any strides with a
    contiguous last dim. cu_seqlens_q, cu_seqlens_k: int32 (B + 1,) offsets on q's device;
    sequence b is rows cu_seqlens[b] to cu_seqlens[b + 1] and attends to its own keys only.
    Sequences of length 0 are allowed. max_seqlen_q, max_seqlen_k: the longest sequences'
    lengths (ints, so the call never reads the offsets: no host sync, CUDA graphs and
    torch.compile stay possible).
    The offsets are trusted: they must start at 0, never decrease, end at total_q and
    total_k, and no sequence may be longer than its max_seqlen; otherwise rows are left
    unwritten or read out of their sequence. ``validate=True`` checks this first (one host
    sync) and raises ValueError naming the argument.
    alibi_slopes: ALiBi's slopes, float32 (Hq,) or (B, Hq) (one row per sequence), as in
    ``attention()``. dropout_p: as in ``attention()``; a packed batch's mask streams are its
    query heads, its rows the packed query rows (``fa2gen.runtime.dropout.problem_mask``).
    causal (bottom-right aligned within each sequence), sm_scale, window_size and softcap as
    in ``attention()``; deterministic: bit-identical gradients across runs, as in
    ``attention()`` (a backward that adds dQ with atomics computes it in its own kernel
    instead). Differentiable in q, k and v (generated backward kernels).
    Under ``torch.compile``: the custom operator ``fa2gen::attention_varlen`` (``runtime.ops``).
    Returns out (total_q, Hq, D), or (out, lse) with lse (Hq, total_q) fp32.
    """
    _check_flags(return_lse=return_lse, deterministic=deterministic)
    options = (causal, sm_scale, window_size, softcap, deterministic, validate, alibi_slopes, dropout_p)
    if torch.compiler.is_compiling():
        from .ops import compiled_attention_varlen

        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
        return compiled_attention_varlen(*args, *options, return_lse=return_lse)
    out, lse = eager_attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, *options)
    return (out, lse) if return_lse else out


def _kept_varlen(
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
    validate,
    alibi_slopes,
    dropout_p,
):
    """(the call shape's kept ``_Varlen``, or None on the CPU reference path, and its problem)
    of a packed call: validated and made on the first call of a layout, found after."""
    key = None
    if validate is False and max_seqlen_q.__class__ is int and max_seqlen_k.__class__ is int:
        options = _options_key(causal, sm_scale, window_size, softcap, dropout_p)
        if options is not None:
            extra = (q, k, v, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
            key = _tensors_key(extra, ("varlen", max_seqlen_q, max_seqlen_k, *options))
    kept = None if key is None else cached_launch(key)
    if kept is None:
        problem = make_varlen_problem(
            q,
            k,
            v,
            cu_seqlens_q,
            cu_seqlens_k,
            max_seqlen_q,
            max_seqlen_k,
            causal=causal,
            sm_scale=sm_scale,
            window_size=window_size,
            softcap=softcap,
            validate=validate,
        )
        problem = _with_options(problem, q, alibi_slopes, dropout_p)
        _check_computable(q)
    else:  # an identical call (shapes, strides, dtypes, devices, options) passed validation before
        problem = kept.problem
    if kept is None and (q.is_cuda or interpreting()):
        # the call shape's launches, kept for its next calls (CUDA)
        index = _index(q) if q.is_cuda else None
        info = None if index is None else cuda_device_info(index)
        kept = _Varlen(problem, Launch(problem, select_params(problem, info)), {}, info)
        if key is not None:
            remember_launch(key, kept)
    return kept, problem


def eager_attention_varlen(
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
    seed=None,
):
    """``attention_varlen()``'s work, (out, lse), through autograd where a gradient is wanted;
    ``seed``: dropout's (None: drawn here)."""
    call = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kept, problem = _kept_varlen(*call, causal, sm_scale, window_size, softcap, validate, alibi_slopes, dropout_p)
    alibi = check_alibi(alibi_slopes, problem, q.device)
    dropout = ((draw_seed(q.device) if seed is None else seed), dropout_p) if problem.dropout else None
    grad = torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad)
    if kept is not None:
        index = _index(q) if q.is_cuda else None
        args = (q, k, v, cu_seqlens_q, cu_seqlens_k, problem)
        with contextlib.nullcontext() if index is None else torch.cuda.device(index):  # (Triton launches there)
            if grad:
                backward = kept.backward_launch(deterministic)
                out, lse = VarlenAttention.apply(*args, kept.launch, backward, alibi, dropout)
            else:
                out, lse = varlen_forward(*args, kept.launch.params, launch=kept.launch, alibi=alibi, dropout=dropout)
    else:
        _warn_cpu()
        drop = _torch_dropout(problem, dropout_p)
        out, lse = varlen_reference(q, k, v, cu_seqlens_q, cu_seqlens_k, problem, alibi=alibi_slopes, dropout=drop)
    return out, lse


def eager_attention_varlen_backward(
    dout,
    q,
    k,
    v,
    out,
    lse,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    causal,
    sm_scale,
    window_size,
    softcap,
    deterministic,
    alibi_slopes,
    dropout_p,
    seed,
):
    """(dq, dk, dv) of an ``eager_attention_varlen`` call, from its out and lse and the output's
    gradient ``dout`` (``runtime.ops``' backward); ``seed``: the forward's."""
    call = (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    kept, problem = _kept_varlen(*call, causal, sm_scale, window_size, softcap, False, alibi_slopes, dropout_p)
    if kept is None:
        raise NotImplementedError("attention_varlen's backward runs the generated kernels: CUDA, or TRITON_INTERPRET=1")
    alibi = check_alibi(alibi_slopes, problem, q.device)
    dropout = (seed, dropout_p) if problem.dropout else None
    dout = dout if dout.stride(-1) == 1 else dout.contiguous()
    return varlen_backward(
        q,
        k,
        v,
        out,
        lse,
        dout,
        cu_seqlens_q,
        cu_seqlens_k,
        problem,
        kept.backward_launch(deterministic),
        alibi=alibi,
        dropout=dropout,
    )


def attention_with_kvcache(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    cache_seqlens: torch.Tensor,
    *,
    block_table: torch.Tensor | None = None,
    k: torch.Tensor | None = None,
    v: torch.Tensor | None = None,
    causal: bool = False,
    sm_scale: float | None = None,
    window_size: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
    return_lse: bool = False,
    validate: bool = False,
    alibi_slopes: torch.Tensor | None = None,
):
    """Attention of new query tokens over a KV cache (decoding, chunked prefill), with
    flash-attention's ``flash_attn_with_kvcache`` layouts. Forward only.

    q: (B, Sq, Hq, D). k_cache, v_cache: (B, S, Hkv, D), or a paged cache (num_blocks,
    page_size, Hkv, D) with ``block_table`` (B, max_blocks) int32 naming sequence b's pages
    in order; any page size that is a multiple of 16. cache_seqlens: (B,) int32, the keys
    each sequence holds before this call. k, v: (B, Sk_new, Hkv, D) new keys and values,
    written into the cache at positions cache_seqlens[b] onwards by this call (the caller
    advances cache_seqlens), or None. Sequence b then attends to its first cache_seqlens[b]
    + Sk_new keys. fp16 or bf16; any strides with a contiguous last dim; Hq % Hkv == 0: the
    query heads of one k/v head share each load of K and V.
    causal (bottom-right aligned: query token s sees keys up to s + N_b - Sq), sm_scale,
    window_size, softcap and alibi_slopes ((Hq,) or (B, Hq)) as in ``attention()``.
    The lengths and the table are trusted (no host sync): each length must leave room for the
    new keys and every page of the table must exist, or the kernels read and write outside
    the cache. ``validate=True`` checks them first (one host sync) and raises ValueError.
    Long caches are split across programs so that a small batch fills the GPU, the splits
    then combined through their log-sum-exps.
    Under ``torch.compile``: the custom operator ``fa2gen::attention_with_kvcache``, which
    mutates the caches (``runtime.ops``).
    Returns out (B, Sq, Hq, D), or (out, lse) with lse (B, Hq, Sq) fp32.
    """
    _check_flags(return_lse=return_lse)
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    options = (causal, sm_scale, window_size, softcap, validate, alibi_slopes)
    if torch.compiler.is_compiling():
        from .ops import compiled_attention_with_kvcache

        return compiled_attention_with_kvcache(*tensors, *options, return_lse=return_lse)
    out, lse = eager_attention_with_kvcache(*tensors, *options)
    return (out, lse) if return_lse else out


def eager_attention_with_kvcache(
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
):
    """``attention_with_kvcache()``'s work: (out, lse)."""
    tensors = (q, k_cache, v_cache, cache_seqlens, block_table, k, v)
    key = None if validate is not False else _options_key(causal, sm_scale, window_size, softcap)
    if key is not None:
        key = _tensors_key((*tensors, alibi_slopes), ("kvcache", *key))
    launch = None if key is None else cached_launch(key)
    if launch is None:
        problem = make_kvcache_problem(
            *tensors, causal=causal, sm_scale=sm_scale, window_size=window_size, softcap=softcap, validate=validate
        )
        problem = _with_options(problem, q, alibi_slopes, 0.0)
        _check_computable(q)
    else:  # an identical call (shapes, strides, dtypes, devices, options) passed validation before
        problem = launch.problem
    alibi = check_alibi(alibi_slopes, problem, q.device)
    if torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in (q, k_cache, v_cache, k, v)):
        raise ValueError("attention_with_kvcache is forward only: its tensors must not require grad")
    if q.is_cuda:
        index, current = q.device.index, _current_device()
        if launch is None:
            info = cuda_device_info(current if index is None else index)
            launch = CacheLaunch(problem, select_params(problem, info, "decode"), info.sm_count)
            if key is not None:
                remember_launch(key, launch)
        run = functools.partial(cache_forward, *tensors, problem, launch.params, launch=launch, alibi=alibi)
        out, lse = run() if index is None or index == current else _on_device(index, run)
    elif interpreting():
        params = select_params(problem, None, "decode")
        launch = CacheLaunch(problem, params, _sm_count(q.device))
        out, lse = cache_forward(*tensors, problem, params, launch=launch, alibi=alibi)
    else:
        _warn_cpu()
        out, lse, k_new, v_new = kvcache_reference(*tensors, problem, alibi=alibi_slopes)
        if problem.new_keys:  # the reference appends into copies: write them back
            k_cache.copy_(k_new)
            v_cache.copy_(v_new)
    return out, lse


def _with_options(problem, q, alibi_slopes, dropout_p):
    """``problem`` with the ALiBi and dropout flags of a call's options, checked."""
    fp8 = q.dtype == FP8_TORCH
    if alibi_slopes is not None:
        if fp8:
            raise ValueError("alibi_slopes: ALiBi takes fp16 or bf16 inputs, not fp8")
        problem = dataclasses.replace(problem, alibi=True)
    if check_dropout(dropout_p) > 0.0:
        if fp8:
            raise ValueError("dropout_p: dropout takes fp16 or bf16 inputs, not fp8")
        problem = dataclasses.replace(problem, dropout=True)
    return problem


def _torch_dropout(problem, dropout_p: float):
    """The CPU reference's dropout: a mask from torch's generator (not the kernels' Philox)."""
    if not problem.dropout:
        return None
    rows = problem.total_q if problem.varlen else problem.seqlen_q
    shape = (1 if problem.varlen else problem.batch, problem.heads_q, rows, problem.seqlen_k)
    return torch.rand(shape) >= dropout_p, dropout_p


def _check_computable(q) -> None:
    """Refuse tensors no path computes on: validation accepts the meta device (shapes only, for
    tracing), where the kernels would fail deep inside Triton."""
    if isinstance(q, torch.Tensor) and q.device.type == "meta":
        raise ValueError("q is on the meta device, which holds no data: fa2gen computes on CUDA (or CPU) tensors")


def _index(t: torch.Tensor) -> int:
    """A CUDA tensor's device index (the current device's for a bare "cuda")."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()


def _check_flags(**flags) -> None:
    for name, value in flags.items():
        if not isinstance(value, bool):
            raise TypeError(f"{name} must be a bool, got {type(value).__name__}")


def _attention_fp8(q, k, v, problem, launch, key, descales):
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        raise ValueError("fp8 attention is forward only: q, k and v must not require grad")
    descales = check_descales(problem, q.device, *descales)
    if q.is_cuda:
        launch, other = _cuda_launch(q, problem, launch, key)
        run = functools.partial(forward, q, k, v, problem, launch.params, launch=launch, descales=descales)
        out, lse = run() if other is None else _on_device(other, run)
    elif interpreting():
        out, lse = forward(q, k, v, problem, select_params(problem, None), descales=descales)
    else:
        _warn_cpu()
        real = [dequantized(t, d) for t, d in zip((q, k, v), descales)]
        out, lse = attention_reference(*real, problem)
        out = out.to(torch.bfloat16)
    return out, lse


def _cuda_launch(q, problem, launch, key):
    """The call's Launch, built, checked and remembered on the first call of its key (which
    holds the device), and the device index to switch to, or None when q's is current."""
    index = q.device.index
    current = _current_device()
    if launch is None:
        info = cuda_device_info(current if index is None else index)
        if problem.kernel_spec().fp8 and info.capability < (8, 9):
            raise RuntimeError(f"fp8 attention needs fp8 tensor cores (sm89 or newer); {q.device} is {info.arch}")
        launch = Launch(problem, select_params(problem, info), info.sm_count)
        if key is not None:
            remember_launch(key, launch)
    return launch, None if index is None or index == current else index


def _warn_cpu() -> None:
    global _warned_cpu
    if not _warned_cpu:
        _warned_cpu = True
        warnings.warn(
            "fa2gen.attention on CPU tensors uses a PyTorch reference path "
            "(set TRITON_INTERPRET=1 to run the generated kernel under Triton's interpreter)",
            RuntimeWarning,
            stacklevel=3,
        )


_thread = threading.local()


def _current_device() -> int:
    """torch's current CUDA device, its context made current in this thread on the thread's
    first call: Triton builds host descriptors through the driver, which needs one, and a
    thread that has run no CUDA operation yet has none (8 new threads' first calls failed)."""
    index = torch.cuda.current_device()
    if not getattr(_thread, "ready", False):
        torch.cuda.set_device(index)
        _thread.ready = True
    return index


def _on_device(index, fn, *args, **kwargs):
    with torch.cuda.device(index):
        return fn(*args, **kwargs)


def _call_key(q, k, v, causal, sm_scale, window_size, softcap, extra=(), dropout_p=0.0) -> tuple | None:
    """What makes two CUDA calls launch the same kernel the same way, or None when the
    call cannot be keyed cheaply (then it is validated and dispatched in full). ``extra``:
    the call's other tensors (fp8's factors, ALiBi's slopes) or None for those not given."""
    options = _options_key(causal, sm_scale, window_size, softcap, dropout_p)
    return None if options is None else _tensors_key((q, k, v, *extra), options)


def _options_key(causal, sm_scale, window_size, softcap, dropout_p=0.0) -> tuple | None:
    """A call's options as a key, or None where they are not of the plain types validation
    accepts: it rejects ``causal=1`` or ``window_size=(True, 0)``, which compare equal to
    accepted values, so the types are part of the key."""
    if (
        causal.__class__ is not bool
        or softcap.__class__ is not float
        or (sm_scale is not None and sm_scale.__class__ is not float)
        or window_size.__class__ is not tuple
        or len(window_size) != 2
        or window_size[0].__class__ is not int
        or window_size[1].__class__ is not int
        or dropout_p.__class__ is not float
        or not 0.0 <= dropout_p < 1.0
    ):
        return None
    return (causal, sm_scale, window_size, softcap, dropout_p)


def _tensors_key(tensors, options: tuple) -> tuple | None:
    """The layout (shape, strides, dtype, device; not the values) of a CUDA call's tensors,
    None for those not given, after ``options``; None when the first is not a CUDA tensor or
    any is not a tensor (full validation then says what is wrong)."""
    try:
        if not tensors[0].is_cuda:
            return None
        key = list(options)
        for t in tensors:
            key.append(None if t is None else (t.shape, t.stride(), t.dtype, t.device))
        return tuple(key)
    except (AttributeError, TypeError):
        return None
