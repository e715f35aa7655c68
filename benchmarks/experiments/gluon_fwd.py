"""Experiment: a Hopper forward written in Gluon (Triton 3.6's explicit-layout language), where
the program itself decides when a tensor-core matmul is waited for.

Plain Triton waits for each score matmul before its softmax, so tensor cores and the softmax
take turns (perf-notes, "Profile: the forward against cuDNN's"). Here, with OVERLAP, block j's
scores Q·K_jᵀ and block j-1's P·V run asynchronously (wgmma), and the softmax of block j runs
while P·V is still on the tensor cores; only the rescale of the accumulator waits for it.
That is the order in the PTX; ptxas (Triton 3.6's) moves the wait for P·V ahead of the
softmax in the SASS, in every form here (docs/perf-notes.md, v20), so only ws2's two warp
groups, which hand slots back independently, can still take turns with each other.
Without OVERLAP the same kernel waits for every matmul at once, as plain Triton does. The
warp-specialised forms add a loader warp (24 registers) that fills the ring, so that the
compute warps (240 registers) never stop to issue loads: FlashAttention-3's split.

K and V stream through a ring of STAGES shared-memory slots filled by the TMA, each with its
own mbarrier. A 128-row query tile runs two warp groups (64 rows each), a 64-row tile one.
Inputs are (B, H, N, D) with any 16-byte aligned strides, fp16 or bf16, read through 4-D
tensor descriptors; GQA; any Nq and Nk (keys past Nk masked, rows past Nq clipped); causal
bottom-right aligned, longest query tiles first, and only the blocks past Nk or across the
diagonal pay for a mask; rows that see no key return 0 with an LSE of -inf.

usage: python benchmarks/experiments/gluon_fwd.py --compile-only [--head-dims 64,128]
           (no GPU: compiles each variant for sm90; ptxas's registers and spills, the SASS's HGMMAs)
       python benchmarks/experiments/gluon_fwd.py [--dtypes fp16] [--head-dims 64,128]
           [--seqlens 1024,4096,16384] [--timeout 45] [--out F.json]
           (times fa2gen's shipped forward and SDPA cuDNN on the canonical grid's cells, then
           each variant in its own process, stopped if a cell takes over --timeout s: checked by
           flash-attention's rule on NaN-poisoned outputs, then timed)
       python benchmarks/experiments/gluon_fwd.py --odd [--dtypes fp16,bf16]
           (each variant checked on ODD_SHAPES: GQA, Nq != Nk, odd N, empty rows, strides)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import selectors
import subprocess
import sys
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

# (BLOCK_M, BLOCK_N, STAGES, mode); 16 query rows per warp, so BLOCK_M // 16 compute warps:
# 128-row tiles run two warp groups in one program, 64-row tiles one, with two programs per SM
# where registers and shared memory allow. mode: "overlap" (softmax under P·V), "serial" (every
# matmul waited for at once), "ws" (overlap, plus a loader warp of its own), "ws2" (as ws, with
# each compute warp group a partition of its own). Most informative first, in case a run is
# cut short.
VARIANTS = [(128, 128, 2, "overlap"), (128, 128, 2, "ws2"), (128, 128, 2, "ws"), (128, 128, 2, "serial"),
            (64, 64, 3, "overlap"), (128, 64, 3, "ws2"), (128, 128, 3, "overlap"), (128, 64, 3, "overlap"),
            (64, 128, 2, "overlap"), (64, 64, 3, "ws")]
# The loader warp's registers, and the register limit per thread the warp-specialised kernels
# launch with, by BLOCK_M: the compute warps get what the loader leaves (240 for 128-row tiles,
# one program per SM; 232 for 64-row tiles, two per SM).
LOADER_REGS = gl.constexpr(24)
COMPUTE_REGS = gl.constexpr(240)
WS_MAXNREG = {128: 168, 64: 128}


@gluon.constexpr_function
def wgmma_layout(num_warps, n):
    """The wgmma accumulator layout of a (16 * num_warps) x n tile: 16 rows per warp."""
    return gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[num_warps, 1], instr_shape=[16, n, 16])


@gluon.jit
def _heads(HQ, GROUP):
    """This program's batch, query head and k/v head (GQA: GROUP query heads per k/v head)."""
    bh = gl.program_id(1)
    return bh // HQ, bh % HQ, (bh % HQ) // GROUP


