"""fp8 (e4m3) inputs: their descaling factors, and the transposed copy of V the kernel reads.

An fp8 tensor holds x / descale. The descaling factors are fp32 tensors, one per input:
a single value (per tensor) or one per (batch, head), as FlashAttention-3 takes them.
Their values are not inspected (that would synchronise with the GPU): a zero, negative or
non-finite factor gives a correspondingly wrong answer, as it would anywhere else.
"""

from __future__ import annotations

import threading

import torch

from .problem import Problem

FP8_TORCH = torch.float8_e4m3fn

_ONES: dict[torch.device, torch.Tensor] = {}
_ones_lock = threading.Lock()

# (tensor, stride over batch, stride over heads): what the kernel takes for one factor.
Descale = tuple[torch.Tensor, int, int]


def _one(device: torch.device) -> torch.Tensor:
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


def transposed_v(v: torch.Tensor) -> torch.Tensor:
    """V as (B, Hkv, D, Nk), each row padded to a 16-byte multiple so that tensor descriptors
    can address it: sm90's fp8 matmul reads P @ V's V contiguous along keys. One extra copy of
    V per call (a memory pass over Nk * D bytes per head)."""
    b, h, n, d = v.shape
    padded = -(-n // 16) * 16
    vt = torch.empty((b, h, d, padded), dtype=v.dtype, device=v.device)[..., :n]
    vt.copy_(v.transpose(-1, -2))
    return vt


def dequantized(t: torch.Tensor, descale: Descale) -> torch.Tensor:
    """fp32 values an fp8 tensor stands for: t * descale, per (batch, head)."""
    factor, sb, sh = descale
    x = t.float()
    if sb == 0 and sh == 0:
        return x * factor.float()
    return x * factor.float()[:, :, None, None]
