"""flash-attention's accuracy rule, used by the tests, the benchmark and the tuner's gate.

A kernel passes when its error against an fp32 reference is at most twice the error
of PyTorch computing the same function in the inputs' dtype, plus a small atol.

fp8 inputs: the reference is fp32 attention over the values the fp8 tensors stand for
(dequantized), and PyTorch's error is that of PyTorch computing with the kernel's
roundings: both matmuls on the fp8 tensors by PyTorch's fp8 GEMM (torch._scaled_mm with
the tensor cores' fast accumulation, as Triton accumulates by default on sm90; exact on
a CPU, where the interpreter's matmul is exact too), P rounded to e4m3, the output in
bf16. How far fp8 is from the unquantized inputs is a separate question (docs/fp8.md
measures it).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..runtime.fp8 import FP8_TORCH, check_descales, dequantized
from ..runtime.kvcache import kvcache_reference
from ..runtime.problem import Problem
from ..runtime.reference import attention_fp8, attention_reference

ATOL = 1e-4


@dataclass(frozen=True)
class Verdict:
    ok: bool
    out_err: float  # max |kernel - fp32 reference|
    out_base: float  # max |PyTorch in dtype - fp32 reference|
    lse_err: float
    lse_base: float
    reason: str = ""

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAIL ({self.reason})"
        return (
            f"{status}: out err {self.out_err:.2e} (base {self.out_base:.2e}), "
            f"lse err {self.lse_err:.2e} (base {self.lse_base:.2e})"
        )


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    both_inf = torch.isinf(a) & torch.isinf(b) & (torch.sign(a) == torch.sign(b))
    d = (a.float() - b.float()).abs().masked_fill(both_inf, 0.0)
    return float(d.max()) if d.numel() else 0.0


def _heads(descale, h0: int, h1: int):
    """An fp8 factor restricted to heads [h0, h1) (a per-tensor factor covers them all)."""
    f, stride_b, stride_h = descale
    return descale if stride_b == 0 and stride_h == 0 else (f[:, h0:h1], stride_b, stride_h)


def check_forward(
    q,
    k,
    v,
    problem: Problem,
    out,
    lse=None,
    *,
    atol: float = ATOL,
    heads_per_chunk: int = 8,
    descales=None,
    alibi=None,
    dropout=None,
) -> Verdict:
    """Judge a forward result by flash-attention's rule; NaN anywhere fails. ``descales``:
    fp8 inputs' factors as ``fa2gen.runtime.fp8.check_descales`` returns them (None: all 1).
    ``alibi``: ALiBi's slopes, (Hq,) or (B, Hq). ``dropout``: (keep mask (B, Hq, Nq, Nk),
    dropout_p), the mask the call drew (``runtime.dropout.problem_mask``)."""
    fp8 = q.dtype == FP8_TORCH
    if fp8:
        descales = descales or check_descales(problem, q.device, None, None, None)
    outs32, lses32, outs_dt, lses_dt = [], [], [], []
    g = problem.group
    step = max(g, (heads_per_chunk // g) * g)
    for h0 in range(0, problem.heads_q, step):
        h1 = min(problem.heads_q, h0 + step)
        sub = Problem(**{**problem.__dict__, "heads_q": h1 - h0, "heads_kv": (h1 - h0) // g})
        qs, ks, vs = q[:, h0:h1], k[:, h0 // g : h1 // g], v[:, h0 // g : h1 // g]
        if fp8:
            ds = [_heads(d, a, b) for d, (a, b) in zip(descales, ((h0, h1), (h0 // g, h1 // g), (h0 // g, h1 // g)))]
            o32, l32 = attention_reference(*(dequantized(t, d) for t, d in zip((qs, ks, vs), ds)), sub)
            odt, ldt = attention_fp8(qs, ks, vs, ds, sub)
        else:
            slopes = None if alibi is None else alibi[..., h0:h1]
            drop = None if dropout is None else (dropout[0][:, h0:h1], dropout[1])
            o32, l32 = attention_reference(qs.float(), ks.float(), vs.float(), sub, alibi=slopes, dropout=drop)
            odt, ldt = attention_reference(qs, ks, vs, sub, compute_dtype=q.dtype, alibi=slopes, dropout=drop)
        outs32.append(o32)
        lses32.append(l32)
        outs_dt.append(odt)
        lses_dt.append(ldt)
    ref, ref_lse = torch.cat(outs32, 1), torch.cat(lses32, 1)
    base_out, base_lse = torch.cat(outs_dt, 1), torch.cat(lses_dt, 1)
    out_err = _max_abs_diff(out, ref)
    out_base = _max_abs_diff(base_out, ref)
    lse_err = _max_abs_diff(lse, ref_lse) if lse is not None else 0.0
    lse_base = _max_abs_diff(base_lse, ref_lse)
    reasons = []
    if torch.isnan(out).any():
        reasons.append("NaN in output")
    if lse is not None and torch.isnan(lse).any():
        reasons.append("NaN in lse")
    if out_err > 2 * out_base + atol:
        reasons.append("output error over 2x PyTorch's + atol")
    if lse is not None and lse_err > 2 * lse_base + atol:
        reasons.append("lse error over 2x PyTorch's + atol")
    if lse is not None and not torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)):
        reasons.append("lse -inf pattern differs from the reference")
    return Verdict(not reasons, out_err, out_base, lse_err, lse_base, "; ".join(reasons))


def check_cache(inputs, problem: Problem, out, lse, caches=None, *, atol: float = ATOL, alibi=None) -> Verdict:
    """Judge a call over a KV cache by the same rule: ``inputs`` are the call's (q, k_cache,
    v_cache, cache_seqlens, block_table, k, v) as they were before it (the caches unchanged),
    ``caches`` the (k_cache, v_cache) it appended into, which must equal the reference's
    exactly (None: not checked). ``alibi``: ALiBi's slopes."""
    exact = [None if t is None else t.float() for t in inputs[:3]] + list(inputs[3:5])
    exact += [None if t is None else t.float() for t in inputs[5:]]
    ref, ref_lse, _, _ = kvcache_reference(*exact, problem, alibi=alibi)
    base, base_lse, ref_k, ref_v = kvcache_reference(*inputs, problem, compute_dtype=inputs[0].dtype, alibi=alibi)
    out_err, out_base = _max_abs_diff(out, ref), _max_abs_diff(base, ref)
    lse_err, lse_base = _max_abs_diff(lse, ref_lse), _max_abs_diff(base_lse, ref_lse)
    reasons = []
    if torch.isnan(out).any() or torch.isnan(lse).any():
        reasons.append("NaN in the output or lse")
    if out_err > 2 * out_base + atol:
        reasons.append("output error over 2x PyTorch's + atol")
    if lse_err > 2 * lse_base + atol:
        reasons.append("lse error over 2x PyTorch's + atol")
    if not torch.equal(torch.isneginf(lse), torch.isneginf(ref_lse)):
        reasons.append("lse -inf pattern differs from the reference")
    if caches is not None and not (torch.equal(caches[0], ref_k) and torch.equal(caches[1], ref_v)):
        reasons.append("the appended cache differs from the reference's")
    return Verdict(not reasons, out_err, out_base, lse_err, lse_base, "; ".join(reasons))


