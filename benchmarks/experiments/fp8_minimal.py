"""Experiment: how fast can a Triton 3.6 attention forward run in fp8 (e4m3) on this GPU, and
which V layout does it want? A minimal non-causal kernel, independent of fa2gen's templates,
with 2-D on-device descriptors over (B*H*N, D). Q and K are fp8 with per-tensor descaling
factors folded into the score scale. P is rounded to e4m3 for the P @ V matmul, as
FlashAttention-3 does. V arrives either as (N, D) rows or transposed to (D, N), since sm90's
fp8 matmul wants both operands contiguous along the reduction axis. The same kernel in bf16
is the baseline.

usage: python benchmarks/experiments/fp8_minimal.py [--seqlens 4096,16384]
       python benchmarks/experiments/fp8_minimal.py --compile-only     (sm90 PTX, no GPU)
"""

from __future__ import annotations

import argparse

import triton
import triton.language as tl

D = 128
# (dtype, V transposed, BLOCK_M, BLOCK_N, num_warps, num_stages)
VARIANTS = ([("bf16", False, 128, 64, 4, 2), ("bf16", False, 128, 128, 8, 2)]
            + [("fp8", vt, bm, bn, w, s) for vt in (True, False)
               for bm, bn, w, s in ((128, 64, 4, 2), (128, 128, 4, 2), (128, 128, 8, 2), (128, 128, 8, 3),
                                    (128, 256, 8, 2), (256, 128, 8, 2))])


@triton.jit
def fp8_fwd(Q, K, V, O, N, scale, v_scale, ROWS,
            D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, VT: tl.constexpr):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    base = bh * N
    q_desc = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    k_desc = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    if VT:  # V^T per (batch, head): (D, N) rows of keys, flattened to (B*H*D, N)
        v_desc = tl.make_tensor_descriptor(V, shape=[ROWS // N * D, N], strides=[N, 1], block_shape=[D, BN])
    else:
        v_desc = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    q = q_desc.load([base + pid_m * BM, 0])
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, N, BN):
        k = k_desc.load([base + start, 0])
        s = tl.dot(q, k.T)
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
        p = tl.exp2(s * scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        if VT:
            v = v_desc.load([bh * D, start]).T
        else:
            v = v_desc.load([base + start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    o_desc = tl.make_tensor_descriptor(O, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    o_desc.store([base + pid_m * BM, 0], (acc * (v_scale / l_i[:, None])).to(O.dtype.element_ty))


def compile_only() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for dtype, vt, bm, bn, warps, stages in VARIANTS:
        t = "*fp8e4nv" if dtype == "fp8" else "*bf16"
        sig = {"Q": t, "K": t, "V": t, "O": "*bf16", "N": "i32", "scale": "fp32", "v_scale": "fp32", "ROWS": "i32"}
        const = {"D": D, "BM": bm, "BN": bn, "VT": vt}
        src = ASTSource(fp8_fwd, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
        label = f"{dtype} vt={int(vt)} {bm}x{bn} w{warps} s{stages}"
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
            print(f"{label}: {k.metadata.shared} B shared, wgmma: {k.asm['ptx'].count('wgmma.mma_async')}")
        except Exception as e:  # a compiler failure is a result here
            print(f"{label}: failed: {type(e).__name__}: {str(e)[:200]}")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args()
    if args.compile_only:
        compile_only()
        return
    import torch

    from fa2gen.bench.timing import measure

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    f8 = torch.float8_e4m3fn
    for n in map(int, args.seqlens.split(",")):
        b, h = max(1, 16384 // n), 2048 // D
        q, k, v = (torch.randn(b, h, n, D, device="cuda") for _ in range(3))
        scales = [t.abs().max() / 448.0 for t in (q, k, v)]
        q8, k8, v8 = ((t / s).to(f8) for t, s in zip((q, k, v), scales))
        v8t = v8.transpose(-1, -2).contiguous()
        # The reference attends over what the fp8 tensors hold, in fp32.
        ref = torch.nn.functional.scaled_dot_product_attention(*(t.float() * s for t, s in zip((q8, k8, v8), scales)))
        base_err = (torch.nn.functional.scaled_dot_product_attention(
            *(t.to(torch.bfloat16) for t in (q, k, v))).float() - ref).abs().max().item()
        flops = 4 * b * h * n * n * D
        print(f"B={b} H={h} N={n} D={D}; bf16 SDPA's error against the reference: {base_err:.2e}")
        for dtype, vt, bm, bn, warps, stages in VARIANTS:
            label = f"{dtype} vt={int(vt)} {bm}x{bn} w{warps} s{stages}"
            if dtype == "fp8":
                ins, qk_scale, v_scale = (q8, k8, v8t if vt else v8), float(scales[0] * scales[1]), float(scales[2])
            else:
                ins, qk_scale, v_scale = tuple(t.to(torch.bfloat16) for t in (q, k, v)), 1.0, 1.0
            o = torch.full((b, h, n, D), float("nan"), device="cuda", dtype=torch.bfloat16)

            def call():
                fp8_fwd[(n // bm, b * h)](*ins, o, n, qk_scale * D ** -0.5 * 1.4426950408889634, v_scale, b * h * n,
                                          D=D, BM=bm, BN=bn, VT=vt, num_warps=warps, num_stages=stages)
            try:
                call()
                torch.cuda.synchronize()
                err = (o.float() - ref).abs().nan_to_num(float("inf")).max().item()
                ms = measure(call).median_ms
                print(f"  {label:28s} {flops / ms / 1e9:6.1f} TFLOP/s  max err {err:.2e}", flush=True)
            except Exception as e:  # a variant that fails to compile or launch is a result here
                print(f"  {label:28s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)


if __name__ == "__main__":
    main()
