"""attention() under autograd: the forward saves O and the log-sum-exp, as FlashAttention-2
does, and the backward runs the generated backward kernels. Nothing N x N is kept."""

from __future__ import annotations

import contextlib

import torch
from torch.autograd.function import once_differentiable

from .backward import backward
from .device import cuda_device_info
from .dispatch import select_params


class AttentionFunction(torch.autograd.Function):
    """Differentiable in q, k and v. The log-sum-exp output is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, problem, run_forward, deterministic):
        out, lse = run_forward()
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.problem = problem
        ctx.deterministic = deterministic
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    @once_differentiable  # the backward kernels have no backward: double backward raises, never lies
    def backward(ctx, dout, _dlse):
        q, k, v, out, lse = ctx.saved_tensors
        problem = ctx.problem
        if q.device.type == "cuda":
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            params = select_params(problem, cuda_device_info(index), "bwd")
            where = torch.cuda.device(index)  # Triton launches on the current device
        else:  # the interpreter
            params = select_params(problem, None, "bwd")
            where = contextlib.nullcontext()
        if ctx.deterministic or torch.are_deterministic_algorithms_enabled():
            params = params.replace(dq_mode="separate")  # atomics add in no fixed order
        with where:
            dq, dk, dv = backward(q, k, v, out, lse, dout, problem, params)
        return dq, dk, dv, None, None, None


def differentiable(q, k, v, problem, run, *, deterministic: bool = False):
    """Run the forward (``run()`` returns (out, lse)), through autograd when a gradient is
    wanted; ``deterministic`` keeps the backward free of atomics."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        return AttentionFunction.apply(q, k, v, problem, run, deterministic)
    return run()