@dataclass(frozen=True)
class GradVerdict:
    ok: bool
    errors: dict  # name -> (max |kernel - fp32 reference|, max |PyTorch in dtype - fp32 reference|)
    reason: str = ""

    def __str__(self) -> str:
        status = "ok" if self.ok else f"FAIL ({self.reason})"
        parts = ", ".join(f"{n} err {e:.2e} (base {b:.2e})" for n, (e, b) in self.errors.items())
        return f"{status}: {parts}"

    @property
    def error(self) -> float:
        """The largest error against the fp32 reference."""
        return max((e for e, _ in self.errors.values()), default=0.0)


def _judged(named, atol: float = ATOL) -> GradVerdict:
    """A verdict over (name, result, fp32 reference, PyTorch in the inputs' dtype) quadruples."""
    errors, reasons = {}, []
    for name, got, ref, base in named:
        err, base_err = _max_abs_diff(got, ref), _max_abs_diff(base, ref)
        errors[name] = (err, base_err)
        if torch.isnan(got).any():
            reasons.append(f"NaN in {name}")
        elif err > 2 * base_err + atol:
            reasons.append(f"{name} error over 2x PyTorch's + atol")
    return GradVerdict(not reasons, errors, "; ".join(reasons))


def check_varlen(inputs, problem: Problem, out, lse, dout=None, grads=None) -> GradVerdict:
    """Judge a packed call by flash-attention's rule, its output and lse, and with ``dout`` its
    gradients ``grads`` (dq, dk, dv) too; ``inputs`` are its (q, k, v, cu_seqlens_q,
    cu_seqlens_k)."""
    from ..runtime.varlen import varlen_reference

    q, k, v, cu_q, cu_k = inputs
    exact = [t.detach().float().requires_grad_() for t in (q, k, v)]
    base = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    ref, ref_lse = varlen_reference(*exact, cu_q, cu_k, problem)
    pytorch, pytorch_lse = varlen_reference(*base, cu_q, cu_k, problem, compute_dtype=q.dtype)
    named = [("out", out, ref, pytorch), ("lse", lse, ref_lse, pytorch_lse)]
    if dout is not None:
        ref.backward(dout.float())
        pytorch.backward(dout)
        named += [(n, g, r.grad, b.grad) for n, g, r, b in zip(("dq", "dk", "dv"), grads, exact, base)]
    return _judged(named)


