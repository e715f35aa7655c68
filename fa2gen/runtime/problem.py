"""Validation of attention() arguments into a normalised Problem.

Every public entry point funnels its tensors through ``make_problem`` so that bad
input fails here, with an error naming the argument, before any kernel runs.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import numbers
from dataclasses import dataclass

import torch

from ..generator.spec import HEAD_DIMS, KernelSpec

DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float8_e4m3fn: "fp8e4m3"}
TORCH_DTYPES = {name: dt for dt, name in DTYPE_NAMES.items()}


def random_normal(*shape, dtype: torch.dtype, device, generator=None) -> torch.Tensor:
    """Standard normal values in ``dtype``; fp8 ones are drawn in fp32 and rounded."""
    draw = torch.float32 if dtype.itemsize == 1 else dtype
    return torch.randn(*shape, device=device, dtype=draw, generator=generator).to(dtype)


@dataclass(frozen=True)
class Problem:
    """One attention call's shape and semantics, independent of the tensors' storage."""

    batch: int
    heads_q: int
    heads_kv: int
    seqlen_q: int
    seqlen_k: int
    head_dim: int
    dtype: str
    mask: str  # none | causal | local
    window_left: int  # -1 = unbounded
    window_right: int  # -1 = unbounded
    sm_scale: float
    softcap: float
    # A packed batch (``make_varlen_problem``): seqlen_q and seqlen_k are the longest
    # sequences' lengths, total_q the packed query rows.
    varlen: bool = False
    total_q: int = 0
    # A call over a KV cache (``make_kvcache_problem``): seqlen_k is the keys a sequence's
    # cache holds at most, new_keys the keys the call appends, page_size 0 for a contiguous
    # cache.
    new_keys: int = 0
    page_size: int = 0
    # ALiBi slopes given (``check_alibi``): the kernels add -slope * |j - (i + Nk - Nq)|
    alibi: bool = False
    # dropout_p > 0 given (``runtime.dropout.check_dropout``): the probability and the seed are
    # the call's, passed at launch
    dropout: bool = False

    @property
    def group(self) -> int:
        return self.heads_q // self.heads_kv

    def kernel_spec(self, direction: str = "fwd") -> KernelSpec:
        paged = direction == "decode" and self.page_size > 0
        return _spec(
            direction,
            self.dtype,
            self.head_dim,
            self.mask,
            self.softcap > 0,
            self.varlen,
            paged,
            self.alibi,
            self.dropout,
        )

    def flops(self) -> float:
        """Forward FLOPs by the FlashAttention-2 paper's count (halved when causal and square)."""
        f = 4.0 * self.batch * self.heads_q * self.seqlen_q * self.seqlen_k * self.head_dim
        if self.mask == "causal" and self.seqlen_q == self.seqlen_k:
            f /= 2
        return f


@functools.lru_cache(maxsize=None)
def _spec(
    direction: str,
    dtype: str,
    head_dim: int,
    mask: str,
    softcap: bool,
    varlen: bool,
    paged: bool = False,
    alibi: bool = False,
    dropout: bool = False,
) -> KernelSpec:
    # Specs are immutable and few: build (and validate) each once, not per call.
    return KernelSpec(
        direction=direction,
        dtype=dtype,
        head_dim=head_dim,
        mask=mask,
        softcap=softcap,
        varlen=varlen,
        paged=paged,
        alibi=alibi,
        dropout=dropout,
    )


