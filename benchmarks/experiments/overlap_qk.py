"""Experiment: issue the next block's Q·Kᵀ before the current block's softmax.

On Hopper the score matmul (wgmma) is asynchronous; in the plain loop its result is
needed at once, so the tensor cores idle while the softmax runs. Here the loop carries
the next block's scores, so the matmul for block j+1 can run under block j's softmax.
Two minimal non-causal kernels (host tensor descriptors, N a multiple of the tiles), the
plain loop and the overlapped one, are checked against SDPA and timed side by side.

usage: python benchmarks/experiments/overlap_qk.py [--ttgir]   (--ttgir: compile for sm90
and count the asynchronous-dot waits, no GPU needed)
"""

from __future__ import annotations

import sys

import triton
import triton.language as tl


@triton.jit
def _softmax_step(qk, acc, l_i, m_i, v, qk_scale):
    m_new = tl.maximum(m_i, tl.max(qk, 1) * qk_scale)
    p = tl.exp2(qk * qk_scale - m_new[:, None])
    alpha = tl.exp2(m_i - m_new)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = tl.dot(p.to(v.dtype), v, acc)
    return acc, l_i, m_new


@triton.jit
def fwd(Q, K, V, O, H, N, sm_scale, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, OVERLAP: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    m0 = pid_m * BM
    q = Q.load([b, h, m0, 0]).reshape(BM, D)
    qk_scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    if OVERLAP == 2:  # warp specialisation: loads, matmuls and softmax in separate warp groups
        for start in tl.range(0, N, BN, warp_specialize=True):
            k = K.load([b, h, start, 0]).reshape(BN, D)
            qk = tl.dot(q, tl.trans(k))
            v = V.load([b, h, start, 0]).reshape(BN, D)
            acc, l_i, m_i = _softmax_step(qk, acc, l_i, m_i, v, qk_scale)
    elif OVERLAP == 1:
        k = K.load([b, h, 0, 0]).reshape(BN, D)
        qk = tl.dot(q, tl.trans(k))
        for start in tl.range(BN, N, BN):
            k = K.load([b, h, start, 0]).reshape(BN, D)
            qk_next = tl.dot(q, tl.trans(k))
            v = V.load([b, h, start - BN, 0]).reshape(BN, D)
            acc, l_i, m_i = _softmax_step(qk, acc, l_i, m_i, v, qk_scale)
            qk = qk_next
        v = V.load([b, h, N - BN, 0]).reshape(BN, D)
        acc, l_i, m_i = _softmax_step(qk, acc, l_i, m_i, v, qk_scale)
    else:
        for start in tl.range(0, N, BN):
            k = K.load([b, h, start, 0]).reshape(BN, D)
            qk = tl.dot(q, tl.trans(k))
            v = V.load([b, h, start, 0]).reshape(BN, D)
            acc, l_i, m_i = _softmax_step(qk, acc, l_i, m_i, v, qk_scale)
    out = (acc / l_i[:, None]).to(q.dtype)
    O.store([b, h, m0, 0], out.reshape(1, 1, BM, D))


def ttgir(D=128, BM=128, BN=64, warps=4, stages=2):
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for overlap in (0, 1, 2):
        sig = {n: f"tensordesc<fp16[1,1,{BM if n in 'QO' else BN},{D}]>" for n in "QKVO"}
        sig.update(H="i32", N="i32", sm_scale="fp32", D="constexpr", BM="constexpr", BN="constexpr", OVERLAP="constexpr")
        src = ASTSource(fwd, signature=sig, constexprs={"D": D, "BM": BM, "BN": BN, "OVERLAP": overlap})
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
        except Exception as e:  # noqa: BLE001 - a variant the compiler rejects is the answer
            print(f"overlap={overlap}: {type(e).__name__}: {str(e)[:200]}")
            continue
        t = k.asm["ttgir"]
        print(f"overlap={overlap}: warp_specialize regions: {t.count('ttg.warp_specialize')}")
        loop = t[t.index("scf.for"):] if "scf.for" in t else "scf.yield"
        loop = loop[:loop.index("scf.yield")]
        print(f"overlap={overlap}: in the loop: {loop.count('warp_group_dot ')} dots, waits:",
              [line.split("pendings = ")[1][:12] for line in loop.splitlines() if "warp_group_dot_wait" in line])


def bench():
    import torch
    import torch.nn.functional as F
    from triton.testing import do_bench
    from triton.tools.tensor_descriptor import TensorDescriptor

    rows = []
    for D, N, BM, BN, warps, stages in [(128, 4096, 128, 64, 4, 2), (128, 1024, 128, 64, 4, 2), (128, 16384, 128, 64, 4, 2),
                                        (128, 4096, 128, 128, 8, 2), (64, 4096, 64, 128, 4, 2), (64, 4096, 128, 64, 4, 2),
                                        (64, 1024, 64, 128, 4, 2), (128, 4096, 128, 64, 4, 3)]:
        B, H = 16384 // N, 2048 // D
        q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
        ref = F.scaled_dot_product_attention(q, k, v)
        flops = 4 * B * H * N * N * D
        line = [f"D={D} N={N} m{BM}n{BN}w{warps}s{stages}"]
        for overlap in (0, 1, 2):
            o = torch.full_like(q, float("nan"))
            desc = lambda t, r: TensorDescriptor(t, list(t.shape), list(t.stride()), [1, 1, r, D])

            def run():
                fwd[(N // BM, B * H)](desc(q, BM), desc(k, BN), desc(v, BN), desc(o, BM), H, N, D ** -0.5,
                                      D=D, BM=BM, BN=BN, OVERLAP=overlap, num_warps=warps, num_stages=stages)

            try:
                run()
                err = (o.float() - ref.float()).abs().max().item()
                ms = do_bench(run, warmup=25, rep=100)
                line.append(f"overlap={overlap}: {flops / ms / 1e9:6.1f} TFLOP/s err {err:.1e}")
            except Exception as e:  # an overlapped config that does not fit is data too
                line.append(f"overlap={overlap}: {type(e).__name__} {str(e)[:60]}")
        print(" | ".join(line), flush=True)


if __name__ == "__main__":
    ttgir() if "--ttgir" in sys.argv else bench()
