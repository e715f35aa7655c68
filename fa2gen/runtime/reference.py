"""Attention written with plain PyTorch ops: the CPU fallback and the tests' oracle.

It materialises the N x N score matrix, so it is for small problems only.
"""

from __future__ import annotations

import torch

from .problem import Problem


def visible(problem: Problem, device) -> torch.Tensor | None:
    """Boolean (Nq, Nk) matrix of visible keys (bottom-right aligned), or None for no mask."""
    if problem.mask == "none":
        return None
    rows = torch.arange(problem.seqlen_q, device=device)[:, None]
    cols = torch.arange(problem.seqlen_k, device=device)[None, :]
    rel = cols - (rows + problem.seqlen_k - problem.seqlen_q)
    keep = torch.ones_like(rel, dtype=torch.bool)
    if problem.window_right >= 0:
        keep &= rel <= problem.window_right
    if problem.window_left >= 0:
        keep &= rel >= -problem.window_left
    return keep


# fp8 kernels keep P at 2**P_SHIFT times exp(s - row max) when they round it to e4m3
# (attn_fwd.py.jinja); the emulation below does the same.
P_SHIFT = 8


def attention_reference(q, k, v, problem: Problem, *, compute_dtype=torch.float32, p_dtype=None):
    """(out, lse) for ``problem``; matmuls in ``compute_dtype``, softmax statistics in fp32
    (fp64 when ``compute_dtype`` is fp64).

    With compute_dtype equal to the input dtype this mimics what PyTorch itself would
    get in that precision (the baseline of flash-attention's error criterion).
    ``p_dtype`` (an fp8 type): emulate the fp8 kernel's one deliberate rounding, P rounded to
    that type for P @ V, kept 2**P_SHIFT above exp(s - row max) as the kernel keeps it.
    """
    stats = torch.promote_types(compute_dtype, torch.float32)
    g = problem.group
    kk = k.repeat_interleave(g, dim=1) if g > 1 else k
    vv = v.repeat_interleave(g, dim=1) if g > 1 else v
    qc, kc, vc = q.to(compute_dtype), kk.to(compute_dtype), vv.to(compute_dtype)
    s = torch.matmul(qc, kc.transpose(-1, -2)).to(stats) * problem.sm_scale
    if problem.softcap > 0:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    keep = visible(problem, q.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    if p_dtype is None:
        p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
        out = torch.matmul(p.to(compute_dtype), vc).to(stats)
    else:
        top = s.amax(dim=-1)
        p = torch.exp(s - torch.where(empty, 0.0, top)[..., None]) * 2.0 ** P_SHIFT
        l_sum = torch.where(empty, 1.0, p.sum(-1))
        out = torch.matmul(p.to(p_dtype).to(compute_dtype), vc).to(stats) / l_sum[..., None]
    out = out.masked_fill(empty[..., None], 0.0)
    return out.to(q.dtype), lse
