"""Attention written with plain PyTorch ops: the CPU fallback and the tests' oracle.

It materialises the N x N score matrix, so it is for small problems only.
"""

from __future__ import annotations

import itertools

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


def alibi_bias(slopes: torch.Tensor, problem: Problem, device) -> torch.Tensor:
    """ALiBi's bias, -slope * |j - (i + Nk - Nq)|, broadcastable over (B, Hq, Nq, Nk); ``slopes``
    (Hq,) or (B, Hq)."""
    rows = torch.arange(problem.seqlen_q, device=device)[:, None]
    cols = torch.arange(problem.seqlen_k, device=device)[None, :]
    distance = (cols - (rows + problem.seqlen_k - problem.seqlen_q)).abs().float()
    per_head = slopes.float().reshape(-1, slopes.shape[-1])
    return -per_head[:, :, None, None] * distance


def attention_reference(q, k, v, problem: Problem, *, compute_dtype=torch.float32, alibi=None, dropout=None):
    """(out, lse) for ``problem``; matmuls in ``compute_dtype``, softmax statistics in fp32
    (fp64 when ``compute_dtype`` is fp64). ``alibi``: ALiBi's slopes, (Hq,) or (B, Hq), added
    after the softcap, as flash-attention does. ``dropout``: (keep, dropout_p), keep a bool mask
    broadcastable over (B, Hq, Nq, Nk): P @ V takes the kept probabilities scaled by
    1 / ``dropout.keep_rate(dropout_p)``; the LSE is the undropped softmax's.

    With compute_dtype equal to the input dtype this mimics what PyTorch itself would
    get in that precision (the baseline of flash-attention's error criterion).
    """
    stats = torch.promote_types(compute_dtype, torch.float32)
    g = problem.group
    kk = k.repeat_interleave(g, dim=1) if g > 1 else k
    vv = v.repeat_interleave(g, dim=1) if g > 1 else v
    qc, kc, vc = q.to(compute_dtype), kk.to(compute_dtype), vv.to(compute_dtype)
    s = torch.matmul(qc, kc.transpose(-1, -2)).to(stats) * problem.sm_scale
    if problem.softcap > 0:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    if alibi is not None:
        s = s + alibi_bias(alibi, problem, q.device).to(stats)
    keep = visible(problem, q.device)
    if keep is not None:
        s = s.masked_fill(~keep, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    p = torch.exp(s - torch.where(empty, 0.0, lse)[..., None])
    if dropout is not None:
        from .dropout import keep_rate

        keep, dropout_p = dropout
        p = torch.where(keep, p / keep_rate(dropout_p), 0.0)
    out = torch.matmul(p.to(compute_dtype), vc).to(stats)
    out = out.masked_fill(empty[..., None], 0.0)
    return out.to(q.dtype), lse


def _scores(s, problem: Problem, device):
    """Scaled scores with softcap and mask applied (s: fp32 q @ k^T before scaling)."""
    s = s * problem.sm_scale
    if problem.softcap > 0:
        s = problem.softcap * torch.tanh(s / problem.softcap)
    keep = visible(problem, device)
    return s if keep is None else s.masked_fill(~keep, float("-inf"))


def _repeat_heads(t: torch.Tensor, g: int) -> torch.Tensor:
    # through uint8: not every PyTorch op has fp8 kernels
    return t.view(torch.uint8).repeat_interleave(g, dim=1).view(t.dtype) if g > 1 else t


def fp8_matmul_nt(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a @ b^T in fp32 for fp8 a (..., M, K) and b (..., N, K), as PyTorch's fp8 GEMM computes
    it on a GPU (torch._scaled_mm, which accumulates as the tensor cores do with fast
    accumulation). Elsewhere PyTorch has no fp8 GEMM: the exact product in fp32."""
    if a.device.type != "cuda":
        return a.float() @ b.float().transpose(-1, -2)
    m, k = a.shape[-2:]
    n = b.shape[-2]
    pad = lambda t, rows: torch.nn.functional.pad(  # noqa: E731  zeros: multiples of 16 both ways
        t.view(torch.uint8), (0, -k % 16, 0, -rows % 16)
    ).view(t.dtype)
    ap, bp = pad(a, m), pad(b, n)
    one = torch.ones((), device=a.device)
    out = torch.empty(*a.shape[:-2], m, n, device=a.device)
    for i in itertools.product(*map(range, a.shape[:-2])):
        out[i] = torch._scaled_mm(
            ap[i], bp[i].t(), scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=True
        )[:m, :n]
    return out


def _factor(descale, group: int) -> torch.Tensor:
    """An fp8 descaling factor as ``fp8.check_descales`` gives it, broadcastable over
    (B, Hq, N, N): a scalar, or per (batch, head) repeated over each GQA group."""
    f, stride_b, stride_h = descale
    if stride_b == 0 and stride_h == 0:
        return f.float().reshape(())
    return f.float().repeat_interleave(group, dim=1)[:, :, None, None]


def attention_fp8(q, k, v, descales, problem: Problem):
    """What PyTorch computes for fp8 inputs with the fp8 kernel's roundings: scores from the
    fp8 tensors by fp8 matmul, P kept 2**P_SHIFT above exp(s - row max) and rounded to e4m3,
    P @ V by fp8 matmul, the factors applied in fp32, the output in bf16. (out, lse)."""
    g = problem.group
    factor_q, factor_k, factor_v = (_factor(d, 1 if i == 0 else g) for i, d in enumerate(descales))
    kk, vv = _repeat_heads(k, g), _repeat_heads(v, g)
    s = _scores(fp8_matmul_nt(q, kk) * factor_q * factor_k, problem, q.device)
    lse = torch.logsumexp(s, dim=-1)
    empty = torch.isinf(lse) & (lse < 0)
    top = s.amax(dim=-1)
    p = torch.exp(s - torch.where(empty, 0.0, top)[..., None]) * 2.0**P_SHIFT
    l_sum = torch.where(empty, 1.0, p.sum(-1))
    out = fp8_matmul_nt(p.to(q.dtype), vv.transpose(-1, -2).contiguous()) * factor_v / l_sum[..., None]
    return out.masked_fill(empty[..., None], 0.0).to(torch.bfloat16), lse
