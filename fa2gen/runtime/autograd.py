"""attention() under autograd: the forward saves O and the log-sum-exp, as FlashAttention-2
does, and the backward runs the generated backward kernels. Nothing N x N is kept."""

from __future__ import annotations

import torch
from torch.autograd.function import once_differentiable

from ..store.buckets import Bucket
from .backward import BackwardLaunch
from .defaults import bucket_default
from .device import cuda_device_info
from .dispatch import select_params


class _Call:
    """One differentiable call: what its backward needs beyond the saved tensors, and the
    forward's LSE, handed back beside autograd (it is not differentiable)."""

    __slots__ = ("problem", "run_forward", "deterministic", "launches", "alibi", "dropout", "lse")


class AttentionFunction(torch.autograd.Function):
    """Differentiable in q, k and v; the output alone goes through autograd. (One argument
    beyond the tensors, one output and one attribute on ctx: each costs apply() time on every
    call.)"""

    @staticmethod
    def forward(ctx, q, k, v, call: _Call):
        out, call.lse = call.run_forward()
        ctx.save_for_backward(q, k, v, out, call.lse)
        ctx.call = call
        return out

    @staticmethod
    @once_differentiable  # the backward kernels have no backward: double backward raises, never lies
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        c = ctx.call
        grads = run_backward(
            q, k, v, out, lse, dout, c.problem, c.deterministic, c.launches, alibi=c.alibi, dropout=c.dropout
        )
        return (*grads, None)


def run_backward(q, k, v, out, lse, dout, problem, deterministic: bool, launches: dict | None, *, alibi, dropout):
    """(dq, dk, dv) of a forward's call: the backward launch kept in ``launches`` (a forward
    ``Launch``'s ``backward``, or None to build one), for ``deterministic`` or
    ``torch.use_deterministic_algorithms``."""
    device = cuda_device_info(q.get_device()) if q.is_cuda else None  # (None: the interpreter)
    launch = kept_backward({} if launches is None else launches, problem, device, deterministic)
    if q.is_cuda and q.get_device() != torch.cuda.current_device():
        with torch.cuda.device(q.get_device()):  # Triton launches on the current device
            return launch.run(q, k, v, out, lse, dout, alibi=alibi, dropout=dropout)
    return launch.run(q, k, v, out, lse, dout, alibi=alibi, dropout=dropout)


def kept_backward(launches: dict, problem, device, deterministic: bool) -> BackwardLaunch:
    """The backward launch kept in ``launches`` (by whether it must be deterministic: the
    call's flag, or torch.use_deterministic_algorithms(True)), built and kept there first."""
    deterministic = bool(deterministic) or torch.are_deterministic_algorithms_enabled()
    launch = launches.get(deterministic)
    if launch is None:
        launch = launches[deterministic] = backward_launch(problem, device, deterministic)
    return launch


def backward_launch(problem, device, deterministic: bool) -> BackwardLaunch:
    """The backward launch of ``problem`` on ``device`` (a DeviceInfo, None for the
    interpreter); ``deterministic``: without atomics (dQ in its own kernel)."""
    params = select_params(problem, device, "bwd")
    if deterministic:  # atomics add in no fixed order: dQ in a kernel of its own
        if params.dq_mode == "atomic" and params.gluon:
            # the one pass's tiles (128 keys by 64 queries, 12 warps) suit no other form of
            # the Gluon dK/dV kernel: the default backward instead
            params = bucket_default(Bucket.of(problem, "bwd"), device.arch if device else "cpu", atomics=False)
        params = params.replace(dq_mode="separate")
    return BackwardLaunch(problem, params)


def differentiable(
    q, k, v, problem, run, *, deterministic: bool = False, launches: dict | None = None, alibi=None, dropout=None
):
    """Run the forward (``run()`` returns (out, lse)), through autograd when a gradient is
    wanted; ``deterministic`` keeps the backward free of atomics. ``launches``: where to keep
    the backward's launch for later calls of the same shape (a forward ``Launch``'s
    ``backward``), or None to build it per call. ``alibi``: ALiBi's (slopes, batch stride),
    for the backward (the slopes get no gradient); ``dropout``: the forward's (seed, dropout_p),
    whose mask the backward draws again."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        call = _Call()
        call.problem, call.run_forward, call.deterministic = problem, run, deterministic
        call.launches, call.alibi, call.dropout = launches, alibi, dropout
        out = AttentionFunction.apply(q, k, v, call)
        lse, call.lse = call.lse, None  # (the saved tensors keep it for the backward)
        return out, lse
    return run()
