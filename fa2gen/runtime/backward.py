"""Launch the generated backward kernels: delta, then dK/dV and dQ (its own kernel, or
atomics from the dK/dV kernel and a store)."""

from __future__ import annotations

import functools

import torch

from ..generator.cache import interpreting, load_module
from ..generator.spec import PASS_WARPS, TuningParams, pass_rows
from .interpreter import patch_interpreter
from .launch import effective_params, gluon_descriptor, gluon_ready, host_descriptor, window_extents
from .problem import Problem


def backward(q, k, v, out, lse, dout, problem: Problem, params: TuningParams, *, dq=None, dk=None, dv=None,
             compile_only: bool = False):
    """Gradients (dq, dk, dv) of ``problem``'s attention for the output gradient ``dout``.

    ``out`` and ``lse`` are what the forward returned for the same inputs. ``dout`` may have
    any strides; a last dim that is not contiguous is copied first. ``dq``/``dk``/``dv`` may
    be given preallocated (tests poison them with NaN). With ``params.dq_mode`` "separate"
    there are no atomics: every sum has one owner and a fixed order, so repeated calls give
    bit-identical gradients; "atomic" adds dQ in fp32 in no fixed order. ``compile_only``
    compiles this call's kernels without launching them (the tuner's workers).
    """
    if dout.shape != out.shape:
        raise ValueError(f"grad_output must have the output's shape {tuple(out.shape)}, got {tuple(dout.shape)}")
    if dout.dtype != out.dtype:
        dout = dout.to(out.dtype)
    if dout.stride(-1) != 1:
        dout = dout.contiguous()
    dq = torch.empty_like(q) if dq is None else dq
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    if problem.batch == 0:
        return dq, dk, dv
    if interpreting():
        patch_interpreter()
    spec = problem.kernel_spec("bwd")
    gluon = None
    if params.gluon:
        # The dK/dV kernel (gluon=2: and the dQ kernel) in Gluon where they can run; the rest
        # from the Triton template on the same tiles. dQ's grid has a program per query head.
        gluon_params, params = params, _triton_part(params)
        heads = problem.heads_q if gluon_params.gluon == 2 else problem.heads_kv
        if gluon_ready(problem, q, k, v, dout, dq, dk, dv, heads=heads):
            gluon = gluon_params
    if gluon is None:  # (gluon_ready has found the tensors fit descriptors)
        # Descriptors need 16-byte aligned bases and strides; otherwise the pointer path runs.
        params = effective_params(spec, params, q, k, v, dout, dq, dk, dv)
    module = load_module(spec, params)
    dp = spec.head_dim_padded
    b, hq, hkv, nq, nk = problem.batch, problem.heads_q, problem.heads_kv, problem.seqlen_q, problem.seqlen_k
    left, right = window_extents(problem)
    lse = lse.contiguous()
    delta = torch.empty((b, hq, nq), device=q.device, dtype=torch.float32)
    launch = dict(num_warps=params.num_warps, num_stages=params.num_stages)
    dims = dict(HEAD_DIM=problem.head_dim, HEAD_DIM_PAD=dp)

    def run(kernel, grid, *args, launch=launch, **constexprs):
        if compile_only:
            kernel.warmup(*args, grid=grid, **constexprs, **launch)
        else:
            kernel[grid](*args, **constexprs, **launch)

    rows, passes = pass_rows(spec), dict(num_warps=PASS_WARPS, num_stages=1)
    run(module.attn_bwd_delta, (-(-nq // rows) * b * hq,),
        out, dout, delta, *out.stride()[:3], *dout.stride()[:3], hq, nq, BLOCK=rows, launch=passes, **dims)
    tiles = dict(OUTER=params.block_m, INNER=params.block_n, **dims)
    scalars = (problem.sm_scale, problem.softcap, left, right)
    atomic = params.dq_mode != "separate"
    descriptors = params.loads == "tma_host"

    def tile(t, rows):
        return host_descriptor(t, rows, dp) if descriptors else t

    outer, inner = params.block_m, params.block_n
    if atomic:  # fp32 sums of dQ, (B, Hq, Nq, D) contiguous, filled by the dK/dV kernel
        dq_acc = torch.zeros((b, hq, nq, problem.head_dim), device=q.device, dtype=torch.float32)
    if gluon is not None:  # it builds its own descriptors (a Gluon kernel's carry a layout)
        _gluon_kernels(spec, gluon, q, k, v, dout, dq, dk, dv, lse, delta, problem, run)
        if gluon.gluon == 2:
            return dq, dk, dv
    else:
        dkdv_args = (tile(q, inner), tile(k, outer), tile(v, outer), tile(dout, inner), lse, delta,
                     tile(dk, outer), tile(dv, outer))
        if atomic:
            dkdv_args += (host_descriptor(dq_acc, inner, dp) if params.dq_mode == "tma_reduce" else dq_acc,)
        run(module.attn_bwd_dkdv, (-(-nk // params.block_m) * b * hkv,),
            *dkdv_args,
            *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dk.stride()[:3], *dv.stride()[:3],
            hkv, problem.group, nq, nk, *scalars, **tiles)
    if atomic:
        run(module.attn_bwd_dq_store, (-(-nq // rows) * b * hq,),
            dq_acc, dq, *dq.stride()[:3], hq, nq, problem.sm_scale, BLOCK=rows, launch=passes, **dims)
        return dq, dk, dv
    run(module.attn_bwd_dq, (-(-nq // params.block_m) * b * hq,),
        tile(q, outer), tile(k, inner), tile(v, inner), tile(dout, outer), lse, delta, tile(dq, outer),
        *q.stride()[:3], *k.stride()[:3], *v.stride()[:3], *dout.stride()[:3], *dq.stride()[:3],
        hq, problem.group, nq, nk, *scalars, **tiles)
    return dq, dk, dv


@functools.lru_cache(maxsize=256)
def _triton_part(params: TuningParams) -> TuningParams:
    # The params delta and dQ run with (dataclasses.replace costs ~10 us a call)
    return params.replace(gluon=0)


def _gluon_kernels(spec, params: TuningParams, q, k, v, dout, dq, dk, dv, lse, delta, problem: Problem,
                   run) -> None:
    """The Gluon kernels of attn_bwd_gluon.py.jinja. dK/dV: one program per block of block_m
    keys of one k/v head, walking block_n queries at a time of each of its query heads. With
    gluon=2, dQ too: one program per block of block_m queries of one query head, walking
    block_n keys at a time."""
    from ..generator.gluon import backward_boxes, descriptor_layout

    module = load_module(spec, params)

    def descs(kernel, *named):  # the kernel's descriptors, in its argument order
        boxes = backward_boxes(spec, params, kernel)
        return [gluon_descriptor(t, boxes[name], descriptor_layout(boxes[name], spec.dtype)) for name, t in named]

    outer, inner = params.block_m, params.block_n
    shape = dict(HEAD_DIM=problem.head_dim, OUTER=outer, INNER=inner, STAGES=params.num_stages,
                 launch=module.LAUNCH)
    run(module.attn_bwd_dkdv, (-(-problem.seqlen_k // outer), problem.batch * problem.heads_kv),
        *descs("attn_bwd_dkdv", ("Q", q), ("K", k), ("V", v), ("DO", dout), ("DK", dk), ("DV", dv)),
        lse, delta, problem.heads_kv, problem.group, problem.seqlen_q, problem.seqlen_k, problem.sm_scale, **shape)
    if params.gluon == 2:
        run(module.attn_bwd_dq, (-(-problem.seqlen_q // outer), problem.batch * problem.heads_q),
            *descs("attn_bwd_dq", ("Q", q), ("K", k), ("V", v), ("DO", dout), ("DQ", dq)),
            lse, delta, problem.heads_q, problem.group, problem.seqlen_q, problem.seqlen_k, problem.sm_scale, **shape)