@gluon.jit
def _barriers(N_BARS: gl.constexpr, COUNT: gl.constexpr):
    """N_BARS mbarriers in shared memory, each completing after COUNT arrivals."""
    bars = gl.allocate_shared_memory(gl.int64, [N_BARS, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(N_BARS):
        mbarrier.init(bars.index(i), count=COUNT)
    return bars


@gluon.jit
def _ring(desc, STAGES: gl.constexpr):
    """A ring of STAGES slots for desc's boxes, and a barrier per slot that its load completes."""
    return gl.allocate_shared_memory(desc.dtype, [STAGES] + desc.block_type.shape, desc.layout), _barriers(STAGES, 1)


@gluon.jit
def _load_step(desc, bars, smem, t, first, b, h, steps, ROWS: gl.constexpr, STAGES: gl.constexpr):
    # Load step t's box (rows (first + t) * ROWS ... of head (b, h)) into its ring slot, if
    # there is such a step.
    if t < steps:
        slot = t % STAGES
        mbarrier.expect(bars.index(slot), desc.block_type.nbytes)
        tma.async_copy_global_to_shared(desc, [b, h, (first + t) * ROWS, 0], bars.index(slot), smem.index(slot))


@gluon.jit
def _scores(q_op, k_smem, k_bars, j, s_init, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr):
    """Issue block j's scores Q·K_jᵀ once K_j has landed in its slot; asynchronous."""
    slot = j % STAGES
    mbarrier.wait(k_bars.index(slot), (j // STAGES) & 1)
    k_op = k_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
    return warpgroup_mma(q_op, k_op.permute((1, 0)), s_init, use_acc=False, is_async=True)


@gluon.jit
def _pv(p, v_smem, v_bars, j, acc, p_layout: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
        STAGES: gl.constexpr):
    """Issue acc += P·V_j once V_j has landed in its slot; asynchronous."""
    slot = j % STAGES
    mbarrier.wait(v_bars.index(slot), (j // STAGES) & 1)
    v_op = v_smem.index(slot).reshape([BLOCK_N, HEAD_DIM])
    return warpgroup_mma(gl.convert_layout(p.to(v_smem.dtype), p_layout), v_op, acc, is_async=True)


@gluon.jit
def _overlap_step(q_op, k_smem, k_bars, v_smem, v_bars, j, p, m_i, l_i, acc, s_init, first_masked, q_idx, k_off,
                  Nq, Nk, qk_scale, p_layout: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                  STAGES: gl.constexpr, CAUSAL: gl.constexpr):
    """Block j's scores and block j-1's P·V issued together; block j's softmax runs while P·V
    is on the tensor cores. Returns block j's P, the row max and sum, the rescale factor and
    the accumulator with P·V_{j-1} added (not yet rescaled)."""
    s = _scores(q_op, k_smem, k_bars, j, s_init, BLOCK_N, HEAD_DIM, STAGES)
    acc = _pv(p, v_smem, v_bars, j - 1, acc, p_layout, BLOCK_N, HEAD_DIM, STAGES)
    # wgmma groups retire in order: one outstanding means the scores are done.
    s = warpgroup_mma_wait(1, deps=(s,))
    s = _mask(s, j, first_masked, q_idx, k_off, Nq, Nk, BLOCK_N, CAUSAL)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
    return p, m_i, l_i, alpha, warpgroup_mma_wait(0, deps=(acc,))


@gluon.jit
def _tile(Nq, Nk, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    """This program's query tile, its number of key blocks and the first block that needs a
    mask (keys past Nk, or past the diagonal). Causal is bottom-right aligned: query i sees
    keys j <= i + Nk - Nq. A tile whose rows see no key still walks one (masked) block."""
    if CAUSAL:  # the longest query tiles first
        pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
        last_key = gl.minimum((pid_m + 1) * BLOCK_M + Nk - Nq, Nk)
        n_blocks = gl.maximum((last_key + BLOCK_N - 1) // BLOCK_N, 1)
        first_masked = gl.minimum(gl.maximum(pid_m * BLOCK_M + Nk - Nq + 1, 0) // BLOCK_N, Nk // BLOCK_N)
    else:
        pid_m = gl.program_id(0)
        n_blocks = (Nk + BLOCK_N - 1) // BLOCK_N
        first_masked = Nk // BLOCK_N
    return pid_m, n_blocks, first_masked


@gluon.jit
def _mask(s, j, first_masked, q_idx, k_off, Nq, Nk, BLOCK_N: gl.constexpr, CAUSAL: gl.constexpr):
    # Only the blocks past Nk or across the diagonal pay for the comparison.
    if j >= first_masked:
        keys = j * BLOCK_N + k_off
        visible = keys < Nk
        if CAUSAL:
            visible = visible & (keys <= q_idx + (Nk - Nq))
        s = gl.where(visible, s, -float("inf"))
    return s


@gluon.jit
def _softmax_step(s, m_i, l_i, qk_scale):
    """Online softmax over one block of scores: P (unnormalised), the new row max and sum,
    and the factor that rescales what was accumulated before. A row that has seen no key yet
    keeps max -inf; it is shifted by 0 instead, so that it yields zeros, not NaN."""
    m_new = gl.maximum(m_i, gl.max(s, 1) * qk_scale)
    m_shift = gl.where(m_new == -float("inf"), 0.0, m_new)
    p = gl.exp2(s * qk_scale - gl.expand_dims(m_shift, 1))
    alpha = gl.exp2(m_i - m_shift)
    return p, m_new, l_i * alpha + gl.sum(p, 1), alpha


@gluon.jit
def _epilogue(acc, m_i, l_i, desc_o, o_smem, lse_ptr, b, h, row0, Nq, HQ, row_o: gl.constexpr,
              row_s: gl.constexpr):
    # o_smem: Q's buffer, free once the last score matmul is done; reusing it keeps shared
    # memory low enough for two 64-row programs per SM. Rows that saw no key get 0 and an
    # LSE of -inf; rows past Nq are clipped by the descriptor store and masked in the LSE's.
    BLOCK_M: gl.constexpr = desc_o.block_type.shape[2]
    HEAD_DIM: gl.constexpr = desc_o.block_type.shape[3]
    empty = l_i == 0.0
    out = acc / gl.expand_dims(gl.convert_layout(gl.where(empty, 1.0, l_i), row_o), 1)
    o_smem.reshape([BLOCK_M, HEAD_DIM]).store(out.to(desc_o.dtype))
    fence_async_shared()
    tma.async_copy_shared_to_global(desc_o, [b, h, row0, 0], o_smem)
    rows = row0 + gl.arange(0, BLOCK_M, layout=row_s)
    lse = gl.where(empty, -float("inf"), (m_i + gl.log2(gl.where(empty, 1.0, l_i))) / 1.4426950408889634)
    gl.store(lse_ptr + (b * HQ + h) * Nq + rows, lse, mask=rows < Nq)
    tma.store_wait(pendings=0)


@gluon.jit
def gluon_attn_fwd(desc_q, desc_k, desc_v, desc_o, lse_ptr, Nq, Nk, HQ, GROUP, qk_scale,
                   BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                   STAGES: gl.constexpr, OVERLAP: gl.constexpr, CAUSAL: gl.constexpr, num_warps: gl.constexpr):
    dtype: gl.constexpr = desc_q.dtype
    pid_m, n_blocks, first_masked = _tile(Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    b, h, kvh = _heads(HQ, GROUP)

    # Scores and output in wgmma accumulator layouts, 16 rows per warp; P feeds the second
    # matmul from registers.
    s_layout: gl.constexpr = wgmma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_idx = gl.expand_dims(pid_m * BLOCK_M + gl.arange(0, BLOCK_M, layout=row_s), 1)
    k_off = gl.expand_dims(gl.arange(0, BLOCK_N, layout=col_s), 0)

    # TMA boxes are (1, 1, rows, D) of the (B, H, N, D) tensors; matmuls see them as (rows, D).
    q_smem = gl.allocate_shared_memory(dtype, desc_q.block_type.shape, desc_q.layout)
    q_bar = _barriers(1, 1).index(0)
    k_smem, k_bars = _ring(desc_k, STAGES)
    v_smem, v_bars = _ring(desc_v, STAGES)

    mbarrier.expect(q_bar, desc_q.block_type.nbytes)
    tma.async_copy_global_to_shared(desc_q, [b, h, pid_m * BLOCK_M, 0], q_bar, q_smem)
    for i in gl.static_range(STAGES):
        _load_step(desc_k, k_bars, k_smem, i, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
        _load_step(desc_v, v_bars, v_smem, i, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
    q_op = q_smem.reshape([BLOCK_M, HEAD_DIM])

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)

    if OVERLAP:
        # Block 0's scores and probabilities before the loop; each step then issues block
        # j's scores and block j-1's P·V together.
        s = warpgroup_mma_wait(0, deps=(_scores(q_op, k_smem, k_bars, 0, s_init, BLOCK_N, HEAD_DIM, STAGES),))
        s = _mask(s, 0, first_masked, q_idx, k_off, Nq, Nk, BLOCK_N, CAUSAL)
        p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
        # K_0's slot is free once both warp groups have their scores.
        gl.thread_barrier()
        _load_step(desc_k, k_bars, k_smem, STAGES, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
        for j in range(1, n_blocks):
            p, m_i, l_i, alpha, acc = _overlap_step(q_op, k_smem, k_bars, v_smem, v_bars, j, p, m_i, l_i, acc,
                                                    s_init, first_masked, q_idx, k_off, Nq, Nk, qk_scale,
                                                    p_layout, BLOCK_N, HEAD_DIM, STAGES, CAUSAL)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            # Both warp groups are past K_j and V_{j-1} before their slots are refilled.
            gl.thread_barrier()
            _load_step(desc_k, k_bars, k_smem, j + STAGES, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
            _load_step(desc_v, v_bars, v_smem, j - 1 + STAGES, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
        acc = _pv(p, v_smem, v_bars, n_blocks - 1, acc, p_layout, BLOCK_N, HEAD_DIM, STAGES)
        acc = warpgroup_mma_wait(0, deps=(acc,))
    else:
        for j in range(0, n_blocks):
            s = warpgroup_mma_wait(0, deps=(_scores(q_op, k_smem, k_bars, j, s_init, BLOCK_N, HEAD_DIM, STAGES),))
            s = _mask(s, j, first_masked, q_idx, k_off, Nq, Nk, BLOCK_N, CAUSAL)
            p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
            acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
            acc = warpgroup_mma_wait(0, deps=(_pv(p, v_smem, v_bars, j, acc, p_layout, BLOCK_N, HEAD_DIM, STAGES),))
            gl.thread_barrier()
            _load_step(desc_k, k_bars, k_smem, j + STAGES, 0, b, kvh, n_blocks, BLOCK_N, STAGES)
            _load_step(desc_v, v_bars, v_smem, j + STAGES, 0, b, kvh, n_blocks, BLOCK_N, STAGES)

    mbarrier.invalidate(q_bar)
    for i in gl.static_range(STAGES):
        mbarrier.invalidate(k_bars.index(i))
        mbarrier.invalidate(v_bars.index(i))
    _epilogue(acc, m_i, l_i, desc_o, q_smem, lse_ptr, b, h, pid_m * BLOCK_M, Nq, HQ, row_o, row_s)


# The warp-specialised form: one loader warp fills the ring through the TMA, with few
# registers; the compute warps wait on "ready" barriers and hand slots back on "empty" ones,
# so that they never stop to issue loads or to synchronise with each other for a refill.


@gluon.jit
def _ws_loader(desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
               Nq, Nk, HQ, GROUP, BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, STAGES: gl.constexpr,
               CAUSAL: gl.constexpr):
    # q_smem holds the tile's query rows as GROUPS boxes of desc_q's rows, one per compute
    # partition.
    GROUPS: gl.constexpr = q_smem.type.shape[0]
    ROWS: gl.constexpr = desc_q.block_type.shape[2]
    pid_m, n_blocks, first_masked = _tile(Nq, Nk, BLOCK_M, BLOCK_N, CAUSAL)
    b, h, kvh = _heads(HQ, GROUP)
    mbarrier.expect(q_bar, GROUPS * desc_q.block_type.nbytes)
    for g in gl.static_range(GROUPS):
        tma.async_copy_global_to_shared(desc_q, [b, h, pid_m * BLOCK_M + g * ROWS, 0], q_bar, q_smem.index(g))
    for i in range(n_blocks):
        slot = i % STAGES
        # An mbarrier starts with its phase of parity 1 complete: the first round of slots
        # is free without waiting.
        phase = ((i // STAGES) & 1) ^ 1
        mbarrier.wait(k_empty.index(slot), phase)
        mbarrier.expect(k_ready.index(slot), desc_k.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_k, [b, kvh, i * BLOCK_N, 0], k_ready.index(slot), k_smem.index(slot))
        mbarrier.wait(v_empty.index(slot), phase)
        mbarrier.expect(v_ready.index(slot), desc_v.block_type.nbytes)
        tma.async_copy_global_to_shared(desc_v, [b, kvh, i * BLOCK_N, 0], v_ready.index(slot), v_smem.index(slot))


@gluon.jit
def _ws_compute(desc_o, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                Nq, Nk, HQ, GROUP, qk_scale, TILE_M: gl.constexpr, GROUP_ID: gl.constexpr,
                BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr, STAGES: gl.constexpr, CAUSAL: gl.constexpr,
                num_warps: gl.constexpr):
    # One compute partition: rows GROUP_ID * BLOCK_M ... of the TILE_M-row query tile. Every
    # partition walks all of the tile's key blocks, so that each hands every slot back once.
    BLOCK_M: gl.constexpr = desc_o.block_type.shape[2]
    q_smem = q_smem.index(GROUP_ID)
    pid_m, n_blocks, first_masked = _tile(Nq, Nk, TILE_M, BLOCK_N, CAUSAL)
    b, h, kvh = _heads(HQ, GROUP)
    row0 = pid_m * TILE_M + GROUP_ID * BLOCK_M
    s_layout: gl.constexpr = wgmma_layout(num_warps, BLOCK_N)
    o_layout: gl.constexpr = wgmma_layout(num_warps, HEAD_DIM)
    p_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=o_layout, k_width=2)
    row_s: gl.constexpr = gl.SliceLayout(1, s_layout)
    row_o: gl.constexpr = gl.SliceLayout(1, o_layout)
    col_s: gl.constexpr = gl.SliceLayout(0, s_layout)
    q_idx = gl.expand_dims(row0 + gl.arange(0, BLOCK_M, layout=row_s), 1)
    k_off = gl.expand_dims(gl.arange(0, BLOCK_N, layout=col_s), 0)
    q_op = q_smem.reshape([BLOCK_M, HEAD_DIM])

    m_i = gl.full([BLOCK_M], -float("inf"), gl.float32, row_s)
    l_i = gl.full([BLOCK_M], 0.0, gl.float32, row_s)
    acc = gl.zeros([BLOCK_M, HEAD_DIM], gl.float32, o_layout)
    s_init = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_layout)
    mbarrier.wait(q_bar, 0)
    s = warpgroup_mma_wait(0, deps=(_scores(q_op, k_smem, k_ready, 0, s_init, BLOCK_N, HEAD_DIM, STAGES),))
    gl.thread_barrier()  # every warp of this partition is done with K_0
    mbarrier.arrive(k_empty.index(0), count=1)
    s = _mask(s, 0, first_masked, q_idx, k_off, Nq, Nk, BLOCK_N, CAUSAL)
    p, m_i, l_i, alpha = _softmax_step(s, m_i, l_i, qk_scale)
    for j in range(1, n_blocks):
        p, m_i, l_i, alpha, acc = _overlap_step(q_op, k_smem, k_ready, v_smem, v_ready, j, p, m_i, l_i, acc, s_init,
                                                first_masked, q_idx, k_off, Nq, Nk, qk_scale, p_layout, BLOCK_N,
                                                HEAD_DIM, STAGES, CAUSAL)
        gl.thread_barrier()  # every warp of this partition is done with K_j and V_{j-1}
        mbarrier.arrive(k_empty.index(j % STAGES), count=1)
        mbarrier.arrive(v_empty.index((j - 1) % STAGES), count=1)
        acc = acc * gl.expand_dims(gl.convert_layout(alpha, row_o), 1)
    acc = warpgroup_mma_wait(0, deps=(_pv(p, v_smem, v_ready, n_blocks - 1, acc, p_layout, BLOCK_N, HEAD_DIM,
                                          STAGES),))
    _epilogue(acc, m_i, l_i, desc_o, q_smem, lse_ptr, b, h, row0, Nq, HQ, row_o, row_s)


@gluon.jit
def gluon_attn_fwd_ws(desc_q, desc_k, desc_v, desc_o, lse_ptr, Nq, Nk, HQ, GROUP, qk_scale,
                      BLOCK_M: gl.constexpr, BLOCK_N: gl.constexpr, HEAD_DIM: gl.constexpr,
                      STAGES: gl.constexpr, CAUSAL: gl.constexpr, GROUPS: gl.constexpr, num_warps: gl.constexpr):
    # GROUPS = 1: all compute warps in the default partition (BLOCK_M // 16 warps); they pass a
    # partition barrier before each slot is handed back. GROUPS = 2: one partition per compute
    # warp group (the default one and a worker, 4 warps each, desc_q/desc_o boxes of
    # BLOCK_M // 2 rows), which hand slots back independently (the empty barriers count 2) and so
    # drift apart: one group's softmax can run under the other's matmuls.
    dtype: gl.constexpr = desc_q.dtype
    q_smem = gl.allocate_shared_memory(dtype, [GROUPS] + desc_q.block_type.shape, desc_q.layout)
    q_bar = _barriers(1, 1).index(0)
    k_smem, k_ready = _ring(desc_k, STAGES)
    v_smem, v_ready = _ring(desc_v, STAGES)
    k_empty = _barriers(STAGES, GROUPS)  # each compute partition hands every slot back
    v_empty = _barriers(STAGES, GROUPS)
    if GROUPS == 1:
        gl.warp_specialize([
            (_ws_compute, (desc_o, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                           Nq, Nk, HQ, GROUP, qk_scale, BLOCK_M, 0, BLOCK_N, HEAD_DIM, STAGES, CAUSAL, num_warps)),
            (_ws_loader, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                          Nq, Nk, HQ, GROUP, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        ], [1], [LOADER_REGS])
    else:
        gl.warp_specialize([
            (_ws_compute, (desc_o, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                           Nq, Nk, HQ, GROUP, qk_scale, BLOCK_M, 0, BLOCK_N, HEAD_DIM, STAGES, CAUSAL, 4)),
            (_ws_compute, (desc_o, lse_ptr, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                           Nq, Nk, HQ, GROUP, qk_scale, BLOCK_M, 1, BLOCK_N, HEAD_DIM, STAGES, CAUSAL, 4)),
            (_ws_loader, (desc_q, desc_k, desc_v, q_smem, k_smem, v_smem, q_bar, k_ready, k_empty, v_ready, v_empty,
                          Nq, Nk, HQ, GROUP, BLOCK_M, BLOCK_N, STAGES, CAUSAL)),
        ], [4, 1], [COMPUTE_REGS, LOADER_REGS])


def _layout(block, dtype):
    return gl.NVMMASharedLayout.get_default_for(block, dtype)


def launcher(q, k, v, block_m: int, block_n: int, stages: int, mode: str, causal: bool, out=None):
    """A launch of one variant on (B, H, N, D) q, k, v (any strides with a contiguous last dim
    and 16-byte aligned others; GQA; Nq != Nk, causal bottom-right aligned), with its
    descriptors and outputs built once, so that timing sees the kernel and not their
    construction: (launch, out, lse)."""
    b, hq, nq, d = q.shape
    hkv, nk = k.shape[1], k.shape[2]
    gdt = gl.float16 if q.dtype == torch.float16 else gl.bfloat16
    out = torch.empty_like(q) if out is None else out
    # NaN until written: a row the kernel misses fails the check instead of passing on stale memory.
    lse = torch.full((b, hq, nq), float("nan"), device=q.device, dtype=torch.float32)
    rows = block_m // 2 if mode == "ws2" else block_m  # ws2: each compute group loads and stores its half
    dq, dk, dv, do = (TensorDescriptor.from_tensor(t, blk, _layout(blk, gdt))
                      for t, blk in zip((q, k, v, out), ([1, 1, rows, d], [1, 1, block_n, d], [1, 1, block_n, d],
                                                         [1, 1, rows, d])))
    grid = (triton.cdiv(nq, block_m), b * hq)
    args = (dq, dk, dv, do, lse, nq, nk, hq, hq // hkv, LOG2E / math.sqrt(d), block_m, block_n, d, stages)
    if mode in ("ws", "ws2"):
        groups = 2 if mode == "ws2" else 1

        def launch():
            gluon_attn_fwd_ws[grid](*args, causal, groups, num_warps=block_m // 16 // groups,
                                    maxnreg=WS_MAXNREG[block_m])
    else:
        def launch():
            gluon_attn_fwd[grid](*args, mode == "overlap", causal, num_warps=block_m // 16)
    return launch, out, lse


def run(q, k, v, block_m: int, block_n: int, stages: int, mode: str, causal: bool, out=None):
    """(out, lse) of attention over (B, H, N, D) q, k, v, causal or not (see launcher)."""
    launch, out, lse = launcher(q, k, v, block_m, block_n, stages, mode, causal, out)
    launch()
    return out, lse


def label(variant) -> str:
    block_m, block_n, stages, mode = variant
    return f"m{block_m} n{block_n} s{stages} {mode}"


def compile_for_sm90(fn, boxes, scalars: dict, values: dict, options: dict):
    """Compile a Gluon kernel for sm90 without a GPU, as a launch would specialise it:
    ``boxes`` names each tensor-descriptor argument with its (1, 1, rows, D) fp16 box,
    ``scalars`` the other runtime arguments' types, ``values`` the constexprs."""
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {}
    for arg, block in boxes:
        signature[arg] = f"tensordesc<fp16[{','.join(map(str, block))}],{_layout(block, gl.float16)!r}>"
    signature.update(scalars)
    signature.update({arg: "constexpr" for arg in values})
    names = list(signature)
    constexprs = {(names.index(arg),): value for arg, value in values.items()}
    return triton.compile(GluonASTSource(fn, signature, constexprs), target=GPUTarget("cuda", 90, 32),
                          options=options)


def resources(kernel, name: str) -> tuple[int | None, int, str]:
    """(registers, bytes spilled, SASS) of a kernel compiled for sm90, from the bundled ptxas
    and cuobjdump."""
    from fa2gen.generator.ahead import assemble, nvidia_tool, spill_bytes

    with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
        report = assemble(kernel, "sm90", cubin.name, name=name)
        sass = subprocess.run([nvidia_tool("cuobjdump"), "--dump-sass", cubin.name], capture_output=True,
                              text=True).stdout
    regs = re.search(r"Used (\d+) registers", report)
    return (int(regs.group(1)) if regs else None), spill_bytes(report), sass


def compiled(variant, head_dim: int, causal: bool):
    """One forward variant compiled for sm90."""
    block_m, block_n, stages, mode = variant
    qrows = block_m // 2 if mode == "ws2" else block_m
    boxes = [(arg, [1, 1, rows, head_dim]) for arg, rows in (("desc_q", qrows), ("desc_k", block_n),
                                                             ("desc_v", block_n), ("desc_o", qrows))]
    scalars = {"lse_ptr": "*fp32", "Nq": "i32", "Nk": "i32", "HQ": "i32", "GROUP": "i32", "qk_scale": "fp32"}
    values = dict(BLOCK_M=block_m, BLOCK_N=block_n, HEAD_DIM=head_dim, STAGES=stages)
    warps = block_m // 32 if mode == "ws2" else block_m // 16
    options = {"num_warps": warps}
    if mode in ("ws", "ws2"):
        fn = gluon_attn_fwd_ws
        options["maxnreg"] = WS_MAXNREG[block_m]
        values.update(CAUSAL=causal, GROUPS=2 if mode == "ws2" else 1)
    else:
        fn = gluon_attn_fwd
        values.update(OVERLAP=mode == "overlap", CAUSAL=causal)
    values["num_warps"] = warps
    return compile_for_sm90(fn, boxes, scalars, values, options)


def compile_only(head_dims) -> None:
    """Compile each variant for sm90 without a GPU and report what ptxas and the SASS say."""
    for head_dim in head_dims:
        for variant in VARIANTS:
            for causal in (False, True):
                kernel = compiled(variant, head_dim, causal)
                regs, spill, sass = resources(kernel, "gluon_attn_fwd")
                print(f"D={head_dim} {label(variant):23s} {'causal' if causal else 'full  '}: {regs} registers, "
                      f"{spill} B spilled, {kernel.metadata.shared} B shared, {sass.count('HGMMA')} HGMMA in the SASS",
                      flush=True)


def cells(args):
    from fa2gen.bench.grid import canonical_grid

    return canonical_grid(dtypes=args.dtypes.split(","), head_dims=[int(x) for x in args.head_dims.split(",")],
                          seqlens=[int(x) for x in args.seqlens.split(",")])


# Correctness beyond the canonical grid: (B, Hq, Hkv, Nq, Nk, D, causal, (B, N, H, D) memory).
ODD_SHAPES = [(2, 6, 2, 200, 333, 64, False, False), (2, 6, 2, 200, 333, 64, True, False),
              (1, 4, 4, 1, 257, 128, True, False), (3, 8, 1, 129, 129, 128, True, False),
              (1, 2, 2, 300, 100, 64, True, False), (2, 4, 4, 257, 257, 128, False, True)]


def check_odd(args) -> None:
    """One variant on ODD_SHAPES, checked only: GQA, Nq != Nk, N not a multiple of any tile,
    rows that see no key, strided inputs. One JSON line per shape."""
    from fa2gen.bench.correctness import check_forward
    from fa2gen.bench.grid import Case, make_inputs
    from fa2gen.runtime.problem import make_problem

    variant = VARIANTS[args.variant]
    for dtype in args.dtypes.split(","):
        for b, hq, hkv, nq, nk, d, causal, strided in ODD_SHAPES:
            case = Case(b, hq, nq, d, causal, dtype, heads_kv=hkv, seqlen_k=nk)
            row = {"case": case.label() + (" (B,N,H,D)" if strided else ""), "variant": label(variant)}
            try:
                q, k, v = make_inputs(case, torch.device("cuda"))
                if strided:
                    q, k, v = (t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v))
                out = torch.full_like(q, float("nan"))
                out, lse = run(q, k, v, *variant, causal, out=out)
                row["check"] = str(check_forward(q, k, v, make_problem(q, k, v, causal=causal), out, lse))
            except Exception as e:  # a variant that fails to compile or launch is a result here
                row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
            print("ROW " + json.dumps(row), flush=True)


def time_variant(args) -> None:
    """One variant over the cells, one JSON line per cell (run in its own process, so that a
    variant that hangs costs only its own time box). fa2gen's shipped forward and SDPA cuDNN
    are timed in the same process right before the variant, so that clock drift over a long
    run does not enter the ratios."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention

    import fa2gen
    from fa2gen.bench.correctness import check_forward
    from fa2gen.bench.grid import make_inputs
    from fa2gen.bench.timing import measure
    from fa2gen.runtime.problem import make_problem

    variant = VARIANTS[args.variant]
    for case in cells(args):
        row = {"case": case.label(), "variant": label(variant)}
        q, k, v = make_inputs(case, torch.device("cuda"))

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return scaled_dot_product_attention(q, k, v, is_causal=case.causal)

        try:  # the references on their own, so that one failing does not hide the variant's result
            row["fa2gen"] = case.flops() / measure(lambda: fa2gen.attention(q, k, v, causal=case.causal)).median_ms / 1e9
            row["cudnn"] = case.flops() / measure(cudnn).median_ms / 1e9
        except Exception as e:
            row["reference_error"] = f"{type(e).__name__}: {str(e)[:200]}"
        try:
            problem = make_problem(q, k, v, causal=case.causal)
            launch, out, lse = launcher(q, k, v, *variant, case.causal, out=torch.full_like(q, float("nan")))
            launch()
            verdict = check_forward(q, k, v, problem, out, lse)
            row["check"] = str(verdict)
            if verdict.ok:
                row["tflops"] = case.flops() / measure(launch).median_ms / 1e9
        except Exception as e:  # a variant that fails to compile or launch is a result here
            row["error"] = f"{type(e).__name__}: {str(e)[:200]}"
        print("ROW " + json.dumps(row), flush=True)


def _worker_rows(cmd, name: str, timeout: float) -> list[dict]:
    """Run one variant's worker; stop it when no cell has finished for ``timeout`` seconds (a
    hang costs that long, not the whole run)."""
    err = tempfile.TemporaryFile(mode="w+")  # a file, not a pipe: a chatty worker never blocks on it
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err)
    rows, pending, killed = [], b"", False
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        while True:
            if not sel.select(timeout):
                proc.kill()
                killed = True
                rows.append({"variant": name, "error": f"no cell finished within {timeout:.0f} s: killed"})
                break
            chunk = os.read(proc.stdout.fileno(), 65536)  # unbuffered: no line waits in a buffer
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.startswith(b"ROW "):
                    rows.append(json.loads(line[4:]))
                    print(f"  {name}: {rows[-1].get('case')}", flush=True)
    proc.wait()
    if proc.returncode and not killed:
        err.seek(0)
        rows.append({"variant": name, "error": f"exit {proc.returncode}: {err.read()[-300:]}"})
    err.close()
    return rows


def arguments(timeout: int) -> argparse.ArgumentParser:
    """The options both Gluon experiments take."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--dtypes", default="fp16")
    ap.add_argument("--head-dims", default="64,128")
    ap.add_argument("--seqlens", default="1024,4096,16384")
    ap.add_argument("--variant", type=int, help="time this variant only (the per-variant worker)")
    ap.add_argument("--timeout", type=int, default=timeout, help="seconds a variant may go without finishing a cell")
    ap.add_argument("--out")
    return ap


def run_variants(script: str, args, labels: list[str], extra: list[str] = ()) -> list[dict]:
    """Each variant of ``script`` in its own worker process (``--variant i``), over the cells
    of ``args``; the rows of all, written to ``args.out`` after each variant, so that a run
    cut short keeps what it measured."""
    rows = []
    worker = [sys.executable, script, "--dtypes", args.dtypes, "--head-dims", args.head_dims, "--seqlens",
              args.seqlens, *extra]
    for i, name in enumerate(labels):
        rows += _worker_rows(worker + ["--variant", str(i)], name, args.timeout)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"rows": rows}, f, indent=1)
    return rows


def main() -> None:
    ap = arguments(timeout=45)
    ap.add_argument("--odd", action="store_true", help="check ODD_SHAPES instead of timing the canonical cells")
    args = ap.parse_args()
    if args.compile_only:
        compile_only([int(x) for x in args.head_dims.split(",")])
        return
    if args.variant is not None:
        check_odd(args) if args.odd else time_variant(args)
        return

    rows = run_variants(__file__, args, [label(v) for v in VARIANTS], ["--odd"] if args.odd else [])
    print(f"{'case':40s} {'variant':23s} {'TFLOP/s':>8s} {'x fa2gen':>9s} {'x cuDNN':>8s}  check")
    for r in rows:
        if "tflops" in r and "fa2gen" in r and "cudnn" in r:
            print(f"{r['case']:40s} {r['variant']:23s} {r['tflops']:8.1f} {r['tflops'] / r['fa2gen']:9.2f} "
                  f"{r['tflops'] / r['cudnn']:8.2f}  {r['check']}")
        else:
            print(f"{r.get('case', '-'):48s} {r['variant']:23s} {r.get('error') or r.get('check')}")
    for mode in sorted({v[3] for v in VARIANTS}):
        best = {}
        for r in rows:
            if "tflops" in r and "fa2gen" in r and "cudnn" in r and r["variant"].endswith(" " + mode):
                best[r["case"]] = max(best.get(r["case"], (0, 0, 0)), (r["tflops"], r["fa2gen"], r["cudnn"]))
        if best:
            ratio = lambda i: math.exp(sum(math.log(t[0] / t[i]) for t in best.values()) / len(best))
            print(f"best {mode} per cell, geomean over {len(best)} cells: x fa2gen {ratio(1):.3f}, x cuDNN {ratio(2):.3f}")


if __name__ == "__main__":
    main()