def _check_tensor(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.layout != torch.strided:  # (a sparse tensor has no strides to check)
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {t.layout}")
    if t.dim() != 4:
        raise ValueError(f"{name} must have 4 dims (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
    if t.dtype not in DTYPE_NAMES:
        raise TypeError(
            f"{name} has dtype {t.dtype}; supported: torch.float16, torch.bfloat16, torch.float8_e4m3fn (forward only)"
        )
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1), got strides {t.stride()}")


def _check_alike(q, k, v, names=("k", "v")) -> None:
    for name, t in zip(names, (k, v)):
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; all inputs must share one device")
        if t.dtype != q.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has {q.dtype}; all inputs must share one dtype")


# The kernel takes scale and softcap as fp32: they must be normal fp32 numbers (or 0).
_FP32_MIN, _FP32_MAX = 1.1754943508222875e-38, 3.4028234663852886e38


def _check_real(name: str, value, *, minimum: float, inclusive: bool) -> float:
    if type(value) is not float and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
        raise TypeError(f"{name} must be a real number, got {type(value).__name__}")
    value = float(value)
    ok = value >= minimum if inclusive else value > minimum
    if not math.isfinite(value) or not ok:
        bound = ">=" if inclusive else ">"
        raise ValueError(f"{name} must be finite and {bound} {minimum}, got {value}")
    if value != 0.0 and not _FP32_MIN <= value <= _FP32_MAX:
        raise ValueError(f"{name} must be representable in fp32 ({_FP32_MIN:.2e} to {_FP32_MAX:.2e}), got {value}")
    return value


def make_problem(q, k, v, *, causal=False, sm_scale=None, window_size=(-1, -1), softcap=0.0) -> Problem:
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_tensor(name, t)
    _check_alike(q, k, v)
    if q.device.type not in ("cuda", "cpu", "meta"):  # meta: shape-only tracing
        raise ValueError(f"q is on unsupported device {q.device}")
    B, Hq, Nq, D = q.shape
    if k.shape[0] != B or v.shape[0] != B:
        raise ValueError(f"batch mismatch: q {B}, k {k.shape[0]}, v {v.shape[0]}")
    if k.shape[3] != D or v.shape[3] != D:
        raise ValueError(f"head_dim mismatch: q {D}, k {k.shape[3]}, v {v.shape[3]}")
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the same shape as k, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Hkv, Nk = k.shape[1], k.shape[2]
    if Hq < 1 or Hkv < 1:
        raise ValueError(f"heads must be >= 1, got q heads {Hq}, k/v heads {Hkv}")
    if Hq % Hkv != 0:
        raise ValueError(f"q heads ({Hq}) must be divisible by k/v heads ({Hkv}) for MQA/GQA")
    if Nq < 1:
        raise ValueError(f"q must have seqlen >= 1, got {Nq}")
    if Nk < 1:
        raise ValueError(f"k must have seqlen >= 1, got {Nk}")
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D} unsupported: must be a multiple of 8 from 16 to 256")
    if q.dtype == torch.float8_e4m3fn and D <= 16:
        raise ValueError(f"head_dim {D} unsupported for fp8: must be 24 or more (fp8 matmuls reduce over 32 columns)")
    options = _options(D, causal, sm_scale, window_size, softcap)
    return Problem(
        batch=B, heads_q=Hq, heads_kv=Hkv, seqlen_q=Nq, seqlen_k=Nk, head_dim=D, dtype=DTYPE_NAMES[q.dtype], **options
    )


def _options(D: int, causal, sm_scale, window_size, softcap) -> dict:
    """A Problem's mask, window, scale and softcap fields from a call's options, checked."""
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be a bool, got {type(causal).__name__}")
    scale = 1.0 / math.sqrt(D) if sm_scale is None else _check_real("sm_scale", sm_scale, minimum=0.0, inclusive=False)
    cap = _check_real("softcap", softcap, minimum=0.0, inclusive=True)
    if not isinstance(window_size, (tuple, list)) or len(window_size) != 2:
        raise TypeError(f"window_size must be a (left, right) pair of ints, got {window_size!r}")
    for i, w in enumerate(window_size):
        if type(w) is not int and (isinstance(w, bool) or not isinstance(w, numbers.Integral)):
            raise TypeError(f"window_size[{i}] must be an int, got {type(w).__name__}")
        if w < -1:
            raise ValueError(f"window_size[{i}] must be >= 0, or -1 for unbounded; got {w}")
    left, right = int(window_size[0]), int(window_size[1])
    if causal:
        right = 0  # flash-attention's convention: causal caps the right extent at the diagonal
    if left == -1 and right == -1:
        mask = "none"
    elif left == -1 and right == 0:
        mask = "causal"
    else:
        mask = "local"
    return dict(mask=mask, window_left=left, window_right=right, sm_scale=scale, softcap=cap)


