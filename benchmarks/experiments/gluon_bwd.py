"""Experiment: the backward's dK/dV kernel written in Gluon, with its matmuls overlapped with
the elementwise work between them, against fa2gen's Triton dK/dV kernel.

For one block of BLOCK_N keys, the kernel walks the query blocks (BLOCK_M rows each):

    Sᵀ = K·Qᵀ     Pᵀ = exp(Sᵀ - LSE)     dV += Pᵀ·dO
    dPᵀ = V·dOᵀ   dSᵀ = Pᵀ ∘ (dPᵀ - Δ)   dK += dSᵀ·Q

With OVERLAP, Sᵀ and dPᵀ are issued together and only Sᵀ is waited for, so the exponentials
run under the dPᵀ matmul; dV's matmul is issued before dPᵀ is waited for, so dSᵀ is computed
under it; the step waits for dV and dK only before its Q/dO slot is refilled. Without
OVERLAP each matmul is waited for at once, as plain Triton does. Q and dO stream through a
TMA ring of STAGES slots; K and V are loaded once. A dQ kernel in the same style walks the key
blocks for one block of queries, with the exponentials under dP's matmul.

Measured, in one process per variant: the Gluon dK/dV kernel against fa2gen's (the latter's
time as its share of fa2gen's whole backward, from the PyTorch profiler: it runs there
without the L2 flush that do_bench gives the Gluon kernel, which favours fa2gen slightly at
small N), the whole backward with the Gluon dK/dV kernel in fa2gen's place, the whole
backward in Gluon, and SDPA cuDNN's backward.

Scope: canonical shapes (Nq = Nk = N a multiple of the tiles, Hq = Hkv, (B, H, N, D) fp16/bf16
inputs with aligned strides), causal or not.

usage: python benchmarks/experiments/gluon_bwd.py --compile-only [--head-dims 64,128]
       python benchmarks/experiments/gluon_bwd.py [--dtypes fp16] [--head-dims 64,128]
           [--seqlens 1024,4096,16384] [--timeout 60] [--out F.json]
"""

from __future__ import annotations

import functools
import importlib.util
import json
import math
from pathlib import Path

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

LOG2E = 1.4426950408889634

# (BLOCK_N keys per program, BLOCK_M queries per step, STAGES, mode); BLOCK_N // 16 warps.
VARIANTS = [(128, 64, 2, "overlap"), (128, 64, 2, "serial"), (128, 32, 2, "overlap"), (64, 64, 2, "overlap"),
            (128, 64, 3, "overlap")]


