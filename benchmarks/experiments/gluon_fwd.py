"""Experiment: a Hopper forward written in Gluon (Triton 3.6's explicit-layout language), where
the program itself decides when a tensor-core matmul is waited for.

Plain Triton waits for each score matmul before its softmax, so tensor cores and the softmax
take turns (perf-notes, "Profile: the forward against cuDNN's"). Here, with OVERLAP, block j's
scores Q·K_jᵀ and block j-1's P·V run asynchronously (wgmma), and the softmax of block j runs
while P·V is still on the tensor cores; only the rescale of the accumulator waits for it.
Without OVERLAP the same kernel waits for every matmul at once, as plain Triton does.

K and V stream through a ring of STAGES shared-memory slots filled by the TMA, each with its
own mbarrier. Two warp groups (8 warps) share one 128-row query tile, 64 rows each. Scope:
non-causal, Nq = Nk = N a multiple of BLOCK_N (at least STAGES blocks), contiguous (B, H, N, D)
fp16/bf16 inputs: what the canonical grid needs to tell whether this pays.

usage: python benchmarks/experiments/gluon_fwd.py --compile-only   (no GPU: compiles for sm90,
           prints ptxas's registers and spills and the SASS's HGMMA count per variant)
       python benchmarks/experiments/gluon_fwd.py [--seqlens 4096,16384] [--dtypes fp16,bf16]
           (checks each variant by flash-attention's rule on NaN-poisoned outputs, then times it
           beside fa2gen's shipped forward and SDPA cuDNN)
"""

from __future__ import annotations

import argparse
import math
import re
import subprocess
import tempfile

import torch
import triton
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

# (BLOCK_N, STAGES, OVERLAP)
VARIANTS = [(128, 2, True), (128, 3, True), (64, 3, True), (128, 2, False)]


@gluon.jit
def _refill(desc, bars, smem, index, row0, n_blocks, BLOCK_N: gl.constexpr, STAGES: gl.constexpr):
    # Load block `index` into its ring slot, if there is such a block.
    if index < n_blocks:
        slot = index % STAGES
        mbarrier.expect(bars.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [row0 + index * BLOCK_N, 0], bars.index(slot), smem.index(slot))