def _check_packed(name: str, t) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != 3:
        raise ValueError(f"{name} must have 3 dims (total tokens, heads, head_dim), got shape {tuple(t.shape)}")
    if t.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{name} has dtype {t.dtype}; packed batches take torch.float16 or torch.bfloat16")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1), got strides {t.stride()}")


def _check_cu_seqlens(name: str, cu, device) -> None:
    if not isinstance(cu, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(cu).__name__}")
    if cu.dtype != torch.int32 or cu.dim() != 1 or cu.shape[0] < 2:
        raise ValueError(f"{name} must be a 1-D int32 tensor of batch + 1 offsets, got {cu.dtype} {tuple(cu.shape)}")
    if cu.device != device:
        raise ValueError(f"{name} is on {cu.device} but q is on {device}")
    if cu.stride(0) != 1:
        raise ValueError(f"{name} must be contiguous, got stride {cu.stride(0)}")


def _check_max(name: str, value, total: int) -> int:
    if type(value) is not int and (isinstance(value, bool) or not isinstance(value, numbers.Integral)):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    if not 0 <= value <= total:
        raise ValueError(f"{name} must be in [0, {total}] (the packed tokens), got {value}")
    return int(value)


def make_varlen_problem(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    *,
    causal=False,
    sm_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    validate=False,
) -> Problem:
    """A packed batch's Problem: q (total_q, Hq, D), k and v (total_k, Hkv, D), sequence b's
    rows from cu_seqlens[b] to cu_seqlens[b + 1]. Checks shapes, dtypes, devices and strides
    without reading the offsets (no host sync); ``validate`` also reads them and checks that
    they start at 0, never decrease, end at the totals and stay within the max lengths."""
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_packed(name, t)
    _check_alike(q, k, v)
    if tuple(v.shape) != tuple(k.shape):
        raise ValueError(f"v must have the same shape as k, got k {tuple(k.shape)} and v {tuple(v.shape)}")
    Tq, Hq, D = q.shape
    Tk, Hkv = k.shape[0], k.shape[1]
    if k.shape[2] != D:
        raise ValueError(f"head_dim mismatch: q {D}, k {k.shape[2]}")
    if Hq < 1 or Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of k/v heads ({Hkv}), both >= 1")
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D} unsupported: must be a multiple of 8 from 16 to 256")
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device)
    if cu_seqlens_k.shape[0] != cu_seqlens_q.shape[0]:
        raise ValueError(
            f"cu_seqlens_q and cu_seqlens_k must have one offset per sequence plus one, got "
            f"{cu_seqlens_q.shape[0]} and {cu_seqlens_k.shape[0]}"
        )
    max_q = _check_max("max_seqlen_q", max_seqlen_q, Tq)
    max_k = _check_max("max_seqlen_k", max_seqlen_k, Tk)
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    if validate:
        for name, cu, total, longest in (
            ("cu_seqlens_q", cu_seqlens_q, Tq, max_q),
            ("cu_seqlens_k", cu_seqlens_k, Tk, max_k),
        ):
            offsets = cu.tolist()
            lengths = [b - a for a, b in zip(offsets, offsets[1:])]
            if offsets[0] != 0 or offsets[-1] != total or min(lengths) < 0:
                raise ValueError(f"{name} must start at 0, never decrease and end at {total}, got {offsets}")
            if max(lengths) > longest:
                raise ValueError(f"{name} holds a sequence of {max(lengths)} rows, more than its max_seqlen {longest}")
    return Problem(
        batch=cu_seqlens_q.shape[0] - 1,
        heads_q=Hq,
        heads_kv=Hkv,
        seqlen_q=max_q,
        seqlen_k=max_k,
        head_dim=D,
        dtype=DTYPE_NAMES[q.dtype],
        **_options(D, causal, sm_scale, window_size, softcap),
        varlen=True,
        total_q=Tq,
    )


