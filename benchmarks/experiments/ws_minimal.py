"""Experiment: does Triton's automatic warp specialisation give a correct, faster attention
on this GPU at all? Deliberately minimal kernels, independent of fa2gen's templates:
non-causal, lengths a multiple of every tile, on-device descriptors over (B*H*N, D), no
masks. If these are wrong or hang when specialised, the compiler is at fault; if they are
right, fa2gen's specialised templates differ from them somewhere that matters.
  fwd:  the forward (O only).
  dkdv: the backward's dK/dV kernel, one program per key block looping over query blocks,
        given the forward's log-sum-exp and delta = rowsum(dO * O).

usage: python benchmarks/experiments/ws_minimal.py [--timeout 45]          (every variant)
       python benchmarks/experiments/ws_minimal.py --compile-only          (sm90 PTX, no GPU)
Variant: kernel, ws (0|1), store (desc|ptr), outer rows, inner rows, num_stages, num_warps.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import triton
import triton.language as tl

VARIANTS = ([("fwd", ws, store, bm, bn, 2, 4) for ws in (0, 1) for store in ("desc", "ptr")
             for bm, bn in ((128, 128), (128, 64))]
            + [("dkdv", 0, "desc", 128, 32, 3, 8), ("dkdv", 0, "desc", 128, 64, 2, 8), ("dkdv", 0, "desc", 128, 32, 2, 4),
               ("dkdv", 1, "desc", 128, 32, 2, 4), ("dkdv", 1, "desc", 128, 64, 2, 4), ("dkdv", 1, "desc", 128, 32, 3, 4),
               ("dkdv", 1, "ptr", 128, 32, 2, 4)])
B, H, N, D = 4, 16, 4096, 128


@triton.jit
def minimal_fwd(Q, K, V, O, N, sm_scale, ROWS,
                D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WS: tl.constexpr, DESC_STORE: tl.constexpr):
    pid_m = tl.program_id(0)
    base = tl.program_id(1) * N  # first row of this (batch, head) in the flattened tensors
    q_desc = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    k_desc = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    v_desc = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    q = q_desc.load([base + pid_m * BM, 0])
    scale = sm_scale * 1.4426950408889634
    m_i = tl.full([BM], float("-inf"), tl.float32)
    l_i = tl.zeros([BM], tl.float32)
    acc = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, N, BN, warp_specialize=WS):
        k = k_desc.load([base + start, 0])
        s = tl.dot(q, k.T)
        m_new = tl.maximum(m_i, tl.max(s, 1) * scale)
        p = tl.exp2(s * scale - m_new[:, None])
        alpha = tl.exp2(m_i - m_new)
        l_i = l_i * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None]
        v = v_desc.load([base + start, 0])
        acc = tl.dot(p.to(v.dtype), v, acc)
        m_i = m_new
    out = (acc / l_i[:, None]).to(O.dtype.element_ty)
    if DESC_STORE:
        o_desc = tl.make_tensor_descriptor(O, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
        o_desc.store([base + pid_m * BM, 0], out)
    else:
        rows = base + pid_m * BM + tl.arange(0, BM)
        tl.store(O + rows.to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :], out)


@triton.jit
def minimal_dkdv(Q, K, V, DO, LSE2, DELTA, DK, DV, N, sm_scale, ROWS,
                 D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, WS: tl.constexpr, DESC_STORE: tl.constexpr):
    # BM: key rows this program owns; BN: query rows per loop step. LSE2 is in the log2 domain.
    pid_n = tl.program_id(0)
    base = tl.program_id(1) * N
    q_desc = tl.make_tensor_descriptor(Q, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    do_desc = tl.make_tensor_descriptor(DO, shape=[ROWS, D], strides=[D, 1], block_shape=[BN, D])
    k_desc = tl.make_tensor_descriptor(K, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    v_desc = tl.make_tensor_descriptor(V, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
    k = k_desc.load([base + pid_n * BM, 0])
    v = v_desc.load([base + pid_n * BM, 0])
    scale = sm_scale * 1.4426950408889634
    dk = tl.zeros([BM, D], tl.float32)
    dv = tl.zeros([BM, D], tl.float32)
    for start in tl.range(0, N, BN, warp_specialize=WS):
        q = q_desc.load([base + start, 0])
        do = do_desc.load([base + start, 0])
        cols = base + start + tl.arange(0, BN)
        lse2 = tl.load(LSE2 + cols)
        delta = tl.load(DELTA + cols)
        p = tl.exp2(tl.dot(k, q.T) * scale - lse2[None, :])
        dv = tl.dot(p.to(do.dtype), do, dv)
        ds = p * (tl.dot(v, do.T) - delta[None, :])
        dk = tl.dot(ds.to(q.dtype), q, dk)
    dk = dk * sm_scale
    if DESC_STORE:
        dk_desc = tl.make_tensor_descriptor(DK, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
        dv_desc = tl.make_tensor_descriptor(DV, shape=[ROWS, D], strides=[D, 1], block_shape=[BM, D])
        dk_desc.store([base + pid_n * BM, 0], dk.to(DK.dtype.element_ty))
        dv_desc.store([base + pid_n * BM, 0], dv.to(DV.dtype.element_ty))
    else:
        rows = (base + pid_n * BM + tl.arange(0, BM)).to(tl.int64)[:, None] * D + tl.arange(0, D)[None, :]
        tl.store(DK + rows, dk.to(DK.dtype.element_ty))
        tl.store(DV + rows, dv.to(DV.dtype.element_ty))


KERNELS = {"fwd": (minimal_fwd, ("Q", "K", "V", "O")),
           "dkdv": (minimal_dkdv, ("Q", "K", "V", "DO", "LSE2", "DELTA", "DK", "DV"))}


def compile_only() -> None:
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    for kernel, ws, store, bm, bn, stages, warps in VARIANTS:
        fn, tensors = KERNELS[kernel]
        sig = {t: "*fp32" if t in ("LSE2", "DELTA") else "*fp16" for t in tensors}
        sig.update({"N": "i32", "sm_scale": "fp32", "ROWS": "i32"})
        const = {"D": D, "BM": bm, "BN": bn, "WS": bool(ws), "DESC_STORE": store == "desc"}
        src = ASTSource(fn, signature={**sig, **{k: "constexpr" for k in const}}, constexprs=const)
        label = f"{kernel} ws={ws} store={store} {bm}x{bn} s{stages} w{warps}"
        try:
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps, "num_stages": stages})
            print(f"{label}: {k.metadata.num_warps} warps, {k.metadata.shared} B shared")
        except Exception as e:  # a compiler failure is a result here
            print(f"{label}: failed: {type(e).__name__}: {str(e)[:200]}")


def run_one(kernel: str, ws: int, store: str, bm: int, bn: int, stages: int, warps: int) -> None:
    import torch

    from fa2gen.bench.timing import measure

    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
    q, k, v = (torch.randn(B, H, N, D, device="cuda", dtype=torch.float16) for _ in range(3))
    scale = D ** -0.5
    opts = dict(D=D, BM=bm, BN=bn, WS=bool(ws), DESC_STORE=store == "desc", num_warps=warps, num_stages=stages)
    if kernel == "fwd":
        o = torch.full_like(q, float("nan"))
        refs = [torch.nn.functional.scaled_dot_product_attention(q.float(), k.float(), v.float())]
        outs = [o]
        flops = 4 * B * H * N * N * D

        def call():
            minimal_fwd[(N // bm, B * H)](q, k, v, o, N, scale, B * H * N, **opts)
    else:
        leaves = [t.float().requires_grad_() for t in (q, k, v)]
        ref_o = torch.nn.functional.scaled_dot_product_attention(*leaves)
        do = torch.randn_like(q)
        ref_o.backward(do.float())
        refs = [leaves[1].grad, leaves[2].grad]
        s = (q.float() @ k.float().transpose(-1, -2)) * scale
        lse2 = (torch.logsumexp(s, -1) * 1.4426950408889634).contiguous()
        delta = (ref_o.detach().half().float() * do.float()).sum(-1).contiguous()
        del s
        dk, dv = (torch.full_like(q, float("nan")) for _ in range(2))
        outs = [dk, dv]
        flops = 8 * B * H * N * N * D

        def call():
            minimal_dkdv[(N // bm, B * H)](q, k, v, do, lse2, delta, dk, dv, N, scale, B * H * N, **opts)

    call()
    torch.cuda.synchronize()
    err = max((o.float() - r).abs().nan_to_num(float("inf")).max().item() for o, r in zip(outs, refs))
    nan = max(o.isnan().float().mean().item() for o in outs)
    ms = measure(call).median_ms
    print(f"RESULT {flops / ms / 1e9:6.1f} TFLOP/s max err {err:.2e}, NaN fraction {nan:.3f}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=45.0)
    ap.add_argument("--compile-only", action="store_true")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.compile_only:
        compile_only()
        return
    if args.one is not None:
        run_one(*VARIANTS[args.one])
        return
    for i, (kernel, ws, store, bm, bn, stages, warps) in enumerate(VARIANTS):
        try:
            proc = subprocess.run([sys.executable, __file__, "--one", str(i)], capture_output=True, text=True,
                                  timeout=args.timeout)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
            result = (lines[-1][7:] if lines else
                      f"error (exit {proc.returncode}): {(proc.stderr.strip().splitlines() or ['-'])[-1][:160]}")
        except subprocess.TimeoutExpired:
            result = f"hang: no result in {args.timeout:.0f} s"
        print(f"{kernel:4s} ws={ws} store={store:4s} {bm}x{bn} s{stages} w{warps}: {result}", flush=True)


if __name__ == "__main__":
    main()
