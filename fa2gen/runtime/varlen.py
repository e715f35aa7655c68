"""Packed batches (varlen): sequences of their own lengths in one (total, heads, D) tensor."""

from __future__ import annotations

import contextlib

import torch

from .launch import Launch
from .problem import Problem
from .reference import attention_reference


def batch_view(t: torch.Tensor, batch: int) -> torch.Tensor:
    """A packed (total, H, D) tensor as the kernels index it, (batch, H, total, D) with batch
    stride 0: every sequence sees all rows, and the kernel starts at its own first one."""
    return t.permute(1, 0, 2).unsqueeze(0).expand(batch, -1, -1, -1)


def varlen_forward(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    problem: Problem,
    params,
    *,
    out=None,
    lse=None,
    launch: Launch | None = None,
    alibi=None,
    dropout=None,
):
    """(out (total_q, Hq, D), lse (Hq, total_q) fp32) of a packed batch, with no host sync.
    Every query row must lie in a sequence of the offsets (as ``validate`` checks): rows
    outside every sequence are not written. ``out``/``lse`` may be given preallocated (tests
    poison them with NaN first)."""
    out = torch.empty_like(q) if out is None else out
    if lse is None:
        lse = torch.empty((problem.heads_q, problem.total_q), dtype=torch.float32, device=q.device)
    if problem.batch == 0 or problem.seqlen_q == 0:
        return out, lse
    b = problem.batch
    views = [batch_view(t, b) for t in (q, k, v, out)]
    _check_launch(launch, problem)
    (launch or Launch(problem, params)).run(
        *views, lse, cu_seqlens=(cu_seqlens_q, cu_seqlens_k), alibi=alibi, dropout=dropout
    )
    return out, lse


class VarlenAttention(torch.autograd.Function):
    """A packed batch's forward, and its backward through the generated backward kernels (the
    forward keeps only out and the log-sum-exp)."""

    @staticmethod
    def forward(
        ctx, q, k, v, cu_seqlens_q, cu_seqlens_k, problem: Problem, launch: Launch, backward, alibi=None, dropout=None
    ):
        """``launch``: the forward's; ``backward``: the backward's ``BackwardLaunch``."""
        cu = (cu_seqlens_q, cu_seqlens_k)
        out, lse = varlen_forward(q, k, v, *cu, problem, launch.params, launch=launch, alibi=alibi, dropout=dropout)
        ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k)
        ctx.problem, ctx.backward, ctx.alibi, ctx.dropout = problem, backward, alibi, dropout
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse, cu_q, cu_k = ctx.saved_tensors
        dout = dout if dout.stride(-1) == 1 else dout.contiguous()
        grads = varlen_backward(
            q, k, v, out, lse, dout, cu_q, cu_k, ctx.problem, ctx.backward, alibi=ctx.alibi, dropout=ctx.dropout
        )
        return (*grads, None, None, None, None, None, None, None)


def _check_launch(launch, problem: Problem) -> None:
    # A launch's grid covers the sequences and the longest sequence it was built for: with more
    # sequences, or longer ones, rows would go unwritten; with fewer, its programs would read
    # offsets past the end of cu_seqlens.
    if launch is None or launch.problem is problem:  # (attention_varlen's kept launches)
        return
    built = launch.problem
    if built.batch != problem.batch or problem.seqlen_q > built.seqlen_q or problem.seqlen_k > built.seqlen_k:
        raise ValueError(
            f"launch: built for {built.batch} sequences of at most {built.seqlen_q} queries and "
            f"{built.seqlen_k} keys; this call has {problem.batch} of at most {problem.seqlen_q} and {problem.seqlen_k}"
        )


def varlen_backward(q, k, v, out, lse, dout, cu_seqlens_q, cu_seqlens_k, problem: Problem, launch, **extra):
    """(dq, dk, dv) of a packed batch, in its packed layout, by ``launch`` (a
    ``BackwardLaunch``); ``extra``: its ``run``'s keywords (grads given, ALiBi, dropout)."""
    dq, dk, dv = (extra.pop(name, None) for name in ("dq", "dk", "dv"))
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    if problem.batch == 0:
        return dq, dk.zero_(), dv.zero_()
    b = problem.batch
    views = [batch_view(t, b) for t in (q, k, v, out)]
    grads = [batch_view(t, b) for t in (dq, dk, dv)]
    _check_launch(launch, problem)
    # (Triton launches on the current device: the inputs' one, as in the forward)
    with torch.cuda.device(q.device) if q.is_cuda else contextlib.nullcontext():
        launch.run(
            *views,
            lse,
            batch_view(dout, b),
            dq=grads[0],
            dk=grads[1],
            dv=grads[2],
            cu_seqlens=(cu_seqlens_q, cu_seqlens_k),
            **extra,
        )
    return dq, dk, dv


def varlen_reference(
    q, k, v, cu_seqlens_q, cu_seqlens_k, problem: Problem, *, compute_dtype=torch.float32, alibi=None, dropout=None
):
    """The PyTorch reference of a packed batch, one sequence at a time (reads the offsets);
    ``alibi``: ALiBi's slopes, (Hq,) or (B, Hq); ``dropout``: (keep mask (Hq, total_q,
    max_seqlen_k) as ``dropout.problem_mask`` gives it, dropout_p)."""
    out = torch.zeros_like(q)
    lse = torch.full((problem.heads_q, problem.total_q), float("-inf"), dtype=torch.float32, device=q.device)
    cq, ck = cu_seqlens_q.tolist(), cu_seqlens_k.tolist()
    for i in range(problem.batch):
        (q0, q1), (k0, k1) = (cq[i], cq[i + 1]), (ck[i], ck[i + 1])
        if q1 == q0 or k1 == k0:  # (no rows, or rows that see no key: zeros, lse -inf)
            continue
        one = Problem(**{**problem.__dict__, "batch": 1, "seqlen_q": q1 - q0, "seqlen_k": k1 - k0, "varlen": False})
        o, s = attention_reference(
            *(t[a:z].permute(1, 0, 2)[None] for t, (a, z) in ((q, (q0, q1)), (k, (k0, k1)), (v, (k0, k1)))),
            one,
            compute_dtype=compute_dtype,
            alibi=None if alibi is None else alibi[i] if alibi.dim() == 2 else alibi,
            dropout=None if dropout is None else (dropout[0][None, :, q0:q1, : k1 - k0], dropout[1]),
        )
        out[q0:q1] = o[0].permute(1, 0, 2)
        lse[:, q0:q1] = s[0]
    return out, lse