def _check_cache_tensor(name: str, t, dims: int, what: str) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != dims:
        raise ValueError(f"{name} must have {dims} dims ({what}), got shape {tuple(t.shape)}")
    if t.dtype not in (torch.float16, torch.bfloat16):
        raise TypeError(f"{name} has dtype {t.dtype}; the KV cache path takes torch.float16 or torch.bfloat16")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (stride(-1) == 1), got strides {t.stride()}")


def _check_index(name: str, t, shape: tuple, device) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype != torch.int32 or tuple(t.shape) != shape:
        raise ValueError(f"{name} must be an int32 tensor of shape {shape}, got {t.dtype} {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim, got strides {t.stride()}")


def make_kvcache_problem(
    q,
    k_cache,
    v_cache,
    cache_seqlens,
    block_table=None,
    k=None,
    v=None,
    *,
    causal=False,
    sm_scale=None,
    window_size=(-1, -1),
    softcap=0.0,
    validate=False,
) -> Problem:
    """A call over a KV cache: q (B, Sq, Hq, D); k_cache, v_cache (B, S, Hkv, D), or pages
    (num_blocks, page_size, Hkv, D) with block_table (B, max_blocks) int32; cache_seqlens (B,)
    int32; new keys k, v (B, Sk_new, Hkv, D) or None. Checks shapes, dtypes, devices and
    strides without reading the lengths or the table (no host sync); ``validate`` also reads
    them: every length in [0, capacity - Sk_new], every page of the table in range."""
    _check_cache_tensor("q", q, 4, "batch, query tokens, heads, head_dim")
    B, Sq, Hq, D = q.shape
    paged = block_table is not None
    layout = "num_blocks, page_size, heads, head_dim" if paged else "batch, keys, heads, head_dim"
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        _check_cache_tensor(name, t, 4, layout)
    _check_alike(q, k_cache, v_cache, ("k_cache", "v_cache"))
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(
            f"v_cache must have the same shape as k_cache, got {tuple(k_cache.shape)} and {tuple(v_cache.shape)}"
        )
    rows, Hkv = k_cache.shape[1], k_cache.shape[2]
    if k_cache.shape[3] != D:
        raise ValueError(f"head_dim mismatch: q {D}, k_cache {k_cache.shape[3]}")
    if Hq < 1 or Hkv < 1 or Hq % Hkv:
        raise ValueError(f"q heads ({Hq}) must be a multiple of the cache's k/v heads ({Hkv}), both >= 1")
    if D not in HEAD_DIMS:
        raise ValueError(f"head_dim {D} unsupported: must be a multiple of 8 from 16 to 256")
    if Sq < 1:
        raise ValueError(f"q must hold at least one query token, got shape {tuple(q.shape)}")
    if paged:
        if rows < 16 or rows % 16:
            raise ValueError(f"the page size (k_cache.shape[1]) must be a multiple of 16, got {rows}")
        if not isinstance(block_table, torch.Tensor) or block_table.dim() != 2 or block_table.shape[0] != B:
            shape = tuple(block_table.shape) if isinstance(block_table, torch.Tensor) else type(block_table).__name__
            raise ValueError(f"block_table must be a (batch={B}, max_blocks) int32 tensor, got {shape}")
        _check_index("block_table", block_table, tuple(block_table.shape), q.device)
        capacity = block_table.shape[1] * rows
    else:
        if k_cache.shape[0] != B:
            raise ValueError(f"k_cache holds {k_cache.shape[0]} sequences but q has batch {B}")
        capacity = rows
    _check_index("cache_seqlens", cache_seqlens, (B,), q.device)
    new = 0
    if (k is None) != (v is None):
        raise ValueError("k and v must be given together (the new keys and values to append), or neither")
    if k is not None:
        for name, t in (("k", k), ("v", v)):
            _check_cache_tensor(name, t, 4, "batch, new keys, heads, head_dim")
        _check_alike(q, k, v)
        if tuple(k.shape) != tuple(v.shape) or k.shape[0] != B or k.shape[2] != Hkv or k.shape[3] != D:
            raise ValueError(
                f"k and v must be (batch={B}, new keys, heads={Hkv}, head_dim={D}), "
                f"got {tuple(k.shape)} and {tuple(v.shape)}"
            )
        new = k.shape[1]
        if new > capacity:
            raise ValueError(f"k appends {new} keys, more than the cache holds ({capacity})")
    if capacity < 1:
        raise ValueError("the cache holds no keys: k_cache has no rows, or block_table no columns")
    if not isinstance(validate, bool):
        raise TypeError(f"validate must be a bool, got {type(validate).__name__}")
    if validate:
        lengths = cache_seqlens.tolist()
        bad = [n for n in lengths if not 0 <= n <= capacity - new]
        if bad:
            raise ValueError(
                f"cache_seqlens must lie in [0, {capacity - new}] (the cache less the new keys), got {bad[0]}"
            )
        if paged and block_table.numel():
            lo, hi = int(block_table.min()), int(block_table.max())
            if lo < 0 or hi >= k_cache.shape[0]:
                raise ValueError(f"block_table holds page {lo if lo < 0 else hi}, outside [0, {k_cache.shape[0]})")
    problem = Problem(
        batch=B,
        heads_q=Hq,
        heads_kv=Hkv,
        seqlen_q=Sq,
        seqlen_k=capacity,
        head_dim=D,
        dtype=DTYPE_NAMES[q.dtype],
        **_options(D, causal, sm_scale, window_size, softcap),
        new_keys=new,
        page_size=rows if paged else 0,
    )
    return cache_problem(problem, new_keys=new, page_size=problem.page_size)


