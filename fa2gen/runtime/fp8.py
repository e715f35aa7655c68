"""fp8 (e4m3) inputs: their descaling factors, and the transposed copy of V the kernel reads.

An fp8 tensor holds x / descale. The descaling factors are fp32 tensors, one per input:
a single value (per tensor) or one per (batch, head), as FlashAttention-3 takes them.
Their values are not inspected (that would synchronise with the GPU): a zero, negative or
non-finite factor gives a correspondingly wrong answer, as it would anywhere else.
"""

from __future__ import annotations

import functools
import threading

import torch

from .. import compat
from .direct import launch
from .problem import Problem

FP8_TORCH = torch.float8_e4m3fn

_ONES: dict[torch.device, torch.Tensor] = {}
_ones_lock = threading.Lock()

# (tensor, stride over batch, stride over heads): what the kernel takes for one factor.
Descale = tuple[torch.Tensor, int, int]


def _one(device: torch.device) -> torch.Tensor:
    if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
        # a tensor first made during capture would be filled only on replay
        return torch.ones((), dtype=torch.float32, device=device)
    t = _ONES.get(device)
    if t is None:
        with _ones_lock:
            t = _ONES.setdefault(device, torch.ones((), dtype=torch.float32, device=device))
    return t


def _descale(name: str, t, problem: Problem, heads: int, device: torch.device, *, group: int = 1) -> Descale:
    if t is None:
        return _one(device), 0, 0
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor or None, got {type(t).__name__}")
    if t.dtype != torch.float32:
        raise TypeError(f"{name} must be float32, got {t.dtype}")
    if t.device != device:
        raise ValueError(f"{name} is on {t.device} but q is on {device}")
    if t.numel() == 1 and t.dim() <= 1:
        return t, 0, 0
    shape = (problem.batch, heads)
    if group > 1 and tuple(t.shape) == (problem.batch, heads // group):
        # FlashAttention-3's layout: q's factors per k/v head, shared by the heads of a group
        t = t.repeat_interleave(group, dim=1)
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} must hold one value or one per (batch, head), shape {shape}; got {tuple(t.shape)}")
    if t.stride(0) == 0 and t.stride(1) == 0:  # one value expanded to (B, H): a per-tensor factor
        return t[0, 0], 0, 0
    return t, t.stride(0), t.stride(1)


def check_descales(problem: Problem, device: torch.device, descale_q, descale_k, descale_v) -> tuple:
    """Validate the three factors of an fp8 call; returns a Descale for each (None -> 1)."""
    return (
        _descale("descale_q", descale_q, problem, problem.heads_q, device, group=problem.group),
        _descale("descale_k", descale_k, problem, problem.heads_kv, device),
        _descale("descale_v", descale_v, problem, problem.heads_kv, device),
    )


def no_descales(descale_q, descale_k, descale_v, dtype: torch.dtype) -> None:
    for name, t in (("descale_q", descale_q), ("descale_k", descale_k), ("descale_v", descale_v)):
        if t is not None:
            raise ValueError(f"{name} applies to fp8 inputs only; q is {dtype}")


@functools.lru_cache(maxsize=1)
def _transpose_kernel():
    # Built on first use, so that TRITON_INTERPRET set after fa2gen is imported still applies.
    import triton
    import triton.language as tl

    @triton.jit
    def transpose(
        V,
        VT,
        Hkv,
        N,
        PADDED,
        stride_vb,
        stride_vh,
        stride_vn,
        stride_tb,
        stride_th,
        stride_td,
        D: tl.constexpr,
        D_PAD: tl.constexpr,
        BLOCK: tl.constexpr,
        KEY_ORDER: tl.constexpr,
    ):
        # One (BLOCK keys x D) tile of one (batch, head) in, its transpose out; the compiler
        # routes it through shared memory so that both sides stay coalesced. KEY_ORDER: column
        # 4q + 2a + b of each 16-key group gets key 8a + 2q + b, and the columns from N to
        # PADDED get zeros. The permutation picks which rows are loaded (each row is one
        # contiguous load either way) so that the stores stay in plain order: permuting the
        # stores' addresses instead made the copy 20x slower on an H200.
        bh = tl.program_id(0)  # the first grid axis: batch * heads may pass 65535
        pid_n = tl.program_id(1)
        b = (bh // Hkv).to(tl.int64)
        h = (bh % Hkv).to(tl.int64)
        columns = pid_n * BLOCK + tl.arange(0, BLOCK)
        if KEY_ORDER:
            c = columns % 16
            keys = columns - c + (c % 4) // 2 * 8 + c // 4 * 2 + c % 2
            written = PADDED
        else:
            keys = columns
            written = N
        cols = tl.arange(0, D_PAD)
        x = tl.load(
            V + b * stride_vb + h * stride_vh + keys.to(tl.int64)[:, None] * stride_vn + cols[None, :],
            mask=(keys[:, None] < N) & (cols[None, :] < D),
            other=0.0,
        )
        ok = (columns[:, None] < written) & (cols[None, :] < D)
        tl.store(
            VT + b * stride_tb + h * stride_th + cols[:, None] * stride_td + columns[None, :],
            tl.trans(x),
            mask=tl.trans(ok),
        )

    return transpose


_TRANSPOSE_BLOCK = 64


def transposed_v(v: torch.Tensor, *, key_order: bool = False, kept: dict | None = None) -> torch.Tensor:
    """V as (B, Hkv, D, Nk) (with ``key_order``, see below), each row padded to a 16-byte
    multiple so that tensor descriptors can address it: sm90's fp8 matmul reads P @ V's V
    contiguous along keys. One extra pass
    over V per call (Nk * D bytes per head read and written), by a tiled Triton transpose:
    PyTorch's own strided copy of fp8 ran at 160 GB/s on an H200, 207 us at B=4 H=16 N=4096
    D=128, a fifth of the attention's time.

    ``key_order``: the keys of each 16-key group in the order the Gluon forward's P holds them
    (key 8a + 2q + b at column 4q + 2a + b), and (B, Hkv, D, Nk rounded up to 16) with zeros
    past Nk, since a key of the last group may land there.

    ``kept``: a kept launch's dict of direct launchers (``runtime.direct``), where the copy's
    launcher is kept after its first launch, so that later calls skip Triton's per-call
    dispatch for the copy as they do for the attention kernel."""
    b, h, n, d = v.shape
    padded = -(-n // 16) * 16
    vt = torch.empty((b, h, d, padded), dtype=v.dtype, device=v.device)
    if not key_order:
        vt = vt[..., :n]
    if b * h * n == 0:
        return vt
    d_pad = max(16, 1 << (d - 1).bit_length())
    grid = (b * h, -(-padded // _TRANSPOSE_BLOCK))
    args = [v, vt, h, n, padded, *v.stride()[:3], *vt.stride()[:3]]
    options = dict(D=d, D_PAD=d_pad, BLOCK=_TRANSPOSE_BLOCK, KEY_ORDER=key_order)
    if kept is None:
        _transpose_kernel()[grid](*args, **compat.codegen(options))
    else:  # the grid and the int arguments follow the call shape, as the kept launch's do
        launch(kept, ("transpose", key_order), _transpose_kernel(), grid, args, options)
    return vt


def dequantized(t: torch.Tensor, descale: Descale) -> torch.Tensor:
    """fp32 values an fp8 tensor stands for: t * descale, per (batch, head)."""
    factor, sb, sh = descale
    x = t.float()
    if sb == 0 and sh == 0:
        return x * factor.float()
    return x * factor.float()[:, :, None, None]
