"""Shared test utilities: random inputs and the poisoned-output forward check."""

from __future__ import annotations

import torch

from fa2gen.bench.correctness import check_forward
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem


def rand_qkv(B, Hq, Hkv, Nq, Nk, D, dtype=torch.float16, device="cpu", seed=0, layout="bhnd"):
    """Fresh random normal inputs; layout "bnhd" gives (B, N, H, D) storage viewed as (B, H, N, D)."""
    g = torch.Generator(device=device).manual_seed(seed)

    def make(H, N):
        if layout == "bnhd":
            return torch.randn(B, N, H, D, generator=g, device=device, dtype=torch.float32).to(dtype).transpose(1, 2)
        return torch.randn(B, H, N, D, generator=g, device=device, dtype=torch.float32).to(dtype)

    return make(Hq, Nq), make(Hkv, Nk), make(Hkv, Nk)


def run_and_check(q, k, v, params, **kw):
    """Run one variant on NaN-poisoned outputs and judge it by flash-attention's rule."""
    problem = make_problem(q, k, v, **kw)
    out = torch.full_like(q, float("nan"))
    lse = torch.full((problem.batch, problem.heads_q, problem.seqlen_q), float("nan"), device=q.device)
    forward(q, k, v, problem, params, out=out, lse=lse)
    verdict = check_forward(q, k, v, problem, out, lse)
    return verdict, out, lse