def _reference_grads(q, k, v, dout, problem: Problem, compute_dtype, alibi=None, dropout=None):
    leaves = [
        t.detach().to(compute_dtype if compute_dtype == torch.float32 else t.dtype).requires_grad_() for t in (q, k, v)
    ]
    out, _ = attention_reference(*leaves, problem, compute_dtype=compute_dtype, alibi=alibi, dropout=dropout)
    out.backward(dout.to(out.dtype))
    return [t.grad for t in leaves]


def check_backward(
    q,
    k,
    v,
    problem: Problem,
    dout,
    dq,
    dk,
    dv,
    *,
    atol: float = ATOL,
    heads_per_chunk: int = 8,
    alibi=None,
    dropout=None,
) -> GradVerdict:
    """Judge gradients by flash-attention's rule (each of dq, dk, dv against an fp32
    reference, allowed twice PyTorch's own error in the inputs' dtype plus atol); NaN fails.
    ``alibi``: ALiBi's slopes, (Hq,) or (B, Hq); ``dropout``: as ``check_forward``'s."""
    g = problem.group
    step = max(g, (heads_per_chunk // g) * g)
    refs, bases = [[], [], []], [[], [], []]
    for h0 in range(0, problem.heads_q, step):
        h1 = min(problem.heads_q, h0 + step)
        sub = Problem(**{**problem.__dict__, "heads_q": h1 - h0, "heads_kv": (h1 - h0) // g})
        args = (q[:, h0:h1], k[:, h0 // g : h1 // g], v[:, h0 // g : h1 // g], dout[:, h0:h1], sub)
        slopes = None if alibi is None else alibi[..., h0:h1]
        drop = None if dropout is None else (dropout[0][:, h0:h1], dropout[1])
        for acc, grads in (
            (refs, _reference_grads(*args, torch.float32, slopes, drop)),
            (bases, _reference_grads(*args, q.dtype, slopes, drop)),
        ):
            for i, grad in enumerate(grads):
                acc[i].append(grad)
    named = zip(("dq", "dk", "dv"), (dq, dk, dv), (torch.cat(r, 1) for r in refs), (torch.cat(b, 1) for b in bases))
    return _judged(named, atol)