def cache_problem(problem: Problem, *, new_keys: int = 0, page_size: int = 0) -> Problem:
    """``problem`` as the decode kernels take it: ``new_keys`` appended, pages of ``page_size``
    (0: k and v a contiguous cache); one query token's causal mask is none (it sees every key:
    one kernel for both)."""
    if problem.seqlen_q == 1 and problem.mask == "causal":
        problem = dataclasses.replace(problem, mask="none", window_right=-1)
    return dataclasses.replace(problem, new_keys=new_keys, page_size=page_size)


def check_alibi(slopes, problem: Problem, device) -> tuple | None:
    """ALiBi's slopes as the kernels take them, (tensor, batch stride), or None when not given:
    an fp32 tensor of one slope per query head, (Hq,), or per batch and query head, (B, Hq)
    (B: the sequences of a packed batch), on the inputs' device, heads contiguous. Raises
    naming ``alibi_slopes``."""
    if slopes is None:
        return None
    if not isinstance(slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor or None, got {type(slopes).__name__}")
    hq, b = problem.heads_q, problem.batch
    if slopes.dtype != torch.float32 or tuple(slopes.shape) not in ((hq,), (b, hq)):
        raise ValueError(
            f"alibi_slopes must be float32 of shape ({hq},) or ({b}, {hq}), got {slopes.dtype} {tuple(slopes.shape)}"
        )
    if slopes.device != device:
        raise ValueError(f"alibi_slopes is on {slopes.device} but q is on {device}")
    if hq > 1 and slopes.stride(-1) != 1:
        raise ValueError(f"alibi_slopes must have contiguous heads (stride(-1) == 1), got strides {slopes.stride()}")
    return slopes, (slopes.stride(0) if slopes.dim() == 2 else 0)