@gluon.jit
def gluon_attn_fwd(desc_q, desc_k, desc_v, desc_o, lse_ptr, N, qk_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                   STAGES: gl.constexpr, OVERLAP: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = desc_q.dtype
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    q_row = bh * N + pid_m * BLOCK_M
    kv_row = bh * N
    n_blocks = N // BLOCK_N

    # Scores and output in wgmma accumulator layouts, 16 rows per warp; P feeds the second
    # matmul from registers.
    s_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, BLOCK_N, 16])
    o_layout: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1],
                                                       instr_shape=[16, HEAD_DIM, 16])
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)

    q_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_q.layout)
    k_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_k.layout)
    v_smem = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, HEAD_DIM], desc_v.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    k_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    v_bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(k_bars.index(i), count=1)
        mbarrier.init(v_bars.index(i), count=1)

    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [q_row, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _refill(desc_k, k_bars, k_smem, i, kv_row, n_blocks, BLOCK_N, STAGES)
        _refill(desc_v, v_bars, v_smem, i, kv_row, n_blocks, BLOCK_N, STAGES)

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        # Block 0's scores and probabilities before the loop; each step then issues block
        # j's scores and block j-1's P·V together.
        mbarrier.wait(k_bars.index(0), 0)
        s = warpgroup_mma(q_smem, k_smem.index(0).permute((1, 0)), s_init, use_acc=False, is_async=True)
        s = warpgroup_mma_wait(0, deps=(s,))
        m_i = gl.max(s, 1) * qk_scale
        p = gl.exp2(s * qk_scale - gl.expand_dims(m_i, 1))
        l_i = gl.sum(p, 1)
        # K_0's slot is free once both warp groups have their scores.
        gl.thread_barrier()
        _refill(desc_k, k_bars, k_smem, STAGES, kv_row, n_blocks, BLOCK_N, STAGES)
        for j in range(1, n_blocks):
            slot = j % STAGES
            prev = (j - 1) % STAGES
            mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
            mbarrier.wait(v_bars.index(prev), ((j - 1) // STAGES) & 1)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(prev), acc, is_async=True)
            # wgmma groups retire in order: one outstanding means the scores are done.
            s = warpgroup_mma_wait(1, deps=(s,))
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            acc = warpgroup_mma_wait(0, deps=(acc,))
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            # Both warp groups are past K_j and V_{j-1} before their slots are refilled.
            gl.thread_barrier()
            _refill(desc_k, k_bars, k_smem, j + STAGES, kv_row, n_blocks, BLOCK_N, STAGES)
            _refill(desc_v, v_bars, v_smem, j - 1 + STAGES, kv_row, n_blocks, BLOCK_N, STAGES)
        last = (n_blocks - 1) % STAGES
        mbarrier.wait(v_bars.index(last), ((n_blocks - 1) // STAGES) & 1)
        acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(last), acc, is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
    else:
        for j in range(0, n_blocks):
            slot = j % STAGES
            phase = (j // STAGES) & 1
            mbarrier.wait(k_bars.index(slot), phase)
            s = warpgroup_mma(q_smem, k_smem.index(slot).permute((1, 0)), s_init, use_acc=False, is_async=True)
            s = warpgroup_mma_wait(0, deps=(s,))
            m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
            p = gl.exp2(s * qk_scale - gl.expand_dims(m_new, 1))
            alpha = gl.exp2(m_i - m_new)
            l_i = l_i * alpha + gl.sum(p, 1)
            m_i = m_new
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            mbarrier.wait(v_bars.index(slot), phase)
            acc = warpgroup_mma(gl.convert_layout(p.to(dtype), p_layout), v_smem.index(slot), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=(acc,))
            gl.thread_barrier()
            _refill(desc_k, k_bars, k_smem, j + STAGES, kv_row, n_blocks, BLOCK_N, STAGES)
            _refill(desc_v, v_bars, v_smem, j + STAGES, kv_row, n_blocks, BLOCK_N, STAGES)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))

    out = acc / gl.expand_dims(gl.convert_layout(l_i, row_o), 1)
    o_smem = gl.allocate_shared_memory(dtype, [BLOCK_M, HEAD_DIM], desc_o.layout)
    o_smem.store(out.to(dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [q_row, 0], o_smem)
    # The log-sum-exp in natural log, per query row.
    rows = pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s)
    gl.store(lse_ptr + bh * N + rows, (m_i + gl.log2(l_i)) / 1.4426950408889634)
    tma.store_wait(pendings=0)


BLOCK_M = 128
NUM_WARPS = 8


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def run(q, k, v, block_n: int, stages: int, overlap: bool, out=None):
    """(out, lse) of non-causal attention over contiguous (B, H, N, D) q, k, v."""
    b, h, n, d = q.shape
    if n % block_n or n // block_n < stages or n % BLOCK_M:
        raise ValueError(f"N={n} must be a multiple of {BLOCK_M} and of BLOCK_N={block_n}, with >= {stages} blocks")
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    out = torch.empty_like(q) if out is None else out
    lse = torch.empty((b, h, n), device=q.device, dtype=torch.float32)
    flat = [t.view(b * h * n, d) for t in (q, k, v, out)]
    dq, dk, dv, do = (TensorDescriptor.from_tensor(t, blk, _layout(blk, gdt))
                      for t, blk in zip(flat, ([BLOCK_M, d], [block_n, d], [block_n, d], [BLOCK_M, d])))
    grid = (n // BLOCK_M, b * h)
    gluon_attn_fwd[grid](dq, dk, dv, do, lse, n, LOG2E / math.sqrt(d), BLOCK_M, block_n, d, stages, overlap,
                         num_warps=NUM_WARPS)
    return out, lse


def compile_only(head_dim: int) -> None:
    """Compile each variant for sm90 without a GPU and report what ptxas and the SASS say."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    from fa2gen.generator.ahead import assemble, nvidia_tool, spill_bytes

    for block_n, stages, overlap in VARIANTS:
        descs = {}
        for name, rows in (("desc_q", BLOCK_M), ("desc_k", block_n), ("desc_v", block_n), ("desc_o", BLOCK_M)):
            layout = _layout([rows, head_dim], gl.float16)
            descs[name] = f"tensordesc<fp16[{rows},{head_dim}],{layout!r}>"
        signature = {**descs, "lse_ptr": "*fp32", "N": "i32", "qk_scale": "fp32", "BLOCK_M": "constexpr",
                     "BLOCK_N": "constexpr", "HEAD_DIM": "constexpr", "STAGES": "constexpr", "OVERLAP": "constexpr",
                     "num_warps": "constexpr"}
        constexprs = {("BLOCK_M",): BLOCK_M, ("BLOCK_N",): block_n, ("HEAD_DIM",): head_dim, ("STAGES",): stages,
                      ("OVERLAP",): overlap, ("num_warps",): NUM_WARPS}
        constexprs = {(list(signature).index(k[0]),): v for k, v in constexprs.items()}
        source = GluonASTSource(gluon_attn_fwd, signature, constexprs)
        kernel = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": NUM_WARPS})
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            report = assemble(kernel, "sm90", cubin.name, name="gluon_attn_fwd")
            sass = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin.name], capture_output=True,
                                  text=True).stdout
        regs = re.search(r"Used (\d+) registers", report)
        print(f"D={head_dim} BLOCK_N={block_n} STAGES={stages} OVERLAP={overlap}: {regs.group(1) if regs else '?'} "
              f"registers, {spill_bytes(report)} B spilled, {kernel.metadata.shared} B shared, "
              f"{sass.count('HGMMA')} HGMMA in the SASS")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--dtypes", default="fp16,bf16")
    ap.add_argument("--head-dim", type=int, default=128)
    args = ap.parse_args()
    if args.compile_only:
        compile_only(args.head_dim)
        return

    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    import fa2gen
    from fa2gen.bench.correctness import check_forward
    from fa2gen.bench.grid import Case, make_inputs
    from fa2gen.bench.timing import measure
    from fa2gen.runtime.problem import make_problem

    d = args.head_dim
    print(f"{'case':40s} {'variant':22s} {'TFLOP/s':>8s} {'x fa2gen':>9s} {'x cuDNN':>8s}  check")
    for dtype in args.dtypes.split(","):
        for n in map(int, args.seqlens.split(",")):
            case = Case(max(1, 16384 // n), 2048 // d, n, d, False, dtype)
            q, k, v = make_inputs(case, torch.device("cuda"))
            problem = make_problem(q, k, v)
            flops = case.flops()
            ours = flops / measure(lambda: fa2gen.attention(q, k, v)).median_ms / 1e9
            def cudnn_fn():
                with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                    return scaled_dot_product_attention(q, k, v)

            cudnn = flops / measure(cudnn_fn).median_ms / 1e9
            print(f"{case.label():40s} {'fa2gen (shipped)':22s} {ours:8.1f} {1.0:9.2f} {ours / cudnn:8.2f}", flush=True)
            for block_n, stages, overlap in VARIANTS:
                label = f"n{block_n} s{stages} {'overlap' if overlap else 'serial'}"
                try:
                    poisoned = torch.full_like(q, float("nan"))
                    out, lse = run(q, k, v, block_n, stages, overlap, out=poisoned)
                    verdict = check_forward(q, k, v, problem, out, lse)
                    t = flops / measure(lambda: run(q, k, v, block_n, stages, overlap)).median_ms / 1e9
                    print(f"{case.label():40s} {label:22s} {t:8.1f} {t / ours:9.2f} {t / cudnn:8.2f}  {verdict}",
                          flush=True)
                except Exception as e:  # a variant that fails to compile or launch is a result here
                    print(f"{case.label():40s} {label:22s} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)


if __name__ == "__main__":
    main()
