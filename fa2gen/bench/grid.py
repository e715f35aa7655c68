"""Benchmark shapes: the FlashAttention-2 paper's grid, or a user's list."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.problem import TORCH_DTYPES, random_normal

DTYPES = TORCH_DTYPES


@dataclass(frozen=True)
class Case:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool
    dtype: str
    heads_kv: int | None = None
    seqlen_k: int | None = None

    @property
    def kv_heads(self) -> int:
        return self.heads_kv or self.heads

    @property
    def kv_seqlen(self) -> int:
        return self.seqlen_k or self.seqlen

    def flops(self) -> float:
        """Forward FLOPs: 4*B*H*Nq*Nk*D, halved when causal and square."""
        f = 4.0 * self.batch * self.heads * self.seqlen * self.kv_seqlen * self.head_dim
        return f / 2 if self.causal and self.seqlen == self.kv_seqlen else f

    def label(self) -> str:
        kv = "" if self.heads_kv in (None, self.heads) else f" Hkv={self.heads_kv}"
        nk = "" if self.seqlen_k in (None, self.seqlen) else f" Nk={self.seqlen_k}"
        c = "causal" if self.causal else "full"
        return f"{self.dtype} D={self.head_dim} B={self.batch} H={self.heads}{kv} N={self.seqlen}{nk} {c}"


CANONICAL_SEQLENS = (512, 1024, 2048, 4096, 8192, 16384)


def canonical_grid(
    dtypes=("fp16", "bf16"),
    head_dims=(64, 128),
    seqlens=CANONICAL_SEQLENS,
    causals=(False, True),
    tokens: int = 16384,
    hidden: int = 2048,
) -> list[Case]:
    """B*N = ``tokens``, H = ``hidden`` / D, as in the FlashAttention-2 paper."""
    return [
        Case(batch=max(1, tokens // n), heads=hidden // d, seqlen=n, head_dim=d, causal=c, dtype=dt)
        for dt in dtypes
        for d in head_dims
        for c in causals
        for n in seqlens
    ]


def cpu_smoke_grid(dtypes=("fp16",), causals=(False, True)) -> list[Case]:
    """A few small shapes (D=64, N=64 and 128) that finish quickly under Triton's interpreter."""
    return [
        Case(batch=1, heads=2, seqlen=n, head_dim=64, causal=c, dtype=dt)
        for dt in dtypes
        for c in causals
        for n in (64, 128)
    ]


def parse_shapes(text: str, *, dtypes, causals) -> list[Case]:
    """Parse "B,H,N,D[;B,H,N,D...]" (optionally B,H,Hkv,Nq,Nk,D) into cases."""
    cases = []
    for item in filter(None, (s.strip() for s in text.split(";"))):
        try:
            nums = [int(x) for x in item.split(",")]
        except ValueError:
            raise ValueError(f"--shapes: {item!r} is not a list of integers") from None
        if len(nums) == 4:
            b, h, n, d = nums
            hkv, nk = None, None
        elif len(nums) == 6:
            b, h, hkv, n, nk, d = nums
        else:
            raise ValueError(f"--shapes: {item!r} must be B,H,N,D or B,H,Hkv,Nq,Nk,D")
        if min(nums) < 1:
            raise ValueError(f"--shapes: {item!r} has a non-positive size")
        for dt in dtypes:
            for c in causals:
                cases.append(Case(b, h, n, d, c, dt, heads_kv=hkv, seqlen_k=nk))
    if not cases:
        raise ValueError("--shapes: no shapes given")
    return cases


def make_inputs(case: Case, device, *, seed: int = 0):
    """Fresh random normal q, k, v in (B, H, N, D) layout. fp8: drawn in fp32 and rounded to
    e4m3 (unit-variance values sit well inside its range, so their descaling factor is 1)."""
    g = torch.Generator(device=device).manual_seed(seed)
    kw = dict(dtype=DTYPES[case.dtype], device=device, generator=g)
    q = random_normal(case.batch, case.heads, case.seqlen, case.head_dim, **kw)
    k = random_normal(case.batch, case.kv_heads, case.kv_seqlen, case.head_dim, **kw)
    v = random_normal(case.batch, case.kv_heads, case.kv_seqlen, case.head_dim, **kw)
    return q, k, v
