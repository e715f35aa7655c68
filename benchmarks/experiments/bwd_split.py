"""Where the backward's GPU time goes, kernel by kernel, and what the dQ kernel's own tiles
would buy.

With the Gluon dK/dV kernel (TuningParams.gluon = 1) the delta and dQ kernels run the Triton
template on the Gluon kernel's tiles, which the tuner chose for the two kernels together. This
times, with the PyTorch profiler, each kernel of fa2gen's backward() on each cell:
- with the shipped params (what attention()'s backward dispatches);
- with Triton-only params on several tiles, whose dQ kernel times say how fast dQ runs on
  tiles of its own.
It prints, per cell, the shipped split (delta / dK/dV / dQ), the fastest dQ tile, and the
backward the shipped dK/dV kernel and that dQ kernel would make, against SDPA cuDNN's backward
timed the same way (do_bench is not used: the profiler's kernel times leave the host out).

usage: python benchmarks/experiments/bwd_split.py --out OUT.json [--dtype fp16]
"""

from __future__ import annotations

import argparse
import json

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from fa2gen.bench.grid import Case, make_inputs
from fa2gen.bench.timing import kernel_ms
from fa2gen.generator.spec import TuningParams
from fa2gen.runtime.backward import backward
from fa2gen.runtime.device import cuda_device_info
from fa2gen.runtime.dispatch import select_params
from fa2gen.runtime.launch import forward
from fa2gen.runtime.problem import make_problem

# Triton-only tiles for the dQ kernel: the shipped Gluon candidates' tiles, and the tiles the
# Triton backward won with at D=128 before the Gluon kernel (128 x 64, 8 warps, 3 stages).
DQ_TILES = [
    TuningParams(block_m=64, block_n=64, num_warps=4, num_stages=2, loads="tma_host"),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=2, loads="tma_host"),
    TuningParams(block_m=128, block_n=32, num_warps=8, num_stages=3, loads="tma_host"),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="tma_host"),
    TuningParams(block_m=128, block_n=64, num_warps=8, num_stages=3, loads="pointer"),
    TuningParams(block_m=64, block_n=32, num_warps=4, num_stages=3, loads="tma_host"),
]
KERNELS = ("attn_bwd_delta", "attn_bwd_dkdv", "attn_bwd_dq")
CELLS = [(128, 4096, False), (128, 16384, False), (128, 4096, True), (128, 16384, True), (64, 16384, False),
         (64, 16384, True), (128, 1024, False)]


def cell(d: int, n: int, causal: bool, dtype: str) -> dict:
    case = Case(16384 // n, 2048 // d, n, d, causal, dtype)
    q, k, v = make_inputs(case, torch.device("cuda"))
    problem = make_problem(q, k, v, causal=causal)
    dev = cuda_device_info(torch.cuda.current_device())
    out, lse = forward(q, k, v, problem, select_params(problem, dev))
    dout = torch.randn_like(out)
    flops = 2.5 * case.flops()
    shipped = select_params(problem, dev, "bwd")

    def split(params):
        return kernel_ms(lambda: backward(q, k, v, out, lse, dout, problem, params), KERNELS)

    row = {"cell": case.label(), "shipped": shipped.label(), "shipped_ms": split(shipped), "dq_tiles": {}}
    for p in DQ_TILES:
        try:
            row["dq_tiles"][p.label()] = split(p)["attn_bwd_dq"]
        except Exception as e:  # a tile the spec rules refuse, or that does not fit: reported
            row["dq_tiles"][p.label()] = f"{type(e).__name__}: {str(e)[:80]}"
    qs, ks, vs = (t.detach().requires_grad_() for t in (q, k, v))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        o = torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, is_causal=causal)
        row["cudnn_ms"] = sum(kernel_ms(lambda: torch.autograd.grad(o, (qs, ks, vs), dout, retain_graph=True)).values())
    total = sum(row["shipped_ms"].values())
    timed = {label: ms for label, ms in row["dq_tiles"].items() if isinstance(ms, float)}
    best = min(timed, key=timed.get)
    with_best = total - row["shipped_ms"].get("attn_bwd_dq", 0.0) + timed[best]
    row.update(total_ms=total, best_dq=best, best_dq_ms=timed[best], with_best_dq_ms=with_best,
               tflops=flops / total / 1e9, x_cudnn=row["cudnn_ms"] / total,
               x_cudnn_with_best_dq=row["cudnn_ms"] / with_best)
    return row


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--dtype", default="fp16")
    args = ap.parse_args()
    rows = []
    for d, n, causal in CELLS:
        row = cell(d, n, causal, args.dtype)
        rows.append(row)
        split = " / ".join(f"{row['shipped_ms'].get(k, 0.0):.3f}" for k in KERNELS)
        print(f"{row['cell']:36s} {row['shipped']:28s} delta/dkdv/dq {split} ms; x cuDNN {row['x_cudnn']:.3f}; "
              f"best dQ tile {row['best_dq']} {row['best_dq_ms']:.3f} ms -> x cuDNN {row['x_cudnn_with_best_dq']:.3f}",
              flush=True)
    with open(args.out, "w") as f:
        json.dump({"device": torch.cuda.get_device_name(), "dtype": args.dtype, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