@functools.cache
def _forward_experiment():
    """gluon_fwd.py beside this file, for its worker harness and compile helpers (the folder
    is not a package)."""
    spec = importlib.util.spec_from_file_location("gluon_fwd", Path(__file__).parent / "gluon_fwd.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# The forward experiment's ring helpers, as globals the kernels below call.
_barriers = _forward_experiment()._barriers
_ring = _forward_experiment()._ring
_load_step = _forward_experiment()._load_step
wgmma_layout = _forward_experiment().wgmma_layout


@gluon.jit
def gluon_attn_bwd_dkdv(desc_q, desc_k, desc_v, desc_do, desc_dk, desc_dv, lse_ptr, delta_ptr, N, HQ,
                        sm_scale, qk_scale, BLOCK_N: gl.constexpr, BLOCK_M: gl.constexpr,
                        HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, OVERLAP: gl.constexpr,
                        CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = desc_q.dtype
    pid_n = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    k0 = pid_n * BLOCK_N
    n_q = N // BLOCK_M
    if CAUSAL:  # query blocks from the diagonal on; those that start before the block's last key are masked
        first = k0 // BLOCK_M
        masked_end = (k0 + BLOCK_N + BLOCK_M - 1) // BLOCK_M
    else:
        first = 0
        masked_end = 0
    steps = n_q - first

    # Transposed scores (keys x queries) and the key-major gradients in wgmma accumulator
    # layouts, 16 key rows per warp; Pᵀ and dSᵀ feed their matmuls from registers.
    st_layout: gl.constexpr = wgmma_layout(num_warps, BLOCK_M)
    kv_layout: gl.constexpr = wgmma_layout(num_warps, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=kv_layout, k_width=2)
    col: gl.constexpr = gl.SliceLayout(0, st_layout)
    row: gl.constexpr = gl.SliceLayout(1, st_layout)
    keys = gl.expand_dims(k0 + gl.arange(0, BLOCK_N, layout=row), 1)
    q_off = gl.expand_dims(gl.arange(0, BLOCK_M, layout=col), 0)

    k_smem = gl.allocate_shared_memory(dtype, desc_k.block_type.shape, desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, desc_v.block_type.shape, desc_v.layout)
    kv_bar = _barriers(1, 1).index(0)
    q_smem, q_bars = _ring(desc_q, STAGES)
    do_smem, do_bars = _ring(desc_do, STAGES)
    mbarrier.expect(kv_bar, desc_k.block_type.nbytes + desc_v.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_k, [b, h, k0, 0], kv_bar, k_smem)
    tma.async_copy_global_to_shared(desc_v, [b, h, k0, 0], kv_bar, v_smem)
    # The ring counts steps from 0; step t holds query block first + t.
    for t in gl.static_range(STAGES):
        _load_step(desc_q, q_bars, q_smem, t, first, b, h, steps, BLOCK_M, STAGES)
        _load_step(desc_do, do_bars, do_smem, t, first, b, h, steps, BLOCK_M, STAGES)

    k_op = k_smem.reshape([BLOCK_N, HEAD_DIM])
    v_op = v_smem.reshape([BLOCK_N, HEAD_DIM])
    dk = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    dv = gl.zeros([BLOCK_N, HEAD_DIM], gl.float32, kv_layout)
    s_init = gl.zeros([BLOCK_N, BLOCK_M], gl.float32, st_layout)
    mbarrier.wait(kv_bar, 0)
    for t in range(steps):
        qb = first + t
        slot = t % STAGES
        phase = (t // STAGES) & 1
        q0 = qb * BLOCK_M
        lse = gl.load(lse_ptr + bh * N + q0 + gl.arange(0, BLOCK_M, layout=col)) * 1.4426950408889634
        delta = gl.load(delta_ptr + bh * N + q0 + gl.arange(0, BLOCK_M, layout=col))
        mbarrier.wait(q_bars.index(slot), phase)
        mbarrier.wait(do_bars.index(slot), phase)
        q_op = q_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        do_op = do_smem.index(slot).reshape([BLOCK_M, HEAD_DIM])
        st = warpgroup_mma(k_op, q_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
        if OVERLAP:
            dpt = warpgroup_mma(v_op, do_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
            st = warpgroup_mma_wait(1, deps=(st,))  # Sᵀ only: dPᵀ runs under the exponentials
        else:
            st = warpgroup_mma_wait(0, deps=(st,))
        pt = gl.exp2(st * qk_scale - gl.expand_dims(lse, 0))
        if CAUSAL:
            if qb < masked_end:
                pt = gl.where(q0 + q_off >= keys, pt, 0.0)
        pt_op = gl.convert_layout(pt.to(dtype), op_layout)
        dv = warpgroup_mma(pt_op, do_op, dv, is_async=True)
        if OVERLAP:
            dpt = warpgroup_mma_wait(1, deps=(dpt,))  # dPᵀ done; dV's matmul runs under dSᵀ
        else:
            dv = warpgroup_mma_wait(0, deps=(dv,))
            dpt = warpgroup_mma(v_op, do_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
            dpt = warpgroup_mma_wait(0, deps=(dpt,))
        dst = pt * (dpt - gl.expand_dims(delta, 0))
        dk = warpgroup_mma(gl.convert_layout(dst.to(dtype), op_layout), q_op, dk, is_async=True)
        dv, dk = warpgroup_mma_wait(0, deps=(dv, dk))
        # Every warp is past Q_i and dO_i before their slot is refilled.
        gl.thread_barrier()
        _load_step(desc_q, q_bars, q_smem, t + STAGES, first, b, h, steps, BLOCK_M, STAGES)
        _load_step(desc_do, do_bars, do_smem, t + STAGES, first, b, h, steps, BLOCK_M, STAGES)

    mbarrier.invalidate(kv_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(q_bars.index(i))
        mbarrier.invalidate(do_bars.index(i))
    # K's and V's buffers stage the results: the last matmuls that read them are done.
    k_smem.reshape([BLOCK_N, HEAD_DIM]).store((dk * sm_scale).to(dtype))
    v_smem.reshape([BLOCK_N, HEAD_DIM]).store(dv.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dk, [b, h, k0, 0], k_smem)
    tma.async_copy_shared_to_global(desc_dv, [b, h, k0, 0], v_smem)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_attn_bwd_dq(desc_q, desc_k, desc_v, desc_do, desc_dq, lse_ptr, delta_ptr, N, HQ, sm_scale, qk_scale,
                      BLOCK_Q: gl.constexpr, BLOCK_K: gl.constexpr, HEAD_DIM: gl.constexpr,
                      STAGES: gl.constexpr, OVERLAP: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    """dQ for one block of BLOCK_Q queries, walking the key blocks: S = Q·Kᵀ and dP = dO·Vᵀ
    issued together, the exponentials under dP's matmul, dQ += dS·K."""
    dtype: gl.constexpr = desc_q.dtype
    if CAUSAL:  # the longest query tiles first
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    else:
        pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    b = bh // HQ
    h = bh % HQ
    q0 = pid_m * BLOCK_Q
    if CAUSAL:
        n_blocks = (q0 + BLOCK_Q + BLOCK_K - 1) // BLOCK_K
        first_masked = q0 // BLOCK_K
    else:
        n_blocks = N // BLOCK_K
        first_masked = n_blocks

    s_layout: gl.constexpr = wgmma_layout(num_warps, BLOCK_K)
    dq_layout: gl.constexpr = wgmma_layout(num_warps, HEAD_DIM)
    op_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=dq_layout, k_width=2)
    row: gl.constexpr = gl.SliceLayout(1, s_layout)
    col: gl.constexpr = gl.SliceLayout(0, s_layout)
    queries = gl.expand_dims(q0 + gl.arange(0, BLOCK_Q, layout=row), 1)
    k_off = gl.expand_dims(gl.arange(0, BLOCK_K, layout=col), 0)
    lse = gl.expand_dims(gl.load(lse_ptr + bh * N + q0 + gl.arange(0, BLOCK_Q, layout=row)) * 1.4426950408889634, 1)
    delta = gl.expand_dims(gl.load(delta_ptr + bh * N + q0 + gl.arange(0, BLOCK_Q, layout=row)), 1)

    q_smem = gl.allocate_shared_memory(dtype, desc_q.block_type.shape, desc_q.layout)
    do_smem = gl.allocate_shared_memory(dtype, desc_do.block_type.shape, desc_do.layout)
    qo_bar = _barriers(1, 1).index(0)
    k_smem, k_bars = _ring(desc_k, STAGES)
    v_smem, v_bars = _ring(desc_v, STAGES)
    mbarrier.expect(qo_bar, desc_q.block_type.nbytes + desc_do.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [b, h, q0, 0], qo_bar, q_smem)
    tma.async_copy_global_to_shared(desc_do, [b, h, q0, 0], qo_bar, do_smem)
    for t in gl.static_range(STAGES):
        _load_step(desc_k, k_bars, k_smem, t, 0, b, h, n_blocks, BLOCK_K, STAGES)
        _load_step(desc_v, v_bars, v_smem, t, 0, b, h, n_blocks, BLOCK_K, STAGES)

    q_op = q_smem.reshape([BLOCK_Q, HEAD_DIM])
    do_op = do_smem.reshape([BLOCK_Q, HEAD_DIM])
    dq = gl.zeros([BLOCK_Q, HEAD_DIM], gl.float32, dq_layout)
    s_init = gl.zeros([BLOCK_Q, BLOCK_K], gl.float32, s_layout)
    mbarrier.wait(qo_bar, 0)
    for j in range(n_blocks):
        slot = j % STAGES
        phase = (j // STAGES) & 1
        mbarrier.wait(k_bars.index(slot), phase)
        mbarrier.wait(v_bars.index(slot), phase)
        k_op = k_smem.index(slot).reshape([BLOCK_K, HEAD_DIM])
        v_op = v_smem.index(slot).reshape([BLOCK_K, HEAD_DIM])
        s = warpgroup_mma(q_op, k_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
        if OVERLAP:
            dp = warpgroup_mma(do_op, v_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(1, deps=(s,))  # S only: dP runs under the exponentials
        else:
            s = warpgroup_mma_wait(0, deps=(s,))
        p = gl.exp2(s * qk_scale - lse)
        if CAUSAL:
            if j >= first_masked:
                p = gl.where(j * BLOCK_K + k_off <= queries, p, 0.0)
        if OVERLAP:
            dp = warpgroup_mma_wait(0, deps=(dp,))
        else:
            dp = warpgroup_mma(do_op, v_op.permute((1, 0)), s_init, use_acc=False, is_async=True)
            dp = warpgroup_mma_wait(0, deps=(dp,))
        ds = p * (dp - delta)
        dq = warpgroup_mma(gl.convert_layout(ds.to(dtype), op_layout), k_op, dq, is_async=True)
        dq = warpgroup_mma_wait(0, deps=(dq,))
        gl.thread_barrier()  # every warp is past K_j and V_j before their slot is refilled
        _load_step(desc_k, k_bars, k_smem, j + STAGES, 0, b, h, n_blocks, BLOCK_K, STAGES)
        _load_step(desc_v, v_bars, v_smem, j + STAGES, 0, b, h, n_blocks, BLOCK_K, STAGES)

    mbarrier.invalidate(qo_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    q_smem.reshape([BLOCK_Q, HEAD_DIM]).store((dq * sm_scale).to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_dq, [b, h, q0, 0], q_smem)
    tma.store_wait(pendings=0)


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def label(variant) -> str:
    block_n, block_m, stages, mode = variant
    return f"n{block_n} m{block_m} s{stages} {mode}"


def launcher(q, k, v, dout, lse, delta, variant, causal: bool, dk=None, dv=None):
    """The dK/dV launch of one variant, descriptors built once: (launch, dk, dv)."""
    block_n, block_m, stages, mode = variant
    b, h, n, d = q.shape
    if n % block_n or n % block_m or k.shape != q.shape:
        raise ValueError(f"canonical shapes only: N={n} a multiple of {block_n} and {block_m}, k and v like q")
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    dk = torch.empty_like(k) if dk is None else dk
    dv = torch.empty_like(v) if dv is None else dv
    descs = [TensorDescriptor.from_tensor(t, blk, _layout(blk, gdt)) for t, blk in
             ((q, [1, 1, block_m, d]), (k, [1, 1, block_n, d]), (v, [1, 1, block_n, d]), (dout, [1, 1, block_m, d]),
              (dk, [1, 1, block_n, d]), (dv, [1, 1, block_n, d]))]
    scale = 1 / math.sqrt(d)
    grid = (n // block_n, b * h)

    def launch():
        gluon_attn_bwd_dkdv[grid](*descs, lse, delta, n, h, scale, scale * LOG2E, block_n, block_m, d, stages,
                                  mode == "overlap", causal, num_warps=block_n // 16)
    return launch, dk, dv


def launcher_dq(q, k, v, dout, lse, delta, variant, causal: bool, dq=None):
    """The dQ launch of one variant (its BLOCK_N query rows per program, BLOCK_M keys per
    step), descriptors built once: (launch, dq)."""
    block_q, block_k, stages, mode = variant
    b, h, n, d = q.shape
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    dq = torch.empty_like(q) if dq is None else dq
    descs = [TensorDescriptor.from_tensor(t, blk, _layout(blk, gdt)) for t, blk in
             ((q, [1, 1, block_q, d]), (k, [1, 1, block_k, d]), (v, [1, 1, block_k, d]), (dout, [1, 1, block_q, d]),
              (dq, [1, 1, block_q, d]))]
    scale = 1 / math.sqrt(d)
    grid = (n // block_q, b * h)

    def launch():
        gluon_attn_bwd_dq[grid](*descs, lse, delta, n, h, scale, scale * LOG2E, block_q, block_k, d, stages,
                                mode == "overlap", causal, num_warps=block_q // 16)
    return launch, dq


def compile_only(head_dims) -> None:
    """Compile both kernels of each variant for sm90 without a GPU; ptxas's registers and
    spills, the SASS's HGMMAs."""
    fwd = _forward_experiment()
    for d in head_dims:
        for variant in VARIANTS:
            for causal in (False, True):
                for name in ("dkdv", "dq"):
                    kernel = compiled(name, variant, d, causal)
                    regs, spill, sass = fwd.resources(kernel, name)
                    print(f"D={d} {name:4s} {label(variant):20s} {'causal' if causal else 'full  '}: {regs} registers, "
                          f"{spill} B spilled, {kernel.metadata.shared} B shared, {sass.count('HGMMA')} HGMMA in the "
                          "SASS", flush=True)


def compiled(name: str, variant, d: int, causal: bool):
    """The dK/dV ("dkdv") or dQ ("dq") kernel of one variant compiled for sm90."""
    block_n, block_m, stages, mode = variant
    if name == "dkdv":
        fn, boxes = gluon_attn_bwd_dkdv, (("desc_q", block_m), ("desc_k", block_n), ("desc_v", block_n),
                                          ("desc_do", block_m), ("desc_dk", block_n), ("desc_dv", block_n))
        values = dict(BLOCK_N=block_n, BLOCK_M=block_m)
    else:
        fn, boxes = gluon_attn_bwd_dq, (("desc_q", block_n), ("desc_k", block_m), ("desc_v", block_m),
                                        ("desc_do", block_n), ("desc_dq", block_n))
        values = dict(BLOCK_Q=block_n, BLOCK_K=block_m)
    scalars = {"lse_ptr": "*fp32", "delta_ptr": "*fp32", "N": "i32", "HQ": "i32", "sm_scale": "fp32",
               "qk_scale": "fp32"}
    values.update(HEAD_DIM=d, STAGES=stages, OVERLAP=mode == "overlap", CAUSAL=causal, num_warps=block_n // 16)
    return _forward_experiment().compile_for_sm90(fn, [(arg, [1, 1, rows, d]) for arg, rows in boxes], scalars,
                                                  values, {"num_warps": block_n // 16})


def _dkdv_share(fn, calls: int = 5) -> float:
    """The fraction of ``fn``'s GPU kernel time spent in fa2gen's dK/dV kernel."""
    from fa2gen.bench.timing import kernel_ms

    ms = kernel_ms(fn, ("attn_bwd_dkdv",), calls=calls)
    total = sum(ms.values())
    return ms.get("attn_bwd_dkdv", 0.0) / total if total else float("nan")


def time_variant(args) -> None:
    """One variant over the cells, one JSON line per cell: the Gluon dK/dV kernel's time,
    fa2gen's whole backward and its dK/dV kernel's share of it, and SDPA cuDNN's backward,
    all timed in this process."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    from fa2gen.bench.correctness import check_backward
    from fa2gen.bench.grid import make_inputs
    from fa2gen.bench.timing import measure
    from fa2gen.runtime.backward import backward
    from fa2gen.runtime.device import cuda_device_info
    from fa2gen.runtime.dispatch import select_params
    from fa2gen.runtime.launch import forward
    from fa2gen.runtime.problem import make_problem

    fwd = _forward_experiment()
    variant = VARIANTS[args.variant]
    for case in fwd.cells(args):
        row = {"case": case.label(), "variant": label(variant)}
        try:
            q, k, v = make_inputs(case, torch.device("cuda"))
            dout = torch.randn_like(q)
            problem = make_problem(q, k, v, causal=case.causal)
            info = cuda_device_info(0)
            out, lse = forward(q, k, v, problem, select_params(problem, info))
            params = select_params(problem, info, "bwd")
            bwd_flops = 2.5 * case.flops()

            def ours():
                return backward(q, k, v, out, lse, dout, problem, params)

            row["fa2gen"] = bwd_flops / measure(ours).median_ms / 1e9
            row["fa2gen_dkdv_share"] = _dkdv_share(ours)
            try:  # on its own, so that a failure here does not hide the Gluon kernels' result
                qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    o = scaled_dot_product_attention(qg, kg, vg, is_causal=case.causal)
                row["cudnn"] = bwd_flops / measure(
                    lambda: torch.autograd.grad(o, (qg, kg, vg), dout, retain_graph=True)).median_ms / 1e9
            except Exception as e:
                row["reference_error"] = f"{type(e).__name__}: {str(e)[:200]}"
            delta = (dout.float() * out.float()).sum(-1)
            nan = float("nan")
            launch, dk, dv = launcher(q, k, v, dout, lse, delta, variant, case.causal,
                                      dk=torch.full_like(k, nan), dv=torch.full_like(v, nan))
            launch_dq, dq = launcher_dq(q, k, v, dout, lse, delta, variant, case.causal, dq=torch.full_like(q, nan))
            launch()
            launch_dq()
            verdict = check_backward(q, k, v, problem, dout, dq, dk, dv)
            row["check"] = str(verdict)
            if verdict.ok:
                ms = measure(launch).median_ms
                whole_ms = bwd_flops / row["fa2gen"] / 1e9
                fa2gen_dkdv_ms = whole_ms * row["fa2gen_dkdv_share"]

                def gluon_backward():  # Δ by PyTorch (three passes where fa2gen fuses one), dK/dV, dQ
                    torch.sum(dout.float() * out.float(), -1, out=delta)
                    launch()
                    launch_dq()

                gluon_whole = bwd_flops / measure(gluon_backward).median_ms / 1e9
                # All measured: only now do the row's results appear, together.
                row.update(gluon_dkdv_ms=ms, fa2gen_dkdv_ms=fa2gen_dkdv_ms, gluon_whole=gluon_whole,
                           # the whole backward with the Gluon kernel in place of fa2gen's dK/dV kernel
                           tflops=bwd_flops / (whole_ms - fa2gen_dkdv_ms + ms) / 1e9)
        except Exception as e:  # a variant that fails to compile or launch is a result here
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print("ROW " + json.dumps(row), flush=True)


def main() -> None:
    args = _forward_experiment().arguments(timeout=60).parse_args()
    if args.compile_only:
        compile_only([int(x) for x in args.head_dims.split(",")])
        return
    if args.variant is not None:
        time_variant(args)
        return
    rows = _forward_experiment().run_variants(__file__, args, [label(v) for v in VARIANTS])
    print(f"{'case':40s} {'variant':20s} {'dK/dV x fa2gen':>14s} {'swapped x cuDNN':>15s} "
          f"{'all-Gluon x cuDNN':>17s} {'fa2gen x cuDNN':>14s}  check")
    for r in rows:
        if "tflops" in r and "cudnn" in r:
            print(f"{r['case']:40s} {r['variant']:20s} {r['fa2gen_dkdv_ms'] / r['gluon_dkdv_ms']:14.2f} "
                  f"{r['tflops'] / r['cudnn']:15.2f} {r['gluon_whole'] / r['cudnn']:17.2f} "
                  f"{r['fa2gen'] / r['cudnn']:14.2f}  {r['check']}")
        else:
            print(f"{r.get('case', '-'):40s} {r['variant']:20s} {r.get('error') or r.get('check')}")
    for v in VARIANTS:
        got = [r for r in rows if "tflops" in r and "cudnn" in r and r["variant"] == label(v)]
        if got:
            geo = lambda a, b: math.exp(sum(math.log(r[a] / r[b]) for r in got) / len(got))
            print(f"{label(v)}, geomean over {len(got)} cells: dK/dV x fa2gen's {geo('fa2gen_dkdv_ms', 'gluon_dkdv_ms'):.3f}; "
                  f"backward with it x cuDNN {geo('tflops', 'cudnn'):.3f}; all-Gluon backward x cuDNN "
                  f"{geo('gluon_whole', 'cudnn'):.3f}; fa2gen's x cuDNN {geo('fa2gen', 'cudnn'):.3f}")


if __name__ == "__main__":
    main()
