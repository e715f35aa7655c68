"""Attention over a KV cache (decoding and chunked prefill): the decode template's three
kernels launched for one call shape, and the PyTorch reference they are tested against."""

from __future__ import annotations

import dataclasses
import functools

import torch

from .. import compat
from ..generator.cache import interpreting, load_module
from ..generator.descriptors import template_of
from ..generator.descriptors.attn_decode import combine_warps
from ..generator.spec import TuningParams, next_pow2
from . import direct
from .defaults import decode_combine, decode_splits
from .launch import _sm_count, bound, window_extents, zero_counters
from .problem import Problem
from .reference import attention_reference


class CacheLaunch:
    """The launches of one call shape over a cache: the split count, grids and the numbers of
    the call, fixed once; built by ``attention_with_kvcache`` and kept for its calls."""

    __slots__ = (
        "problem",
        "params",
        "spec",
        "kernels",
        "splits",
        "combine_last",
        "grids",
        "fixed",
        "bound",
        "heads_major",
        "_direct",
    )

    def __init__(self, problem: Problem, params: TuningParams, sm_count: int, *, heads_major: bool = False):
        """``heads_major``: q, out and the caches are given as attention()'s (B, H, N, D), not the
        cache layout (B, N, H, D) (``attention_as_cache``); a full cache, no new keys, no pages."""
        if heads_major and (problem.new_keys or problem.page_size):
            raise ValueError("a heads-major cache launch takes a full contiguous cache without new keys")
        self.problem, self.params, self.heads_major = problem, params, heads_major
        self.spec = spec = problem.kernel_spec("decode")
        append, decode, combine = template_of(spec, params).kernels(spec, params)
        self.splits = splits = decode_splits(problem, params, sm_count)
        # the split count is the launch's: whether partials are written, who combines them, and
        # the combine kernel's tile
        self.combine_last = splits > 1 and decode_combine(params, splits) == "last"
        flags = {"SPLIT": int(splits > 1), "COMBINE_LAST": int(self.combine_last)}
        page = {"PAGE_SIZE": problem.page_size} if problem.page_size else {}
        append = dataclasses.replace(append, constexprs={**append.constexprs, **page})
        decode = dataclasses.replace(decode, constexprs={**decode.constexprs, **flags, **page})
        pad = next_pow2(splits)
        warps = combine_warps(pad, spec.head_dim_padded)
        combine = dataclasses.replace(
            combine,
            constexprs={**combine.constexprs, "SPLITS_PAD": pad},
            options={**combine.options, "num_warps": warps},
        )
        self.kernels = (append, decode, combine)
        b, hkv, sq, hq = problem.batch, problem.heads_kv, problem.seqlen_q, problem.heads_q
        rows = sq * problem.group
        self.grids = (
            (b * hkv, -(-problem.new_keys // append.constexprs["APPEND_ROWS"])),
            (b * hkv, -(-rows // params.block_m), splits),
            (b * sq * hq,),
        )
        left, right = window_extents(problem)
        self.fixed = dict(
            Hq=hq,
            Hkv=hkv,
            group=problem.group,
            Sq=sq,
            Sk_new=problem.new_keys,
            batch=b,
            num_splits=splits,
            rows=b * sq * hq,
            sm_scale=problem.sm_scale,
            softcap=problem.softcap,
            win_left=left,
            win_right=right,
        )
        self.bound = None
        self._direct = {}

    def run(
        self, q, k_cache, v_cache, cache_seqlens, block_table, k, v, out, lse, *, alibi=None, compile_only=False
    ) -> None:
        """Append ``k``/``v`` (when the problem has new keys), then attend: ``out`` (B, Sq, Hq,
        D) and ``lse`` (B, Hq, Sq) fp32 are written. ``alibi``: ALiBi's (slopes, batch stride).
        ``compile_only`` compiles the kernels this call would launch, without launching them
        (the tuner's compile workers)."""
        if self.bound is None:
            if interpreting():
                compat.patch_interpreter()
            module = load_module(self.spec, self.params)
            # (B, H, N, D) tensors' strides read as the (B, N, H, D) views' would be
            dims = dict.fromkeys(("Q", "O", "K", "V"), (0, 2, 1, 3)) if self.heads_major else None
            self.bound = tuple(bound(self.spec, kernel, module, self.fixed, False, dims) for kernel in self.kernels)
        given = {"Q": q, "K": k_cache, "V": v_cache, "O": out, "LSE": lse, "CACHE_SEQLENS": cache_seqlens}
        if block_table is not None:
            given["BLOCK_TABLE"] = block_table
        if alibi is not None:
            given["ALIBI"], given["stride_ab"] = alibi
        launch = functools.partial(direct.launch, self._direct)
        if compile_only:
            launch = _warmup
        (append_fn, append_args, append_opts), (fn, args, opts), (combine_fn, combine_args, combine_opts) = self.bound
        if self.problem.new_keys:
            given["K_NEW"], given["V_NEW"] = k, v
            launch("append_kv", append_fn, self.grids[0], append_args(given), append_opts)
        if self.splits > 1:  # the splits' outputs and LSEs, in one allocation
            p = self.problem
            rows = self.splits * p.batch * p.seqlen_q * p.heads_q
            parts = torch.empty(rows * (p.head_dim + 1), dtype=torch.float32, device=q.device)
            given["O_PART"], given["LSE_PART"] = parts[: rows * p.head_dim], parts[rows * p.head_dim :]
        else:  # (the kernel writes the output itself and never reads these)
            given["LSE_PART"] = given["O_PART"] = lse
        if self.combine_last:  # a count of finished splits per tile
            tiles = self.grids[1][0] * self.grids[1][1]
            given["COUNTS"] = zero_counters(q.device, tiles) if q.is_cuda else torch.zeros(tiles, dtype=torch.int32)
        else:  # (never read)
            given["COUNTS"] = cache_seqlens
        launch("attn_decode", fn, self.grids[1], args(given), opts)
        if self.splits > 1 and not self.combine_last:
            launch("combine", combine_fn, self.grids[2], combine_args(given), combine_opts)


def _warmup(name, kernel, grid, args, options) -> None:
    direct.warmup(kernel, grid, args, options)


def kvcache_reference(
    q, k_cache, v_cache, cache_seqlens, block_table, k, v, problem: Problem, *, compute_dtype=torch.float32, alibi=None
):
    """(out (B, Sq, Hq, D), lse (B, Hq, Sq) fp32) by PyTorch, one sequence at a time, with the
    new keys appended into copies of the caches, which are returned too: (out, lse, k_cache,
    v_cache). Reads the lengths and the table (a host sync). ``alibi``: ALiBi's slopes."""
    k_cache, v_cache = k_cache.clone(), v_cache.clone()
    out = torch.zeros_like(q)
    lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("-inf"), device=q.device)
    page = problem.page_size
    for b, n in enumerate(cache_seqlens.tolist()):
        total = n + problem.new_keys
        if page:
            pages = block_table[b, : -(-total // page)].long()
            keys, values = (c[pages].flatten(0, 1) for c in (k_cache, v_cache))  # views of copies
        else:
            keys, values = k_cache[b], v_cache[b]
        if problem.new_keys:
            keys[n:total], values[n:total] = k[b], v[b]
            if page:  # write the appended rows back through the table
                for j in range(n, total):
                    k_cache[block_table[b, j // page], j % page] = keys[j]
                    v_cache[block_table[b, j // page], j % page] = values[j]
        if total == 0:
            continue
        one = dataclasses.replace(problem, batch=1, seqlen_k=total, new_keys=0, page_size=0)
        o, s = attention_reference(
            q[b : b + 1].transpose(1, 2),
            keys[None, :total].transpose(1, 2),
            values[None, :total].transpose(1, 2),
            one,
            compute_dtype=compute_dtype,
            alibi=None if alibi is None else alibi[b] if alibi.dim() == 2 else alibi,
        )
        out[b] = o[0].transpose(0, 1)
        lse[b] = s[0]
    return out, lse, k_cache, v_cache


def cache_forward(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table,
    k,
    v,
    problem,
    params,
    *,
    launch=None,
    out=None,
    lse=None,
    alibi=None,
):
    """Run the decode kernels (``launch``, or one built here); returns (out, lse). ``out``/``lse``
    may be given preallocated (tests poison them with NaN first)."""
    out = torch.empty_like(q) if out is None else out
    if lse is None:
        lse = torch.empty((problem.batch, problem.heads_q, problem.seqlen_q), dtype=torch.float32, device=q.device)
    if problem.batch == 0:
        return out, lse
    launch = launch or CacheLaunch(problem, params, _sm_count(q.device))
    launch.run(q, k_cache, v_cache, cache_seqlens, block_table, k, v, out, lse, alibi=alibi)
    return out, lse


# attention() calls without a gradient that the decode kernels serve instead of the dense
# forward, their rows (up to 16 tokens x the GQA group) in one tile: one token from 8k keys and
# up to 16 from 32k at any batch, and from 512 keys where the batch's k/v heads make 64 tiles or
# more and each k/v head serves several query heads (the dense forward then reads each K/V
# block once per query head). On the H100 (bf16, D=128, 32 query heads over 8, attention() on
# (B, H, N, D), one run), a call through the decode kernels against the dense forward:
# - batches 8 and 64, 512-8k keys, 1 and 16 tokens: 0.65-0.77x the time in an eager loop,
#   0.61-1.00x as graph replays;
# - batch 1, one token, 8k keys: 0.67x eager, 0.22x replayed;
# - batch 1, 16 tokens, 8k keys: 1.14x eager (the decode call's host time, 85 us, over the
#   kernels' 27), 0.40x replayed; so few tokens at a small batch wait for 32k keys;
# - batch 1 below 8k keys: 1.08-1.55x eager, the dense forward's host path being shorter.
AS_CACHE_ONE_TOKEN = 8192
AS_CACHE_FEW_TOKENS = 32768
AS_CACHE_SHORT_KEYS = 512
AS_CACHE_SHORT_TILES = 64


def serves_as_cache(problem: Problem) -> bool:
    """Whether an attention() call without a gradient runs the decode kernels, its k and v a
    full cache (``attention_as_cache``)."""
    # (asked on every CUDA call of attention(): the cheapest test first)
    if problem.seqlen_q > 16 or problem.varlen or problem.seqlen_q * problem.group > 128:
        return False
    if problem.dropout or problem.kernel_spec().fp8:  # (the decode kernels have no dropout)
        return False
    if problem.seqlen_k >= (AS_CACHE_ONE_TOKEN if problem.seqlen_q == 1 else AS_CACHE_FEW_TOKENS):
        return True
    return (
        problem.seqlen_k >= AS_CACHE_SHORT_KEYS
        and problem.group > 1
        and problem.batch * problem.heads_kv >= AS_CACHE_SHORT_TILES
    )


_FULL: dict = {}


def full_lengths(batch: int, keys: int, device) -> torch.Tensor:
    """(batch,) int32 of ``keys``: every sequence's cache full. Kept per shape and device
    (read only; made outside any graph capture on first use)."""
    key = (batch, keys, device)
    lengths = _FULL.get(key)
    if lengths is None:
        if len(_FULL) >= 1024:
            _FULL.clear()
        lengths = _FULL[key] = torch.full((batch,), keys, dtype=torch.int32, device=device)
    return lengths


def attention_as_cache(q, k, v, launch: CacheLaunch, *, alibi=None):
    """attention()'s (out (B, Hq, Nq, D), lse (B, Hq, Nq)) by the decode kernels of a
    ``heads_major`` launch: q (B, Hq, Nq, D) and k, v (B, Hkv, Nk, D) read as the cache layout
    (B, N, H, D) through their strides, without views or copies (host time: a call of a few
    tokens is short)."""
    p = launch.problem
    lengths = full_lengths(p.batch, p.seqlen_k, q.device)
    return cache_forward(q, k, v, lengths, None, None, None, p, launch.params, launch=launch, alibi=alibi)
